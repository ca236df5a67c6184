"""Every five minutes: make sure the stream runs, then check how far behind its source it is.

``ensure_stream`` does nothing when the stream runs (the process it started before is alive, a
process holds the ``ha`` leader lease, or, without ``ha``, the stream committed within a minute
and, if the process it started died, again within 5 s) and else starts it detached from the
task, where ``DBLOG_STREAM_MODE`` says: ``local`` (default: ``dblog stream -c FILE`` on this
worker, the config's ``spark.master``) or ``spark-submit`` (``spark-submit
$DBLOG_SPARK_SUBMIT_ARGS airflow_dblog/cli/spark_submit.py -c FILE``, e.g. ``--master
spark://spark-master:7077``). Its output goes to ``<checkpoint>/launcher/stream.log``; the task
fails naming that file if the stream exits or does not commit within two minutes.

``check_lag`` (deferrable: it waits in the triggerer) fails when the stream is not running, when
its lag is unknown, or when it stays more than ``MAX_LAG_S`` seconds or ``MAX_LAG_BYTES`` bytes
behind its source for ``GRACE_S`` (time for a just restarted stream to catch up).
"""

from __future__ import annotations

import os
from datetime import datetime, timedelta

from airflow_dblog.provider.compat import DAG
from airflow_dblog.provider.example_dags import SENSOR_RETRY, config_path
from airflow_dblog.provider.operators.dblog import DblogEnsureStreamOperator
from airflow_dblog.provider.sensors.dblog import DblogStreamSensor

MAX_LAG_S = 300
MAX_LAG_BYTES = 1 << 30  # 1 GiB of binlog / WAL
GRACE_S = 120

with DAG(
    dag_id="dblog_keep_alive",
    schedule="*/5 * * * *",
    start_date=datetime(2026, 1, 1),
    catchup=False,
    max_active_runs=1,  # two runs must not both find the stream down and start it
    dagrun_timeout=timedelta(minutes=15),
    tags=["dblog"],
    doc_md=__doc__,
):
    ensure = DblogEnsureStreamOperator(
        task_id="ensure_stream",
        config_path=config_path(),
        mode=os.environ.get("DBLOG_STREAM_MODE", "local"),
        spark_args=os.environ.get("DBLOG_SPARK_SUBMIT_ARGS", ""),
        timeout_s=120,
    )
    check = DblogStreamSensor(
        task_id="check_lag",
        config_path=config_path(),
        max_lag_s=MAX_LAG_S,
        max_lag_bytes=MAX_LAG_BYTES,
        grace_s=GRACE_S,
        poke_interval=10,
        timeout=600,
        deferrable=True,
        **SENSOR_RETRY,
    )
    ensure >> check
