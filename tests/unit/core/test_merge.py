"""The watermark merge on hand-written logs: the DBLog paper's example and one case per rule."""

from __future__ import annotations

import pytest

from airflow_dblog.core.events import ChangeEvent, Heartbeat, TableId, WatermarkEvent
from airflow_dblog.core.gtid import parse_gtid_set
from airflow_dblog.core.merge import (
    DumpedRows,
    HistoryLost,
    MergeError,
    Seen,
    WatermarkMerge,
    expand,
    removed,
)
from airflow_dblog.core.position import Position
from airflow_dblog.core.window import (
    GtidWindow,
    HighWatermarkWindow,
    PositionWindow,
    SnapshotXidWindow,
    TableWindow,
    WindowError,
    XidSnapshot,
)
from tests.support.merge_helpers import ChunkRows, ChunkSpec, ExpandingMerge, feed_all, merge, run

T = TableId("app", "t")
OTHER = TableId("app", "other")
UUID = "3e11fa47-71ca-11e1-9e33-c80aa9429562"


# A MySQL table window is registered before its LW is written, while the reader may still be
# behind: changes fed between registration and the LW were seen by the SELECT.
REGISTERED = pytest.mark.parametrize("registered", ["at the low watermark", "up front"])


def pos(offset: int) -> Position:
    return Position.mysql(1, offset)


def ev(key: str | int, offset: int, op: str = "u", table: TableId = T, **kw: object) -> ChangeEvent:
    after = None if op == "d" else {"id": key, "v": f"log@{offset}"}
    return ChangeEvent(table, op, (key,), pos(offset), after=after, **kw)  # type: ignore[arg-type]


def wm(value: str, offset: int) -> WatermarkEvent:
    return WatermarkEvent("s", value, pos(offset))


def rows(*keys: str | int) -> list[tuple[tuple[object, ...], dict[str, object]]]:
    return [((k,), {"id": k, "v": "dump"}) for k in keys]


def summary(out: list[ChangeEvent]) -> list[tuple[str, object, Position]]:
    return [(e.op, e.key[0], e.position) for e in out]


def stats(dumped: DumpedRows, out: list[ChangeEvent]) -> tuple[int, int, int]:
    """(selected, dropped, emitted) of one chunk, as the capture records them: emitted counted
    in the expanded output, dropped the rest of what was selected."""
    emitted = sum(1 for e in out if e.op == "r" and e.chunk_id == dumped.chunk_id)
    return dumped.selected, dumped.selected - emitted, emitted


def keys(changed: frozenset[tuple[object, ...]]) -> list[object]:
    return sorted((k[0] for k in changed), key=str)


# ------------------------------------------------------------------------- the paper's example


@REGISTERED
def test_paper_example_chunk_k1_to_k6(registered: str):
    """DBLog paper, watermark-based chunk selection: a chunk selects k1..k6 between the low (L)
    and high (H) watermark; the log shows changes to k1 and k3 between L and H, so those rows are
    dropped and k2, k4, k5, k6 are appended right after H, before the log continues. The chunk
    is registered before the log is read, or once k2 was fed: same output."""
    chunk = ChunkSpec(1, 7, T, TableWindow("L", "H"), rows("k1", "k2", "k3", "k4", "k5", "k6"))
    log = [
        ev("k2", 10),  # before L: the SELECT sees it, nothing to do
        *([chunk] if registered == "at the low watermark" else []),
        wm("L", 20),
        ev("k1", 30),
        ev("k3", 40),
        wm("H", 50),
        ev("k5", 60),  # after H: newer than the dumped k5, and emitted after it
    ]
    out, [d] = run(log, [chunk] if registered == "up front" else [])
    h = pos(50)
    # row i of the SELECT keeps index i: the dropped k1 and k3 leave gaps
    assert summary(out) == [
        ("u", "k2", pos(10)),
        ("u", "k1", pos(30)),
        ("u", "k3", pos(40)),
        ("r", "k2", h.dumped_row(1)),
        ("r", "k4", h.dumped_row(3)),
        ("r", "k5", h.dumped_row(4)),
        ("r", "k6", h.dumped_row(5)),
        ("u", "k5", pos(60)),
    ]
    assert (d.chunk_id, d.dump_id, d.table, d.position, d.first_index) == (1, 7, T, h, 0)
    assert keys(d.changed) == ["k1", "k3"]
    assert stats(d, out) == (6, 2, 4)
    dumped = [e for e in out if e.op == "r"]
    assert all(e.before is None and e.after == {"id": e.key[0], "v": "dump"} for e in dumped)
    assert all((e.dump_id, e.chunk_id, e.table) == (7, 1, T) for e in dumped)
    # positions: the dumped rows sort right after H and before the next log event
    assert [e.position for e in out] == sorted(e.position for e in out)
    assert str(pos(50)) < str(h.dumped_row(0)) < str(h.dumped_row(5)) < str(pos(60))


