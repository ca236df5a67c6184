"""The stream's application for spark-submit: ``dblog stream`` with master and resources from
spark-submit's arguments.

    spark-submit --master <url> --jars "$(python -m airflow_dblog.engine.connector_jars)" \
        "$(python -c 'import airflow_dblog.cli.spark_submit as m; print(m.__file__)')" \
        -c stream.yaml

A file inside the package, so an installed wheel has it (the launcher's default application).
It lives at the command line's layer, not in ``spark/``, because it resolves an Airflow
connection id in ``source.url`` (:func:`~airflow_dblog.provider.connections.resolved`), which
the Spark layer may not import; its folder holds nothing else worth importing, since Python
puts a script's folder first on ``sys.path``.

The config's ``spark.master`` is ignored here (``dblog stream`` uses it). The Delta and Kafka
jars must be on ``--jars``: under spark-submit the driver's JVM is up before the job could add
them. airflow-dblog must be installed in the driver's Python; the session ships it to the
executors, whose Python needs its dependencies. The checkpoint directory must be on storage the
driver and executors share.
"""

from __future__ import annotations

import argparse
import logging
import sys

from airflow_dblog.config import load_config
from airflow_dblog.errors import DblogError
from airflow_dblog.provider.connections import resolved
from airflow_dblog.redact import redact


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="dblog_stream.py")
    parser.add_argument("-c", "--config", required=True, metavar="FILE", help="stream config")
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    try:
        config = resolved(load_config(args.config))
        from airflow_dblog.spark.stream_job import run_stream  # imports pyspark

        return run_stream(config, master=None)
    except DblogError as err:
        print(f"dblog_stream: error: {redact(str(err))}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
