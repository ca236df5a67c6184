"""Change events as they flow from a reader or a chunk through the merge to the sinks."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from airflow_dblog.core.position import Position

Op = Literal["c", "u", "d", "r"]
Row = dict[str, Any]


@dataclass(frozen=True)
class TableId:
    """``db`` is the MySQL database or the PostgreSQL schema (the database is the source's)."""

    db: str
    table: str

    def __str__(self) -> str:
        return f"{self.db}.{self.table}"

    @classmethod
    def parse(cls, text: str) -> TableId:
        db, sep, table = text.partition(".")
        if not sep or not db or not table:
            raise ValueError(f"table {text!r} must be written as db.table")
        return cls(db, table)


@dataclass(frozen=True, init=False)
class ChangeEvent:
    """One committed row change, or one dumped row (``op == "r"``).

    ``key`` holds the primary-key columns in key order; ``xid`` (PostgreSQL) and ``gtid``
    (MySQL/MariaDB) let snapshot and GTID watermarks decide whether a change fell inside a
    chunk's window.

    The constructor is written out: readers build one event per row change, and a frozen
    dataclass's generated ``__init__`` sets each field through ``object.__setattr__``, where
    this one fills the instance's ``__dict__`` in one step (the fields are the same).
    """

    table: TableId
    op: Op
    key: tuple[Any, ...]
    position: Position
    before: Row | None = None
    after: Row | None = None
    ts_ms: int = 0
    xid: int | None = None
    gtid: str | None = None
    dump_id: int | None = None
    chunk_id: int | None = None
    extra: dict[str, Any] = field(default_factory=dict, compare=False)

    def __init__(
        self,
        table: TableId,
        op: Op,
        key: tuple[Any, ...],
        position: Position,
        before: Row | None = None,
        after: Row | None = None,
        ts_ms: int = 0,
        xid: int | None = None,
        gtid: str | None = None,
        dump_id: int | None = None,
        chunk_id: int | None = None,
        extra: dict[str, Any] | None = None,
    ) -> None:
        self.__dict__.update(
            table=table,
            op=op,
            key=key,
            position=position,
            before=before,
            after=after,
            ts_ms=ts_ms,
            xid=xid,
            gtid=gtid,
            dump_id=dump_id,
            chunk_id=chunk_id,
            extra={} if extra is None else extra,
        )

    @property
    def row(self) -> Row | None:
        """The row's state after this event: ``None`` for a delete."""
        return None if self.op == "d" else self.after


@dataclass(frozen=True)
class WatermarkEvent:
    """A low or high watermark write seen in the log (``table`` watermark strategy)."""

    stream: str
    value: str
    position: Position


@dataclass(frozen=True)
class Heartbeat:
    """The reader is at ``position`` with nothing to report; closes windows on an idle source."""

    position: Position


LogItem = ChangeEvent | WatermarkEvent | Heartbeat
