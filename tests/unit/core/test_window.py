"""Window types in isolation: what is inside, where each one ends."""

from __future__ import annotations

import pytest

from airflow_dblog.core.events import ChangeEvent, Heartbeat, TableId, WatermarkEvent
from airflow_dblog.core.position import Position
from airflow_dblog.core.window import (
    GtidWindow,
    HighWatermarkWindow,
    PositionWindow,
    SnapshotXidWindow,
    TableWindow,
    XidSnapshot,
    widen_xid,
)

T = TableId("app", "t")
A = "3e11fa47-71ca-11e1-9e33-c80aa9429562"
E32 = 2**32


def change(position: Position, xid: int | None = None, gtid: str | None = None) -> ChangeEvent:
    return ChangeEvent(T, "u", (1,), position, after={"id": 1}, xid=xid, gtid=gtid)


# ------------------------------------------------------------------------------------ table


def test_table_window_opens_at_low_and_closes_at_high():
    w = TableWindow("low", "high")
    assert not w.starts_open
    assert w.opens_at(WatermarkEvent("s", "low", Position.mysql(1, 1)))
    assert not w.opens_at(WatermarkEvent("s", "high", Position.mysql(1, 1)))
    assert not w.opens_at(Heartbeat(Position.mysql(1, 1)))
    assert w.closes_at(WatermarkEvent("s", "high", Position.mysql(1, 2)))
    assert not w.closes_at(WatermarkEvent("s", "other", Position.mysql(1, 2)))
    assert not w.closes_before(WatermarkEvent("s", "high", Position.mysql(1, 2)))
    assert w.contains(change(Position.mysql(1, 1)))
    assert not w.judges_past  # MySQL/MariaDB only: binlog_order_commits
    assert not w.forgettable(change(Position.mysql(1, 1)))  # no memory is kept for it anyway
    assert w.fallback_position() is None
    assert w.describe() == "table(low..high)"
    with pytest.raises(TypeError):
        TableWindow("low", "high", XidSnapshot(1, 2, frozenset()))  # type: ignore[call-arg]
    with pytest.raises(ValueError):
        TableWindow("x", "x")
    with pytest.raises(ValueError):
        TableWindow("", "x")


# -------------------------------------------------------------------------------------- xid


