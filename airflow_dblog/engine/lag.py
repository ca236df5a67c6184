"""How far a stream is behind its source: its state, and bytes and seconds behind.

**Bytes behind** run from the source's head to the stream's last committed position (the one
the metadata store holds, saved once every sink holds the batch); the source measures them in
its own log (``Source.log_lag``: binlog bytes on MySQL/MariaDB, WAL bytes on PostgreSQL).

**Seconds behind** are now minus the source time the committed position stands for: the
source's timestamp of the last change committed (PostgreSQL: its commit time; MySQL/MariaDB:
the binlog event's, in whole seconds) or the time a heartbeat found the log read to its end,
whichever is later. Heartbeats make a stream whose tables are idle on a busy server read as
current, not as old as its last change. When nothing is behind in bytes the stream is caught up
and is 0 seconds behind; when the bytes are unknown (the source is unreachable, the committed
binlog file was purged, the stream followed another server) so are the seconds.

**State**: ``running`` when the stream committed within :data:`STALE_AFTER_S` (a running stream
commits every second or so, also when idle), ``stopped`` when its last commit is older,
``unknown`` when it never committed. ``leader`` is the last leader recorded (``ha`` only).

The arithmetic is pure (unit-tested); :func:`stream_status` does the I/O.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

from airflow_dblog.config import Config
from airflow_dblog.core.events import ChangeEvent, Heartbeat, LogItem
from airflow_dblog.engine.configured_source import open_source
from airflow_dblog.engine.metadata import MetadataStore
from airflow_dblog.engine.metadata.models import StreamState
from airflow_dblog.errors import DblogError
from airflow_dblog.redact import redact

STALE_AFTER_S = 60.0
"""A stream that has not committed for this long is ``stopped``."""


# -- the arithmetic ---------------------------------------------------------------------------


def seconds_behind(lag_bytes: int | None, source_ts_ms: int | None, now_ms: int) -> float | None:
    """0 when caught up (nothing behind in bytes); else now minus the source time the
    committed position stands for; None when either is unknown."""
    if lag_bytes == 0:
        return 0.0
    if lag_bytes is None or source_ts_ms is None:
        return None
    return max(0.0, (now_ms - source_ts_ms) / 1000)


def stream_state(
    heartbeat_at: datetime | None, now: datetime, stale_after_s: float = STALE_AFTER_S
) -> str:
    """``running``, ``stopped`` or ``unknown`` from the time of the stream's last commit."""
    if heartbeat_at is None:
        return "unknown"
    return "running" if (now - heartbeat_at).total_seconds() <= stale_after_s else "stopped"


def source_time_ms(items: Iterable[LogItem], now_ms: int, previous: int | None) -> int | None:
    """The source time the log stands at after ``items``: the latest change timestamp, or
    ``now_ms`` for a heartbeat (the reader found the log read to its end)."""
    latest = previous
    for item in items:
        if isinstance(item, Heartbeat):
            ts = now_ms
        elif isinstance(item, ChangeEvent) and item.ts_ms > 0:
            ts = item.ts_ms
        else:
            continue
        latest = ts if latest is None else max(latest, ts)
    return latest


# -- the status -------------------------------------------------------------------------------


@dataclass(frozen=True)
class StreamStatus:
    name: str
    state: str  # running | stopped | unknown
    leader: str | None
    lag_bytes: int | None
    lag_s: float | None
    position: str | None  # the committed position
    head: str | None  # the source's head: "binlog.000042:1234" or an LSN "0/16B3748"
    heartbeat_at: datetime | None  # the stream's last commit
    last_event_at: datetime | None  # its last commit that held changes
    note: str | None = None  # why a lag is unknown

    def as_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "state": self.state,
            "leader": self.leader,
            "lag_s": None if self.lag_s is None else round(self.lag_s, 3),
            "lag_bytes": self.lag_bytes,
            "position": self.position,
            "head": self.head,
            "heartbeat_at": _iso(self.heartbeat_at),
            "last_event_at": _iso(self.last_event_at),
            "note": self.note,
        }

    def problem(self, max_lag_s: float, max_lag_bytes: int) -> str | None:
        """Why a health check should fail (not running, lag unknown or past a limit); None
        when the stream is running within both limits."""
        if self.state != "running":
            return f"stream {self.name} is {self.state}" + (f" ({self.note})" if self.note else "")
        if self.lag_s is None or self.lag_bytes is None:
            return f"stream {self.name}: lag unknown ({self.note})"
        if self.lag_s > max_lag_s or self.lag_bytes > max_lag_bytes:
            return (
                f"stream {self.name} is {self.lag_s:.0f}s and {self.lag_bytes} bytes behind its"
                f" source (limits {max_lag_s:g}s, {max_lag_bytes} bytes)"
            )
        return None

    def line(self) -> str:
        """One line for ``dblog status``."""
        text = f"stream {self.name} [{self.state}]"
        if self.leader:
            text += f" leader {self.leader}"
        if self.lag_bytes is not None:
            behind = f"{self.lag_bytes} bytes"
            if self.lag_s is not None:
                behind += f", {self.lag_s:.1f}s"
            text += f": {behind} behind the source (at {self.head})"
        else:
            text += ": lag unknown"
        if self.heartbeat_at is not None:
            text += f", last commit {self.heartbeat_at.isoformat(timespec='seconds')}Z"
        return text + (f" - {self.note}" if self.note else "")


def _iso(value: datetime | None) -> str | None:
    return None if value is None else value.isoformat() + "Z"


def stream_status(
    config: Config,
    store: MetadataStore,
    source: Any = None,
    *,
    stale_after_s: float = STALE_AFTER_S,
) -> StreamStatus:
    """The stream's state and lag; ``source`` (opened from the config when None) gives the head.

    The source failing (unreachable, a missing grant) leaves the lag unknown, with a note.
    """
    row: StreamState | None = store.stream_state(config.name)
    now_ms = int(time.time() * 1000)
    now = datetime.fromtimestamp(now_ms / 1000, timezone.utc).replace(tzinfo=None)
    position = row.position if row else None
    offset = row.source_offset if row else None
    head = lag_bytes = note = None
    if row is None or not (position or offset):
        note = "the stream never ran"
    else:
        opened = source is None
        try:
            if source is None:
                source = open_source(config)
            head, lag_bytes, note = source.log_lag(position, offset)
        except (DblogError, ImportError) as err:
            note = "source: " + redact(str(err)).splitlines()[0]
        finally:
            if opened and source is not None:
                source.close()
    return StreamStatus(
        name=config.name,
        state=stream_state(row.heartbeat_at if row else None, now, stale_after_s),
        leader=row.leader if row else None,
        lag_bytes=lag_bytes,
        lag_s=seconds_behind(lag_bytes, row.source_ts_ms if row else None, now_ms),
        position=position,
        head=head,
        heartbeat_at=row.heartbeat_at if row else None,
        last_event_at=row.last_event_at if row else None,
        note=note,
    )
