"""Chunk windows: which log changes a chunk's SELECT may not have seen, and where the chunk ends.

A window answers three questions for the merge, one log item at a time:

- :meth:`Window.contains`: was this change (of the chunk's table) possibly missed by the SELECT?
  If so the change's key is dropped from the chunk: the log carries the newer value. Saying yes
  too often only costs a dumped row that the log replaces anyway; saying no wrongly would let a
  stale row overwrite a newer change, so every doubtful case answers yes.
- :meth:`Window.contains_past`: the same question for a change the log delivered *before* the
  window was registered (or, for a ``table`` window, before its low watermark). Log order is not
  visibility order: a commit can be in the binlog/WAL, and read by the stream, while the
  transaction is still invisible to a SELECT (PostgreSQL leaves the ProcArray after the WAL
  flush and, with synchronous replication, after the standby's answer; MariaDB's semi-sync
  ``AFTER_SYNC`` waits before the engine commit). The merge keeps recent changes so a window can
  judge them when it arrives.
- :meth:`Window.closes_before`: is the log past the window, so that the rows go out *before*
  this item (read-only strategies: the log reached a position read after the SELECT)?
- :meth:`Window.closes_at`: is this item the window's end, so that the rows go out right after
  it, at its position (``table`` strategy: the high watermark)?

Windows are immutable values; whether a ``table`` window has opened is the merge's per-chunk
state. Windows never look at tables: the merge only asks about changes of the chunk's own table.

:meth:`Window.forgettable` tells the merge which remembered changes no later window of the same
kind can need (the source's horizon: PostgreSQL's oldest running xid, MariaDB's consistent
snapshot position, MySQL's executed GTID set only grow).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Protocol

from airflow_dblog.core.events import ChangeEvent, LogItem, WatermarkEvent
from airflow_dblog.core.gtid import GtidSet, parse_gtid_set
from airflow_dblog.core.position import Position
from airflow_dblog.errors import DblogError

_XID32 = 2**32


class Change(Protocol):
    """What a window looks at in a change: a logged ``ChangeEvent`` or the merge's memory of one."""

    @property
    def position(self) -> Position: ...
    @property
    def xid(self) -> int | None: ...
    @property
    def gtid(self) -> str | None: ...


class WindowError(DblogError):
    """The log contradicts a chunk's window (a high watermark without its low one, ...)."""


class Window:
    """The interface the merge uses; see the module docstring."""

    kind: ClassVar[str]
    starts_open: ClassVar[bool] = True
    """Read-only windows are open from registration; a ``table`` window opens at its LW."""

    def opens_at(self, item: LogItem) -> bool:
        return False

    def contains(self, event: Change) -> bool:
        raise NotImplementedError

    def closes_before(self, item: LogItem) -> bool:
        return False

    def closes_at(self, item: LogItem) -> bool:
        return False

    def fallback_position(self) -> Position | None:
        """Where rows may go if the merge has seen no log event at all before the close."""
        return None

    @property
    def judges_past(self) -> bool:
        """Whether changes read before registration can matter (the merge must remember them)."""
        return True

    def contains_past(self, event: Change) -> bool:
        """Whether a change read before the window was registered (or opened) was missed."""
        return self.contains(event)

    def forgettable(self, change: Change) -> bool:
        """Whether no window registered after this one can need ``change`` (see the module)."""
        return False

    def describe(self) -> str:
        return self.kind


def later_xid(a: int, b: int) -> int:
    """The later of two transaction ids, each 32-bit (wal2json) or xid8.

    Compared by their low 32 bits on the circle, as PostgreSQL compares xids: a plain ``max``
    is wrong across the 32-bit wraparound and between an xid8 and a 32-bit xid.
    """
    return a if (a - b) % _XID32 < _XID32 // 2 else b


