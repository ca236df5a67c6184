"""Stream lag: the arithmetic, the source time a stream commits, and the health line
(tests/integration/engine/test_lag.py measures it against real MariaDB and PostgreSQL)."""

from __future__ import annotations

import time
from datetime import datetime, timedelta
from pathlib import Path

from airflow_dblog.config import parse_config
from airflow_dblog.core.events import ChangeEvent, Heartbeat, LogItem, TableId, WatermarkEvent
from airflow_dblog.core.position import Position
from airflow_dblog.engine.capture import SpooledCapture
from airflow_dblog.engine.lag import StreamStatus, seconds_behind, source_time_ms, stream_state
from airflow_dblog.engine.metadata import MetadataStore
from airflow_dblog.engine.spool import Spool
from airflow_dblog.sources.base import Wake
from airflow_dblog.sources.mysql.lag import binlog_bytes_behind, committed_binlog_point
from airflow_dblog.sources.postgres.lag import committed_lsn, wal_bytes_behind

LOGS = [("bin.000007", 1000), ("bin.000008", 5000), ("bin.000009", 700)]


def test_binlog_bytes_behind_sums_the_files_between() -> None:
    head = ("bin.000009", 700)
    assert binlog_bytes_behind(LOGS, head, (9, 700)) == 0
    assert binlog_bytes_behind(LOGS, head, (9, 300)) == 400
    assert binlog_bytes_behind(LOGS, head, (9, 900)) == 0  # a heartbeat past the status read
    # rest of file 7, all of file 8, file 9 up to the head
    assert binlog_bytes_behind(LOGS, head, (7, 400)) == 600 + 5000 + 700
    assert binlog_bytes_behind(LOGS, head, (8, 5000)) == 700
    # the head file's size is the status's offset, not SHOW BINARY LOGS' (read a moment apart)
    assert binlog_bytes_behind(LOGS, ("bin.000009", 800), (8, 4000)) == 1000 + 800
    # a new file the listing does not show yet
    assert binlog_bytes_behind(LOGS, ("bin.000010", 120), (9, 700)) == 120
    assert binlog_bytes_behind(LOGS, head, (6, 10)) is None  # purged
    assert binlog_bytes_behind(LOGS, ("bin.000001", 400), (9, 10)) is None  # RESET MASTER


def test_wal_and_seconds_behind() -> None:
    assert wal_bytes_behind(0x2_0000_0100, 0x1_FFFF_FF00) == 0x200
    assert wal_bytes_behind(100, 150) == 0
    now = 1_700_000_010_000
    assert seconds_behind(0, None, now) == 0.0  # caught up: 0 s, whatever the last change's age
    assert seconds_behind(0, now - 3_600_000, now) == 0.0
    assert seconds_behind(512, now - 2_500, now) == 2.5
    assert seconds_behind(512, now + 1_000, now) == 0.0  # clocks a little apart
    assert seconds_behind(512, None, now) is None
    assert seconds_behind(None, now - 2_500, now) is None


def test_stream_state_from_the_last_commit() -> None:
    now = datetime(2026, 1, 1, 12, 0, 0)
    assert stream_state(None, now) == "unknown"
    assert stream_state(now - timedelta(seconds=5), now) == "running"
    assert stream_state(now - timedelta(seconds=61), now) == "stopped"
    assert stream_state(now - timedelta(seconds=5), now, stale_after_s=2) == "stopped"


def test_source_time_takes_changes_and_heartbeats() -> None:
    t = TableId("app", "t")
    change = ChangeEvent(t, "c", (1,), Position.postgres(100, 1), after={"id": 1}, ts_ms=5_000)
    old = ChangeEvent(t, "u", (1,), Position.postgres(200, 1), after={"id": 1}, ts_ms=4_000)
    mark = WatermarkEvent("s", "x", Position.postgres(300, 1))
    assert source_time_ms([], 9_000, None) is None
    assert source_time_ms([], 9_000, 1_000) == 1_000
    assert source_time_ms([change, old, mark], 9_000, None) == 5_000  # never backwards
    assert source_time_ms([change, Heartbeat(Position.postgres(400, 0))], 9_000, None) == 9_000
    unstamped = ChangeEvent(t, "c", (2,), Position.postgres(500, 1), after={"id": 2})
    assert source_time_ms([unstamped], 9_000, 7_000) == 7_000


