"""Test conveniences around the watermark merge: a whole log through a fresh merge, in one call.

The merge never holds a chunk's rows: it emits one :class:`DumpedRows` item where they belong,
and the sinks turn it into ``op="r"`` events with :func:`expand` and the chunk file's rows.
:class:`ExpandingMerge` plays both parts for tests: it keeps each chunk's rows itself, tells the
merge how many there are (:meth:`~WatermarkMerge.rows_ready`), and expands every
:class:`DumpedRows` in place, so its output is plain change events (the items themselves are
kept in :attr:`ExpandingMerge.dumped`).

:func:`merge` runs a new merge over a list of log items, with chunks registered up front
(``chunks``) or exactly where a :class:`ChunkSpec` stands among the items, and rows supplied
where a :class:`ChunkRows` stands. :func:`feed_all` feeds items to an existing merge.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from airflow_dblog.core.events import ChangeEvent, LogItem, TableId
from airflow_dblog.core.merge import DumpedRows, Rows, WatermarkMerge, expand
from airflow_dblog.core.position import Position
from airflow_dblog.core.window import Window


@dataclass(frozen=True)
class ChunkSpec:
    """A chunk for :func:`merge`: registered where it appears (or up front), rows optional."""

    chunk_id: int
    dump_id: int
    table: TableId
    window: Window
    rows: Rows | None = None
    ts_ms: int | None = None


@dataclass(frozen=True)
class ChunkRows:
    """Rows for a chunk registered earlier, supplied where this appears among the items."""

    chunk_id: int
    rows: Rows
    ts_ms: int | None = None


@dataclass(frozen=True)
class RowsHandle:
    """What the helper gives the merge as a chunk's ``rows``: it must come back unchanged."""

    chunk_id: int


class ExpandingMerge:
    """A :class:`WatermarkMerge` whose :class:`DumpedRows` are expanded as a sink does.

    Other attributes (``forget``, ``remembers_all``, ``open_count``, ...) are the merge's.
    """

    def __init__(self, merge: WatermarkMerge | None = None, **kwargs: Any) -> None:
        self.merge = merge if merge is not None else WatermarkMerge(**kwargs)
        self.rows: dict[int, list[tuple[Any, Any]]] = {}  # by chunk, until its window closes
        self.dumped: list[DumpedRows] = []  # every DumpedRows the merge emitted, in order

    def __getattr__(self, name: str) -> Any:
        if name == "merge":  # not set yet: no recursion
            raise AttributeError(name)
        return getattr(self.merge, name)

    def open_chunk(self, chunk_id: int, dump_id: int, table: TableId, window: Window) -> None:
        self.merge.open_chunk(chunk_id, dump_id, table, window)

    def rows_ready(self, chunk_id: int, rows: Rows, ts_ms: int | None = None) -> None:
        """The chunk's SELECT result, ``(key, row)`` in key order; the merge gets its count."""
        kept = list(rows)
        self.merge.rows_ready(chunk_id, len(kept), RowsHandle(chunk_id), ts_ms)
        self.rows[chunk_id] = kept

    def feed(self, item: LogItem) -> list[ChangeEvent]:
        out: list[ChangeEvent] = []
        for o in self.merge.feed(item):
            if isinstance(o, DumpedRows):
                assert o.rows == RowsHandle(o.chunk_id), f"rows handle changed: {o.rows!r}"
                self.dumped.append(o)
                out.extend(expand(o, self.rows.pop(o.chunk_id)))
            else:
                out.append(o)
        return out

    def pop_dumped(self) -> list[DumpedRows]:
        """The :class:`DumpedRows` emitted since the last call, in order."""
        dumped, self.dumped = self.dumped, []
        return dumped


def feed_all(state: ExpandingMerge, items: Iterable[LogItem]) -> list[ChangeEvent]:
    """Feed ``items`` in order; everything the merge emitted, in order, rows expanded."""
    out: list[ChangeEvent] = []
    for item in items:
        out.extend(state.feed(item))
    return out


def run(
    log_items: Iterable[LogItem | ChunkSpec | ChunkRows],
    chunks: Iterable[ChunkSpec] = (),
    *,
    start: Position | None = None,
) -> tuple[list[ChangeEvent], list[DumpedRows]]:
    """Like :func:`merge`, also returning the :class:`DumpedRows` items in emit order."""
    state = ExpandingMerge(start=start)
    out: list[ChangeEvent] = []

    def register(spec: ChunkSpec) -> None:
        state.open_chunk(spec.chunk_id, spec.dump_id, spec.table, spec.window)
        if spec.rows is not None:
            state.rows_ready(spec.chunk_id, spec.rows, spec.ts_ms)

    for spec in chunks:
        register(spec)
    for item in log_items:
        if isinstance(item, ChunkSpec):
            register(item)
        elif isinstance(item, ChunkRows):
            state.rows_ready(item.chunk_id, item.rows, item.ts_ms)
        else:
            out.extend(state.feed(item))
    return out, state.dumped


def merge(
    log_items: Iterable[LogItem | ChunkSpec | ChunkRows],
    chunks: Iterable[ChunkSpec] = (),
    *,
    start: Position | None = None,
) -> list[ChangeEvent]:
    """Run a fresh merge over a whole log; the output in emit order, dumped rows expanded.

    ``chunks`` are registered before the first item; a :class:`ChunkSpec` or :class:`ChunkRows`
    among ``log_items`` is applied at that point, so tests can place registrations exactly.
    """
    return run(log_items, chunks, start=start)[0]