@pytest.mark.parametrize(
    ("xid", "reference", "expected"),
    [
        (5, 10, 5),
        (5, 3 * E32 + 10, 3 * E32 + 5),
        (E32 - 3, 3 * E32 + 10, 2 * E32 + E32 - 3),  # just before the wrap: previous epoch
        (7, 2 * E32 + E32 - 3, 3 * E32 + 7),  # just after the wrap: next epoch
        (E32 - 1, 10, E32 - 1),  # epoch 0 has no previous epoch
        (3 * E32 + 9, 10, 3 * E32 + 9),  # already 64-bit
        (E32 // 2 + 10, 0, E32 // 2 + 10),
    ],
)
def test_widen_xid(xid, reference, expected):
    assert widen_xid(xid, reference) == expected


def test_widen_xid_rejects_negative():
    with pytest.raises(ValueError):
        widen_xid(-1, 10)


@pytest.mark.parametrize(
    ("xid", "visible"),
    [
        (99, True),  # below xmin: committed before the snapshot
        (100, False),  # xmin, in progress
        (101, True),  # between xmin and xmax, finished
        (102, False),  # in progress
        (104, True),  # xmax - 1, finished
        (105, False),  # xmax: not started yet
        (10_000, False),
    ],
)
def test_xid_visibility(xid, visible):
    w = SnapshotXidWindow(100, 105, frozenset({100, 102}), Position.postgres(50))
    assert w.visible(xid) is visible
    assert w.contains(change(Position.postgres(10), xid=xid)) is (not visible)


def test_xid_visibility_with_xid8_snapshot_and_32_bit_changes():
    base = 7 * E32
    w = SnapshotXidWindow(base - 2, base + 3, frozenset({base + 1}), Position.postgres(50))
    assert w.visible(E32 - 5)  # epoch 6, long done
    assert w.visible(E32 - 2)  # epoch 6, == xmin and finished
    assert not w.visible(1)  # base + 1: in progress
    assert w.visible(2)
    assert not w.visible(3)  # base + 3 == xmax


def test_xid_window_without_xid_is_inside_and_empty_snapshot():
    w = SnapshotXidWindow(9, 9, frozenset(), Position.postgres(50))
    assert w.contains(change(Position.postgres(1)))
    assert not w.contains(change(Position.postgres(1), xid=8))
    assert w.contains(change(Position.postgres(1), xid=9))


def test_xid_window_closes_before_the_first_item_at_close_at():
    w = SnapshotXidWindow(9, 9, frozenset(), Position.postgres(500))
    assert not w.closes_before(Heartbeat(Position.postgres(499, 7)))
    assert w.closes_before(Heartbeat(Position.postgres(500)))
    assert w.closes_before(change(Position.postgres(501), xid=3))
    assert not w.closes_at(Heartbeat(Position.postgres(500)))
    assert w.fallback_position() == Position.postgres(500)


def test_xid_window_validation_and_pg_snapshot_text():
    snap = XidSnapshot.parse("100:105:100,102")
    w = SnapshotXidWindow(snap.xmin, snap.xmax, snap.xip, Position.postgres(1))
    assert (w.xmin, w.xmax, w.xip) == (100, 105, frozenset({100, 102}))
    assert XidSnapshot.parse("7:7:").xip == frozenset()
    for bad in ["1:2", "x:2:", "1:2:3:4", ""]:
        with pytest.raises(ValueError):
            XidSnapshot.parse(bad)
    with pytest.raises(ValueError, match="xmin"):
        SnapshotXidWindow(6, 5, frozenset(), Position.postgres(1))
    with pytest.raises(ValueError, match="outside"):
        SnapshotXidWindow(5, 8, frozenset({8}), Position.postgres(1))


def test_snapshot_judges_changes_logged_before_it_and_knows_what_it_can_forget():
    """A commit is in the WAL before it is visible: a change read earlier may still be unseen."""
    w = SnapshotXidWindow(100, 105, frozenset({102}), Position.postgres(500))
    held = change(Position.postgres(10), xid=102)  # logged long before, still in progress
    assert w.judges_past and w.contains_past(held)
    assert not w.contains_past(change(Position.postgres(10), xid=101))
    assert not w.forgettable(held)  # a later snapshot may still miss it
    assert w.forgettable(change(Position.postgres(10), xid=99))  # below xmin: seen by all
    assert not w.forgettable(change(Position.postgres(10)))  # no xid: keep


def test_table_window_counts_no_change_before_its_low_watermark():
    """MySQL: binlog_order_commits makes everything logged before the LW visible to the SELECT,
    which ran after the LW's commit returned. The merge asks ``contains_past`` of the changes
    it is fed after registering the window and before its LW."""
    w = TableWindow("lw", "hw")
    assert not w.contains_past(change(Position.mysql(1, 2)))


def test_snapshot_text_validation():
    for bad in ["1:2", "x:2:", "1:2:3:4", "5:4:", "5:8:9"]:
        with pytest.raises(ValueError):
            XidSnapshot.parse(bad)


# ------------------------------------------------------------------- high watermark (pg table)


def test_high_watermark_window_is_open_from_registration_and_closes_at_its_high_watermark():
    w = HighWatermarkWindow("hw", XidSnapshot.parse("100:105:102"))
    assert w.kind == "table"
    assert w.starts_open  # no low watermark: open as soon as it is registered
    assert not w.opens_at(WatermarkEvent("s", "hw", Position.postgres(7)))
    assert w.closes_at(WatermarkEvent("s", "hw", Position.postgres(7)))
    assert not w.closes_at(WatermarkEvent("s", "other", Position.postgres(7)))
    assert not w.closes_at(Heartbeat(Position.postgres(7)))
    assert not w.closes_before(WatermarkEvent("s", "hw", Position.postgres(7)))
    assert not w.closes_before(Heartbeat(Position.postgres(10**9)))  # no position ends it
    assert w.fallback_position() is None
    assert w.describe() == "table(..hw, snapshot 100:105)"


@pytest.mark.parametrize(
    ("xid", "missed"),
    [
        (None, True),  # no xid: cannot tell
        (99, False),  # below xmin
        (100, False),  # xmin, finished
        (102, True),  # in progress
        (104, False),
        (105, True),  # xmax
        (7 * E32 + 101, True),  # an xid8 is taken as it is: far past xmax
        (E32 + 101, True),
    ],
)
def test_high_watermark_window_judges_by_its_snapshot_before_and_after_registration(xid, missed):
    """A commit is in the WAL before it is visible: only the snapshot tells, wherever the
    change lies in the log and whenever the merge read it."""
    w = HighWatermarkWindow("hw", XidSnapshot.parse("100:105:102"))
    assert w.judges_past
    for at in (Position.postgres(1), Position.postgres(10**6)):
        assert w.contains(change(at, xid=xid)) is missed
        assert w.contains_past(change(at, xid=xid)) is missed


def test_high_watermark_window_forgets_what_every_later_snapshot_sees():
    w = HighWatermarkWindow("hw", XidSnapshot.parse("100:105:102"))
    assert w.forgettable(change(Position.postgres(10), xid=99))
    assert not w.forgettable(change(Position.postgres(10), xid=100))  # a later xmin may be 100
    assert not w.forgettable(change(Position.postgres(10), xid=102))
    assert not w.forgettable(change(Position.postgres(10)))  # no xid: keep
    # 32-bit xids of a snapshot in a later epoch: widened against its xmax
    late = HighWatermarkWindow("hw", XidSnapshot(3 * E32 + 5, 3 * E32 + 9, frozenset()))
    assert late.forgettable(change(Position.postgres(10), xid=4))
    assert not late.forgettable(change(Position.postgres(10), xid=5))
    assert late.forgettable(change(Position.postgres(10), xid=E32 - 1))  # epoch 2


# ------------------------------------------------------------------------------------- gtid


def test_gtid_window_inside_means_not_in_low():
    w = GtidWindow.from_strings(f"{A}:1-10", f"{A}:1-12", Position.mysql(1, 900))
    assert not w.contains(change(Position.mysql(1, 1), gtid=f"{A}:10"))
    assert w.contains(change(Position.mysql(1, 1), gtid=f"{A}:11"))
    assert w.contains(change(Position.mysql(1, 1)))  # no GTID: assume the worst


def test_gtid_window_closes_at_close_at_or_at_a_gtid_beyond_high():
    w = GtidWindow.from_strings(f"{A}:1-10", f"{A}:1-12", Position.mysql(1, 900))
    assert not w.closes_before(change(Position.mysql(1, 100), gtid=f"{A}:12"))
    assert w.closes_before(change(Position.mysql(1, 100), gtid=f"{A}:13"))
    assert not w.closes_before(change(Position.mysql(1, 100)))
    assert not w.closes_before(Heartbeat(Position.mysql(1, 899)))
    assert w.closes_before(Heartbeat(Position.mysql(1, 900)))
    assert w.closes_before(Heartbeat(Position.mysql(2, 4)))  # next binlog file


def test_gtid_window_flavors_and_validation():
    maria = GtidWindow.from_strings("0-1-5", "0-1-9", Position.mysql(1, 1))
    assert maria.high.flavor == "mariadb"
    assert GtidWindow.from_strings("", "0-1-9", Position.mysql(1, 1)).low.flavor == "mariadb"
    assert GtidWindow.from_strings("", "", Position.mysql(1, 1)).low.is_empty()
    with pytest.raises(ValueError, match="not contained"):
        GtidWindow.from_strings(f"{A}:1-10", f"{A}:1-5", Position.mysql(1, 1))
    with pytest.raises(ValueError):
        GtidWindow.from_strings(f"{A}:1-10", "0-1-9", Position.mysql(1, 1))


# --------------------------------------------------------------------------------- position


def test_position_window():
    w = PositionWindow(Position.mysql(3, 1000, 2**32 - 1), Position.mysql(3, 1001))
    assert not w.contains(change(Position.mysql(3, 1000, 5)))  # same event, seen
    assert not w.contains(change(Position.mysql(2, 9000)))
    assert w.contains(change(Position.mysql(3, 1019)))
    assert w.contains(change(Position.mysql(4, 4)))
    assert not w.closes_before(Heartbeat(Position.mysql(3, 1000, 2**32 - 1)))
    assert w.closes_before(change(Position.mysql(3, 1019)))
    with pytest.raises(ValueError):
        PositionWindow(Position.mysql(3, 1000), Position.mysql(2, 1))
    # a transaction in the binlog before the window but not yet visible to its snapshot
    # (semi-sync AFTER_SYNC) lies past ``start``: judged as missed, also when read earlier
    assert w.contains_past(change(Position.mysql(3, 1019)))
    assert w.forgettable(change(Position.mysql(3, 900)))
    assert not w.forgettable(change(Position.mysql(3, 1019)))
