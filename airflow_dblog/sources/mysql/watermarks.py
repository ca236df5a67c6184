"""The watermark strategies of MySQL and MariaDB sources, by ``source.watermark`` mode.

``table`` writes a low watermark before the SELECT and a high one after; ``gtid`` (MySQL)
reads the executed GTID set around the SELECT; ``snapshot`` (MariaDB) reads the binlog
position its consistent snapshot saw. See :mod:`airflow_dblog.sources.watermark`.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any, ClassVar

from airflow_dblog.core.gtid import parse_gtid_set
from airflow_dblog.core.merge import Seen
from airflow_dblog.core.window import GtidWindow, PositionWindow, TableWindow, Window
from airflow_dblog.errors import SourceError
from airflow_dblog.sources.watermark import (
    Horizon,
    Opened,
    Rows,
    Selection,
    TableWatermarks,
    WatermarkStrategy,
)


class MysqlTableWatermarks(TableWatermarks, WatermarkStrategy["MysqlSource"]):
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


STRATEGIES: dict[str, type[WatermarkStrategy[Any]]] = {
    "table": MysqlTableWatermarks,
    "gtid": GtidWatermarks,
    "snapshot": MariaDbSnapshotWatermarks,
}
"""The strategy of each ``source.watermark`` mode a MySQL/MariaDB source offers."""
