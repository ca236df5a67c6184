"""How a chunk's window is bounded: the watermark strategy every source kind implements.

``source.watermark`` in the config names a mode; each source kind offers its own strategy per
mode (``sources/<kind>/watermarks.py``, listed by the registry):

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

from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar, Generic, Protocol, TypeVar

from airflow_dblog.core.events import Row, TableId
from airflow_dblog.core.merge import Seen
from airflow_dblog.core.window import Window
from airflow_dblog.sources.base import Key, Source

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


class TableWatermarks:
    """Both ``table`` strategies: the stream's row of the watermark table, written by the driver."""

    kind: ClassVar[str] = "table"
    source: Any
    stream: str

    def finish(self, opened: Opened) -> None:
        assert opened.high is not None
        self.source.write_watermark(self.stream, opened.high)

    def record(self, opened: Opened) -> tuple[Any, ...]:
        return ({"type": "table"}, opened.low, opened.high)