@dataclass(frozen=True)
class XidSnapshot:
    """A PostgreSQL snapshot (``pg_current_snapshot()``): which transactions a SELECT saw.

    Values are 64-bit ``xid8``; a committed transaction is visible iff ``xid < xmax`` and it is
    not in ``xip``. wal2json's 32-bit xids are widened against ``xmax`` (:func:`widen_xid`).
    """

    xmin: int
    xmax: int
    xip: frozenset[int]

    def __post_init__(self) -> None:
        object.__setattr__(self, "xip", frozenset(self.xip))
        if not 0 <= self.xmin <= self.xmax:
            raise ValueError(f"bad snapshot: xmin {self.xmin} > xmax {self.xmax}")
        stray = [x for x in self.xip if not self.xmin <= x < self.xmax]
        if stray:
            raise ValueError(
                f"bad snapshot: xip {sorted(stray)} outside [{self.xmin}, {self.xmax})"
            )

    @classmethod
    def parse(cls, text: str) -> XidSnapshot:
        """From the text form ``xmin:xmax:xip,xip`` of ``pg_current_snapshot()``."""
        parts = text.strip().split(":")
        if len(parts) != 3:
            raise ValueError(f"not a PostgreSQL snapshot: {text!r}")
        try:
            xip = frozenset(int(x) for x in parts[2].split(",") if x)
            return cls(int(parts[0]), int(parts[1]), xip)
        except ValueError:
            raise ValueError(f"not a PostgreSQL snapshot: {text!r}") from None

    def visible(self, xid: int) -> bool:
        """Whether the SELECT's snapshot saw the transaction ``xid`` (32-bit or xid8)."""
        full = widen_xid(xid, self.xmax)
        if full < self.xmin:
            return True
        return full < self.xmax and full not in self.xip

    def missed(self, change: Change) -> bool:
        """A change the snapshot did not see (no xid: cannot tell, so yes)."""
        return change.xid is None or not self.visible(change.xid)

    def older(self, change: Change) -> bool:
        """A change every later snapshot sees: its xid is below this snapshot's xmin.

        Later snapshots have an xmin at least as high (the oldest running xid only grows), and
        a change with an xid below it committed before that xid started.
        """
        return change.xid is not None and widen_xid(change.xid, self.xmax) < self.xmin


@dataclass(frozen=True)
class TableWindow(Window):
    """MySQL/MariaDB ``table`` strategy: the log items between the LW and HW watermark writes.

    Rows go out at the HW event's position. The LW may arrive before or after the rows are known;
    an HW without its LW means the log lost the LW (or the reader skips the watermark table).

    Every change between LW and HW is a conflict. Before the LW, with ``binlog_order_commits``
    (checked at start-up), every change was visible to the SELECT, which ran after the LW's
    commit returned.
    """

    kind: ClassVar[str] = "table"
    starts_open: ClassVar[bool] = False
    low: str
    high: str

    def __post_init__(self) -> None:
        if not self.low or not self.high or self.low == self.high:
            raise ValueError("a table window needs two different, non-empty watermark values")

    def opens_at(self, item: LogItem) -> bool:
        return isinstance(item, WatermarkEvent) and item.value == self.low

    def contains(self, event: Change) -> bool:
        return True  # every change of the table between LW and HW

    @property
    def judges_past(self) -> bool:
        return False

    def contains_past(self, event: Change) -> bool:
        return False  # logged before the LW: the SELECT, after the LW's commit, saw it

    def closes_at(self, item: LogItem) -> bool:
        return isinstance(item, WatermarkEvent) and item.value == self.high

    def describe(self) -> str:
        return f"table({self.low}..{self.high})"


@dataclass(frozen=True)
class HighWatermarkWindow(Window):
    """PostgreSQL ``table`` strategy: the SELECT's snapshot judges, the HW write closes.

    A commit is in the WAL before it is visible to a SELECT, so no low watermark can tell
    which changes the SELECT saw; its snapshot (``pg_current_snapshot()`` in the SELECT's
    REPEATABLE READ transaction) can. A change is in the window iff its xid was invisible to it,
    whether the log delivered it before or after the window was registered. The high
    watermark, written after the rows are in their file, closes the window; the rows go at its
    position.
    """

    kind: ClassVar[str] = "table"
    high: str
    snapshot: XidSnapshot

    def contains(self, event: Change) -> bool:
        return self.snapshot.missed(event)

    def forgettable(self, change: Change) -> bool:
        return self.snapshot.older(change)

    def closes_at(self, item: LogItem) -> bool:
        return isinstance(item, WatermarkEvent) and item.value == self.high

    def describe(self) -> str:
        return f"table(..{self.high}, snapshot {self.snapshot.xmin}:{self.snapshot.xmax})"


def widen_xid(xid: int, reference: int) -> int:
    """A 32-bit xid (as wal2json reports it) as the 64-bit xid8 nearest to ``reference``.

    PostgreSQL 13+ snapshots (``pg_current_snapshot()``) carry xid8 values: epoch << 32 | xid.
    Assumption: the change's transaction is within 2**31 transactions of ``reference`` (the
    snapshot's xmax). PostgreSQL itself guarantees it: unfrozen xids never lag the next xid by
    2**31 or more (wraparound protection), and a window only sees transactions running around
    its snapshot. Values that already exceed 32 bits are taken as xid8 unchanged.
    """
    if xid < 0:
        raise ValueError(f"negative transaction id {xid}")
    if xid >= _XID32:
        return xid
    widened = (reference & ~(_XID32 - 1)) | xid
    if widened - reference > _XID32 // 2:
        widened -= _XID32
    elif reference - widened > _XID32 // 2:
        widened += _XID32
    return widened if widened >= 0 else xid


