"""Every ten minutes: is the stream alive, and how far behind is it?"""

from __future__ import annotations

from datetime import datetime

from airflow_dblog.provider.compat import DAG, task
from airflow_dblog.provider.example_dags import config_path

MAX_LAG_S = 300


@task
def check_stream() -> float:
    from airflow_dblog.errors import DblogError
    from airflow_dblog.provider.hooks.dblog import DblogHook

    lag = DblogHook(config_path=config_path()).stream_lag_s()
    if lag is None:
        raise DblogError("the stream has never reported", "start it with: dblog stream -c FILE")
    if lag > MAX_LAG_S:
        raise DblogError(f"the stream last reported {lag:.0f}s ago", "check the dblog stream job")
    print(f"stream reported {lag:.1f}s ago")
    return lag


with DAG(
    dag_id="dblog_health",
    schedule="*/10 * * * *",
    start_date=datetime(2026, 1, 1),
    catchup=False,
    tags=["dblog"],
    doc_md=__doc__,
):
    check_stream()
