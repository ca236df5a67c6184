"""The watermark merge: log events flow through, chunk rows join them when their window closes.

Feed the log in order with :meth:`WatermarkMerge.feed`; each call returns what to emit now.
Change events are emitted at once, in log order (a dump never holds the log back). A chunk is
registered with :meth:`~WatermarkMerge.open_chunk` before any log item that may fall inside its
window is fed, and :meth:`~WatermarkMerge.rows_ready` says, any time before the window closes,
that its SELECT is done and how many rows it read. The rows themselves never pass through the
merge: they are in a chunk file written where the SELECT ran (a Spark executor), and the merge
only keeps the keys of the table that changed inside the window (the log's value is at least
as new for those). When the window closes it emits one :class:`DumpedRows` item placed right
after the closing point and before anything the log emits later: at the high watermark's
position (``table``), or after the last log event emitted before the item that closed the
window (read-only strategies). Row ``i`` of the chunk (in key order) becomes an ``op="r"``
event at ``base.dumped_row(first_index + i)`` unless its key changed in the window
(:func:`expand` is the rule the sinks apply, to the file's rows). Keys a key-list chunk asked
for that the SELECT did not find, and that the log did not change in the window, become deletes
right after the rows (:func:`removed`): a dump of keys the source lacks removes them downstream.

Several chunks may be open at once, of one table or several. Watermark events and heartbeats are
never emitted.

Log order is not visibility order (a commit is in the binlog/WAL before a SELECT can see it), so
a window must also judge changes the log delivered *before* the window was registered: the merge
remembers recent changes (:class:`Seen`) and :meth:`~WatermarkMerge.open_chunk` drops the keys
of those the window says the SELECT missed (:meth:`Window.contains_past`). The memory is trimmed
by the source's horizon (:meth:`~WatermarkMerge.forget`); if it ever has to drop changes that are
still needed (``history_limit``), windows that judge the past are refused with
:class:`HistoryLost` until the horizon has passed them, and the chunk is selected again.

Chunks may be registered late, after the log was read past their SELECT (a Spark task ran it
while the reader went on): read-only windows and PostgreSQL's snapshot-judged ``table`` window
judge what the merge remembers, and the caller keeps the memory back to the oldest SELECT in
flight (a horizon read before it started).

The state lives in memory only, nothing of it is checkpointed: a restarted stream starts a new
merge (``unknown_past``) and selects its chunks in flight again. Pure logic: no I/O, no clock.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from airflow_dblog.core.events import ChangeEvent, Heartbeat, LogItem, Row, TableId, WatermarkEvent
from airflow_dblog.core.position import Position
from airflow_dblog.core.window import Window, WindowError, later_xid
from airflow_dblog.errors import DblogError

Key = tuple[Any, ...]
Rows = Iterable[tuple[Sequence[Any], Row]]

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
class DumpedRows:
    """A chunk whose window closed, at its place in the output: its rows are emitted here.

    Row ``i`` of the chunk's SELECT (key order, counting every selected row) becomes an
    ``op="r"`` event at ``position.dumped_row(first_index + i)`` unless its key is in
    ``changed`` (those changed inside the window: the log carries a newer value). ``rows`` is
    whatever the caller gave :meth:`WatermarkMerge.rows_ready` (where the rows are).
    ``deleted``: keys the chunk asked for that its SELECT did not find and the log did not change
    inside the window; each becomes a delete after the rows (:func:`removed`). ``low``: where
    the window began (the low watermark; for a window open from registration, just after the
    last item fed then, or the earliest change it judged missed): a change of the table logged
    before it was seen by the SELECT, so a key the lake last changed before ``low`` and the
    chunk's range lacks was gone from the source (None: unknown).
    """

    chunk_id: int
    dump_id: int
    table: TableId
    selected: int
    position: Position
    first_index: int
    changed: frozenset[Key]
    rows: Any
    ts_ms: int
    deleted: tuple[Key, ...] = ()
    low: Position | None = None

    def row_position(self, index: int) -> Position:
        return self.position.dumped_row(self.first_index + index)


def expand(dumped: DumpedRows, rows: Rows) -> Iterator[ChangeEvent]:
    """The events a :class:`DumpedRows` stands for, given its chunk's rows in SELECT order."""
    for i, (key, row) in enumerate(rows):
        k = tuple(key)
        if k in dumped.changed:
            continue
        yield ChangeEvent(
            table=dumped.table,
            op="r",
            key=k,
            position=dumped.row_position(i),
            after=row,
            ts_ms=dumped.ts_ms,
            dump_id=dumped.dump_id,
            chunk_id=dumped.chunk_id,
        )


