"""The source and the changelog reader a stream's config describes.

The sources layer takes plain arguments (kind, URL, reader settings) and knows nothing of the
config; these helpers read them from a :class:`~airflow_dblog.config.Config` whose
``source.url`` is a URL already (an Airflow connection id is resolved at the top, by
:func:`airflow_dblog.provider.connections.resolved`).
"""

from __future__ import annotations

from airflow_dblog.config import Config
from airflow_dblog.sources import registry
from airflow_dblog.sources.base import ChangelogReader, Offset, Source
from airflow_dblog.sources.registry import ReaderSettings


def open_source(config: Config) -> Source:
    """The stream's source; it connects at its first query."""
    return registry.source_for(config.source.type, config.source.url)


def reader_settings(config: Config) -> ReaderSettings:
    source = config.source
    return ReaderSettings(
        stream=config.name,
        tables=tuple(source.tables),
        watermark=source.watermark,
        slot=source.slot,
        server_id=source.server_id,
    )


def open_reader(config: Config, offset: Offset | None) -> ChangelogReader:
    """The stream's changelog reader, resuming right after ``offset`` (None: a new stream)."""
    return registry.open_reader(
        config.source.type, config.source.url, reader_settings(config), offset
    )
