"""The watermark merge: log events flow through, chunk rows join them when their window closes.

Feed the log in order with :meth:`WatermarkMerge.feed`; each call returns what to emit now.
Change events are emitted at once, in log order (a dump never holds the log back). A chunk is
registered with :meth:`~WatermarkMerge.open_chunk` before any log item that may fall inside its
window is fed, and its SELECTed rows arrive with :meth:`~WatermarkMerge.set_rows` any time before
the window closes. Every change of the chunk's table inside the window removes its key from the
rows (the log's value is at least as new). When the window closes, the remaining rows are emitted
as ``op="r"`` events placed right after the closing point and before anything the log emits
later: at the high watermark's position (``table``), or after the last log event emitted before
the item that closed the window (read-only strategies), as ``base.dumped_row(i)``.

Several chunks may be open at once, of one table or several. Watermark events and heartbeats are
never emitted.

Log order is not visibility order (a commit is in the binlog/WAL before a SELECT can see it), so
a window must also judge changes the log delivered *before* the window was registered: the merge
remembers recent changes (:class:`Seen`) and :meth:`~WatermarkMerge.open_chunk` drops the keys
of those the window says the SELECT missed (:meth:`Window.contains_past`). The memory is trimmed
by the source's horizon (:meth:`~WatermarkMerge.forget`); if it ever has to drop changes that are
still needed (``history_limit``), windows that judge the past are refused with
:class:`HistoryLost` until the horizon has passed them, and the chunk is selected again.

The state (open windows, rows, keys seen; not the memory) round-trips through a JSON-able dict so
a streaming job can checkpoint it between micro-batches. Pure logic: no I/O, no clock.
"""

from __future__ import annotations

import base64
import datetime as dt
import decimal
import uuid
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from airflow_dblog.core.events import ChangeEvent, Heartbeat, LogItem, Row, TableId, WatermarkEvent
from airflow_dblog.core.position import Position
from airflow_dblog.core.window import Window, WindowError, later_xid
from airflow_dblog.errors import DblogError

Key = tuple[Any, ...]
Rows = Sequence[tuple[Sequence[Any], Row]]

_STATE_VERSION = 1
_MAX_COORD = 2**64 - 1


class MergeError(DblogError):
    """The caller broke the merge's protocol (order of the log, rows, registration)."""


class HistoryLost(MergeError):
    """A window needs changes the merge no longer remembers: select the chunk again later."""


@dataclass(frozen=True, slots=True)
class Seen:
    """A change the merge passed on, remembered so a window registered later can judge it."""

    table: TableId | None
    key: Key
    position: Position
    xid: int | None = None
    gtid: str | None = None


HISTORY_LIMIT = 200_000  # remembered changes at most (a horizon normally keeps far fewer)


@dataclass(frozen=True)
class ClosedChunk:
    """A chunk whose window closed, with the numbers the metadata store records.

    ``position`` is the base the rows were placed at; row ``i`` of the output has position
    ``position.dumped_row(first_index + i)`` (``first_index`` is 0 unless another chunk closed
    at the same point first).
    """

    chunk_id: int
    dump_id: int
    table: TableId
    selected: int
    dropped: int
    emitted: int
    position: Position
    first_index: int = 0


@dataclass
class _Chunk:
    chunk_id: int
    dump_id: int
    table: TableId
    window: Window
    opened: bool
    rows: dict[Key, Row] | None = None  # remaining rows in key order, once known
    changed: set[Key] | None = field(default_factory=set)  # in-window keys while rows unknown
    selected: int = 0
    dropped: int = 0
    ts_ms: int | None = None


