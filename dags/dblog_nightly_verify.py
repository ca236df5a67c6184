"""Each night, compare every captured Delta table with its source table and repair the differences.

``plan_verify`` plans a verify dump of every table (``dblog verify --all``): the stream reads
the same chunks as a dump, live, and compares each with the Delta table instead of writing it.
Follow-up dumps then read the differing keys again and write only them; with the ``dry_run``
param (trigger form) nothing is written and the counts and example keys are the whole result.

``wait_for_verify`` (deferrable: it waits in the triggerer) waits for the verify dump and then
for its repairs, and emits an Asset event per Delta table and topic the repairs wrote (none in
a dry run, or when nothing differed). It fails when more rows differ than ``max_differences``,
with the counts and example keys in one line. The lake is kept from the source's log, so by
default any difference fails the run: something changed the lake, or the log missed a change,
and a repair alone would hide that. A failed run emits no Asset events, though its repairs
still write.
"""

from __future__ import annotations

from datetime import datetime

from airflow_dblog.provider.compat import DAG, Param
from airflow_dblog.provider.example_dags import SENSOR_RETRY, config_path
from airflow_dblog.provider.operators.dblog import DblogDumpOperator
from airflow_dblog.provider.sensors.dblog import DblogDumpSensor

MAX_DIFFERENCES = 0

with DAG(
    dag_id="dblog_nightly_verify",
    schedule="0 4 * * *",
    start_date=datetime(2026, 1, 1),
    catchup=False,
    max_active_runs=1,
    tags=["dblog"],
    doc_md=__doc__,
    params={
        "dry_run": Param(
            False,
            type="boolean",
            title="Dry run",
            description="compare only: report the differences, write nothing",
        ),
        "max_differences": Param(
            MAX_DIFFERENCES,
            type="integer",
            minimum=0,
            title="Most differences allowed",
            description="more rows missing, extra or different than this fail the run",
        ),
    },
):
    plan = DblogDumpOperator(
        task_id="plan_verify",
        config_path=config_path(),
        verify=True,
        dry_run="{{ params.dry_run }}",
    )
    DblogDumpSensor(
        task_id="wait_for_verify",
        dump_id="{{ ti.xcom_pull(task_ids='plan_verify') }}",
        config_path=config_path(),
        max_differences="{{ params.max_differences }}",
        deferrable=True,
        **SENSOR_RETRY,
    ).set_upstream(plan)
