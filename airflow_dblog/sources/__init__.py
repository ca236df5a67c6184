"""Source databases, chosen by ``source.type`` in the config.

Importing this package imports no database driver; :func:`open_source` and :func:`open_reader`
load the module of the configured kind.
"""

from __future__ import annotations

from airflow_dblog.config import Config
from airflow_dblog.sources.base import ChangelogReader, Offset, Source, TableSchema

__all__ = ["ChangelogReader", "Offset", "Source", "TableSchema", "open_reader", "open_source"]


def source_url(config: Config) -> str:
    """The source URL; a bare name is an Airflow connection id, looked up only then."""
    if not config.source.is_airflow_conn:
        return config.source.url
    from airflow_dblog.provider.connections import url_from_airflow_connection

    return url_from_airflow_connection(config.source.url, config.source.type)


def open_source(config: Config) -> Source:
    return source_for(config.source.type, source_url(config))


def source_for(kind: str, url: str) -> Source:
    """A source of ``source.type`` ``kind``; it connects at its first query."""
    if kind == "mysql":
        from airflow_dblog.sources.mysql import MysqlSource

        return MysqlSource(url)
    from airflow_dblog.sources.postgres import PostgresSource

    return PostgresSource(url)


def open_reader(config: Config, offset: Offset | None) -> ChangelogReader:
    url = source_url(config)
    tables = list(config.source.tables)
    if config.source.type == "mysql":
        from airflow_dblog.sources.binlog_reader import (
            WATERMARK_TABLE_ID,
            BinlogReader,
            server_id_for,
        )

        # two replicas with one server id on a server disconnect each other: derive a stable one
        server_id = config.source.server_id or server_id_for(config.name)
        # read-only strategies never look at the watermark table (their user may not see it)
        watermarks = WATERMARK_TABLE_ID if config.source.watermark == "table" else None
        return BinlogReader(
            url,
            tables,
            offset=offset,
            server_id=server_id,
            watermark_table=watermarks,
            watermark_stream=config.name,
        )
    from airflow_dblog.sources.wal2json_reader import Wal2jsonReader

    slot = config.source.slot or f"dblog_{config.name.replace('-', '_').lower()}"
    return Wal2jsonReader(url, tables, slot=slot, offset=offset)