def test_paper_example_rows_arrive_after_the_low_watermark_was_seen():
    """The log may run ahead of the SELECT: L and the k1/k3 changes are fed before the rows."""
    m = ExpandingMerge()
    m.open_chunk(1, 7, T, TableWindow("L", "H"))
    out = feed_all(m, [wm("L", 20), ev("k1", 30), ev("k3", 40)])
    assert m.pop_dumped() == []
    m.rows_ready(1, rows("k1", "k2", "k3", "k4", "k5", "k6"))
    out += m.feed(wm("H", 50))
    assert [(e.op, e.key[0]) for e in out] == [
        ("u", "k1"),
        ("u", "k3"),
        ("r", "k2"),
        ("r", "k4"),
        ("r", "k5"),
        ("r", "k6"),
    ]
    [d] = m.pop_dumped()
    assert (d.chunk_id, d.dump_id, d.table) == (1, 7, T)
    assert (d.selected, d.position, d.first_index) == (6, pos(50), 0)
    assert keys(d.changed) == ["k1", "k3"]
    assert stats(d, out) == (6, 2, 4)
    assert m.open_count() == 0


# ------------------------------------------------------------------------------ table windows


def test_log_events_are_emitted_immediately_and_watermarks_and_heartbeats_never():
    m = WatermarkMerge()
    m.open_chunk(1, 1, T, TableWindow("L", "H"))
    assert m.feed(wm("L", 1)) == []
    assert m.feed(Heartbeat(pos(2))) == []
    e = ev(1, 3)
    assert m.feed(e) == [e]
    m.rows_ready(1, 0, "no file")
    # an empty chunk still closes: one DumpedRows with nothing to expand
    assert m.feed(wm("H", 4)) == [
        DumpedRows(1, 1, T, 0, pos(4), 0, frozenset({(1,)}), "no file", e.ts_ms, low=pos(1))
    ]
    assert m.open_count() == 0 and m.open_ids() == set()


def test_delete_in_window_drops_the_key_and_new_keys_just_flow():
    log = [wm("L", 1), ev(2, 2, op="d"), ev(9, 3, op="c"), wm("H", 4)]
    out, [d] = run(log, [ChunkSpec(1, 1, T, TableWindow("L", "H"), rows(1, 2, 3))])
    assert summary(out) == [
        ("d", 2, pos(2)),
        ("c", 9, pos(3)),
        ("r", 1, pos(4).dumped_row(0)),
        ("r", 3, pos(4).dumped_row(2)),
    ]
    assert keys(d.changed) == [2, 9]  # 9 is no row of the chunk: nothing to drop for it
    assert stats(d, out) == (3, 1, 2)


@REGISTERED
def test_changes_outside_the_window_or_of_other_tables_keep_the_row(registered: str):
    chunk = ChunkSpec(1, 1, T, TableWindow("L", "H"), rows(1, 2, 3))
    log = [
        ev(1, 1),  # before L
        *([chunk] if registered == "at the low watermark" else []),
        wm("L", 2),
        ev(2, 3, table=OTHER),  # same key, other table
        wm("H", 4),
        ev(3, 5),  # after H
    ]
    out, [d] = run(log, [chunk] if registered == "up front" else [])
    assert d.changed == frozenset()
    assert [(e.op, e.table.table, e.key[0]) for e in out] == [
        ("u", "t", 1),
        ("u", "other", 2),
        ("r", "t", 1),
        ("r", "t", 2),
        ("r", "t", 3),
        ("u", "t", 3),
    ]


def test_high_watermark_without_low_is_an_error():
    m = WatermarkMerge()
    m.open_chunk(1, 1, T, TableWindow("L", "H"))
    m.rows_ready(1, 1)
    with pytest.raises(WindowError, match="before it opened"):
        m.feed(wm("H", 5))


def test_window_closing_before_rows_are_known_is_a_bug():
    m = WatermarkMerge()
    m.open_chunk(1, 1, T, TableWindow("L", "H"))
    m.feed(wm("L", 1))
    with pytest.raises(MergeError, match="before its rows were ready"):
        m.feed(wm("H", 2))


def test_every_key_changed_in_the_window_is_kept_before_and_after_the_rows_are_ready():
    """The merge never sees the rows, only their count: it keeps every key of the table changed
    inside the window, for the whole window, and the sink drops those among the rows."""
    m = ExpandingMerge()
    m.open_chunk(1, 1, T, TableWindow("L", "H"))
    feed_all(m, [wm("L", 1), ev(1, 2), ev(50, 3), ev(99, 4)])
    m.rows_ready(1, rows(1, 2, 3))
    m.feed(ev(3, 5))
    out = m.feed(wm("H", 6))
    assert summary(out) == [("r", 2, pos(6).dumped_row(1))]
    [d] = m.pop_dumped()
    assert keys(d.changed) == [1, 3, 50, 99]
    assert stats(d, out) == (3, 2, 1)


def test_two_overlapping_chunks_of_two_tables_close_at_their_own_high_watermarks():
    log = [
        ChunkSpec(1, 1, T, TableWindow("L1", "H1")),
        wm("L1", 1),
        ChunkSpec(2, 2, OTHER, TableWindow("L2", "H2")),
        ev(1, 2),  # in window 1 only (window 2 not open yet)
        wm("L2", 3),
        ev(2, 4),  # table t: in window 1
        ev(1, 5, table=OTHER),  # table other: in window 2
        ChunkRows(1, rows(1, 2, 3)),
        wm("H1", 6),
        ev(2, 7, table=OTHER),  # in window 2
        ChunkRows(2, rows(1, 2, 3)),
        wm("H2", 8),
    ]
    out = merge(log)
    assert [(e.op, e.table.table, e.key[0], e.position) for e in out] == [
        ("u", "t", 1, pos(2)),
        ("u", "t", 2, pos(4)),
        ("u", "other", 1, pos(5)),
        ("r", "t", 3, pos(6).dumped_row(2)),
        ("u", "other", 2, pos(7)),
        ("r", "other", 3, pos(8).dumped_row(2)),
    ]


