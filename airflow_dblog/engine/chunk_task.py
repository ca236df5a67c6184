"""One chunk's SELECT as it travels to where it runs: a Spark executor, or a driver thread.

A :class:`ChunkTask` is picklable and self-contained: the source's kind and URL, the keyset
page or key list, and the watermark strategy whose static ``select`` runs it (on its own
connection, kept per worker thread for the next chunk). :func:`run_task` returns the chunk
file's table and what the driver is told; an error that belongs to the chunk (a key the table
no longer takes, a dropped table) comes back as a value, so it fails the chunk's dump with
its own one-line reason instead of a Spark stack trace.

The URL carries the source's password to the executors, as Spark's JDBC source carries its
options: it is never logged (``repr`` leaves it out); on networks you do not trust, turn on
Spark's RPC encryption (``spark.network.crypto.enabled``).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from airflow_dblog.core.events import TableId
from airflow_dblog.engine.chunk_file import ChunkSelected, encode_rows
from airflow_dblog.errors import DblogError, InputError, SourceError
from airflow_dblog.sources.registry import source_for
from airflow_dblog.sources.watermark import Selection

if TYPE_CHECKING:
    import pyarrow as pa

    from airflow_dblog.sources.base import Key, Source


@dataclass(frozen=True)
class ChunkTask:
    chunk_id: int
    folder: str  # the chunk file's folder under <checkpoint>/chunks
    table: TableId
    strategy: type  # its static ``select`` runs the SELECT
    source_kind: str
    url: str = field(repr=False)
    lineage_epoch: int = 0
    lower: Key | None = None
    upper: Key | None = None
    limit: int = 0
    keys: list[Key] | None = None
    typed: tuple[tuple[str, str], ...] = ()  # columns to write typed too (Delta reads them)

    def selection(self) -> Selection:
        return Selection(self.table, self.lower, self.upper, self.limit, self.keys)


_sources = threading.local()  # per worker thread: sources are not thread-safe


def _cached_source(kind: str, url: str) -> Source:
    """This thread's source of ``kind`` at ``url`` (the registry imports the driver once)."""
    cache: dict[tuple[str, str], Source] = _sources.__dict__.setdefault("cache", {})
    source = cache.get((kind, url))
    if source is None:
        source = cache[(kind, url)] = source_for(kind, url)
    return source


def _source(task: ChunkTask) -> Source:
    source = _cached_source(task.source_kind, task.url)
    source.lineage_epoch = task.lineage_epoch  # positions the snapshot reports follow the stream
    return source


def prepare(source_kind: str, url: str) -> None:
    """Ready this worker for chunks: the source's driver imported and its connection open."""
    _cached_source(source_kind, url).ping()


def run_task(task: ChunkTask) -> tuple[pa.Table, ChunkSelected]:
    """Run the chunk's SELECT here: the chunk file's table and the driver's summary."""
    source = _source(task)
    try:
        rows, info = task.strategy.select(source, task.selection())
    except DblogError as err:
        failed = ChunkSelected(error=(type(err).__name__, str(err)))
        return encode_rows(task.chunk_id, [])[0], failed
    return encode_rows(task.chunk_id, rows, info, task.keys, task.typed)


_ERRORS: dict[str, type[DblogError]] = {
    e.__name__: e for e in (DblogError, SourceError, InputError)
}


def error_of(selected: ChunkSelected) -> DblogError | None:
    """The chunk's error as raised where it ran (its class decides whose fault it is)."""
    if selected.error is None:
        return None
    kind, message = selected.error
    return _ERRORS.get(kind, DblogError)(message)
