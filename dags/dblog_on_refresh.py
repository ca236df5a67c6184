"""Runs after every finished dump or backfill of a captured table: a downstream job.

Scheduled on the Assets of the stream's Delta tables, any of them (``AssetAny``); the dump
sensor of the dump and backfill DAGs emits one Asset event per table it refreshed. For one
table, ``schedule=[Asset("file:///data/delta/app/orders")]`` (the table's location as a URI,
see ``airflow_dblog.provider.assets``) is the same thing. Without a config at parse time
(``DBLOG_CONFIG``) the DAG has no Assets to wait for and runs only when triggered.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from airflow_dblog.provider.compat import DAG, Asset, AssetAny, task
from airflow_dblog.provider.example_dags import delta_table_assets

ASSETS = delta_table_assets()


@task
def report_refreshed_tables(triggering_asset_events: Any = None) -> list[str]:
    """What refreshed which table; a real DAG would rebuild what reads those tables."""
    refreshed = []
    for key in triggering_asset_events or {}:
        if not isinstance(key, Asset):
            continue  # the same events, listed again under the alias they came through
        for event in triggering_asset_events[key]:
            extra = event.extra or {}
            print(
                f"{key.uri} refreshed by dump {extra.get('dump_id')} of stream "
                f"{extra.get('stream')}: {extra.get('rows_emitted')} rows emitted"
            )
        refreshed.append(key.uri)
    return sorted(refreshed)


with DAG(
    dag_id="dblog_on_refresh",
    schedule=AssetAny(*ASSETS) if ASSETS else None,
    start_date=datetime(2026, 1, 1),
    catchup=False,
    tags=["dblog"],
    doc_md=__doc__,
):
    report_refreshed_tables()
