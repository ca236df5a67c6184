"""What the capture engine needs from a source database, whatever its kind.

A ``Source`` answers questions about tables and runs the chunk SELECTs and watermark writes; a
``ChangelogReader`` turns the binlog or WAL into ``LogItem``s. The planner, the chunk executor,
the capture loop and the merge use only these two protocols; what one watermark strategy needs
of one kind of server (GTID sets, binlog or snapshot positions, snapshot SELECTs) it asks of
that source's own class (``sources/<kind>/watermarks.py``).
"""

from __future__ import annotations

import contextlib
import os
import select
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from airflow_dblog.core.events import LogItem, Row, TableId

Key = tuple[Any, ...]
Offset = dict[str, Any]  # JSON-able resume token of a reader
C = TypeVar("C", bound="Closeable")


@dataclass(frozen=True)
class Column:
    name: str
    type: str  # the server's type name, e.g. "int", "varchar(20)", "uuid", "timestamp"
    nullable: bool


@dataclass(frozen=True)
class TableSchema:
    table: TableId
    columns: tuple[Column, ...]
    key: tuple[str, ...]  # primary key columns in index order


class Source(Protocol):
    kind: str  # "mysql" | "postgres"
    # the reader's lineage epoch, for the positions the source reads (position.py; 0 on PG)
    lineage_epoch: int

    def describe(self, table: TableId) -> TableSchema:
        """Columns and primary key; InputError for an unknown table or one without a key."""
        ...

    def max_key(self, table: TableId) -> Key | None: ...

    def estimate_rows(self, table: TableId) -> int: ...

    def next_bound(self, table: TableId, after: Key | None, upto: Key, n: int) -> Key | None:
        """The n-th key after ``after`` (at most ``upto``), read from the key index only.

        ``None`` when fewer than n keys remain: the chunk runs to ``upto``.
        """
        ...

    def select_range(
        self, table: TableId, lower: Key | None, upper: Key, limit: int
    ) -> list[tuple[Key, Row]]:
        """Keyset page ``lower < key <= upper ORDER BY key LIMIT limit``; lower None: from start."""
        ...

    def select_keys(self, table: TableId, keys: Sequence[Key]) -> list[tuple[Key, Row]]: ...

    def coerce_key(self, table: TableId, key: Sequence[Any]) -> Key:
        """A user-given key (JSON values) in the column types; InputError if it cannot match."""
        ...

    def ensure_watermark_table(self) -> None:
        """``table`` strategy: create the watermark table if missing, or refuse in one line."""
        ...

    def write_watermark(self, stream: str, value: str) -> None:
        """``table`` strategy: set the stream's row of the watermark table to ``value``."""
        ...

    def ping(self) -> None:
        """SourceError unless the server answers: tells a dead source from a bad chunk."""
        ...

    def log_lag(
        self, position: str | None, offset: Offset | None
    ) -> tuple[str, int | None, str | None]:
        """How far a stream that committed ``position`` (and reader ``offset``) is behind the
        head of this source's log: (the head, the bytes between, why they are unknown)."""
        ...

    def close(self) -> None: ...


class ChangelogReader(Protocol):
    # which history of the source's log this reader follows: the Source places the positions
    # it reads (watermarks, snapshots) on the same one (MySQL/MariaDB; 0 elsewhere)
    lineage_epoch: int

    def read(self, max_items: int, timeout_s: float, wake: Wake | None = None) -> list[LogItem]:
        """Up to ``max_items`` items in commit order; a Heartbeat when idle for ``timeout_s``.

        ``wake`` set by another thread ends the wait early: the read returns what it has, which
        may be nothing."""
        ...

    def offset(self) -> Offset:
        """Resume token: a reader opened with it continues right after the last item returned."""
        ...

    def acknowledge(self, offset: Offset) -> None:
        """Everything up to ``offset`` is committed downstream; the source may free it."""
        ...

    def close(self) -> None: ...


class Wake:
    """Ends a log read's wait from another thread: the read waits on its connection and on
    this pipe, so a chunk whose SELECT ends is registered at once, not at the read's timeout,
    and the log is still read as it comes. Its state is the pipe's content alone."""

    def __init__(self) -> None:
        self._read_fd, self._write_fd = os.pipe()
        os.set_blocking(self._read_fd, False)
        os.set_blocking(self._write_fd, False)

    def fileno(self) -> int:
        return self._read_fd

    def set(self) -> None:
        if self._write_fd < 0:
            return  # closed: the stream stopped
        with contextlib.suppress(OSError):  # the pipe is full: it is set already
            os.write(self._write_fd, b"\0")

    def is_set(self) -> bool:
        return bool(select.select([self._read_fd], [], [], 0)[0])

    def clear(self) -> None:
        with contextlib.suppress(BlockingIOError):
            while os.read(self._read_fd, 4096):
                pass

    def close(self) -> None:
        fds = (self._read_fd, self._write_fd)
        self._read_fd = self._write_fd = -1  # a late set() must not write to a reused number
        for fd in fds:
            if fd >= 0:
                os.close(fd)


class Closeable:
    """Sources and readers: ``with`` closes them."""

    def close(self) -> None:
        raise NotImplementedError

    def __enter__(self: C) -> C:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class StreamReader(Closeable):
    """What the binlog and WAL readers share: ``close`` ends the log stream, then the
    connection of the reader's ``source`` (its catalog questions)."""

    source: Any

    def _close_stream(self) -> None:
        raise NotImplementedError

    def close(self) -> None:
        self._close_stream()
        self.source.close()