def test_two_chunks_of_one_table_with_nested_windows():
    m = ExpandingMerge()
    m.open_chunk(1, 1, T, TableWindow("L1", "H1"))
    m.open_chunk(2, 1, T, TableWindow("L2", "H2"))
    m.rows_ready(1, rows(1, 2))
    m.rows_ready(2, rows(3, 4))
    out = feed_all(m, [wm("L1", 1), wm("L2", 2), ev(4, 3), wm("H2", 4), ev(1, 5), wm("H1", 6)])
    assert summary(out) == [
        ("u", 4, pos(3)),
        ("r", 3, pos(4).dumped_row(0)),
        ("u", 1, pos(5)),
        ("r", 2, pos(6).dumped_row(1)),
    ]
    dumped = m.pop_dumped()
    assert [(d.chunk_id, *stats(d, out)) for d in dumped] == [(2, 2, 1, 1), (1, 2, 1, 1)]
    assert [keys(d.changed) for d in dumped] == [[4], [1, 4]]


# --------------------------------------------------------------------------- snapshot (xid)


def pg(lsn: int, change: int = 0) -> Position:
    return Position.postgres(lsn, change)


def pev(key: int, lsn: int, xid: int, op: str = "u", table: TableId = T) -> ChangeEvent:
    after = None if op == "d" else {"id": key, "v": f"xid{xid}"}
    return ChangeEvent(table, op, (key,), pg(lsn), after=after, xid=xid)  # type: ignore[arg-type]


def test_xid_window_drops_exactly_the_keys_of_invisible_transactions():
    # snapshot 100:105:[100,103]: 99 committed before; 101, 102, 104 committed; 100 and 103
    # were running; 105 and later had not started
    window = SnapshotXidWindow(100, 105, frozenset({100, 103}), close_at=pg(1000))
    log = [
        pev(1, 500, 99),  # visible (below xmin)
        pev(2, 510, 101),  # visible (between, not in progress)
        pev(3, 520, 100),  # invisible: xmin itself, in progress
        pev(4, 530, 103),  # invisible: in progress
        pev(5, 540, 104),  # visible: xmax - 1
        pev(6, 550, 105),  # invisible: xmax
        pev(7, 1000, 106),  # at close_at: the window closes before it
    ]
    out = merge(log, [ChunkSpec(1, 1, T, window, rows(1, 2, 3, 4, 5, 6, 7))])
    assert summary(out) == [
        ("u", 1, pg(500)),
        ("u", 2, pg(510)),
        ("u", 3, pg(520)),
        ("u", 4, pg(530)),
        ("u", 5, pg(540)),
        ("u", 6, pg(550)),
        ("r", 1, pg(550).dumped_row(0)),
        ("r", 2, pg(550).dumped_row(1)),
        ("r", 5, pg(550).dumped_row(4)),
        ("r", 7, pg(550).dumped_row(6)),
        ("u", 7, pg(1000)),
    ]


def test_xid_window_handles_32_bit_xids_across_the_wraparound():
    epoch = 3 << 32
    xmax = epoch + 5  # the snapshot was taken just after xids wrapped into epoch 3
    window = SnapshotXidWindow(epoch - 10, xmax, frozenset({epoch - 2}), close_at=pg(900))
    log = [
        pev(1, 100, 2**32 - 20),  # epoch 2, below xmin: visible
        pev(2, 110, 2**32 - 2),  # epoch 2, in progress: invisible
        pev(3, 120, 3),  # epoch 3, committed before xmax: visible
        pev(4, 130, 5),  # epoch 3, = xmax: invisible
        Heartbeat(pg(900)),
    ]
    out = merge(log, [ChunkSpec(1, 1, T, window, rows(1, 2, 3, 4))])
    assert [e.key[0] for e in out if e.op == "r"] == [1, 3]


def test_xid_window_closes_at_a_heartbeat_on_an_idle_source():
    m = ExpandingMerge()
    m.feed(pev(9, 100, 50))
    m.open_chunk(1, 1, T, SnapshotXidWindow(51, 51, frozenset(), close_at=pg(101)))
    m.rows_ready(1, rows(1, 2))
    assert m.feed(Heartbeat(pg(100, 5))) == []  # not there yet
    out = m.feed(Heartbeat(pg(101)))
    # rows go after the last *event* emitted, not at the heartbeat
    assert summary(out) == [("r", 1, pg(100).dumped_row(0)), ("r", 2, pg(100).dumped_row(1))]
    # a change at exactly the heartbeat's position still sorts after the rows
    nxt = pev(1, 101, 51)
    assert m.feed(nxt) == [nxt]
    assert nxt.position > out[-1].position


def test_chunks_closing_at_the_same_point_get_distinct_positions():
    m = ExpandingMerge()
    m.feed(pev(9, 100, 50))
    m.open_chunk(1, 1, T, SnapshotXidWindow(51, 51, frozenset(), close_at=pg(200)))
    m.open_chunk(2, 1, OTHER, SnapshotXidWindow(51, 51, frozenset(), close_at=pg(150)))
    m.rows_ready(1, rows(1, 2))
    m.rows_ready(2, rows(1))
    out = m.feed(Heartbeat(pg(300)))
    assert [(e.table.table, e.key[0], e.position) for e in out] == [
        ("t", 1, pg(100).dumped_row(0)),
        ("t", 2, pg(100).dumped_row(1)),
        ("other", 1, pg(100).dumped_row(2)),
    ]
    assert [(d.chunk_id, d.position, d.first_index) for d in m.pop_dumped()] == [
        (1, pg(100), 0),
        (2, pg(100), 2),
    ]


