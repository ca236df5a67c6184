"""Stream lag in bytes and seconds behind against real MariaDB and PostgreSQL while a stopped
stream's source goes on writing."""

from __future__ import annotations

import dataclasses
import time
import uuid
from pathlib import Path

import pytest

from airflow_dblog.config import Config, parse_config
from airflow_dblog.engine.configured_source import open_reader, open_source
from airflow_dblog.engine.lag import stream_status
from airflow_dblog.engine.metadata import MetadataStore
from airflow_dblog.engine.metadata.database import utcnow
from tests.support.memory_sink import MemoryCapture, MemorySink
from tests.support.workload import Db, db_for, execute

ROWS_PER_ROUND = 40
NOTE = "x" * 250  # ~10 kB of binlog / WAL per round at least


def _config(db: Db, tmp_path: Path) -> Config:
    return parse_config(
        f"""
name: lag-{uuid.uuid4().hex[:8]}
source: {{type: {db.kind}, url: "{db.url}", tables: [{db.table()}]}}
metadata: {{url: "sqlite:///{tmp_path}/meta.db"}}
sinks: {{delta: {{path: {tmp_path}/delta}}}}
checkpoint: {tmp_path}/checkpoint
""",
        env={},
    )


@pytest.mark.integration
@pytest.mark.parametrize("kind", ["mysql", "postgres"])
def test_a_stopped_stream_falls_behind_while_writes_go_on(
    kind: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    db = dataclasses.replace(db_for(request, kind), name="lagged")
    text = "varchar(300)" if kind == "mysql" else "text"
    execute(db, f"CREATE TABLE {db.quoted()} (id int PRIMARY KEY, note {text})")
    config = _config(db, tmp_path)
    store = MetadataStore(config.metadata_url)
    assert stream_status(config, store).state == "unknown"

    # a real capture runs until it has committed a heartbeat (caught up), then stops
    capture = MemoryCapture(
        config, store, open_source(config), open_reader(config, None), [MemorySink()]
    )
    try:
        execute(db, f"INSERT INTO {db.quoted()} VALUES (0, 'first')")
        deadline = time.monotonic() + 20
        seen_change = False
        while True:
            assert time.monotonic() < deadline, "the capture never caught up"
            step = capture.step(timeout_s=0.2)
            seen_change = seen_change or step.emitted > 0
            state = store.stream_state(config.name)
            if seen_change and step.items and not step.emitted and state is not None:
                break  # a heartbeat after the change: read to the end of the log
    finally:
        capture.close()
    state = store.stream_state(config.name)
    assert state is not None and state.source_ts_ms is not None
    caught_up = stream_status(config, store)
    assert caught_up.state == "running", caught_up
    assert caught_up.lag_bytes is not None and caught_up.lag_s is not None, caught_up
    assert caught_up.lag_s < 5, caught_up  # other tests may write to the same server

    # the stream is stopped; the source goes on writing: the lag grows with every round
    previous = caught_up
    source = open_source(config)
    try:
        for round_ in range(1, 3):
            execute(
                db,
                f"INSERT INTO {db.quoted()} VALUES (%s, %s)",
                [(round_ * 1000 + i, NOTE) for i in range(ROWS_PER_ROUND)],
            )
            time.sleep(1.0)
            now = stream_status(config, store, source)
            assert now.lag_bytes is not None and now.lag_s is not None, now
            assert now.lag_bytes >= previous.lag_bytes + ROWS_PER_ROUND * len(NOTE), (previous, now)
            assert now.lag_s >= previous.lag_s + 1.0, (previous, now)
            assert now.head != previous.head and now.position == caught_up.position
            previous = now
    finally:
        source.close()
    assert stream_status(config, store, stale_after_s=0.5).state == "stopped"
    store.save_stream_state(config.name, heartbeat_at=utcnow(), leader="host:1")
    assert stream_status(config, store).leader == "host:1"
