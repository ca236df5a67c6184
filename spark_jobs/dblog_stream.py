"""spark-submit entry point of the streaming job, for a source checkout: the package's own
:mod:`airflow_dblog.cli.spark_submit` (which an installed wheel has too).

    spark-submit --master <url> --jars "$(python -m airflow_dblog.engine.connector_jars)" \
        spark_jobs/dblog_stream.py -c stream.yaml
"""

from __future__ import annotations

import sys

from airflow_dblog.cli.spark_submit import main

if __name__ == "__main__":
    sys.exit(main())
