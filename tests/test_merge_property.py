"""Property test: the merge against a simulated database, for every watermark strategy.

The simulation owns two tables whose keys come from a small range (so keys are deleted and
reused), a change log, and the merge. Random steps write transactions, feed the log to the
merge (the reader lags behind the database by a random amount), write heartbeats, and advance
one dump per table: chunks are keyset pages ``key > last ORDER BY key LIMIT n`` up to the
largest key at dump start, executed the way each strategy's executor does it:

- ``table``: register, write LW; (writes); SELECT; (writes); write HW — writes and log feeding
  happen between these steps, and other chunks run in between too;
- ``xid``: (PostgreSQL) snapshot with xmin:xmax:xip of concurrent transactions, SELECT,
  commits, read the WAL position as ``close_at``, register — the reader is paused throughout;
- ``gtid-mysql`` / ``gtid-mariadb``: low set, writes, SELECT, writes, high set, writes,
  binlog position as ``close_at``, register;
- ``position`` (MariaDB): snapshot binlog position, SELECT, writes, ``close_at``, register.

Rows are sometimes supplied late (but before the reader passes the window). The tables start
with rows that are never logged, so only the dump can bring them to the output.

Checked: output positions strictly increase; every dumped row equals the table's true value at
the point of the log where it is placed; each chunk emits exactly its selected rows minus the
keys changed in its window (computed from the simulation, not from the windows); replaying the
output converges to the final tables; every row unchanged during its table's dump is emitted
exactly once as ``r``; chunk statistics add up.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass, field
from itertools import pairwise
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from airflow_dblog.events import ChangeEvent, Heartbeat, LogItem, TableId, WatermarkEvent
from airflow_dblog.gtid import GtidSet, parse_gtid_set
from airflow_dblog.merge import ClosedChunk, WatermarkMerge
from airflow_dblog.position import Position
from airflow_dblog.window import GtidWindow, PositionWindow, SnapshotXidWindow, TableWindow

TABLES = (TableId("app", "a"), TableId("app", "b"))
KEYS = 10
UUIDS = ("3e11fa47-71ca-11e1-9e33-c80aa9429562", "aaaaaaaa-bbbb-cccc-dddd-eeeeeeeeeeee")
STRATEGIES = ("table", "xid", "gtid-mysql", "gtid-mariadb", "position")

Row = dict[str, Any]


@dataclass
class ChunkRecord:
    chunk_id: int
    table: TableId
    selected: list[tuple[tuple[int], Row]]
    changed: set[int] = field(default_factory=set)  # oracle: keys changed in the window
    low: str = ""
    high: str = ""
    lw_index: int = -1


@dataclass
class Dump:
    table: TableId
    dump_id: int
    max_key: int | None = None
    last: int | None = None
    started: bool = False
    done: bool = False
    active: ChunkRecord | None = None  # table strategy: between LW and HW
    phase: int = 0
    start_index: int = 0
    end_index: int = 0
    at_start: dict[int, Row] = field(default_factory=dict)


class Sim:
    def __init__(self, strategy: str, data: st.DataObject) -> None:
        self.strategy, self.data = strategy, data
        self.pg = strategy == "xid"
        self.chunk_size = data.draw(st.integers(1, 4), label="chunk_size")
        self.initial: dict[TableId, dict[int, Row]] = {}
        for t in TABLES:
            keys = data.draw(st.sets(st.integers(0, KEYS - 1)), label=f"initial {t.table}")
            self.initial[t] = {k: {"id": k, "v": f"{t.table}{k}@init"} for k in sorted(keys)}
        self.state = copy.deepcopy(self.initial)
        self.log: list[LogItem] = []
        self.fed = 0
        self.merge = WatermarkMerge()
        self.out: list[ChangeEvent] = []
        self.closed: list[ClosedChunk] = []
        self.version = 0
        # MySQL-like binlog: a transaction fills [offset, offset + 10), its rows event at +5
        self.file, self.offset = 1, 4
        # PostgreSQL: commit LSNs and 64-bit xids (the log carries the low 32 bits)
        self.lsn = 1000
        self.next_xid = data.draw(
            st.sampled_from([3, 2**32 - 4, 5 * 2**32 - 3, 2**40 + 17]), label="xid base"
        )
        self.running: list[int] = []  # xids in progress, in begin order
        self.xid_of: dict[int, int] = {}  # log index -> full xid
        # GTIDs
        self.gtids: GtidSet = parse_gtid_set("", "mariadb" if strategy == "gtid-mariadb" else None)
        self.gno = {u: 0 for u in UUIDS}
        self.seq = {0: 0, 1: 0}
        # dumps and chunks
        self.dumps = {t: Dump(t, i + 1) for i, t in enumerate(TABLES)}
        self.chunks: dict[int, ChunkRecord] = {}
        self.next_chunk = 1
        self.pending: dict[int, tuple[list[Any], Callable[[LogItem, int], bool]]] = {}

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

    def current(self) -> Position:
        """Where the log ends now: a heartbeat there, or a close_at read now."""
        return (
            Position.postgres(self.lsn + 1) if self.pg else Position.mysql(self.file, self.offset)
        )

    def changes(self) -> list[tuple[TableId, int, bool]]:
        """One or two (table, key, delete-if-present) changes, from a single draw."""
        x = self.draw(st.integers(0, 6 * KEYS - 1), "tx")
        table, key, delete = TABLES[x % 2], (x // 2) % KEYS, bool((x // (2 * KEYS)) % 3 == 1)
        picked = [(table, key, delete)]
        if x // (2 * KEYS) == 2:  # a second row in the same transaction, in the other table
            picked.append((TABLES[(x + 1) % 2], (key * 7 + 3) % KEYS, key % 2 == 0))
        return picked

    def commit(self, targets: list[tuple[TableId, int, bool]], xid: int | None = None) -> None:
        if self.pg:
            self.lsn += 1 + self.version % 3  # sometimes right at a close_at read just before
        gtid = self.new_gtid(targets[0][1]) if self.strategy.startswith("gtid") else None
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
            if xid is not None:
                self.xid_of[len(self.log)] = xid
            self.log.append(event)
        self.end_tx()

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
        self.log.append(WatermarkEvent("s", value, self.next_position()))
        self.end_tx()
        return len(self.log) - 1

    def heartbeat(self) -> None:
        self.log.append(Heartbeat(self.current()))

    def rotate(self) -> None:
        if not self.pg:
            self.file, self.offset = self.file + 1, 4

    # ------------------------------------------------------------------------------ reader

    def feed(self, n: int) -> None:
        for _ in range(n):
            if self.fed >= len(self.log):
                return
            item = self.log[self.fed]
            for chunk_id, (rows, due) in list(self.pending.items()):
                if due(
                    item, self.fed
                ):  # the executor supplies rows before the reader passes the window
                    self.merge.set_rows(chunk_id, rows)
                    del self.pending[chunk_id]
            self.out.extend(self.merge.feed(item))
            self.closed.extend(self.merge.pop_closed())
            self.fed += 1

    def supply(self, chunk_id: int, rows: list[Any], due: Callable[[LogItem, int], bool]) -> None:
        if self.draw(st.booleans(), "rows later?"):
            self.pending[chunk_id] = (rows, due)
        else:
            self.merge.set_rows(chunk_id, rows)

    # ------------------------------------------------------------------------------- dumps

    def select(self, dump: Dump) -> list[tuple[tuple[int], Row]]:
        assert dump.max_key is not None
        keys = sorted(
            k
            for k in self.state[dump.table]
            if (dump.last is None or k > dump.last) and k <= dump.max_key
        )[: self.chunk_size]
        return [((k,), dict(self.state[dump.table][k])) for k in keys]

    def changed_keys(self, table: TableId, lo: int, hi: int, keep: Callable[[int], bool]) -> set:
        return {
            e.key[0]
            for i, e in enumerate(self.log[lo:hi], start=lo)
            if isinstance(e, ChangeEvent) and e.table == table and keep(i)
        }

    def advance(self, dump: Dump) -> None:
        if dump.done:
            return
        if not dump.started:
            dump.started, dump.start_index = True, len(self.log)
            dump.at_start = copy.deepcopy(self.state[dump.table])
            dump.max_key = max(self.state[dump.table], default=None)
            if dump.max_key is None:
                dump.done, dump.end_index = True, len(self.log)
            return
        if self.strategy == "table":
            self.advance_table(dump)
            return
        chunk = ChunkRecord(self.next_chunk, dump.table, [])
        self.next_chunk += 1
        t = dump.table
        if self.strategy == "xid":
            xmin = min(self.running, default=self.next_xid)
            xmax, xip = self.next_xid, frozenset(self.running)
            snap = len(self.log)
            chunk.selected = self.select(dump)
            self.writes(3, "writes after snapshot")
            close_at, close = self.current(), len(self.log)
            window: Any = SnapshotXidWindow(xmin, xmax, xip, close_at)
            chunk.changed = self.changed_keys(
                t, snap, close, lambda i: self.xid_of[i] >= xmax or self.xid_of[i] in xip
            )
            due_index = close
        elif self.strategy.startswith("gtid"):
            low, lo = self.gtids, len(self.log)
            self.writes(2, "writes after low")
            chunk.selected = self.select(dump)
            self.writes(2, "writes after select")
            high, hi = self.gtids, len(self.log)
            self.writes(2, "writes after high")
            close_at = self.current()
            window = GtidWindow(low, high, close_at)
            chunk.changed = self.changed_keys(t, lo, hi, lambda i: True)
            due_index = hi
        else:
            start, snap = self.current(), len(self.log)
            chunk.selected = self.select(dump)
            self.writes(3, "writes after snapshot")
            close_at, close = self.current(), len(self.log)
            window = PositionWindow(start, close_at)
            chunk.changed = self.changed_keys(t, snap, close, lambda i: True)
            due_index = close
        self.merge.open_chunk(chunk.chunk_id, dump.dump_id, t, window)
        self.chunks[chunk.chunk_id] = chunk

        def due(item: LogItem, at: int, limit: Position = close_at, index: int = due_index) -> bool:
            return at >= index or item.position.log_part() >= limit.log_part()

        self.supply(chunk.chunk_id, chunk.selected, due)
        self.next_page(dump, chunk)

    def advance_table(self, dump: Dump) -> None:
        if dump.phase == 0:  # register, then write the low watermark
            chunk = ChunkRecord(self.next_chunk, dump.table, [])
            self.next_chunk += 1
            chunk.low, chunk.high = f"L{chunk.chunk_id}", f"H{chunk.chunk_id}"
            self.merge.open_chunk(
                chunk.chunk_id, dump.dump_id, dump.table, TableWindow(chunk.low, chunk.high)
            )
            self.chunks[chunk.chunk_id] = chunk
            chunk.lw_index = self.watermark(chunk.low)
            dump.active, dump.phase = chunk, 1
        elif dump.phase == 1:  # the SELECT
            chunk = dump.active
            assert chunk is not None
            chunk.selected = self.select(dump)
            high = chunk.high

            def due(item: LogItem, at: int) -> bool:
                return isinstance(item, WatermarkEvent) and item.value == high

            self.supply(chunk.chunk_id, chunk.selected, due)
            dump.phase = 2
        else:  # the high watermark
            chunk = dump.active
            assert chunk is not None
            hw = self.watermark(chunk.high)
            chunk.changed = self.changed_keys(dump.table, chunk.lw_index + 1, hw, lambda i: True)
            dump.active, dump.phase = None, 0
            self.next_page(dump, chunk)

    def next_page(self, dump: Dump, chunk: ChunkRecord) -> None:
        if len(chunk.selected) < self.chunk_size:
            dump.done, dump.end_index = True, len(self.log)
        else:
            dump.last = chunk.selected[-1][0][0]

    # --------------------------------------------------------------------------------- run

    def run(self) -> None:
        steps = self.draw(st.integers(0, 60), "steps")
        for _ in range(steps):
            action = self.draw(st.integers(0, 6), "action")
            if action <= 1:
                self.write()
            elif action == 2:
                self.feed(self.draw(st.integers(1, 6), "feed"))
            elif action <= 4:
                self.advance(self.dumps[self.draw(st.sampled_from(TABLES), "dump")])
            elif action == 5:
                self.heartbeat()
            else:
                self.rotate()
        while not all(d.done for d in self.dumps.values()):
            for dump in self.dumps.values():
                self.advance(dump)
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
    assert sim.merge.open_count() == 0 and not sim.pending
    assert sim.fed == len(sim.log)

    # log events come out unchanged, in log order, none lost
    assert [e for e in out if e.op != "r"] == [e for e in sim.log if isinstance(e, ChangeEvent)]

    # no time travel: positions strictly increase, overall and so per key
    positions = [e.position for e in out]
    assert all(a < b for a, b in pairwise(positions)), "positions must increase"
    last: dict[tuple[TableId, int], Position] = {}
    for e in out:
        k = (e.table, e.key[0])
        assert k not in last or last[k] < e.position
        last[k] = e.position

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

    # each chunk: exactly the selected rows whose key did not change in the window, in key order
    dumped: dict[int, list[ChangeEvent]] = {}
    for e in out:
        if e.op == "r":
            assert e.chunk_id is not None
            dumped.setdefault(e.chunk_id, []).append(e)
    closed = {c.chunk_id: c for c in sim.closed}
    assert set(closed) == set(sim.chunks)
    for chunk in sim.chunks.values():
        got = [(e.key, e.after) for e in dumped.get(chunk.chunk_id, [])]
        want = [(k, r) for k, r in chunk.selected if k[0] not in chunk.changed]
        assert got == want, f"chunk {chunk.chunk_id}: window changes {chunk.changed}"
        c = closed[chunk.chunk_id]
        assert (c.selected, c.emitted) == (len(chunk.selected), len(want))
        assert c.dropped == c.selected - c.emitted
        assert c.table == chunk.table

    # convergence: the output alone rebuilds the final tables (initial rows were never logged)
    assert replay(out) == sim.state

    # every row unchanged during its table's dump is dumped exactly once
    for dump in sim.dumps.values():
        touched = {
            e.key[0]
            for e in sim.log[dump.start_index : dump.end_index]
            if isinstance(e, ChangeEvent) and e.table == dump.table
        }
        counts: dict[int, int] = {}
        for e in out:
            if e.op == "r" and e.table == dump.table:
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
    check(sim)