def test_a_chunk_closing_at_the_same_point_counts_every_selected_row_of_the_one_before():
    """Row indices count selected rows, dropped ones too (the sink decides which go out), so
    the next chunk at the same base starts after all of them; an empty chunk takes none."""
    m = ExpandingMerge()
    m.feed(pev(9, 100, 50))
    for chunk_id in (1, 2, 3):
        m.open_chunk(chunk_id, 1, T, SnapshotXidWindow(51, 52, frozenset(), close_at=pg(200)))
    m.feed(pev(1, 110, 52))  # key 1 changed after the snapshots (xid 52 = xmax): missed
    m.rows_ready(1, rows(1, 2))
    m.rows_ready(2, [])
    m.rows_ready(3, rows(1, 3))
    out = m.feed(Heartbeat(pg(200)))
    base = pg(110)
    assert summary(out) == [("r", 2, base.dumped_row(1)), ("r", 3, base.dumped_row(3))]
    dumped = m.pop_dumped()
    assert [(d.chunk_id, d.position, d.first_index, d.selected) for d in dumped] == [
        (1, base, 0, 2),
        (2, base, 2, 0),
        (3, base, 2, 2),
    ]
    assert [stats(d, out) for d in dumped] == [(2, 1, 1), (0, 0, 0), (2, 1, 1)]
    nxt = pev(4, 300, 53)
    assert m.feed(nxt) == [nxt] and nxt.position > out[-1].position


def test_events_without_xid_count_as_inside_the_window():
    window = SnapshotXidWindow(10, 10, frozenset(), close_at=pg(1000))
    bare = ChangeEvent(T, "u", (1,), pg(5), after={"id": 1})
    out = merge([bare, Heartbeat(pg(1000))], [ChunkSpec(1, 1, T, window, rows(1, 2))])
    assert [e.key[0] for e in out if e.op == "r"] == [2]


# -------------------------------------------------------------------------------------- gtid


def gev(key: int, offset: int, gno: int, table: TableId = T) -> ChangeEvent:
    return ev(key, offset, table=table, gtid=f"{UUID}:{gno}")


def test_gtid_window_drops_keys_changed_after_the_low_set():
    window = GtidWindow.from_strings(f"{UUID}:1-10", f"{UUID}:1-13", close_at=pos(500))
    log = [
        gev(1, 100, 9),  # in low: the SELECT saw it
        gev(2, 110, 11),  # not in low: inside
        gev(3, 120, 13),  # not in low, in high: inside
        gev(4, 130, 14),  # not in high: the window closes before it
    ]
    out, [d] = run(log, [ChunkSpec(1, 1, T, window, rows(1, 2, 3, 4))])
    assert summary(out) == [
        ("u", 1, pos(100)),
        ("u", 2, pos(110)),
        ("u", 3, pos(120)),
        ("r", 1, pos(120).dumped_row(0)),
        ("r", 4, pos(120).dumped_row(3)),
        ("u", 4, pos(130)),
    ]
    assert keys(d.changed) == [2, 3]  # key 4's change comes after the window closed


def test_gtid_window_closes_at_close_at_or_heartbeat_when_idle():
    window = GtidWindow.from_strings(f"{UUID}:1-10", f"{UUID}:1-10", close_at=pos(500))
    m = ExpandingMerge()
    m.feed(gev(9, 100, 10))
    m.open_chunk(1, 1, T, window)
    m.rows_ready(1, rows(1))
    assert m.feed(Heartbeat(pos(499))) == []
    assert summary(m.feed(Heartbeat(pos(500)))) == [("r", 1, pos(100).dumped_row(0))]


def test_gtid_window_with_mariadb_positions():
    window = GtidWindow(
        parse_gtid_set("0-1-100,1-1-7"), parse_gtid_set("0-1-102,1-1-7"), close_at=pos(900)
    )
    log = [
        ev(1, 100, gtid="0-1-100"),  # seen by the SELECT
        ev(2, 110, gtid="1-1-7"),  # seen
        ev(3, 120, gtid="0-2-101"),  # after low: inside
        ev(4, 130, gtid="2-1-1"),  # new domain, not in high: closes first
    ]
    out = merge(log, [ChunkSpec(1, 1, T, window, rows(1, 2, 3, 4))])
    assert [(e.op, e.key[0]) for e in out] == [
        ("u", 1),
        ("u", 2),
        ("u", 3),
        ("r", 1),
        ("r", 2),
        ("r", 4),
        ("u", 4),
    ]


# --------------------------------------------------------------------------- position window


def test_position_window_drops_keys_changed_after_the_snapshot_position():
    window = PositionWindow(start=pos(200), close_at=pos(300))
    log = [ev(1, 150), ev(2, 250), Heartbeat(pos(280)), ev(3, 300)]
    out = merge(log, [ChunkSpec(1, 1, T, window, rows(1, 2, 3))])
    assert summary(out) == [
        ("u", 1, pos(150)),
        ("u", 2, pos(250)),
        ("r", 1, pos(250).dumped_row(0)),
        ("r", 3, pos(250).dumped_row(2)),
        ("u", 3, pos(300)),
    ]


