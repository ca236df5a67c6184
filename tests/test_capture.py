"""The capture engine end to end on real MariaDB and PostgreSQL, for every watermark strategy.

Three writer threads insert, update and delete (reusing deleted keys) in a table with a
composite key while a dump with ~100-row chunks runs. The table is loaded before the reader
starts, so its original rows can reach the output only through the dump. Afterwards replaying
the output gives exactly the source table, and no key's positions ever go backwards.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from workload import Db, db_for, load, source_rows, writers

from airflow_dblog.capture import Capture
from airflow_dblog.config import Config, parse_config
from airflow_dblog.metadata import MetadataStore
from airflow_dblog.planner import plan_dump
from airflow_dblog.sinks.memory_sink import MemorySink
from airflow_dblog.sources import open_reader, open_source

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def _config(db: Db, watermark: str, tmp_path: Path) -> Config:
    return parse_config(
        f"""
name: cap-{uuid.uuid4().hex[:8]}
source:
  type: {db.kind}
  url: {db.url}
  tables: [{db.table()}]
  watermark: {watermark}
metadata: {{url: "sqlite:///{tmp_path}/meta.db"}}
dump: {{chunk_size: 100, parallelism: 2}}
sinks: {{delta: {{path: {tmp_path}/delta}}}}
checkpoint: {tmp_path}/checkpoint
""",
        env={},
    )


def _open(config: Config, store: MetadataStore, sink: MemorySink) -> Capture:
    state = store.stream_state(config.name)
    saved = (state.source_offset or {}) if state else {}
    reader = open_reader(config, saved.get("reader"))
    return Capture(
        config, store, open_source(config), reader, [sink], batch_id=saved.get("batch_id", 0)
    )


def _run_until(capture: Capture, done: Callable[[], bool], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not done():
        assert time.monotonic() < deadline, "capture did not get there in time"
        capture.step(timeout_s=0.05)


def _drain(capture: Capture, quiet_s: float = 2.0) -> None:
    """Step until the log has been quiet (no change emitted) for ``quiet_s``."""
    quiet_since = time.monotonic()
    deadline = quiet_since + 120
    while time.monotonic() - quiet_since < quiet_s:
        assert time.monotonic() < deadline, "the log never went quiet"
        if capture.step(timeout_s=0.1).emitted:
            quiet_since = time.monotonic()


CASES = [
    ("mysql", "table"),
    ("mysql", "gtid"),
    ("mysql", "snapshot"),
    ("postgres", "table"),
    ("postgres", "snapshot"),
]


@pytest.mark.parametrize("restart", [False, True], ids=["straight", "restart"])
@pytest.mark.parametrize(("kind", "watermark"), CASES, ids=[f"{k}-{w}" for k, w in CASES])
def test_dump_under_concurrent_writes_converges(
    request: pytest.FixtureRequest, tmp_path: Path, kind: str, watermark: str, restart: bool
) -> None:
    db = db_for(request, kind)
    load(db)
    config = _config(db, watermark, tmp_path)
    store = MetadataStore(config.metadata_url)
    sink = MemorySink()
    capture = _open(config, store, sink)  # the log starts here: seed rows come only by dump
    with writers(db) as counts:
        _run_until(capture, lambda: counts.total() > 200, 60)
        dump_id = plan_dump(config, store, requested_by="test")
        if restart:
            _run_until(capture, lambda: store.progress(dump_id).chunks_done >= 60, 300)
            capture.reader.close()  # crash: nothing else is flushed or closed
            capture = _open(config, store, sink)
        _run_until(capture, lambda: store.progress(dump_id).state == "done", 600)
    _drain(capture)
    capture.close()

    progress = store.progress(dump_id)
    assert progress.rows_emitted > 0 and progress.rows_dropped >= 0
    assert counts["insert"] and counts["update"] and counts["delete"]
    table = db.table()
    assert sink.rows(table) == source_rows(db)

    last: dict[tuple[Any, ...], Any] = {}
    for event in sink.received:
        assert event.table == table
        assert event.key not in last or last[event.key] < event.position, event
        last[event.key] = event.position
    dumped = [e for e in sink.received if e.op == "r"]
    assert len(dumped) == progress.rows_emitted

    attempts = [c.attempts for c in store.chunks(dump_id)]
    assert max(attempts) <= 1 + restart
    assert sum(a - 1 for a in attempts) <= (config.dump.parallelism if restart else 0)
