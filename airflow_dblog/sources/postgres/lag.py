"""How far a PostgreSQL stream is behind in bytes: ``pg_current_wal_lsn()`` minus the LSN up
to which every transaction is committed downstream (the reader offset's flush LSN)."""

from __future__ import annotations

from typing import Any, Protocol

from airflow_dblog.core.position import Position, int_to_lsn, lsn_to_int


class WalServer(Protocol):
    """What the lag asks of a PostgreSQL source."""

    def current_wal_lsn(self) -> int: ...


def wal_bytes_behind(head_lsn: int, at_lsn: int) -> int:
    """WAL bytes from ``at_lsn`` to ``head_lsn`` (0 when the stream is at or past the head)."""
    return max(0, head_lsn - at_lsn)


def committed_lsn(position: str | None, source_offset: dict[str, Any] | None) -> int | None:
    """The LSN up to which a PostgreSQL stream committed every transaction: the reader
    offset's flush LSN, else the last position's LSN."""
    reader = (source_offset or {}).get("reader") or {}
    if reader.get("flush_lsn"):
        return lsn_to_int(str(reader["flush_lsn"]))
    if position:
        return Position.parse(position).coords[0]
    return None


def wal_lag(
    source: WalServer, position: str | None, offset: dict[str, Any] | None
) -> tuple[str, int | None, str | None]:
    """(head LSN, bytes behind, why unknown) of a stream at ``position``/``offset``."""
    head = source.current_wal_lsn()
    at = committed_lsn(position, offset)
    if at is None:
        return int_to_lsn(head), None, "no committed LSN"
    return int_to_lsn(head), wal_bytes_behind(head, at), None
