"""Backfill specific primary keys of one table, from the trigger form.

Pick the table and enter the keys, one per line: a bare value for one-column keys (``42`` or
``abc``), JSON for composite keys (``[42, "eu"]`` in key order, or ``{"id": 42, "region": "eu"}``).
Bad input fails the first task with a one-line message and writes nothing.
"""

from __future__ import annotations

from airflow_dblog.provider.compat import DAG, Param
from airflow_dblog.provider.example_dags import SENSOR_RETRY, captured_tables, config_path
from airflow_dblog.provider.operators.dblog import DblogBackfillOperator
from airflow_dblog.provider.sensors.dblog import DblogDumpSensor

TABLES = captured_tables()
table_param = (
    Param(TABLES[0], type="string", enum=TABLES, title="Table", description="db.table to backfill")
    if TABLES
    else Param("", type="string", minLength=3, title="Table", description="db.table to backfill")
)

with DAG(
    dag_id="dblog_backfill",
    schedule=None,
    catchup=False,
    tags=["dblog"],
    doc_md=__doc__,
    params={
        "table": table_param,
        "keys": Param(
            "",
            type="string",
            format="multiline",
            minLength=1,
            title="Primary keys",
            description='one key per line; JSON for composite keys, e.g. [42, "eu"]',
        ),
    },
):
    plan = DblogBackfillOperator(
        task_id="plan_backfill",
        table="{{ params.table }}",
        keys="{{ params['keys'] }}",
        config_path=config_path(),
    )
    DblogDumpSensor(
        task_id="wait_for_backfill",
        dump_id="{{ ti.xcom_pull(task_ids='plan_backfill') }}",
        config_path=config_path(),
        deferrable=True,
        **SENSOR_RETRY,
        log_interval_s=5,
        poke_interval=2,
    ).set_upstream(plan)
