"""How far a MySQL/MariaDB stream is behind in bytes: from its committed binlog file and
offset to the end of the binlog (``SHOW MASTER STATUS``), summed over the files between with
the sizes ``SHOW BINARY LOGS`` gives."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

from airflow_dblog.core.position import Position, binlog_file_index


class BinlogServer(Protocol):
    """What the lag asks of a MySQL/MariaDB source."""

    def master_status(self) -> tuple[str, int]: ...

    def identity(self) -> str: ...

    def binary_log_sizes(self) -> list[tuple[str, int]]: ...


def binlog_bytes_behind(
    logs: Sequence[tuple[str, int]], head: tuple[str, int], at: tuple[int, int]
) -> int | None:
    """Binlog bytes from ``at`` (file index, offset) to ``head`` (file, end offset).

    ``logs``: the server's binlog files and sizes (``SHOW BINARY LOGS``). None when ``at`` is
    not on the server's binlog: its file was purged, or lies past the head (a RESET MASTER).
    """
    sizes = {binlog_file_index(name): size for name, size in logs}
    head_index = binlog_file_index(head[0])
    sizes[head_index] = head[1]  # the head file's size as the status read it
    at_index, at_offset = at
    if at_index > head_index or at_index not in sizes:
        return None
    if at_index == head_index:
        return max(0, head[1] - at_offset)
    between = sum(size for index, size in sizes.items() if at_index < index < head_index)
    return max(0, sizes[at_index] - at_offset) + between + head[1]


def committed_binlog_point(
    position: str | None, source_offset: dict[str, Any] | None
) -> tuple[int, int] | None:
    """(binlog file index, offset) a MySQL/MariaDB stream committed: its last position (the
    end of the last event applied), else the reader offset it would resume from."""
    if position:
        committed = Position.parse(position)
        return committed.binlog_file_index, committed.coords[1]
    reader = (source_offset or {}).get("reader") or {}
    if isinstance(reader.get("file"), str) and reader.get("pos") is not None:
        return binlog_file_index(reader["file"]), int(reader["pos"])
    return None


def binlog_lag(
    source: BinlogServer, position: str | None, offset: dict[str, Any] | None
) -> tuple[str, int | None, str | None]:
    """(head ``file:offset``, bytes behind, why unknown) of a stream at ``position``/``offset``."""
    file, end = source.master_status()
    head = f"{file}:{end}"
    read = ((offset or {}).get("reader") or {}).get("server")
    if read and read != (now := source.identity()):
        return head, None, f"the stream last read server {read}; the source is now {now}"
    at = committed_binlog_point(position, offset)
    if at is None:
        return head, None, "no committed binlog position"
    lag = binlog_bytes_behind(source.binary_log_sizes(), (file, end), at)
    if lag is None:
        return head, None, f"binlog file #{at[0]} of the committed position is not on the server"
    return head, lag, None
