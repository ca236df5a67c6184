"""spark-submit entry point of the streaming job.

    spark-submit --master <url> --jars "$(python -m airflow_dblog.spark.session)" \
        spark_jobs/dblog_stream.py -c stream.yaml

The master and resources come from spark-submit (the config's ``spark.master`` is ignored here;
``dblog stream`` uses it). The Delta and Kafka jars must be on ``--jars``: under spark-submit
the driver's JVM is up before the job could add them. airflow-dblog must be installed in the
driver's Python; the session ships it to the executors, whose Python needs its dependencies.
The checkpoint directory must be on storage the driver and executors share.
"""

from __future__ import annotations

import argparse
import logging
import sys

from airflow_dblog.config import load_config
from airflow_dblog.errors import DblogError
from airflow_dblog.redact import redact
from airflow_dblog.spark.stream_job import run_stream


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="dblog_stream.py")
    parser.add_argument("-c", "--config", required=True, metavar="FILE", help="stream config")
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    try:
        return run_stream(load_config(args.config), master=None)
    except DblogError as err:
        print(f"dblog_stream: error: {redact(str(err))}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
