"""Every kind of source database, keyed by ``source.type``: its facts and where its code lives.

A :class:`SourceKind` holds what other layers need to know of a database without importing its
driver: the URL schemes it accepts, its watermark modes, whether it takes a replication slot,
how Debezium and OpenLineage name it. Its code (the ``Source`` class, the changelog reader, the
watermark strategies) is named by ``module:attribute`` and imported only when first used, so
importing this module, or validating a config, imports no database driver.

Adding a database: write ``sources/<kind>/`` (a ``Source``, a reader, its watermark strategies)
and add its :class:`SourceKind` to :data:`KINDS`.
"""

from __future__ import annotations

import importlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote, urlsplit

from airflow_dblog.core.events import TableId
from airflow_dblog.errors import ConfigError

if TYPE_CHECKING:
    from airflow_dblog.sources.base import ChangelogReader, Offset, Source
    from airflow_dblog.sources.watermark import WatermarkStrategy


@dataclass(frozen=True)
class ReaderSettings:
    """What a changelog reader is opened with, besides the URL and the resume offset."""

    stream: str  # the stream's name: a replica server id or a slot name is derived from it
    tables: tuple[TableId, ...]
    watermark: str  # the watermark mode: only ``table`` reads the watermark table
    slot: str | None = None  # PostgreSQL's replication slot (default: dblog_<stream>)
    server_id: int | None = None  # MySQL's replica server id (default: derived from stream)


@dataclass(frozen=True)
class SourceKind:
    """One kind of source database: plain facts, and its code by ``module:attribute``."""

    name: str  # the value of source.type
    product: str  # for messages: "MySQL", "PostgreSQL"
    url_schemes: tuple[str, ...]  # accepted in source.url (before any "+driver")
    url_scheme: str  # written when a URL is built from an Airflow connection
    default_port: int
    watermark_modes: tuple[str, ...]  # the source.watermark values it offers
    takes_slot: bool  # whether source.slot (a replication slot) applies
    debezium_connector: str  # the envelope's source.connector
    envelope_db_field: str  # the envelope's source field naming TableId.db: database | schema
    # OpenLineage names a table database.schema.table where TableId.db is a schema: the URL's
    # database (this default when the URL names none) goes first; None where TableId.db is
    # the database
    lineage_database: str | None
    source_class: str  # module:attribute of the Source class, built from a URL
    reader_opener: str  # module:attribute of ``open_reader(url, settings, offset)``
    strategies: str  # module:attribute of the dict watermark mode -> strategy class

    def url_example(self) -> str:
        return f"{self.url_schemes[0]}://user:password@host:{self.default_port}/db"

    def source(self, url: str) -> Source:
        """A source of this kind; it connects at its first query."""
        source: Source = _load(self.source_class)(url)
        return source

    def open_reader(
        self, url: str, settings: ReaderSettings, offset: Offset | None
    ) -> ChangelogReader:
        """The changelog reader, resuming right after ``offset`` (None: from the log's end)."""
        reader: ChangelogReader = _load(self.reader_opener)(url, settings, offset)
        return reader

    def watermark_strategies(self) -> dict[str, type[WatermarkStrategy[Any]]]:
        """The strategy class of each watermark mode this kind offers."""
        strategies: dict[str, type[WatermarkStrategy[Any]]] = _load(self.strategies)
        return strategies

    def openlineage_name(self, url: str, table: TableId) -> tuple[str, str]:
        """(namespace, name) of a captured table; only host, port and database of ``url``."""
        parts = urlsplit(url)
        host, port = parts.hostname or "localhost", parts.port or self.default_port
        namespace = f"{self.name}://{host}:{port}"
        if self.lineage_database is None:
            return namespace, f"{table.db}.{table.table}"
        database = unquote(parts.path.lstrip("/")) or self.lineage_database
        return namespace, f"{database}.{table.db}.{table.table}"


_MYSQL = "airflow_dblog.sources.mysql"
_POSTGRES = "airflow_dblog.sources.postgres"

KINDS: dict[str, SourceKind] = {
    kind.name: kind
    for kind in (
        SourceKind(
            name="mysql",
            product="MySQL",
            url_schemes=("mysql", "mariadb"),
            url_scheme="mysql",
            default_port=3306,
            watermark_modes=("table", "gtid", "snapshot"),
            takes_slot=False,
            debezium_connector="mysql",
            envelope_db_field="database",
            lineage_database=None,
            source_class=f"{_MYSQL}.source:MysqlSource",
            reader_opener=f"{_MYSQL}.binlog_reader:open_binlog_reader",
            strategies=f"{_MYSQL}.watermarks:STRATEGIES",
        ),
        SourceKind(
            name="postgres",
            product="PostgreSQL",
            url_schemes=("postgres", "postgresql"),
            url_scheme="postgresql",
            default_port=5432,
            watermark_modes=("table", "snapshot"),
            takes_slot=True,
            debezium_connector="postgresql",
            envelope_db_field="schema",
            lineage_database="postgres",
            source_class=f"{_POSTGRES}.source:PostgresSource",
            reader_opener=f"{_POSTGRES}.wal2json_reader:open_wal2json_reader",
            strategies=f"{_POSTGRES}.watermarks:STRATEGIES",
        ),
    )
}
"""Every source kind by its ``source.type``."""

SOURCE_TYPES: tuple[str, ...] = tuple(KINDS)


def source_kind(name: str) -> SourceKind:
    """The kind named ``name``; a one-line ConfigError naming the kinds there are otherwise."""
    try:
        return KINDS[name]
    except KeyError:
        raise ConfigError(
            f"source.type {name!r} is not a known source kind",
            f"set source.type to one of: {', '.join(KINDS)}",
        ) from None


def watermark_modes() -> tuple[str, ...]:
    """Every watermark mode some kind offers, in the order the kinds list them."""
    return tuple(dict.fromkeys(mode for kind in KINDS.values() for mode in kind.watermark_modes))


def kinds_offering(mode: str) -> Sequence[SourceKind]:
    return [kind for kind in KINDS.values() if mode in kind.watermark_modes]


def source_for(kind: str, url: str) -> Source:
    """A source of ``source.type`` ``kind``; it connects at its first query."""
    return source_kind(kind).source(url)


def open_reader(
    kind: str, url: str, settings: ReaderSettings, offset: Offset | None
) -> ChangelogReader:
    """The changelog reader of ``source.type`` ``kind``, resuming right after ``offset``."""
    return source_kind(kind).open_reader(url, settings, offset)


def _load(target: str) -> Any:
    module, _, attribute = target.partition(":")
    return getattr(importlib.import_module(module), attribute)