def test_a_window_registered_after_the_log_passed_it_judges_what_was_read():
    """Log order is not visibility order: key 1 was logged (and emitted) before the snapshot
    that missed it was taken; its dumped row must not follow the newer logged value."""
    m = ExpandingMerge()
    assert [e.key for e in m.feed(ev(1, 250))] == [(1,)]
    m.feed(ev(1, 255, table=OTHER))  # another table's key 1: no conflict
    m.open_chunk(1, 1, T, PositionWindow(start=pos(200), close_at=pos(200)))
    m.rows_ready(1, rows(1, 2))
    out = m.feed(Heartbeat(pos(260)))  # the log is past the window: rows go out now
    assert summary(out) == [("r", 2, pos(255).dumped_row(1))]
    [d] = m.pop_dumped()
    assert keys(d.changed) == [1]
    assert stats(d, out) == (2, 1, 1)


def test_the_memory_is_trimmed_by_the_horizon_and_a_gap_refuses_windows():
    m = ExpandingMerge(history_limit=2)
    for i, offset in enumerate((10, 20, 30)):
        m.feed(ev(i, offset))
    assert not m.remembers_all  # change 0 was dropped while a window might need it
    with pytest.raises(HistoryLost):
        m.open_chunk(1, 1, T, PositionWindow(start=pos(5), close_at=pos(40)))
    m.open_chunk(2, 1, T, TableWindow("lw", "hw"))  # judges no past: no memory needed
    assert m.forget(lambda s: s.position <= pos(20)) == 1
    assert m.remembers_all  # the horizon passed everything that was dropped
    m.open_chunk(3, 1, T, PositionWindow(start=pos(25), close_at=pos(40)))
    m.rows_ready(3, rows(1, 2))
    assert summary(m.feed(Heartbeat(pos(40)))) == [
        ("r", 1, pos(30).dumped_row(0)),
    ]  # key 2 was changed at 30, past the snapshot, before the window existed


def test_a_restarted_merge_refuses_windows_until_the_horizon_passes_the_unknown_past():
    m = WatermarkMerge(unknown_past=Seen(None, (), pos(0), xid=41))
    window = SnapshotXidWindow(40, 45, frozenset({41}), close_at=pos(100))
    assert not m.remembers_all
    with pytest.raises(HistoryLost):
        m.open_chunk(1, 1, T, window)
    m.forget(SnapshotXidWindow(41, 45, frozenset(), close_at=pos(1)).forgettable)
    assert not m.remembers_all  # xid 41 may be one of the unknown, still running at xmin 41
    m.forget(SnapshotXidWindow(42, 45, frozenset(), close_at=pos(1)).forgettable)
    assert m.remembers_all
    m.open_chunk(1, 1, T, window)


def _pg(key: int, lsn: int, xid: int) -> ChangeEvent:
    """A wal2json change: the log carries the low 32 bits of the xid."""
    after = {"id": key, "v": f"log@{lsn}"}
    return ChangeEvent(T, "u", (key,), Position.postgres(lsn), after=after, xid=xid & 0xFFFFFFFF)


def _dump_after_lost_memory(m: ExpandingMerge, snap: XidSnapshot) -> list[ChangeEvent]:
    """The horizon of ``snap`` (its xid ``xmin`` still invisible), then a chunk selecting key 2
    in that snapshot: key 2's logged change was invisible to it, so no row may follow it."""
    m.forget(snap.older)
    if not m.remembers_all:
        return []  # refused, as it must be: the change the window needs was dropped
    m.open_chunk(1, 1, T, SnapshotXidWindow(snap.xmin, snap.xmax, snap.xip, Position.postgres(99)))
    m.rows_ready(1, [((2,), {"id": 2, "v": "before the invisible update"})])
    return [e for e in m.feed(Heartbeat(Position.postgres(99))) if e.op == "r"]


def test_dropped_memory_is_not_forgotten_early_across_the_32_bit_xid_wraparound():
    m = ExpandingMerge(history_limit=1)
    m.feed(_pg(1, 10, 2**32 - 2))
    m.feed(_pg(2, 20, 2**32 + 1))  # logged as xid 1; still invisible below
    m.feed(_pg(3, 30, 2**32 - 1))  # the memory drops key 1's change, then key 2's
    snap = XidSnapshot(2**32 + 1, 2**32 + 3, frozenset({2**32 + 1}))
    assert _dump_after_lost_memory(m, snap) == []


def test_dropped_memory_after_a_restart_in_a_later_xid_epoch_is_not_forgotten_early():
    epoch = 2**32
    m = ExpandingMerge(history_limit=1, unknown_past=Seen(None, (), pos(0), xid=epoch + 5))
    m.feed(_pg(2, 20, epoch + 10))  # still invisible below
    m.feed(_pg(3, 30, epoch + 11))  # the memory drops key 2's change
    snap = XidSnapshot(epoch + 10, epoch + 12, frozenset({epoch + 10}))
    assert _dump_after_lost_memory(m, snap) == []


# ------------------------------------------------------------------------- late registration
# The SELECT runs on a Spark executor while the driver reads on: read-only windows and
# PostgreSQL's HighWatermarkWindow are often registered after the log went past the SELECT.


