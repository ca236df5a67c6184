"""Test conveniences around the watermark merge: a whole log through a fresh merge, in one call.

:func:`merge` runs a new :class:`WatermarkMerge` over a list of log items, with chunks registered
up front (``chunks``) or exactly where a :class:`ChunkSpec` stands among the items, and rows
supplied where a :class:`ChunkRows` stands. :func:`feed_all` feeds items to an existing merge.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from airflow_dblog.core.events import ChangeEvent, LogItem, TableId
from airflow_dblog.core.merge import Rows, WatermarkMerge
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


def feed_all(state: WatermarkMerge, items: Iterable[LogItem]) -> list[ChangeEvent]:
    """Feed ``items`` in order; everything the merge emitted, in order."""
    out: list[ChangeEvent] = []
    for item in items:
        out.extend(state.feed(item))
    return out


def merge(
    log_items: Iterable[LogItem | ChunkSpec | ChunkRows],
    chunks: Iterable[ChunkSpec] = (),
    *,
    start: Position | None = None,
) -> list[ChangeEvent]:
    """Run a fresh :class:`WatermarkMerge` over a whole log; the output in emit order.

    ``chunks`` are registered before the first item; a :class:`ChunkSpec` or :class:`ChunkRows`
    among ``log_items`` is applied at that point, so tests can place registrations exactly.
    """
    state = WatermarkMerge(start)
    out: list[ChangeEvent] = []

    def register(spec: ChunkSpec) -> None:
        state.open_chunk(spec.chunk_id, spec.dump_id, spec.table, spec.window)
        if spec.rows is not None:
            state.set_rows(spec.chunk_id, spec.rows, spec.ts_ms)

    for spec in chunks:
        register(spec)
    for item in log_items:
        if isinstance(item, ChunkSpec):
            register(item)
        elif isinstance(item, ChunkRows):
            state.set_rows(item.chunk_id, item.rows, item.ts_ms)
        else:
            out.extend(state.feed(item))
    return out
