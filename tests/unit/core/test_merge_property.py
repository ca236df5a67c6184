"""Property test: the merge against a simulated database, for every watermark strategy.

The simulation owns two tables whose keys come from a small range (so keys are deleted and
reused), a change log, and the merge. Random steps write transactions, feed the log to the
merge (the reader lags behind the database by a random amount), write heartbeats, refresh the
source's horizon, restart the stream, and advance one dump per table (a finished table is
sometimes dumped again): chunks are keyset pages ``key > last ORDER BY key LIMIT n`` up to the
largest key at dump start. Between chunks, writes often update a row the next chunk selects.

Log order is not visibility order. A transaction may be in the log (and fed to the merge) a few
steps before a SELECT can see it: PostgreSQL writes the commit record before the transaction
leaves the ProcArray, MariaDB's semi-sync ``AFTER_SYNC`` writes the binlog before the engine
commit. On PostgreSQL such transactions become visible in any order; on MySQL/MariaDB engine
commits follow binlog order, so a transaction becomes visible only with every earlier one. A
transaction writing a row waits until the previous writer of that row is visible (row locks are
released after it). The GTID strategies have no lag.

A chunk runs as the executor runs it (``ChunkExecutor``): the driver opens it and sends its
SELECT (reading the source's horizon just before), the SELECT runs on an executor, and once it
is done the driver registers the window (if it was not yet), calls ``rows_ready`` and writes the
high watermark. The reader goes on all the while: the chunk stays in flight for a random number
of steps (writes, log feeding, heartbeats, horizon refreshes, the other table's chunks), and the
log is fed a random number of items more right before the window is registered, so windows are
often registered after the log went past their SELECT, even past their end, and judge what the
merge remembers. While a SELECT is in flight the memory is trimmed by the horizon read before
the oldest one in flight was sent, as the executor does. Per strategy:

- ``table`` (MySQL/MariaDB): register ``TableWindow(low, high)``, write LW — with
  ``binlog_order_commits`` its commit makes every earlier binlog transaction visible —,
  (writes), SELECT; ... ``rows_ready``, (writes), write HW. ``table-fed``: the same with the
  reader caught up when the window is registered (nothing of the table is fed between the
  registration and the LW);
- ``table-pg`` (PostgreSQL): SELECT in a snapshot (xmin:xmax:xip, xip holding the committed but
  invisible transactions too); ... register ``HighWatermarkWindow(high, snapshot)``,
  ``rows_ready``, (writes), write HW. No LW;
- ``xid`` (PostgreSQL): snapshot and SELECT, (writes), WAL end as ``close_at``; ... register;
- ``gtid-mysql`` / ``gtid-mariadb``: low set, writes, SELECT, writes, high set, writes,
  binlog position as ``close_at``; ... register;
- ``position`` (MariaDB): SELECT at the snapshot position (the end of the last visible
  transaction, possibly before log items already fed to the merge), (writes), ``close_at`` that
  position (as the executor does) or the binlog end; ... register.

A restart (when no chunk is open or in flight) replaces the merge with a fresh one whose
``unknown_past`` stands for everything fed before, as the capture builds it; windows are refused
with :class:`HistoryLost` until the horizon passes it (the chunk is then selected again later, as
the executor requeues it). The memory may also be bounded (``history_limit``) so that it
overflows, also while a SELECT is in flight. The tables start with rows that are never logged,
so only the dump can bring them to the output. The merge never sees the rows: the simulation
keeps them and expands each :class:`DumpedRows` as a sink does (:func:`expand`).

Checked: log events come out unchanged and in order; output positions strictly increase; every
dumped row equals the table's true value at the point of the log where it is placed; each chunk
emits exactly its selected rows minus the keys its SELECT missed a change of that the output
places before its rows (computed from the simulation's visibility, not from the windows), row
``i`` of the SELECT at ``dumped_row(first_index + i)``; chunks placed at one point number their
rows one after the other, counting every selected row; replaying the output converges to the
final tables; every row unchanged during its table's dump (and not hidden by an invisible
transaction when it started) is emitted exactly once as ``r``; chunk statistics add up. The
search is steered (``target``) towards SELECTs that missed a change the merge had already
emitted: the case a window registered late must judge.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass, field
from itertools import pairwise
from typing import Any

import pytest
from hypothesis import HealthCheck, event, given, settings, target
from hypothesis import strategies as st

from airflow_dblog.core.events import ChangeEvent, Heartbeat, LogItem, TableId, WatermarkEvent
from airflow_dblog.core.gtid import GtidSet, parse_gtid_set
from airflow_dblog.core.merge import DumpedRows, HistoryLost, Seen, WatermarkMerge, expand
from airflow_dblog.core.position import Position
from airflow_dblog.core.window import (
    GtidWindow,
    HighWatermarkWindow,
    PositionWindow,
    ReadOnlyWindow,
    SnapshotXidWindow,
    TableWindow,
    Window,
    XidSnapshot,
)

TABLES = (TableId("app", "a"), TableId("app", "b"))
KEYS = 10
UUIDS = ("3e11fa47-71ca-11e1-9e33-c80aa9429562", "aaaaaaaa-bbbb-cccc-dddd-eeeeeeeeeeee")
MYSQL_TABLE = ("table", "table-fed")
STRATEGIES = (*MYSQL_TABLE, "table-pg", "xid", "gtid-mysql", "gtid-mariadb", "position")
POSTGRES = ("table-pg", "xid")
LAGGING = (*MYSQL_TABLE, "table-pg", "xid", "position")  # commits may be logged before visible
VISIBLE_WITHIN = 6  # steps after which a logged transaction is surely visible

Row = dict[str, Any]
Horizon = Callable[[Any], bool]


@dataclass
class ChunkRecord:
    chunk_id: int
    table: TableId
    selected: list[tuple[tuple[int], Row]]
    changed: set[int] = field(default_factory=set)  # oracle: keys the rows must not carry
    past: set[int] = field(default_factory=set)  # keys of missed changes fed before registration


@dataclass(frozen=True)
class Handle:
    """The ``rows`` given to the merge for a chunk: where a sink would find them."""

    chunk_id: int


@dataclass
class Flight:
    """A chunk whose SELECT was sent and whose window is not registered yet (or, ``table``,
    whose rows are not ready yet): what the driver and the executor read for it."""

    chunk: ChunkRecord
    dump: Dump
    horizon: Horizon | None  # read before the SELECT was sent
    hidden: set[int] = field(default_factory=set)  # log indices invisible to the SELECT
    snap: int = 0  # log length when the SELECT's snapshot was taken
    lw: int = 0  # index of the low watermark (``table``)
    high: str = ""  # the high watermark's value (``table``, ``table-pg``)
    snapshot: XidSnapshot | None = None  # ``table-pg``
    window: Window | None = None  # read-only strategies: what the executor read
    lo: int = 0  # ``gtid``: log length when the low set was read
    hi: int = 0  # and the high set


@dataclass
class Tx:
    """A transaction in the log that SELECTs cannot see yet."""

    indices: list[int]  # its log items
    xid: int | None
    end_before: Position  # MySQL-like: the visible end while it (and later ones) are hidden
    since: int  # the step it was logged at


@dataclass
class Dump:
    table: TableId
    dump_id: int
    max_key: int | None = None
    last: int | None = None
    started: bool = False
    done: bool = False
    start_index: int = 0
    end_index: int = 0
    at_start: dict[int, Row] = field(default_factory=dict)
    hidden_at_start: set[int] = field(default_factory=set)
    flight: int | None = None  # the chunk of this dump in flight


class Sim:
    def __init__(self, strategy: str, data: st.DataObject) -> None:
        self.strategy, self.data = strategy, data
        self.pg = strategy in POSTGRES
        self.lag = strategy in LAGGING
        self.history = strategy not in MYSQL_TABLE  # windows judge the past (the capture's rule)
        self.chunk_size = data.draw(st.integers(1, 4), label="chunk_size")
        self.history_limit = data.draw(st.sampled_from([0, 0, 2, 5]), label="history limit")
        self.initial: dict[TableId, dict[int, Row]] = {}
        for t in TABLES:
            keys = data.draw(st.sets(st.integers(0, KEYS - 1)), label=f"initial {t.table}")
            self.initial[t] = {k: {"id": k, "v": f"{t.table}{k}@init"} for k in sorted(keys)}
        self.state = copy.deepcopy(self.initial)  # the log's state (every logged commit)
        self.log: list[LogItem] = []
        self.fed = 0
        self.merge = self.new_merge(resumed=False)
        self.restarts: list[int] = []  # where the output stood at each restart
        self.out: list[ChangeEvent] = []
        self.closed: list[tuple[DumpedRows, int]] = []  # with the number of restarts before
        self.version = 0
        self.step = 0
        # MySQL-like binlog: a transaction fills [offset, offset + 10), its rows event at +5
        self.file, self.offset = 1, 4
        self.last_end = Position.mysql(1, 4)  # end of the last transaction in the binlog
        # PostgreSQL: commit LSNs and 64-bit xids (the log carries the low 32 bits)
        self.lsn = 1000
        self.next_xid = data.draw(
            st.sampled_from([3, 2**32 - 4, 5 * 2**32 - 3, 2**40 + 17]), label="xid base"
        )
        self.running: list[int] = []  # xids in progress, in begin order
        self.hidden: dict[int, Tx] = {}  # logged, not visible yet, in log order
        self.next_tx = 0
        # GTIDs
        self.gtids: GtidSet = parse_gtid_set("", "mariadb" if strategy == "gtid-mariadb" else None)
        self.gno = {u: 0 for u in UUIDS}
        self.seq = {0: 0, 1: 0}
        # dumps and chunks
        self.dumps = {t: Dump(t, i + 1) for i, t in enumerate(TABLES)}  # the latest per table
        self.done_dumps: list[Dump] = []
        self.chunks: dict[int, ChunkRecord] = {}  # registered with the merge
        self.flights: dict[int, Flight] = {}  # SELECTs in flight, in the order they were sent
        self.next_chunk = 1
        self.judged = 0  # chunks whose SELECT missed a change already fed to the merge
        self.in_chunk = False

    def new_merge(self, resumed: bool) -> WatermarkMerge:
        """As the capture builds it: a memory only if windows judge the past."""
        if not self.history:
            return WatermarkMerge(history_limit=0)
        unknown = None
        if resumed and self.pg:
            unknown = Seen(None, (), Position.postgres(0), xid=max(self.snapshot().xmax - 1, 0))
        elif resumed and self.strategy == "position":
            unknown = Seen(None, (), self.current())
        if self.history_limit:
            return WatermarkMerge(history_limit=self.history_limit, unknown_past=unknown)
        return WatermarkMerge(unknown_past=unknown)

    # ------------------------------------------------------------------------- the database

    def draw(self, strategy: st.SearchStrategy[Any], label: str) -> Any:
        return self.data.draw(strategy, label=label)

    def next_position(self, row: int = 0) -> Position:
        if self.pg:
            return Position.postgres(self.lsn, row)
        return Position.mysql(self.file, self.offset + 5, row)

    def end_tx(self) -> None:
        if not self.pg:
            self.offset += 10
            self.last_end = Position.mysql(self.file, self.offset)

    def current(self) -> Position:
        """Where the log ends now: a heartbeat there, or a close_at read now."""
        return (
            Position.postgres(self.lsn + 1) if self.pg else Position.mysql(self.file, self.offset)
        )

    def visible_end(self) -> Position:
        """MariaDB's binlog snapshot position: the end of the last visible transaction."""
        assert not self.pg
        return next(iter(self.hidden.values())).end_before if self.hidden else self.last_end

    def snapshot(self) -> XidSnapshot:
        """``pg_current_snapshot()`` now: logged but invisible transactions are in progress."""
        xip = set(self.running) | {tx.xid for tx in self.hidden.values() if tx.xid is not None}
        return XidSnapshot(min(xip, default=self.next_xid), self.next_xid, frozenset(xip))

    def hidden_indices(self) -> set[int]:
        return {i for tx in self.hidden.values() for i in tx.indices}

    def visible(self, table: TableId) -> dict[int, Row]:
        """What a SELECT sees now: the log's state without the invisible transactions."""
        rows = dict(self.state[table])
        for i in sorted(self.hidden_indices(), reverse=True):
            e = self.log[i]
            assert isinstance(e, ChangeEvent)
            if e.table == table:
                if e.before is None:
                    rows.pop(e.key[0], None)
                else:
                    rows[e.key[0]] = e.before
        return rows

    def make_visible(self, tx_id: int) -> None:
        """One transaction becomes visible; on MySQL/MariaDB every earlier one with it."""
        if self.pg:
            del self.hidden[tx_id]
            return
        for earlier in [t for t in self.hidden if t <= tx_id]:
            del self.hidden[earlier]

    def make_all_visible(self) -> None:
        self.hidden.clear()

    def overdue(self) -> None:
        for tx_id, tx in list(self.hidden.items()):
            if tx_id in self.hidden and tx.since <= self.step - VISIBLE_WITHIN:
                self.make_visible(tx_id)

    def changes(self) -> list[tuple[TableId, int, bool]]:
        """One or two (table, key, delete-if-present) changes, from a single draw; between
        chunks sometimes an update of a row the next chunk selects (so that its SELECT may
        miss a change the merge has already seen)."""
        x = self.draw(st.integers(0, 10 * KEYS - 1), "tx")
        if x >= 6 * KEYS and not self.in_chunk:
            dump = self.dumps[TABLES[x % 2]]
            ahead = sorted(k for k in self.state[dump.table] if dump.last is None or k > dump.last)
            if dump.started and not dump.done and ahead:
                return [(dump.table, ahead[x // 2 % min(len(ahead), self.chunk_size)], False)]
            x %= 6 * KEYS
        table, key, delete = TABLES[x % 2], (x // 2) % KEYS, bool((x // (2 * KEYS)) % 3 == 1)
        picked = [(table, key, delete)]
        if x // (2 * KEYS) == 2:  # a second row in the same transaction, in the other table
            picked.append((TABLES[(x + 1) % 2], (key * 7 + 3) % KEYS, key % 2 == 0))
        return picked

    def commit(self, targets: list[tuple[TableId, int, bool]], xid: int | None = None) -> None:
        # a writer waits for the row's previous writer to be visible (its row lock)
        for tx_id, tx in list(self.hidden.items()):
            if tx_id in self.hidden and any(
                (e.table, e.key[0]) == (t, k)
                for e in (self.log[i] for i in tx.indices)
                if isinstance(e, ChangeEvent)
                for t, k, _ in targets
            ):
                self.make_visible(tx_id)
        end_before = self.last_end
        if self.pg:
            self.lsn += 1 + self.version % 3  # sometimes right at a close_at read just before
        gtid = self.new_gtid(targets[0][1]) if self.strategy.startswith("gtid") else None
        first = len(self.log)
        for row, (table, key, delete) in enumerate(targets):
            rows = self.state[table]
            self.version += 1
            if key not in rows:
                op, after = "c", {"id": key, "v": f"{table.table}{key}@{self.version}"}
            elif delete:
                op, after = "d", None
            else:
                op, after = "u", {"id": key, "v": f"{table.table}{key}@{self.version}"}
            before = rows.get(key)
            if after is None:
                del rows[key]
            else:
                rows[key] = after
            event = ChangeEvent(
                table,
                op,  # type: ignore[arg-type]
                (key,),
                self.next_position(row),
                before=before,
                after=after,
                ts_ms=self.version,
                xid=None if xid is None else xid & 0xFFFFFFFF,
                gtid=gtid,
            )
            self.log.append(event)
        self.end_tx()
        # MySQL/MariaDB: not visible before an earlier transaction in the binlog
        later = self.lag and self.draw(st.booleans(), "visible later?")
        if later or (self.lag and self.hidden and not self.pg):
            indices = list(range(first, len(self.log)))
            self.hidden[self.next_tx] = Tx(indices, xid, end_before, self.step)
            self.next_tx += 1

    def new_gtid(self, key: int) -> str:
        """Two MariaDB domains and servers, or two MySQL servers taking turns (failovers)."""
        if self.strategy == "gtid-mariadb":
            domain = key % 2
            self.seq[domain] += 1
            gtid = f"{domain}-{1 + self.version // 4 % 2}-{self.seq[domain]}"
        else:
            uuid = UUIDS[self.version // 5 % 2]
            self.gno[uuid] += 1
            gtid = f"{uuid}:{self.gno[uuid]}"
        self.gtids = self.gtids.add(gtid)
        return gtid

    def write(self) -> None:
        """One transaction; with PostgreSQL sometimes a long one that commits later, or aborts."""
        if not self.pg:
            self.commit(self.changes())
            return
        choice = self.draw(st.integers(0, 3), "pg tx")
        if choice == 0 or not self.running:
            xid = self.next_xid
            self.next_xid += 1
            if choice == 0 and len(self.running) < 4:
                self.running.append(xid)  # stays in progress for a while
            else:
                self.commit(self.changes(), xid)
        elif choice == 1:
            self.running.remove(self.draw(st.sampled_from(self.running), "abort"))
        else:
            xid = self.draw(st.sampled_from(self.running), "commit")
            self.running.remove(xid)
            self.commit(self.changes(), xid)

    def writes(self, most: int, label: str) -> None:
        for _ in range(self.draw(st.integers(0, most), label)):
            self.write()

    def watermark(self, value: str) -> int:
        """The executor's own write: visible when its commit returns. With MySQL's
        ``binlog_order_commits`` every transaction before it in the binlog is visible then."""
        if self.pg:
            self.lsn += 1
            self.next_xid += 1  # its own transaction
        else:
            self.make_all_visible()
        self.log.append(WatermarkEvent("s", value, self.next_position()))
        self.end_tx()
        return len(self.log) - 1

    def heartbeat(self) -> None:
        self.log.append(Heartbeat(self.current()))

    def rotate(self) -> None:
        if not self.pg:
            self.file, self.offset = self.file + 1, 4
            self.last_end = Position.mysql(self.file, self.offset)

    # ------------------------------------------------------------------------------ reader

    def feed(self, n: int) -> None:
        for _ in range(n):
            if self.fed >= len(self.log):
                return
            for out in self.merge.feed(self.log[self.fed]):
                if isinstance(out, DumpedRows):
                    # a sink's part: the chunk's rows, as the SELECT returned them
                    assert out.rows == Handle(out.chunk_id)
                    self.closed.append((out, len(self.restarts)))
                    self.out.extend(expand(out, self.chunks[out.chunk_id].selected))
                else:
                    self.out.append(out)
            self.fed += 1

    def horizon(self) -> Horizon | None:
        """The source's horizon now, as the executor's strategies read it."""
        if not self.history:
            return None
        if self.pg:
            return self.snapshot().older
        if self.strategy == "position":
            seen_upto = self.visible_end().log_part()
            return lambda change: change.position.log_part() <= seen_upto
        executed = self.gtids
        return lambda change: change.gtid is not None and executed.contains(change.gtid)

    def refresh_horizon(self) -> None:
        """ChunkExecutor.refresh_horizon: while a SELECT is in flight, the horizon read before
        the oldest one was sent (its window, registered later, may need what a newer one
        would let go)."""
        oldest = next(iter(self.flights.values()), None)
        horizon = self.horizon() if oldest is None else oldest.horizon
        if horizon is not None:
            self.merge.forget(horizon)

    def restart(self) -> None:
        """The stream restarts between batches; in-flight chunks would be requeued (none here)."""
        if self.merge.open_count() or self.flights:
            return
        self.merge = self.new_merge(resumed=True)
        self.restarts.append(len(self.out))
        event("restart")

    # ------------------------------------------------------------------------------- dumps

    def select(self, dump: Dump) -> list[tuple[tuple[int], Row]]:
        assert dump.max_key is not None
        visible = self.visible(dump.table)
        keys = sorted(
            k for k in visible if (dump.last is None or k > dump.last) and k <= dump.max_key
        )[: self.chunk_size]
        return [((k,), dict(visible[k])) for k in keys]

    def changed_keys(self, table: TableId, lo: int, hi: int, keep: Callable[[int], bool]) -> set:
        return {
            e.key[0]
            for i, e in enumerate(self.log[lo:hi], start=lo)
            if isinstance(e, ChangeEvent) and e.table == table and keep(i)
        }

    def first_closing(self, start: int, closes: Callable[[int], bool]) -> int:
        """The log index before which a read-only window closes once the merge was fed up to
        ``start``: the first item from there that closes it (every item logged later does)."""
        for i in range(start, len(self.log)):
            if closes(i):
                return i
        return len(self.log)

    def past(self, limit: Position) -> Callable[[int], bool]:
        return lambda i: self.log[i].position.log_part() >= limit.log_part()

    def advance(self, dump: Dump) -> None:
        """The dump's next step: finish its chunk in flight, or send the next one."""
        if dump.done:
            return
        if dump.flight is not None:
            self.finish(self.flights[dump.flight])
            return
        t = dump.table
        if not dump.started:  # the executor reads the bound with its first chunk
            dump.started, dump.start_index = True, len(self.log)
            dump.at_start = copy.deepcopy(self.visible(t))
            dump.hidden_at_start = self.changed_keys(
                t, 0, len(self.log), self.hidden_indices().__contains__
            )
            dump.max_key = max(dump.at_start, default=None)
            if dump.max_key is None:
                dump.done, dump.end_index = True, len(self.log)
            return
        if self.history and not self.merge.remembers_all:  # ChunkExecutor.ready()
            self.refresh_horizon()
            if not self.merge.remembers_all and not self.draw(st.booleans(), "try anyway?"):
                return
        flight = self.send(dump)
        if self.draw(st.booleans(), "SELECT done within the step?"):
            self.finish(flight)

    def send(self, dump: Dump) -> Flight:
        """The driver opens the chunk and the SELECT runs (writes go on meanwhile)."""
        t = dump.table
        chunk = ChunkRecord(self.next_chunk, t, [])
        self.next_chunk += 1
        flight = Flight(chunk, dump, self.horizon())  # read before the SELECT is sent
        self.in_chunk = True
        if self.strategy in MYSQL_TABLE:
            low, flight.high = f"L{chunk.chunk_id}", f"H{chunk.chunk_id}"
            if self.strategy == "table-fed":
                self.feed(len(self.log))
            # registered before its LW can be in the log
            self.merge.open_chunk(chunk.chunk_id, dump.dump_id, t, TableWindow(low, flight.high))
            self.chunks[chunk.chunk_id] = chunk
            flight.lw = self.watermark(low)
            self.writes(2, "writes after low")
            flight.hidden = self.hidden_indices()
            chunk.selected = self.select(dump)
        elif self.strategy == "table-pg":
            flight.high = f"H{chunk.chunk_id}"
            flight.snap, flight.hidden = len(self.log), self.hidden_indices()
            flight.snapshot = self.snapshot()
            chunk.selected = self.select(dump)
        elif self.strategy.startswith("gtid"):
            low_set, flight.lo = self.gtids, len(self.log)
            self.writes(2, "writes after low")
            chunk.selected = self.select(dump)
            self.writes(2, "writes after select")
            high_set, flight.hi = self.gtids, len(self.log)
            self.writes(2, "writes after high")
            flight.window = GtidWindow(low_set, high_set, self.current())
        else:
            flight.snap, flight.hidden = len(self.log), self.hidden_indices()
            if self.pg:
                s = self.snapshot()
            else:
                start = self.visible_end()
            chunk.selected = self.select(dump)
            self.writes(3, "writes after snapshot")
            if self.pg:
                flight.window = SnapshotXidWindow(s.xmin, s.xmax, s.xip, self.current())
            else:
                close = start if self.draw(st.booleans(), "close at start?") else self.current()
                flight.window = PositionWindow(start, close)
        self.in_chunk = False
        self.flights[chunk.chunk_id] = flight
        dump.flight = chunk.chunk_id
        return flight

    def finish(self, flight: Flight) -> None:
        """ChunkExecutor._finish: the SELECT is done, the reader went on meanwhile; register
        the window (unless registered at open), rows ready, then the HW."""
        self.feed(self.draw(st.integers(0, 6), "fed before registration"))
        chunk, dump, t = flight.chunk, flight.dump, flight.chunk.table
        del self.flights[chunk.chunk_id]
        dump.flight = None
        handle, selected = Handle(chunk.chunk_id), len(chunk.selected)
        self.in_chunk = True
        if self.strategy in MYSQL_TABLE:
            self.merge.rows_ready(chunk.chunk_id, selected, handle)
            self.writes(2, "writes before high")
            hw = self.watermark(flight.high)
            lw, hidden = flight.lw, flight.hidden
            chunk.changed = self.changed_keys(t, 0, hw, lambda i: i > lw or i in hidden)
            chunk.past = self.changed_keys(t, 0, self.fed, lambda i: i > lw or i in hidden)
            self.in_chunk = False
            self.next_page(dump, chunk)
            return
        window, missed, end = self.late_window(flight)
        if not self.merge.remembers_all:
            with pytest.raises(HistoryLost):  # requeued: the page is selected again later
                self.merge.open_chunk(chunk.chunk_id, dump.dump_id, t, window)
            event("a window was refused: history lost")
            self.in_chunk = False
            return
        self.merge.open_chunk(chunk.chunk_id, dump.dump_id, t, window)
        self.merge.rows_ready(chunk.chunk_id, selected, handle)
        self.chunks[chunk.chunk_id] = chunk
        chunk.past = self.changed_keys(t, 0, self.fed, missed)
        if self.strategy == "table-pg":
            self.writes(2, "writes before high")
            end = self.watermark(flight.high)
        chunk.changed = self.changed_keys(t, 0, end, missed)
        if {k[0] for k, _ in chunk.selected} & chunk.past:
            event("the SELECT missed a change the merge had already emitted")
            self.judged += 1
        self.in_chunk = False
        self.next_page(dump, chunk)

    def late_window(self, flight: Flight) -> tuple[Window, Callable[[int], bool], int]:
        """The window registered after the SELECT, and the oracle: which log items are changes
        the SELECT did not see (from the simulation's visibility, not the window's rules), and
        the log index before which the output places the rows (read-only windows; the HW is
        not written yet)."""
        if self.strategy == "table-pg":
            assert flight.snapshot is not None
            window: Window = HighWatermarkWindow(flight.high, flight.snapshot)
            end = -1  # the HW's index, once written
        elif self.strategy.startswith("gtid"):
            assert isinstance(flight.window, GtidWindow)
            window, hi = flight.window, flight.hi
            beyond = self.past(window.close_at)

            def closes(i: int) -> bool:  # or a change that committed after the high set
                return beyond(i) or (i >= hi and isinstance(self.log[i], ChangeEvent))

            end = self.first_closing(self.fed, closes)
        else:
            assert isinstance(flight.window, (SnapshotXidWindow, PositionWindow))
            window = flight.window
            end = self.first_closing(self.fed, self.past(window.close_at))
        if (
            isinstance(window, ReadOnlyWindow)
            and self.fed
            and self.past(window.close_at)(self.fed - 1)
        ):
            event("a read-only window registered after the log passed its end")
        lo, snap, hidden = flight.lo, flight.snap, flight.hidden

        def missed(i: int) -> bool:
            if self.strategy.startswith("gtid"):
                return i >= lo  # no lag: every change after the low set, none before
            return i >= snap or i in hidden

        return window, missed, end

    def next_page(self, dump: Dump, chunk: ChunkRecord) -> None:
        if len(chunk.selected) < self.chunk_size:
            dump.done, dump.end_index = True, len(self.log)
        else:
            dump.last = chunk.selected[-1][0][0]

    # --------------------------------------------------------------------------------- run

    def run(self) -> None:
        steps = self.draw(st.integers(10, 80), "steps")
        for self.step in range(steps):
            self.overdue()
            action = self.draw(st.integers(0, 9), "action")
            if action <= 1:
                self.write()
            elif action in (2, 9) or (action == 6 and self.pg):
                self.feed(self.draw(st.integers(-2, 6), "feed") % (len(self.log) + 1))  # <0: all
            elif action <= 4:
                table = self.draw(st.sampled_from(TABLES), "dump")
                if self.dumps[table].done and len(self.done_dumps) < 4:  # dump it again
                    self.done_dumps.append(self.dumps[table])
                    self.dumps[table] = Dump(table, len(self.done_dumps) + len(TABLES))
                self.advance(self.dumps[table])
            elif action == 5:
                self.heartbeat()
            elif action == 6:
                self.rotate()
            elif action == 7 and self.hidden:
                self.make_visible(self.draw(st.sampled_from(sorted(self.hidden)), "visible"))
            elif action == 8:
                if self.draw(st.integers(0, 3), "restart?") == 0:
                    self.restart()
                else:
                    self.refresh_horizon()
        # the end: every transaction finishes and becomes visible, the dumps run to completion
        while self.running:
            xid = self.running.pop()
            self.commit(self.changes(), xid)
        for _ in range(10_000):
            if all(d.done for d in self.dumps.values()):
                break
            self.make_all_visible()
            for dump in self.dumps.values():
                self.advance(dump)
        else:
            raise AssertionError("the dumps make no progress")
        self.heartbeat()  # an idle source: only a heartbeat closes the last read-only windows
        self.feed(len(self.log))


def replay(events: list[ChangeEvent]) -> dict[TableId, dict[int, Row]]:
    state: dict[TableId, dict[int, Row]] = {t: {} for t in TABLES}
    for e in events:
        if e.op == "d":
            state[e.table].pop(e.key[0], None)
        else:
            assert e.after is not None
            state[e.table][e.key[0]] = e.after
    return state


def check(sim: Sim) -> None:
    out = sim.out
    assert sim.merge.open_count() == 0 and not sim.flights
    assert sim.fed == len(sim.log)

    # log events come out unchanged, in log order, none lost
    assert [e for e in out if e.op != "r"] == [e for e in sim.log if isinstance(e, ChangeEvent)]

    # no time travel: positions strictly increase, overall and so per key. Across a restart
    # the log parts only do not go back: a fresh merge knows nothing of the dumped rows placed
    # before it, so rows it places at the same point reuse their row indices (same values)
    bounds = [0, *sim.restarts, len(out)]
    for lo, hi in pairwise(bounds):
        positions = [e.position for e in out[lo:hi]]
        assert all(a < b for a, b in pairwise(positions)), "positions must increase"
        last: dict[tuple[TableId, int], Position] = {}
        for e in out[lo:hi]:
            k = (e.table, e.key[0])
            assert k not in last or last[k] < e.position
            last[k] = e.position
    assert all(a.position.log_part() <= b.position.log_part() for a, b in pairwise(out))

    # every dumped row is the key's true value at the point of the log where it is placed
    truth = copy.deepcopy(sim.initial)
    for e in out:
        if e.op == "r":
            assert truth[e.table].get(e.key[0]) == e.after, f"stale dumped row {e}"
        elif e.op == "d":
            truth[e.table].pop(e.key[0], None)
        else:
            assert e.after is not None
            truth[e.table][e.key[0]] = e.after

    # each chunk: exactly the selected rows whose key had no missed change before them, in
    # order, row i of the SELECT at dumped_row(first_index + i)
    dumped: dict[int, list[ChangeEvent]] = {}
    for e in out:
        if e.op == "r":
            assert e.chunk_id is not None
            dumped.setdefault(e.chunk_id, []).append(e)
    closed = {d.chunk_id: d for d, _ in sim.closed}
    assert len(closed) == len(sim.closed), "a chunk closed twice"
    assert set(closed) == set(sim.chunks)
    for chunk in sim.chunks.values():
        d = closed[chunk.chunk_id]
        got = [(e.key, e.after, e.position) for e in dumped.get(chunk.chunk_id, [])]
        want = [
            (k, r, d.position.dumped_row(d.first_index + i))
            for i, (k, r) in enumerate(chunk.selected)
            if k[0] not in chunk.changed
        ]
        assert got == want, f"chunk {chunk.chunk_id}: missed changes of {chunk.changed}"
        # statistics, as the capture records them
        selected = {k[0] for k, _ in chunk.selected}
        assert (d.selected, d.table) == (len(chunk.selected), chunk.table)
        dropped = {k[0] for k in d.changed} & selected
        assert dropped == chunk.changed & selected
        assert d.selected - len(dropped) == len(want)

    # chunks placed at one point number their rows one after the other, every selected row
    # counted (dropped ones too: a sink drops them); a restarted merge starts again
    for segment in range(len(sim.restarts) + 1):
        base: Position | None = None
        following = 0
        for d, restarts in sim.closed:
            if restarts != segment:
                continue
            same = base is not None and base.log_part() == d.position.log_part()
            assert d.first_index == (following if same else 0)
            if d.selected:
                base, following = d.position, d.first_index + d.selected

    # convergence: the output alone rebuilds the final tables (initial rows were never logged)
    assert replay(out) == sim.state

    # every row unchanged during its table's dump is dumped exactly once
    for dump in [*sim.done_dumps, *sim.dumps.values()]:
        touched = dump.hidden_at_start | {
            e.key[0]
            for e in sim.log[dump.start_index : dump.end_index]
            if isinstance(e, ChangeEvent) and e.table == dump.table
        }
        counts: dict[int, int] = {}
        for e in out:
            if e.op == "r" and e.dump_id == dump.dump_id:
                counts[e.key[0]] = counts.get(e.key[0], 0) + 1
        assert all(n == 1 for n in counts.values())
        for key in dump.at_start:
            if key not in touched:
                assert counts.get(key) == 1, f"{dump.table}: unchanged key {key} not dumped once"


@pytest.mark.parametrize("strategy", STRATEGIES)
@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_merge_against_a_simulated_database(strategy: str, data: st.DataObject) -> None:
    sim = Sim(strategy, data)
    sim.run()
    target(float(sim.judged), label="SELECTs that missed a change already emitted")
    check(sim)