def test_a_snapshot_window_registered_after_the_log_passed_its_end_closes_at_the_next_item():
    """It judges the remembered changes by its snapshot, closes before the next item fed (the
    log is past close_at) and its rows go after the last event emitted, not at close_at."""
    m = ExpandingMerge()
    fed = [
        pev(4, 90, 49),  # below xmin: seen by the SELECT
        pev(1, 100, 50),  # seen
        pev(2, 110, 51),  # running at the snapshot (xip), committed after close_at: missed
        pev(3, 120, 52),  # xmax: started after the snapshot: missed
        pev(5, 130, 53, table=OTHER),  # missed, but another table's key 5
    ]
    assert feed_all(m, fed) == fed
    m.open_chunk(1, 1, T, SnapshotXidWindow(51, 52, frozenset({51}), close_at=pg(105)))
    m.rows_ready(1, rows(1, 2, 3, 4, 5))
    assert m.open_ids() == {1}  # nothing closes before an item is fed
    nxt = pev(6, 140, 54)
    out = m.feed(nxt)
    base = pg(130)  # after keys 2 and 3's newer values: their rows must not follow them
    assert summary(out) == [
        ("r", 1, base.dumped_row(0)),
        ("r", 4, base.dumped_row(3)),
        ("r", 5, base.dumped_row(4)),
        ("u", 6, pg(140)),
    ]
    [d] = m.pop_dumped()
    assert (d.position, d.first_index, keys(d.changed)) == (base, 0, [2, 3])
    assert stats(d, out) == (5, 2, 3)
    assert m.open_ids() == set()


def test_a_gtid_window_registered_after_the_log_passed_its_end_judges_by_its_low_set():
    window = GtidWindow.from_strings(f"{UUID}:1-10", f"{UUID}:1-12", close_at=pos(125))
    m = ExpandingMerge()
    feed_all(m, [gev(1, 100, 10), gev(2, 110, 11), gev(3, 120, 12), gev(4, 130, 13)])
    m.open_chunk(1, 1, T, window)
    m.rows_ready(1, rows(1, 2, 3, 4, 5))
    out = m.feed(Heartbeat(pos(131)))
    # 11 and 12 committed after the low set was read, 13 even after the high one: all dropped
    assert summary(out) == [("r", 1, pos(130).dumped_row(0)), ("r", 5, pos(130).dumped_row(4))]
    assert keys(m.pop_dumped()[0].changed) == [2, 3, 4]


def test_a_high_watermark_window_registered_late_judges_every_change_by_its_snapshot():
    """PostgreSQL ``table`` mode: no low watermark. The window is registered once the SELECT is
    done, the log read on meanwhile; its snapshot judges every change of the table before its
    HW, fed before the registration or after, whatever its place in the log."""
    snap = XidSnapshot(100, 103, frozenset({101}))
    m = ExpandingMerge()
    feed_all(
        m,
        [
            pev(1, 10, 99),  # below xmin: seen
            pev(2, 20, 101),  # running at the snapshot: missed, though fed before registration
            pev(3, 30, 102),  # committed before the snapshot: seen
            pev(4, 40, 103),  # xmax: missed
        ],
    )
    m.open_chunk(1, 1, T, HighWatermarkWindow("H", snap))
    assert m.open_ids() == {1}
    m.rows_ready(1, rows(1, 2, 3, 4, 5, 6, 7))
    out = feed_all(
        m,
        [
            pev(5, 50, 104),  # missed
            pev(6, 55, 105, table=OTHER),  # another table's key 6
            WatermarkEvent("s", "H2", pg(60)),  # another chunk's HW: not this window's end
            pev(7, 65, 100),  # visible to the snapshot, read only now: the row stays
            WatermarkEvent("s", "H", pg(70)),
            pev(1, 80, 106),  # after the HW: after the rows
        ],
    )
    h = pg(70)
    assert [(e.op, e.table.table, e.key[0], e.position) for e in out] == [
        ("u", "t", 5, pg(50)),
        ("u", "other", 6, pg(55)),
        ("u", "t", 7, pg(65)),
        ("r", "t", 1, h.dumped_row(0)),
        ("r", "t", 3, h.dumped_row(2)),
        ("r", "t", 6, h.dumped_row(5)),
        ("r", "t", 7, h.dumped_row(6)),
        ("u", "t", 1, pg(80)),
    ]
    [d] = m.pop_dumped()
    assert (d.position, d.first_index, keys(d.changed)) == (h, 0, [2, 4, 5])
    assert stats(d, out) == (7, 3, 4)
    assert m.open_count() == 0


def test_a_horizon_read_before_the_select_keeps_what_its_late_window_needs():
    """While a SELECT is in flight the caller trims the memory by the horizon read before it
    was sent; one read later may already count a change the SELECT missed as seen by all."""
    sent = XidSnapshot(100, 101, frozenset({100}))  # the horizon when the SELECT was sent
    select = XidSnapshot(100, 102, frozenset({100}))  # the SELECT's snapshot: 100 still running
    now = XidSnapshot(102, 102, frozenset())  # a horizon read after 100 committed
    log = [pev(1, 10, 99), pev(2, 20, 101), pev(3, 30, 100)]

    def late_chunk(horizon: XidSnapshot) -> tuple[int, list[ChangeEvent]]:
        m = ExpandingMerge()
        feed_all(m, log)
        forgotten = m.forget(horizon.older)
        m.open_chunk(1, 1, T, SnapshotXidWindow(select.xmin, select.xmax, select.xip, pg(25)))
        m.rows_ready(1, rows(1, 2, 3))
        return forgotten, m.feed(Heartbeat(pg(31)))

    forgotten, out = late_chunk(sent)
    assert forgotten == 1  # xid 99's change only
    assert summary(out) == [("r", 1, pg(30).dumped_row(0)), ("r", 2, pg(30).dumped_row(1))]
    # with the later horizon xid 100's change is forgotten: key 3's stale row would follow it
    forgotten, out = late_chunk(now)
    assert forgotten == 3
    assert [e.key[0] for e in out] == [1, 2, 3]


