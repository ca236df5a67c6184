"""How a chunk's window is bounded: one strategy per watermark mode and source kind.

``source.watermark`` in the config picks the strategy from :data:`STRATEGIES`:

- ``table``: UUIDs written to ``dblog.dblog_watermarks``; the high watermark, written once the
  chunk's rows are in their file, closes the window. On MySQL/MariaDB a low watermark written
  before the SELECT opens it (with ``binlog_order_commits``, checked at start); on PostgreSQL,
  where log order is not visibility order, the SELECT's own snapshot judges every change
  before the high watermark instead.
- ``gtid`` (MySQL): executed GTID sets read before and after the SELECT (read-only). Refused on
  MariaDB, whose ``@@gtid_binlog_pos`` counts a transaction before it is visible.
- ``snapshot``: the SELECT's own snapshot says which changes it saw (read-only and exact):
  PostgreSQL's ``pg_current_snapshot()``, MariaDB's binlog snapshot position.
"""

from __future__ import annotations

import uuid
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Generic, Protocol, TypeVar

from airflow_dblog.core.events import Row, TableId
from airflow_dblog.core.gtid import parse_gtid_set
from airflow_dblog.core.merge import Seen
from airflow_dblog.core.position import Position
from airflow_dblog.core.window import (
    GtidWindow,
    HighWatermarkWindow,
    PositionWindow,
    SnapshotXidWindow,
    TableWindow,
    Window,
    XidSnapshot,
)
from airflow_dblog.errors import ConfigError, SourceError
from airflow_dblog.sources.base import Key, Source

if TYPE_CHECKING:
    pass

Rows = list[tuple[Key, Row]]
Horizon = Callable[[Seen], bool]
S = TypeVar("S", bound=Source)
Snap = TypeVar("Snap", covariant=True)


class SnapshotSelects(Protocol[Snap]):
    """A source that SELECTs in a snapshot and says what the snapshot saw."""

    def snapshot_select_range(
        self, table: TableId, lower: Key | None, upper: Key, limit: int
    ) -> tuple[Rows, Snap]: ...

    def snapshot_select_keys(self, table: TableId, keys: list[Key]) -> tuple[Rows, Snap]: ...


@dataclass(frozen=True)
class Selection:
    """What one chunk reads: a keyset page ``(lower, upper]`` or a list of keys."""

    table: TableId
    lower: Key | None = None
    upper: Key | None = None
    limit: int = 0
    keys: list[Key] | None = None

    def plain(self, source: Source) -> Rows:
        if self.keys is not None:
            return source.select_keys(self.table, self.keys)
        assert self.upper is not None
        return source.select_range(self.table, self.lower, self.upper, self.limit)

    def in_snapshot(self, source: SnapshotSelects[Snap]) -> tuple[Rows, Snap]:
        """The rows and the snapshot they were read in, in one transaction."""
        if self.keys is not None:
            return source.snapshot_select_keys(self.table, self.keys)
        assert self.upper is not None
        return source.snapshot_select_range(self.table, self.lower, self.upper, self.limit)


@dataclass(frozen=True)
class Opened:
    """What the driver did before a chunk's SELECT was sent: the window it registered already
    (MySQL's ``table`` window must be open in the merge before its low watermark is logged)
    and the watermark values it wrote or will write."""

    window: Window | None = None
    low: str | None = None
    high: str | None = None


class WatermarkStrategy(ABC, Generic[S]):
    """How one watermark mode bounds a chunk's window on one kind of source.

    A chunk runs in three parts: :meth:`open` on the driver, :meth:`select` wherever the SELECT
    runs (a Spark executor: a static method of a class importable there, on its own connection),
    then :meth:`window` and :meth:`finish` on the driver once the rows are written. The driver
    reads the log all along, so a window is often registered after the log went past the SELECT:
    it judges those changes from the merge's memory.

    ``history``: whether its windows judge changes logged before them (the merge remembers
    recent changes only then). ``horizon`` tells which remembered changes no later window can
    need; ``unknown_past`` stands for what a restarted stream emitted before it had a memory.
    """

    history: ClassVar[bool] = True

    def __init__(self, source: S, stream: str) -> None:
        self.source, self.stream = source, stream

    def check(self) -> None:
        """Start-up checks: refuse a setup in which the windows would not be exact."""

    def open(self, register: Callable[[Window], None]) -> Opened:
        """On the driver, before the SELECT is sent; ``register`` opens a window in the merge."""
        return Opened()

    @staticmethod
    @abstractmethod
    def select(source: Any, selection: Selection) -> tuple[Rows, Any]:
        """Where the SELECT runs: the rows, and what the strategy needs to know of its snapshot
        (picklable: it travels back from an executor)."""

    @abstractmethod
    def window(self, opened: Opened, info: Any) -> Window | None:
        """On the driver after the SELECT: the window to register now (None: registered at
        :meth:`open`)."""

    def finish(self, opened: Opened) -> None:
        """On the driver after the window is registered and its rows are ready (the HW write)."""

    def record(self, opened: Opened) -> tuple[Any, ...]:
        """What the metadata store records of the chunk's window."""
        return ({"type": self.kind},)

    kind: ClassVar[str] = "snapshot"

    def horizon(self) -> Horizon | None:
        return None

    def unknown_past(self) -> Seen | None:
        return None


class _PostgresHorizon(WatermarkStrategy["PostgresSource"]):
    """The oldest running xid only grows: changes of older transactions every snapshot sees."""

    def horizon(self) -> Horizon | None:
        return self.source.current_snapshot().older

    def unknown_past(self) -> Seen | None:
        # every transaction the stream read before it restarted has an xid below this
        # snapshot's xmax; once the oldest running xid has passed it, all of them are visible
        xmax = self.source.current_snapshot().xmax
        return Seen(None, (), Position.postgres(0), xid=max(xmax - 1, 0))