def test_committed_points() -> None:
    position = str(Position.mysql(42, 1234, 2**32 - 1, epoch=3))
    assert committed_binlog_point(position, None) == (42, 1234)  # the epoch is not a file
    offset = {"reader": {"file": "bin.000041", "pos": 4}}
    assert committed_binlog_point(None, offset) == (41, 4)
    assert committed_binlog_point(None, {"reader": {"file": None, "pos": None}}) is None
    pg = str(Position.postgres(0x1_0000_0000, 3))
    assert committed_lsn(pg, {"reader": {"flush_lsn": "1/80"}}) == 0x1_0000_0080
    assert committed_lsn(pg, None) == 0x1_0000_0000
    assert committed_lsn(None, {}) is None


class _Source:
    kind, lineage_epoch = "mysql", 0

    def ensure_watermark_table(self) -> None: ...

    def check_commit_order(self) -> None: ...

    def close(self) -> None: ...


class _Reader:
    lineage_epoch = 0

    def __init__(self, reads: list[list[LogItem]]) -> None:
        self.reads, self.done = reads, 0

    def read(self, max_items: int, timeout_s: float, wake: Wake | None = None) -> list[LogItem]:
        if not self.reads:
            return []
        self.done += 1
        return self.reads.pop(0)

    def offset(self) -> dict[str, object]:
        return {"file": "bin.000001", "pos": 100 * self.done}

    def acknowledge(self, offset: object) -> None: ...

    def close(self) -> None: ...


def test_the_stream_commits_the_source_time_of_its_position(tmp_path: Path) -> None:
    """Spooled segments carry the source time; the commit saves the latest one."""
    config = parse_config(
        f"""
name: s
source: {{type: mysql, url: "mysql://u:p@127.0.0.1:1/app", tables: [app.t]}}
metadata: {{url: "sqlite:///{tmp_path}/meta.db"}}
sinks: {{delta: {{path: {tmp_path}/delta}}}}
checkpoint: {tmp_path}/checkpoint
""",
        env={},
    )
    store = MetadataStore(config.metadata_url)
    t = TableId("app", "t")
    change = ChangeEvent(t, "c", (1,), Position.mysql(1, 50), after={"id": 1}, ts_ms=5_000)
    reader = _Reader([[change], [Heartbeat(Position.mysql(1, 90, 2**32 - 1))]])
    spool = Spool(tmp_path / "spool")
    capture = SpooledCapture(config, store, _Source(), lambda offset: reader, spool)  # type: ignore[arg-type]
    capture.step(timeout_s=0)
    assert capture.source_ts_ms == 5_000
    capture.committed([spool.footer(seq) for seq in spool.segments()])
    state = store.stream_state("s")
    assert state is not None and state.source_ts_ms == 5_000
    before = int(time.time() * 1000)
    capture._spooled_at = 0.0  # write the next segment at once
    capture.step(timeout_s=0)
    capture.committed([spool.footer(seq) for seq in spool.segments()])
    state = store.stream_state("s")
    assert state is not None and state.source_ts_ms is not None
    assert before <= state.source_ts_ms <= time.time() * 1000  # the heartbeat: read to the end
    assert state.position == str(Position.mysql(1, 90, 2**32 - 1))


def _status(**kw: object) -> StreamStatus:
    values: dict[str, object] = {
        "name": "s",
        "state": "running",
        "leader": None,
        "lag_bytes": 10,
        "lag_s": 1.0,
        "position": None,
        "head": "bin.000001:10",
        "heartbeat_at": datetime(2026, 1, 1),
        "last_event_at": None,
    }
    values.update(kw)
    return StreamStatus(**values)  # type: ignore[arg-type]


def test_health_problem_and_line() -> None:
    assert _status().problem(300, 1000) is None
    assert _status(lag_s=301.0).problem(300, 1000) == (
        "stream s is 301s and 10 bytes behind its source (limits 300s, 1000 bytes)"
    )
    assert "bytes behind" in str(_status(lag_bytes=1001).problem(300, 1000))
    assert _status(state="stopped").problem(300, 1000) == "stream s is stopped"
    unknown = _status(lag_bytes=None, lag_s=None, note="source: cannot reach MySQL")
    assert unknown.problem(300, 1000) == "stream s: lag unknown (source: cannot reach MySQL)"
    assert _status(leader="h:1").line() == (
        "stream s [running] leader h:1: 10 bytes, 1.0s behind the source (at bin.000001:10),"
        " last commit 2026-01-01T00:00:00Z"
    )
    assert unknown.line().endswith(
        "lag unknown, last commit 2026-01-01T00:00:00Z - source: cannot reach MySQL"
    )
    assert _status().as_dict()["heartbeat_at"] == "2026-01-01T00:00:00Z"