def removed(dumped: DumpedRows, key_columns: Sequence[str]) -> Iterator[ChangeEvent]:
    """The deletes a :class:`DumpedRows` stands for, placed after its rows.

    A dump that names keys repairs as well as adds: a named key the source lacks is deleted
    downstream at the chunk's place, unless the log changed it inside the window (the log's
    word is newer). The delete's image holds the key columns only; it carries the dump's id
    but no chunk id, so sinks treat it as any delete of the log (a chunk's rows are merged
    within the chunk's key span, which these keys need not fall in).
    """
    for i, key in enumerate(dumped.deleted):
        yield ChangeEvent(
            table=dumped.table,
            op="d",
            key=key,
            position=dumped.row_position(dumped.selected + i),
            before=dict(zip(key_columns, key, strict=True)),
            ts_ms=dumped.ts_ms,
            dump_id=dumped.dump_id,
        )


Output = ChangeEvent | DumpedRows


@dataclass
class _Chunk:
    chunk_id: int
    dump_id: int
    table: TableId
    window: Window
    opened: bool
    changed: set[Key]  # keys of the table changed inside the window so far
    selected: int | None = None  # known once the SELECT is done
    rows: Any = None
    ts_ms: int | None = None
    absent: tuple[Key, ...] = ()  # keys asked for that the SELECT did not find
    low: Position | None = None  # where the window began (see DumpedRows.low)

    def began(self, position: Position | None) -> None:
        """The window reaches back to ``position`` (its opening, or a change it judged)."""
        if position is not None and (self.low is None or position < self.low):
            self.low = position


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
        past: list[Seen] = []
        if window.judges_past:
            if self._lost is not None:
                raise HistoryLost(
                    f"chunk {chunk_id} ({table}): changes up to {self._lost.position} that its"
                    f" {window.describe()} window must judge are no longer remembered",
                    "the chunk is selected again once the source's horizon has passed them",
                )
            past = [s for s in self._history if s.table == table and window.contains_past(s)]
            changed = {s.key for s in past}
        chunk = _Chunk(chunk_id, dump_id, table, window, window.starts_open, changed)
        if window.starts_open and self._last_position is not None:
            # what was fed so far, the last item included, the window judged above (``past``)
            chunk.began(_just_after(self._last_position))
        for seen in past:
            chunk.began(seen.position)
        self._open[chunk_id] = chunk

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

    def rows_ready(
        self,
        chunk_id: int,
        selected: int,
        rows: Any = None,
        ts_ms: int | None = None,
        absent: Sequence[Key] = (),
    ) -> None:
        """The chunk's SELECT is done: ``selected`` rows, kept wherever ``rows`` says.

        ``ts_ms``: when they were read (default: the last change's time when the window closes).
        ``absent``: the keys a key-list chunk asked for that the SELECT did not find.
        Keys must compare equal to the log's event keys (same Python types): the sources see to
        that, and the sinks compare :func:`~airflow_dblog.core.keys.match_key` texts.
        """
        chunk = self._get(chunk_id)
        if chunk.selected is not None:
            raise MergeError(f"rows of chunk {chunk_id} were already supplied")
        if selected < 0:
            raise MergeError(f"chunk {chunk_id}: {selected} rows selected")
        chunk.selected, chunk.rows, chunk.ts_ms = selected, rows, ts_ms
        chunk.absent = tuple(tuple(k) for k in absent)

    def cancel_chunk(self, chunk_id: int) -> bool:
        """Forget an open chunk without emitting it (its SELECT failed, its dump was cancelled)."""
        return self._open.pop(chunk_id, None) is not None

    def cancel_dump(self, dump_id: int) -> int:
        """Forget every open chunk of a dump; returns how many there were."""
        ids = [c.chunk_id for c in self._open.values() if c.dump_id == dump_id]
        for chunk_id in ids:
            del self._open[chunk_id]
        return len(ids)

    @property
    def last_position(self) -> Position | None:
        """The position of the last change or watermark fed (what the log was read up to)."""
        return self._last_position

    def open_ids(self) -> set[int]:
        return set(self._open)

    def open_count(self) -> int:
        return len(self._open)

    @property
    def remembers_all(self) -> bool:
        """False while changes a window may need were dropped (or predate a restart)."""
        return self._lost is None

    # ------------------------------------------------------------------------------- log

    def feed(self, item: LogItem) -> list[Output]:
        """One log item in; the events to emit now, in order."""
        if not isinstance(item, (ChangeEvent, WatermarkEvent, Heartbeat)):
            raise TypeError(f"not a log item: {item!r}")
        positioned = isinstance(item, (ChangeEvent, WatermarkEvent))  # heartbeats may repeat
        if positioned:
            self._check_order(item)
        out: list[Output] = []
        for chunk in list(self._open.values()):
            if chunk.opened and chunk.window.closes_before(item):
                out.append(self._close(chunk, self._base_before(chunk, item)))
        change = item if isinstance(item, ChangeEvent) else None
        for chunk in self._open.values():
            mine = change is not None and change.table == chunk.table
            if not chunk.opened:
                chunk.opened = chunk.window.opens_at(item)
                if chunk.opened:
                    chunk.began(item.position)  # type: ignore[union-attr]
                if mine and chunk.window.contains_past(change):  # type: ignore[arg-type]
                    self._conflict(chunk, change.key)  # type: ignore[union-attr]
                    chunk.began(change.position)  # type: ignore[union-attr]
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
                out.append(self._close(chunk, item.position))
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
        chunk.changed.add(key)

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

    def _close(self, chunk: _Chunk, base: Position) -> DumpedRows:
        if chunk.selected is None:
            raise MergeError(
                f"the window of chunk {chunk.chunk_id} (dump {chunk.dump_id}, {chunk.table}) closed"
                f" at {base} before its rows were ready",
                "call rows_ready before the log is fed past the chunk's window",
            )
        del self._open[chunk.chunk_id]
        deleted = tuple(k for k in chunk.absent if k not in chunk.changed)
        same_base = self._dump_base is not None and self._dump_base.log_part() == base.log_part()
        first = self._dump_next if same_base else 0
        if chunk.selected or deleted:
            self._dump_base, self._dump_next = base, first + chunk.selected + len(deleted)
        return DumpedRows(
            chunk.chunk_id,
            chunk.dump_id,
            chunk.table,
            chunk.selected,
            base,
            first,
            frozenset(chunk.changed),
            chunk.rows,
            self._last_ts if chunk.ts_ms is None else chunk.ts_ms,
            deleted,
            chunk.low,
        )

    def _get(self, chunk_id: int) -> _Chunk:
        try:
            return self._open[chunk_id]
        except KeyError:
            raise MergeError(f"chunk {chunk_id} is not open in the merge") from None


def _unopened(chunk: _Chunk, item: LogItem) -> WindowError:
    return WindowError(
        f"chunk {chunk.chunk_id} ({chunk.table}): {chunk.window.describe()} window reached its"
        f" end at {item.position} before it opened",
        "check that the reader captures the dblog watermark table (binlog filters, publication)"
        " and that the stream resumed from a position before the chunk started",
    )


def _just_after(position: Position) -> Position:
    """The greatest position of ``position``'s log part: above it and the rows placed at it,
    below the next log item."""
    return Position((*position.log_part(), _MAX_COORD))


def _just_before(position: Position) -> Position:
    """The greatest log position below ``position``'s log part (its dumped rows sort below it)."""
    coords = list(position.log_part())
    for i in range(len(coords) - 1, -1, -1):
        if coords[i] > 0:
            coords[i] -= 1
            coords[i + 1 :] = [_MAX_COORD] * (len(coords) - i - 1)
            return Position((*coords, 0))
    raise MergeError(f"no position exists before {position} to place dumped rows at")
