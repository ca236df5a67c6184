"""The watermark strategies of PostgreSQL sources, by ``source.watermark`` mode.

Both judge changes by the SELECT's own snapshot (``pg_current_snapshot()``): log order is not
visibility order on PostgreSQL. ``table`` also writes a high watermark that closes the window;
``snapshot`` writes nothing. See :mod:`airflow_dblog.sources.watermark`.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any

from airflow_dblog.core.merge import Seen
from airflow_dblog.core.position import Position
from airflow_dblog.core.window import HighWatermarkWindow, SnapshotXidWindow, Window, XidSnapshot
from airflow_dblog.sources.watermark import (
    Horizon,
    Opened,
    Rows,
    Selection,
    TableWatermarks,
    WatermarkStrategy,
)


class _PostgresHorizon(WatermarkStrategy["PostgresSource"]):
    """The oldest running xid only grows: changes of older transactions every snapshot sees."""

    def horizon(self) -> Horizon | None:
        return self.source.current_snapshot().older

    def unknown_past(self) -> Seen | None:
        # every transaction the stream read before it restarted has an xid below this
        # snapshot's xmax; once the oldest running xid has passed it, all of them are visible
        xmax = self.source.current_snapshot().xmax
        return Seen(None, (), Position.postgres(0), xid=max(xmax - 1, 0))


class PostgresTableWatermarks(TableWatermarks, _PostgresHorizon):
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


STRATEGIES: dict[str, type[WatermarkStrategy[Any]]] = {
    "table": PostgresTableWatermarks,
    "snapshot": PostgresSnapshotWatermarks,
}
"""The strategy of each ``source.watermark`` mode a PostgreSQL source offers."""