class WatermarkMerge:
    """Stateful merge of one source's log with the chunks of its dumps.

    ``start`` is the position of the last log item already emitted before this merge started
    (exclusive); items fed must come after it. Without it, the first item is trusted.
    ``history_limit`` bounds the remembered changes (0: remember none, for strategies whose
    windows never judge the past); ``unknown_past``: what a restarted stream emitted before
    this merge existed and cannot remember, as one :class:`Seen` standing for all of it (the
    greatest position and xid); windows are refused until the horizon forgets it.
    """

    def __init__(
        self,
        start: Position | None = None,
        history_limit: int = HISTORY_LIMIT,
        unknown_past: Seen | None = None,
    ) -> None:
        self._history: deque[Seen] = deque()
        self._history_limit = history_limit
        self._lost = unknown_past  # stands for every change dropped while possibly still needed
        self._open: dict[int, _Chunk] = {}
        self._closed: list[ClosedChunk] = []
        self._last_position = start  # last ChangeEvent/WatermarkEvent fed (or ``start``)
        self._last_ts = 0
        self._dump_base: Position | None = None  # where the latest dumped rows were placed
        self._dump_next = 0  # next free row index at that base

    # ---------------------------------------------------------------------------- chunks

    def open_chunk(self, chunk_id: int, dump_id: int, table: TableId, window: Window) -> None:
        """Register a chunk; call before feeding any log item that may fall in its window."""
        if chunk_id in self._open:
            raise MergeError(f"chunk {chunk_id} is already open in the merge")
        if not isinstance(window, Window):
            raise TypeError(f"not a window: {window!r}")
        changed: set[Key] = set()
        if window.judges_past:
            if self._lost is not None:
                raise HistoryLost(
                    f"chunk {chunk_id} ({table}): changes up to {self._lost.position} that its"
                    f" {window.describe()} window must judge are no longer remembered",
                    "the chunk is selected again once the source's horizon has passed them",
                )
            changed = {s.key for s in self._history if s.table == table and window.contains_past(s)}
        self._open[chunk_id] = _Chunk(
            chunk_id, dump_id, table, window, window.starts_open, changed=changed
        )

    def forget(self, forgettable: Callable[[Seen], bool]) -> int:
        """Drop the oldest remembered changes no later window can need; returns how many."""
        dropped = 0
        while self._history and forgettable(self._history[0]):
            self._history.popleft()
            dropped += 1
        if self._lost is not None and forgettable(self._lost):
            self._lost = None
        return dropped

    def _remember(self, event: ChangeEvent) -> None:
        if not self._history_limit:
            return
        self._history.append(Seen(event.table, event.key, event.position, event.xid, event.gtid))
        if len(self._history) > self._history_limit:
            old = self._history.popleft()
            lost = self._lost
            xid = old.xid if lost is None or lost.xid is None else lost.xid
            if old.xid is not None and xid is not None:
                xid = later_xid(xid, old.xid)
            self._lost = Seen(  # the latest of everything dropped so far
                None,
                (),
                old.position if lost is None else max(lost.position, old.position),
                xid,
                old.gtid,
            )

    def set_rows(self, chunk_id: int, rows: Rows, ts_ms: int | None = None) -> None:
        """The chunk's SELECT result, ``(key, row)`` in key order; ``ts_ms``: when it was read.

        Keys changed inside the window so far are dropped now; from here on only keys among the
        rows are tracked, so memory stays at one chunk of rows per open chunk. Keys must compare
        equal to the log's event keys (same Python types): the sources see to that.
        """
        chunk = self._get(chunk_id)
        if chunk.rows is not None:
            raise MergeError(f"rows of chunk {chunk_id} were already supplied")
        remaining: dict[Key, Row] = {}
        for key, row in rows:
            k = tuple(key)
            if k in remaining:
                raise MergeError(f"chunk {chunk_id} selected key {k!r} twice")
            remaining[k] = row
        chunk.selected = len(remaining)
        for k in chunk.changed or ():
            if k in remaining:
                del remaining[k]
                chunk.dropped += 1
        chunk.rows, chunk.changed, chunk.ts_ms = remaining, None, ts_ms

    def cancel_chunk(self, chunk_id: int) -> bool:
        """Forget an open chunk without emitting it (its SELECT failed, its dump was cancelled)."""
        return self._open.pop(chunk_id, None) is not None

    def cancel_dump(self, dump_id: int) -> int:
        """Forget every open chunk of a dump; returns how many there were."""
        ids = [c.chunk_id for c in self._open.values() if c.dump_id == dump_id]
        for chunk_id in ids:
            del self._open[chunk_id]
        return len(ids)

    def open_count(self) -> int:
        return len(self._open)

    def open_chunk_ids(self) -> list[int]:
        return list(self._open)

    def is_open(self, chunk_id: int) -> bool:
        return chunk_id in self._open

    def pop_closed(self) -> list[ClosedChunk]:
        """Chunks closed since the last call, in closing order."""
        closed, self._closed = self._closed, []
        return closed

    @property
    def remembers_all(self) -> bool:
        """False while changes a window may need were dropped (or predate a restart)."""
        return self._lost is None

    @property
    def last_position(self) -> Position | None:
        """The last change or watermark event fed (or ``start``)."""
        return self._last_position

    # ------------------------------------------------------------------------------- log

    def feed(self, item: LogItem) -> list[ChangeEvent]:
        """One log item in; the events to emit now, in order."""
        if not isinstance(item, (ChangeEvent, WatermarkEvent, Heartbeat)):
            raise TypeError(f"not a log item: {item!r}")
        positioned = isinstance(item, (ChangeEvent, WatermarkEvent))  # heartbeats may repeat
        if positioned:
            self._check_order(item)
        out: list[ChangeEvent] = []
        for chunk in list(self._open.values()):
            if chunk.opened and chunk.window.closes_before(item):
                out.extend(self._close(chunk, self._base_before(chunk, item)))
        change = item if isinstance(item, ChangeEvent) else None
        for chunk in self._open.values():
            mine = change is not None and change.table == chunk.table
            if not chunk.opened:
                chunk.opened = chunk.window.opens_at(item)
                if mine and chunk.window.contains_past(change):  # type: ignore[arg-type]
                    self._conflict(chunk, change.key)  # type: ignore[union-attr]
            elif mine and chunk.window.contains(change):  # type: ignore[arg-type]
                self._conflict(chunk, change.key)  # type: ignore[union-attr]
        if change is not None:
            out.append(change)
            self._last_ts = change.ts_ms
            self._remember(change)
        if positioned:
            self._last_position = item.position
        for chunk in list(self._open.values()):
            if chunk.window.closes_at(item):
                if not chunk.opened:
                    raise _unopened(chunk, item)
                out.extend(self._close(chunk, item.position))
        return out

    def feed_all(self, items: Iterable[LogItem]) -> list[ChangeEvent]:
        out: list[ChangeEvent] = []
        for item in items:
            out.extend(self.feed(item))
        return out

    def _check_order(self, item: ChangeEvent | WatermarkEvent) -> None:
        if isinstance(item, ChangeEvent) and item.op == "r":
            raise MergeError(f"a dumped row (op r) was fed as a log item at {item.position}")
        last, base = self._last_position, self._dump_base
        if last is not None and item.position <= last:
            raise MergeError(
                f"log item at {item.position} is not after the previous one at {last}",
                "feed the log once, in order, from after the merge's last position",
            )
        if base is not None and item.position.log_part() <= base.log_part():
            raise MergeError(
                f"log item at {item.position} is not after the dumped rows placed at {base}",
                "log positions must grow strictly from one event to the next",
            )

    def _conflict(self, chunk: _Chunk, key: Key) -> None:
        if chunk.rows is None:
            assert chunk.changed is not None
            chunk.changed.add(key)
        elif key in chunk.rows:
            del chunk.rows[key]
            chunk.dropped += 1

    def _base_before(self, chunk: _Chunk, item: LogItem) -> Position:
        """Where rows go when the window closes before ``item``: after the last event emitted.

        Heartbeats are not used: one may share its position with the next event, which would
        then sort before rows emitted ahead of it. With no event seen since the merge started,
        the window's own end (or the last position below ``item``) serves.
        """
        if self._last_position is not None:
            return self._last_position
        fallback = chunk.window.fallback_position()
        if fallback is not None and fallback.log_part() < item.position.log_part():
            return fallback
        return _just_before(item.position)

    def _close(self, chunk: _Chunk, base: Position) -> list[ChangeEvent]:
        if chunk.rows is None:
            raise MergeError(
                f"the window of chunk {chunk.chunk_id} (dump {chunk.dump_id}, {chunk.table}) closed"
                f" at {base} before its rows were supplied",
                "call set_rows before the log is fed past the chunk's window",
            )
        del self._open[chunk.chunk_id]
        same_base = self._dump_base is not None and self._dump_base.log_part() == base.log_part()
        first = self._dump_next if same_base else 0
        ts_ms = self._last_ts if chunk.ts_ms is None else chunk.ts_ms
        events = [
            ChangeEvent(
                table=chunk.table,
                op="r",
                key=key,
                position=base.dumped_row(first + i),
                before=None,
                after=row,
                ts_ms=ts_ms,
                dump_id=chunk.dump_id,
                chunk_id=chunk.chunk_id,
            )
            for i, (key, row) in enumerate(chunk.rows.items())
        ]
        if events:
            self._dump_base, self._dump_next = base, first + len(events)
        self._closed.append(
            ClosedChunk(
                chunk.chunk_id,
                chunk.dump_id,
                chunk.table,
                chunk.selected,
                chunk.dropped,
                len(events),
                base,
                first,
            )
        )
        return events

    def _get(self, chunk_id: int) -> _Chunk:
        try:
            return self._open[chunk_id]
        except KeyError:
            raise MergeError(f"chunk {chunk_id} is not open in the merge") from None

    # ----------------------------------------------------------------------------- state

    def to_dict(self) -> dict[str, Any]:
        """The whole state as JSON-able values (row values are tagged to survive the trip)."""
        return {
            "version": _STATE_VERSION,
            "last_position": _pos_out(self._last_position),
            "last_ts_ms": self._last_ts,
            "dump_base": _pos_out(self._dump_base),
            "dump_next": self._dump_next,
            "chunks": [
                {
                    "chunk_id": c.chunk_id,
                    "dump_id": c.dump_id,
                    "table": {"db": c.table.db, "table": c.table.table},
                    "window": c.window.to_dict(),
                    "opened": c.opened,
                    "rows": None
                    if c.rows is None
                    else [[encode_value(list(k)), encode_value(r)] for k, r in c.rows.items()],
                    "changed": None
                    if c.changed is None
                    else [encode_value(list(k)) for k in c.changed],
                    "selected": c.selected,
                    "dropped": c.dropped,
                    "ts_ms": c.ts_ms,
                }
                for c in self._open.values()
            ],
            "closed": [
                {
                    "chunk_id": c.chunk_id,
                    "dump_id": c.dump_id,
                    "table": {"db": c.table.db, "table": c.table.table},
                    "selected": c.selected,
                    "dropped": c.dropped,
                    "emitted": c.emitted,
                    "position": str(c.position),
                    "first_index": c.first_index,
                }
                for c in self._closed
            ],
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> WatermarkMerge:
        if data.get("version") != _STATE_VERSION:
            raise MergeError(
                f"merge state version {data.get('version')!r} is not {_STATE_VERSION}",
                "start from a checkpoint written by this version of airflow-dblog",
            )
        merge = cls(_pos_in(data["last_position"]))
        merge._last_ts = int(data["last_ts_ms"])
        merge._dump_base = _pos_in(data["dump_base"])
        merge._dump_next = int(data["dump_next"])
        for c in data["chunks"]:
            rows = c["rows"]
            changed = c["changed"]
            chunk = _Chunk(
                chunk_id=c["chunk_id"],
                dump_id=c["dump_id"],
                table=TableId(c["table"]["db"], c["table"]["table"]),
                window=Window.from_dict(c["window"]),
                opened=bool(c["opened"]),
                rows=None
                if rows is None
                else {tuple(decode_value(k)): decode_value(r) for k, r in rows},
                changed=None if changed is None else {tuple(decode_value(k)) for k in changed},
                selected=int(c["selected"]),
                dropped=int(c["dropped"]),
                ts_ms=c["ts_ms"],
            )
            merge._open[chunk.chunk_id] = chunk
        merge._closed = [
            ClosedChunk(
                c["chunk_id"],
                c["dump_id"],
                TableId(c["table"]["db"], c["table"]["table"]),
                c["selected"],
                c["dropped"],
                c["emitted"],
                Position.parse(c["position"]),
                c["first_index"],
            )
            for c in data["closed"]
        ]
        return merge


def _unopened(chunk: _Chunk, item: LogItem) -> WindowError:
    return WindowError(
        f"chunk {chunk.chunk_id} ({chunk.table}): {chunk.window.describe()} window reached its"
        f" end at {item.position} before it opened",
        "check that the reader captures the dblog watermark table (binlog filters, publication)"
        " and that the stream resumed from a position before the chunk started",
    )


def _just_before(position: Position) -> Position:
    """The greatest log position below ``position``'s log part (its dumped rows sort below it)."""
    coords = list(position.log_part())
    for i in range(len(coords) - 1, -1, -1):
        if coords[i] > 0:
            coords[i] -= 1
            coords[i + 1 :] = [_MAX_COORD] * (len(coords) - i - 1)
            return Position((*coords, 0))
    raise MergeError(f"no position exists before {position} to place dumped rows at")


def _pos_out(position: Position | None) -> str | None:
    return None if position is None else str(position)


def _pos_in(text: str | None) -> Position | None:
    return None if text is None else Position.parse(text)


# ----------------------------------------------------------------------- value codec (state)

_TAG = "$dblog"


def encode_value(value: Any) -> Any:
    """A row or key value as JSON-able data; types JSON lacks are tagged ``{"$dblog": type}``."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, list):
        return [encode_value(v) for v in value]
    if isinstance(value, dict):
        body = {str(k): encode_value(v) for k, v in value.items()}
        return {_TAG: "dict", "v": body} if _TAG in body else body
    if isinstance(value, tuple):
        return {_TAG: "tuple", "v": [encode_value(v) for v in value]}
    if isinstance(value, decimal.Decimal):
        return {_TAG: "decimal", "v": str(value)}
    if isinstance(value, dt.datetime):
        return {_TAG: "datetime", "v": value.isoformat()}
    if isinstance(value, dt.date):
        return {_TAG: "date", "v": value.isoformat()}
    if isinstance(value, dt.time):
        return {_TAG: "time", "v": value.isoformat()}
    if isinstance(value, dt.timedelta):
        return {_TAG: "timedelta", "v": [value.days, value.seconds, value.microseconds]}
    if isinstance(value, (bytes, bytearray, memoryview)):
        return {_TAG: "bytes", "v": base64.b64encode(bytes(value)).decode("ascii")}
    if isinstance(value, uuid.UUID):
        return {_TAG: "uuid", "v": str(value)}
    if isinstance(value, (set, frozenset)):
        return {_TAG: "set", "v": [encode_value(v) for v in sorted(value, key=repr)]}
    raise TypeError(f"cannot checkpoint a value of type {type(value).__name__}: {value!r}")


_DECODERS: dict[str, Any] = {
    "tuple": lambda v: tuple(decode_value(x) for x in v),
    "decimal": decimal.Decimal,
    "datetime": dt.datetime.fromisoformat,
    "date": dt.date.fromisoformat,
    "time": dt.time.fromisoformat,
    "timedelta": lambda v: dt.timedelta(days=v[0], seconds=v[1], microseconds=v[2]),
    "bytes": lambda v: base64.b64decode(v),
    "uuid": uuid.UUID,
    "set": lambda v: {decode_value(x) for x in v},
    "dict": lambda v: {k: decode_value(x) for k, x in v.items()},
}


def decode_value(data: Any) -> Any:
    """Undo :func:`encode_value`."""
    if isinstance(data, list):
        return [decode_value(v) for v in data]
    if isinstance(data, dict):
        tag = data.get(_TAG)
        if isinstance(tag, str) and set(data) == {_TAG, "v"} and tag in _DECODERS:
            return _DECODERS[tag](data["v"])
        return {k: decode_value(v) for k, v in data.items()}
    return data


# ----------------------------------------------------------------------- pure convenience


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