class _TableWatermarks:
    """Both ``table`` strategies: the stream's row of the watermark table, written by the driver."""

    kind: ClassVar[str] = "table"
    source: Any
    stream: str

    def finish(self, opened: Opened) -> None:
        assert opened.high is not None
        self.source.write_watermark(self.stream, opened.high)

    def record(self, opened: Opened) -> tuple[Any, ...]:
        return ({"type": "table"}, opened.low, opened.high)


class MysqlTableWatermarks(_TableWatermarks, WatermarkStrategy["MysqlSource"]):
    """LW written, window registered, SELECT sent; HW written once the rows are in the file.

    With ``binlog_order_commits`` every change logged before the LW was visible to the SELECT,
    which started after the LW's commit returned: the window between the two alone decides.
    """

    history = False

    def check(self) -> None:
        self.source.ensure_watermark_table()
        self.source.check_commit_order()

    def open(self, register: Callable[[Window], None]) -> Opened:
        low, high = str(uuid.uuid4()), str(uuid.uuid4())
        window = TableWindow(low, high)
        register(window)  # before the LW can be in the log
        self.source.write_watermark(self.stream, low)
        return Opened(window, low, high)

    @staticmethod
    def select(source: Any, selection: Selection) -> tuple[Rows, Any]:
        return selection.plain(source), None

    def window(self, opened: Opened, info: Any) -> Window | None:
        return None


class PostgresTableWatermarks(_TableWatermarks, _PostgresHorizon):
    """The SELECT's snapshot judges every change before the HW; the HW write closes the window.

    A commit is in the WAL before it is visible, so a low watermark could not tell which
    changes the SELECT saw; its snapshot can, wherever they lie. No LW is written.
    """

    def check(self) -> None:
        self.source.ensure_watermark_table()

    def open(self, register: Callable[[Window], None]) -> Opened:
        return Opened(high=str(uuid.uuid4()))

    @staticmethod
    def select(source: Any, selection: Selection) -> tuple[Rows, Any]:
        return selection.in_snapshot(source)

    def window(self, opened: Opened, info: Any) -> Window | None:
        assert opened.high is not None
        return HighWatermarkWindow(opened.high, XidSnapshot(info.xmin, info.xmax, info.xip))


class PostgresSnapshotWatermarks(_PostgresHorizon):
    @staticmethod
    def select(source: Any, selection: Selection) -> tuple[Rows, Any]:
        return selection.in_snapshot(source)

    def window(self, opened: Opened, info: Any) -> Window | None:
        # every commit the snapshot saw starts below close_position; an idle heartbeat reaches it
        return SnapshotXidWindow(info.xmin, info.xmax, info.xip, info.close_position)


class MariaDbSnapshotWatermarks(WatermarkStrategy["MysqlSource"]):
    def check(self) -> None:
        if self.source.flavor != "mariadb":
            raise SourceError(
                f"watermark snapshot needs MariaDB; MySQL at {self.source.where} has no binlog"
                " snapshot position",
                "set source.watermark: gtid (read-only) or table",
            )

    @staticmethod
    def select(source: Any, selection: Selection) -> tuple[Rows, Any]:
        return selection.in_snapshot(source)

    def window(self, opened: Opened, info: Any) -> Window | None:
        # the SELECT saw the binlog exactly up to ``info`` (after every row of the event ending
        # there): rows belong right there, and an idle server's heartbeat reaches it
        return PositionWindow(info, info)

    def horizon(self) -> Horizon | None:
        seen_upto = self.source.visible_position().log_part()
        return lambda change: change.position.log_part() <= seen_upto

    def unknown_past(self) -> Seen | None:
        return Seen(None, (), self.source.binlog_position())


class GtidWatermarks(WatermarkStrategy["MysqlSource"]):
    """MySQL only. After a restart it judges only what it has read since (no GTID horizon)."""

    kind: ClassVar[str] = "gtid"

    def check(self) -> None:
        self.source.refuse_gtid_watermarks()

    @staticmethod
    def select(source: Any, selection: Selection) -> tuple[Rows, Any]:
        low = source.gtid_executed()
        rows = selection.plain(source)
        high = source.gtid_executed()
        return rows, (low, high, source.binlog_position())

    def window(self, opened: Opened, info: Any) -> Window | None:
        low, high, close_at = info
        return GtidWindow.from_strings(low, high, close_at)

    def horizon(self) -> Horizon | None:
        executed = parse_gtid_set(self.source.gtid_executed())
        return lambda change: change.gtid is not None and executed.contains(change.gtid)


STRATEGIES: dict[tuple[str, str], type[WatermarkStrategy[Any]]] = {
    ("table", "mysql"): MysqlTableWatermarks,
    ("table", "postgres"): PostgresTableWatermarks,
    ("gtid", "mysql"): GtidWatermarks,
    ("snapshot", "mysql"): MariaDbSnapshotWatermarks,
    ("snapshot", "postgres"): PostgresSnapshotWatermarks,
}


def watermark_strategy(mode: str, source: Source, stream: str) -> WatermarkStrategy[Any]:
    """The strategy of ``source.watermark`` for this source, checked against the server."""
    try:
        kind = STRATEGIES[(mode, source.kind)]
    except KeyError:
        modes = sorted(m for m, k in STRATEGIES if k == source.kind)
        raise ConfigError(
            f"source.watermark {mode!r} is not available on {source.kind}",
            f"set source.watermark to one of: {', '.join(modes)}",
        ) from None
    strategy = kind(source, stream)
    strategy.check()
    return strategy