def test_late_windows_need_their_rows_once_and_before_they_close():
    m = WatermarkMerge()
    feed_all(m, [pev(1, 100, 50), pev(2, 200, 60)])
    m.open_chunk(1, 1, T, SnapshotXidWindow(51, 51, frozenset(), close_at=pg(150)))
    with pytest.raises(MergeError, match=r"chunk 1 .* before its rows were ready"):
        m.feed(Heartbeat(pg(201)))  # the log was past close_at: it closes now, rows or not

    m = WatermarkMerge()
    m.open_chunk(2, 1, T, HighWatermarkWindow("H", XidSnapshot(5, 5, frozenset())))
    m.feed(pev(1, 10, 6))
    with pytest.raises(MergeError, match=r"chunk 2 .* before its rows were ready"):
        m.feed(WatermarkEvent("s", "H", pg(20)))

    m = WatermarkMerge()
    m.feed(pev(1, 100, 50))
    m.open_chunk(3, 1, T, SnapshotXidWindow(51, 51, frozenset(), close_at=pg(50)))
    m.rows_ready(3, 2, "file")
    with pytest.raises(MergeError, match="already supplied"):
        m.rows_ready(3, 2, "file")
    [d] = m.feed(Heartbeat(pg(101)))
    assert isinstance(d, DumpedRows) and (d.selected, d.rows) == (2, "file")
    with pytest.raises(MergeError, match="not open"):
        m.rows_ready(3, 2)  # closed: gone from the merge


def test_expand_skips_changed_keys_and_keeps_every_row_index():
    d = DumpedRows(4, 2, T, 3, pos(10), 5, frozenset({(2,)}), None, 99)
    out = list(expand(d, [([1], {"id": 1}), ([2], {"id": 2}), ((3,), {"id": 3})]))
    assert [(e.op, e.key, e.position, e.after, e.before) for e in out] == [
        ("r", (1,), pos(10).dumped_row(5), {"id": 1}, None),
        ("r", (3,), pos(10).dumped_row(7), {"id": 3}, None),
    ]
    assert all((e.table, e.ts_ms, e.dump_id, e.chunk_id) == (T, 99, 2, 4) for e in out)
    assert d.row_position(2) == out[-1].position


def test_keys_asked_for_and_not_found_are_deleted_after_the_rows_unless_the_log_changed_them():
    m = WatermarkMerge()
    m.open_chunk(1, 7, T, TableWindow("L", "H"))
    m.feed(wm("L", 1))
    m.feed(ev(4, 2, op="c"))  # inserted inside the window: the log's word stands
    m.rows_ready(1, 1, "file", absent=[(3,), (4,), (5,)])
    [d] = m.feed(wm("H", 3))
    assert isinstance(d, DumpedRows) and d.deleted == ((3,), (5,))
    out = list(removed(d, ["id"]))
    assert [(e.op, e.key, e.position, e.before) for e in out] == [
        ("d", (3,), pos(3).dumped_row(1), {"id": 3}),
        ("d", (5,), pos(3).dumped_row(2), {"id": 5}),
    ]
    assert all((e.dump_id, e.chunk_id, e.after) == (7, None, None) for e in out)
    # the next chunk closing at the same place goes after those deletes
    m.open_chunk(2, 7, T, PositionWindow(pos(3), pos(3)))
    m.rows_ready(2, 2, "file 2")
    [d2] = m.feed(Heartbeat(pos(4)))
    assert isinstance(d2, DumpedRows) and d2.first_index == 3


# ------------------------------------------------------------------- protocol and bookkeeping


def test_fresh_merge_places_rows_at_the_window_end_when_nothing_was_seen():
    m = ExpandingMerge()
    m.open_chunk(1, 1, T, PositionWindow(start=pos(200), close_at=pos(201)))
    m.rows_ready(1, rows(1))
    out = m.feed(ev(2, 250))
    assert summary(out) == [("r", 1, pos(201).dumped_row(0)), ("u", 2, pos(250))]


def test_fresh_merge_closing_on_an_item_at_exactly_close_at_places_rows_before_it():
    m = ExpandingMerge()
    m.open_chunk(1, 1, T, SnapshotXidWindow(5, 5, frozenset(), close_at=pg(100)))
    m.rows_ready(1, rows(1))
    nxt = pev(2, 100, 7)
    out = m.feed(nxt)
    assert [e.op for e in out] == ["r", "u"]
    assert out[0].position < nxt.position


def test_start_position_is_where_rows_go_before_any_event():
    m = ExpandingMerge(start=pos(40))
    m.open_chunk(1, 1, T, PositionWindow(start=pos(50), close_at=pos(60)))
    m.rows_ready(1, rows(1))
    assert summary(m.feed(Heartbeat(pos(60)))) == [("r", 1, pos(40).dumped_row(0))]
    with pytest.raises(MergeError, match="not after"):
        m.feed(ev(3, 40))


