"""What the example DAGs need from their environment, kept out of the DAG files.

The DAGs find the stream's config file in the ``DBLOG_CONFIG`` environment variable; without
it they use the ``dblog_default`` connection (its "Config file" or "Config (YAML)" field).
Reading the config at parse time only offers the table list to the trigger form and names
the Assets a downstream DAG is scheduled on; nothing connects anywhere.
"""

from __future__ import annotations

import os
from datetime import timedelta
from typing import Any

from airflow_dblog.config import load_config
from airflow_dblog.errors import DblogError

# A deferrable sensor resumed from its trigger can be failed by the executor's late report of
# its deferral (apache/airflow#72716, Airflow 3.3): one retry soon after reads the same state
# again (the sensors only read it), where a failed run would ask someone to clear it
SENSOR_RETRY: dict[str, Any] = {"retries": 1, "retry_delay": timedelta(seconds=5)}


def config_path() -> str | None:
    return os.environ.get("DBLOG_CONFIG") or None


def captured_tables() -> list[str]:
    path = config_path()
    if path is None:
        return []
    try:
        return [str(t) for t in load_config(path).source.tables]
    except DblogError:
        return []  # the first task reports the config problem with its one-line message


def delta_table_assets() -> list[Any]:
    """The Assets of the stream's Delta tables (what a downstream DAG waits for), or none."""
    path = config_path()
    if path is None:
        return []
    from airflow_dblog.provider.assets import dblog_assets

    try:
        return dblog_assets(load_config(path), sinks=("delta",))
    except DblogError:
        return []
