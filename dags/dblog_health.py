"""Every ten minutes: is the stream running, and how far behind its source is it?

Fails when the stream is not running, when its lag cannot be read (the source unreachable, the
binlog it stands in purged), or when it is more than ``MAX_LAG_S`` seconds or ``MAX_LAG_BYTES``
bytes behind the source's head (binlog end / ``pg_current_wal_lsn()``).
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from airflow_dblog.provider.compat import DAG, task
from airflow_dblog.provider.example_dags import config_path

MAX_LAG_S = 300
MAX_LAG_BYTES = 1 << 30  # 1 GiB of binlog / WAL


@task
def check_stream() -> dict[str, Any]:
    from airflow_dblog.errors import DblogError
    from airflow_dblog.provider.hooks.dblog import DblogHook

    status = DblogHook(config_path=config_path()).stream_status()
    print(status.line())
    problem = status.problem(MAX_LAG_S, MAX_LAG_BYTES)
    if problem is not None:
        raise DblogError(problem, "check the dblog stream job: dblog status -c FILE")
    return status.as_dict()


with DAG(
    dag_id="dblog_health",
    schedule="*/10 * * * *",
    start_date=datetime(2026, 1, 1),
    catchup=False,
    tags=["dblog"],
    doc_md=__doc__,
):
    check_stream()