class ReadOnlyWindow(Window):
    """A window of a read-only strategy: it ends at ``close_at``, a log position read after
    the SELECT, and the rows go out before the first log item at or past it."""

    close_at: Position

    def closes_before(self, item: LogItem) -> bool:
        return item.position.log_part() >= self.close_at.log_part()

    def fallback_position(self) -> Position | None:
        return self.close_at


@dataclass(frozen=True)
class SnapshotXidWindow(ReadOnlyWindow):
    """PostgreSQL ``snapshot`` strategy: changes whose transaction the SELECT could not see.

    ``xmin:xmax:xip`` is ``pg_current_snapshot()`` taken in the chunk's REPEATABLE READ
    transaction. A change is in the window iff its xid was invisible: at or above xmax, or in
    progress (in xip). The window closes before the first log item at or past ``close_at``, the
    WAL position read in that transaction after the snapshot: everything committed later was
    invisible and comes after the rows anyway.
    """

    kind: ClassVar[str] = "snapshot_xid"
    xmin: int
    xmax: int
    xip: frozenset[int]
    close_at: Position

    def __post_init__(self) -> None:
        object.__setattr__(self, "xip", frozenset(self.xip))
        XidSnapshot(self.xmin, self.xmax, self.xip)  # validates

    @property
    def snapshot(self) -> XidSnapshot:
        return XidSnapshot(self.xmin, self.xmax, self.xip)

    def visible(self, xid: int) -> bool:
        """Whether the SELECT's snapshot saw the transaction ``xid`` (32-bit or xid8)."""
        return self.snapshot.visible(xid)

    def contains(self, event: Change) -> bool:
        return self.snapshot.missed(event)

    def forgettable(self, change: Change) -> bool:
        return self.snapshot.older(change)

    def describe(self) -> str:
        return f"snapshot({self.xmin}:{self.xmax}:{len(self.xip)} in progress)"


@dataclass(frozen=True)
class GtidWindow(ReadOnlyWindow):
    """Read-only ``gtid`` strategy: changes that committed after the low GTID set was read.

    ``low`` is read before the SELECT, ``high`` after it, ``close_at`` (the binlog position)
    right after ``high``. A change is in the window iff its GTID is not in ``low``. The window
    closes before the first item at or past ``close_at``, or before the first change whose GTID
    is not even in ``high`` (it committed after the SELECT, so it may follow the rows).
    """

    kind: ClassVar[str] = "gtid"
    low: GtidSet
    high: GtidSet
    close_at: Position

    def __post_init__(self) -> None:
        if not self.low.issubset(self.high):
            raise ValueError(f"low GTID set {self.low} is not contained in high set {self.high}")

    @classmethod
    def from_strings(cls, low: str, high: str, close_at: Position) -> GtidWindow:
        """From the server's text of both sets; the flavor is taken from whichever is non-empty."""
        flavor = None
        for text in (high, low):
            if text.strip():
                flavor = parse_gtid_set(text).flavor
                break
        return cls(parse_gtid_set(low, flavor), parse_gtid_set(high, flavor), close_at)

    def contains(self, event: Change) -> bool:
        return event.gtid is None or not self.low.contains(event.gtid)

    def forgettable(self, change: Change) -> bool:
        return change.gtid is not None and self.low.contains(change.gtid)  # sets only grow

    def closes_before(self, item: LogItem) -> bool:
        if super().closes_before(item):
            return True
        gtid = item.gtid if isinstance(item, ChangeEvent) else None
        return gtid is not None and not self.high.contains(gtid)

    def describe(self) -> str:
        return f"gtid({self.low}..{self.high})"


@dataclass(frozen=True)
class PositionWindow(ReadOnlyWindow):
    """MariaDB ``snapshot`` strategy: the SELECT saw the binlog exactly up to ``start``.

    ``start`` comes from ``binlog_snapshot_file/position`` in the chunk's consistent-snapshot
    transaction: the position of the last transaction the engine had committed, so a
    transaction already in the binlog but not yet visible (semi-sync ``AFTER_SYNC`` waiting for
    its ACK) lies past it. A change is in the window iff its position is past ``start``, also
    when the stream read it before the window was registered; the window closes before the
    first item at or past ``close_at`` (>= ``start``).
    """

    kind: ClassVar[str] = "position"
    start: Position
    close_at: Position

    def __post_init__(self) -> None:
        if self.close_at.log_part() < self.start.log_part():
            raise ValueError(f"window closes at {self.close_at}, before its start {self.start}")

    def contains(self, event: Change) -> bool:
        return event.position.log_part() > self.start.log_part()

    def forgettable(self, change: Change) -> bool:
        return change.position.log_part() <= self.start.log_part()  # later snapshots: later

    def describe(self) -> str:
        return f"position({self.start}..{self.close_at})"
