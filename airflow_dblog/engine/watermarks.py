"""How a chunk's window is bounded: one strategy per watermark mode and source kind.

``source.watermark`` in the config picks the strategy from :data:`STRATEGIES`:

- ``table``: UUIDs written to ``dblog.dblog_watermarks`` before and after the SELECT; the
  window is what the log shows between the two writes. On PostgreSQL the SELECT also reads its
  snapshot, which judges the changes logged before the low watermark (log order is not
  visibility order there); MySQL/MariaDB need ``binlog_order_commits`` (checked at start).
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


class WatermarkStrategy(ABC, Generic[S]):
    """How one watermark mode bounds a chunk's window on one kind of source.

    ``history``: whether its windows judge changes logged before them (the merge remembers
    recent changes only then). ``horizon`` tells which remembered changes no later window can
    need; ``unknown_past`` stands for what a restarted stream emitted before it had a memory.
    """

    history: ClassVar[bool] = True

    def __init__(self, source: S, stream: str) -> None:
        self.source, self.stream = source, stream

    def check(self) -> None:
        """Start-up checks: refuse a setup in which the windows would not be exact."""

    @abstractmethod
    def select(self, selection: Selection) -> tuple[Rows, Window, tuple[Any, ...]]:
        """Run the chunk's SELECT inside its window: rows, window, what the store records."""

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


class MysqlTableWatermarks(WatermarkStrategy["MysqlSource"]):
    history = False  # binlog order is commit order: the window alone decides

    def check(self) -> None:
        self.source.ensure_watermark_table()
        self.source.check_commit_order()

    def select(self, selection: Selection) -> tuple[Rows, Window, tuple[Any, ...]]:
        low, high = str(uuid.uuid4()), str(uuid.uuid4())
        self.source.write_watermark(self.stream, low)
        rows = selection.plain(self.source)
        self.source.write_watermark(self.stream, high)
        return rows, TableWindow(low, high, None), ({"type": "table"}, low, high)


class PostgresTableWatermarks(_PostgresHorizon):
    def check(self) -> None:
        self.source.ensure_watermark_table()

    def select(self, selection: Selection) -> tuple[Rows, Window, tuple[Any, ...]]:
        low, high = str(uuid.uuid4()), str(uuid.uuid4())
        self.source.write_watermark(self.stream, low)
        rows, info = selection.in_snapshot(self.source)
        self.source.write_watermark(self.stream, high)
        window = TableWindow(low, high, XidSnapshot(info.xmin, info.xmax, info.xip))
        return rows, window, ({"type": "table"}, low, high)


class PostgresSnapshotWatermarks(_PostgresHorizon):
    def select(self, selection: Selection) -> tuple[Rows, Window, tuple[Any, ...]]:
        rows, info = selection.in_snapshot(self.source)
        # every commit the snapshot saw starts below close_position; an idle heartbeat reaches it
        window = SnapshotXidWindow(info.xmin, info.xmax, info.xip, info.close_position)
        return rows, window, ({"type": "snapshot"},)


class MariaDbSnapshotWatermarks(WatermarkStrategy["MysqlSource"]):
    def check(self) -> None:
        if self.source.flavor != "mariadb":
            raise SourceError(
                f"watermark snapshot needs MariaDB; MySQL at {self.source.where} has no binlog"
                " snapshot position",
                "set source.watermark: gtid (read-only) or table",
            )

    def select(self, selection: Selection) -> tuple[Rows, Window, tuple[Any, ...]]:
        # the SELECT saw the binlog exactly up to ``at`` (after every row of the event ending
        # there): rows belong right there, and an idle server's heartbeat reaches it
        rows, at = selection.in_snapshot(self.source)
        return rows, PositionWindow(at, at), ({"type": "snapshot"},)

    def horizon(self) -> Horizon | None:
        seen_upto = self.source.visible_position().log_part()
        return lambda change: change.position.log_part() <= seen_upto

    def unknown_past(self) -> Seen | None:
        return Seen(None, (), self.source.binlog_position())


class GtidWatermarks(WatermarkStrategy["MysqlSource"]):
    """MySQL only. After a restart it judges only what it has read since (no GTID horizon)."""

    def check(self) -> None:
        self.source.refuse_gtid_watermarks()

    def select(self, selection: Selection) -> tuple[Rows, Window, tuple[Any, ...]]:
        low = self.source.gtid_executed()
        rows = selection.plain(self.source)
        high = self.source.gtid_executed()
        window = GtidWindow.from_strings(low, high, self.source.binlog_position())
        return rows, window, ({"type": "gtid"}, low, high)

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