def test_log_going_backwards_is_refused():
    m = WatermarkMerge()
    m.feed(ev(1, 10))
    with pytest.raises(MergeError, match="not after the previous one"):
        m.feed(ev(1, 10))
    with pytest.raises(MergeError, match="op r"):
        m.feed(ChangeEvent(T, "r", (1,), pos(20), after={}))


def test_rows_ready_protocol_errors():
    m = WatermarkMerge()
    with pytest.raises(MergeError, match="not open"):
        m.rows_ready(1, 0)
    m.open_chunk(1, 1, T, TableWindow("L", "H"))
    with pytest.raises(MergeError, match="already open"):
        m.open_chunk(1, 1, T, TableWindow("L", "H"))
    with pytest.raises(TypeError, match="not a window"):
        m.open_chunk(2, 1, T, "L..H")  # type: ignore[arg-type]
    with pytest.raises(MergeError, match="-1 rows selected"):
        m.rows_ready(1, -1)
    m.rows_ready(1, 1, "first")
    with pytest.raises(MergeError, match="already supplied"):
        m.rows_ready(1, 1, "second")
    with pytest.raises(MergeError, match="already supplied"):
        m.rows_ready(1, 0)  # not even a different count
    assert m.feed(wm("L", 1)) == []
    [d] = m.feed(wm("H", 2))  # the first call holds
    assert isinstance(d, DumpedRows) and (d.selected, d.rows) == (1, "first")
    assert m.open_count() == 0


def test_cancelled_chunks_emit_nothing():
    m = WatermarkMerge()
    m.open_chunk(1, 5, T, TableWindow("L1", "H1"))
    m.open_chunk(2, 5, T, TableWindow("L2", "H2"))
    m.open_chunk(3, 6, T, TableWindow("L3", "H3"))
    m.rows_ready(1, 1)
    assert m.cancel_dump(5) == 2
    assert m.open_ids() == {3}
    assert m.cancel_chunk(3) and not m.cancel_chunk(3)
    assert m.open_ids() == set()
    # no DumpedRows comes out of the cancelled chunk 1's window
    assert [m.feed(item) for item in [wm("L1", 1), ev(1, 2), wm("H1", 3)]] == [
        [],
        [ev(1, 2)],
        [],
    ]


def test_dumped_rows_carry_the_select_time_or_the_log_time():
    m = ExpandingMerge()
    m.open_chunk(1, 1, T, TableWindow("L", "H"))
    m.open_chunk(2, 1, OTHER, TableWindow("L2", "H2"))
    m.rows_ready(1, rows(1), ts_ms=1234)
    m.rows_ready(2, rows(1))
    out = feed_all(
        m,
        [
            wm("L", 1),
            wm("L2", 2),
            ChangeEvent(T, "u", (9,), pos(3), after={}, ts_ms=777),
            wm("H", 4),
            wm("H2", 5),
        ],
    )
    assert [(e.op, e.ts_ms) for e in out] == [("u", 777), ("r", 1234), ("r", 777)]
    assert [d.ts_ms for d in m.pop_dumped()] == [1234, 777]


# ---------------------------------------------------------------- where a window began (low)


def test_a_table_window_begins_at_its_low_watermark_whenever_it_was_registered():
    m = WatermarkMerge()
    m.feed(ev(1, 1))
    m.open_chunk(1, 1, T, TableWindow("L", "H"))
    m.feed(ev(2, 2))  # before the LW: seen by the SELECT
    m.feed(wm("L", 3))
    m.feed(ev(3, 4))
    m.rows_ready(1, 0)
    [d] = m.feed(wm("H", 5))
    assert isinstance(d, DumpedRows) and d.low == pos(3)


def test_a_read_only_window_begins_where_the_log_stood_at_registration():
    """Just after the last item fed: the SELECT saw that change (else the window judged it
    missed), so a key the lake holds at exactly its position counts as before the window."""
    m = WatermarkMerge()
    m.feed(ev(1, 10))
    m.feed(ev(1, 20, table=OTHER))
    m.open_chunk(1, 1, T, PositionWindow(pos(20), pos(30)))
    m.rows_ready(1, 0)
    m.feed(ev(2, 25))
    [d, _] = m.feed(ev(3, 30))
    assert isinstance(d, DumpedRows) and d.low is not None
    assert pos(20) < d.low < pos(21) and str(pos(20)) < str(d.low) < str(pos(21))
    assert pos(20).dumped_row(10**6) < d.low


def test_a_window_registered_late_begins_at_the_earliest_change_it_judged_missed():
    snap = XidSnapshot(100, 103, frozenset({101}))
    m = WatermarkMerge()
    feed_all(m, [pev(1, 10, 99), pev(2, 20, 101), pev(3, 30, 102), pev(4, 40, 99, table=OTHER)])
    m.open_chunk(1, 1, T, HighWatermarkWindow("H", snap))
    m.rows_ready(1, 0)
    [d] = m.feed(WatermarkEvent("s", "H", pg(50)))
    assert isinstance(d, DumpedRows) and d.low == pg(20)  # not 40, where the log stood


def test_a_window_registered_before_any_log_item_has_no_known_beginning():
    m = WatermarkMerge()
    m.open_chunk(1, 1, T, PositionWindow(pos(20), pos(30)))
    m.rows_ready(1, 0)
    [d] = m.feed(Heartbeat(pos(30)))
    assert isinstance(d, DumpedRows) and d.low is None
