"""A full dump of every captured table each night, followed until it is done."""

from __future__ import annotations

from datetime import datetime

from airflow_dblog.provider.compat import DAG
from airflow_dblog.provider.example_dags import SENSOR_RETRY, config_path
from airflow_dblog.provider.operators.dblog import DblogDumpOperator
from airflow_dblog.provider.sensors.dblog import DblogDumpSensor

with DAG(
    dag_id="dblog_scheduled_dump",
    schedule="0 2 * * *",
    start_date=datetime(2026, 1, 1),
    catchup=False,
    max_active_runs=1,
    tags=["dblog"],
    doc_md=__doc__,
):
    plan = DblogDumpOperator(task_id="plan_dump", config_path=config_path())
    DblogDumpSensor(
        task_id="wait_for_dump",
        dump_id="{{ ti.xcom_pull(task_ids='plan_dump') }}",
        config_path=config_path(),
        deferrable=True,
        **SENSOR_RETRY,
    ).set_upstream(plan)
