"""The stream sensor and its trigger against real MariaDB (the lag is the binlog's) and a SQLite
metadata store."""

from __future__ import annotations

import asyncio
import re
import time
from pathlib import Path
from typing import Any

import pytest

from airflow_dblog.config import load_config
from airflow_dblog.engine.metadata import MetadataStore
from airflow_dblog.engine.metadata.database import utcnow
from airflow_dblog.provider.sensors.dblog import DblogStreamSensor, StreamUnhealthy
from airflow_dblog.provider.triggers.dblog import DblogStreamTrigger
from tests.support.trigger_loop import collect


@pytest.fixture
def config_path(mysql_db: Any, tmp_path: Path) -> str:
    conn = mysql_db.connect()
    with conn.cursor() as cur:
        cur.execute("CREATE TABLE t (id INT PRIMARY KEY, v VARCHAR(200))")
    conn.close()
    file = tmp_path / "dblog.yaml"
    file.write_text(
        f"""
name: kept
source: {{type: mysql, url: "{mysql_db.url}", tables: [{mysql_db.name}.t]}}
metadata: {{url: "sqlite:///{tmp_path}/meta.db"}}
sinks: {{delta: {{path: {tmp_path}/delta}}}}
checkpoint: {tmp_path}/cp
"""
    )
    return str(file)


def _commit_at_head(config_path: str, mysql_db: Any, age_s: float = 0.0) -> None:
    """The stream's state as if it had committed the binlog up to its end ``age_s`` ago."""
    conn = mysql_db.connect()
    with conn.cursor() as cur:
        cur.execute("SHOW MASTER STATUS")
        file, pos = cur.fetchone()[:2]
    conn.close()
    config = load_config(config_path)
    MetadataStore(config.metadata_url).save_stream_state(
        config.name,
        source_offset={"reader": {"file": file, "pos": int(pos)}},
        heartbeat_at=utcnow(),
        source_ts_ms=int((time.time() - age_s) * 1000),
    )


def _write_rows(mysql_db: Any, n: int) -> None:
    conn = mysql_db.connect()
    with conn.cursor() as cur:
        cur.executemany("INSERT INTO t VALUES (%s, %s)", [(i, "x" * 100) for i in range(n)])
    conn.close()


@pytest.mark.integration
def test_trigger_fires_ok_lagging_and_down_from_the_real_binlog(
    config_path: str, mysql_db: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    _commit_at_head(config_path, mysql_db)
    trigger = DblogStreamTrigger(config_path=config_path, poll_interval_s=0.05)
    events, max_gap = asyncio.run(collect(trigger))
    assert [(e["status"], e["stream"]["lag_bytes"], e["stream"]["lag_s"]) for e in events] == [
        ("ok", 0, 0.0)
    ]
    assert max_gap < 0.5  # the source and store calls run in a thread

    _commit_at_head(config_path, mysql_db, age_s=600)
    _write_rows(mysql_db, 20)  # behind by their binlog bytes, and 600 s
    lagging = DblogStreamTrigger(
        config_path=config_path, max_lag_s=60, grace_s=0.3, poll_interval_s=0.05
    )
    events, _ = asyncio.run(collect(lagging))
    assert [e["status"] for e in events] == ["lagging"]
    assert events[0]["stream"]["lag_bytes"] > 20 * 100
    assert re.match(r"stream kept is 60[0-9]s and \d+ bytes behind", events[0]["reason"])
    assert events[0]["reason"].endswith("behind its source (limits 60s, 1073741824 bytes)")
    lines = [line for line in capsys.readouterr().out.splitlines() if "state=" in line]
    assert len(lines) >= 3  # each look, for 0.3 s of grace
    assert "stream kept: state=running lag_s=0.0 lag_bytes=0 | " in lines[0]
    assert "stream kept: state=running lag_s=600." in lines[-1]

    config = load_config(config_path)
    MetadataStore(config.metadata_url).save_stream_state(
        config.name, heartbeat_at=utcnow().replace(year=2020)
    )
    events, _ = asyncio.run(collect(DblogStreamTrigger(config_path=config_path, grace_s=60)))
    assert [e["status"] for e in events] == ["down"]  # at once, whatever the grace
    assert events[0]["reason"] == "stream kept is stopped"


@pytest.mark.integration
def test_sensor_poke_and_completion(config_path: str, mysql_db: Any) -> None:
    _commit_at_head(config_path, mysql_db)
    sensor = DblogStreamSensor(task_id="lag", config_path=config_path, deferrable=False)
    assert sensor.poke({}) is True
    _write_rows(mysql_db, 5)
    tight = DblogStreamSensor(
        task_id="tight", config_path=config_path, max_lag_bytes=10, deferrable=False
    )
    with pytest.raises(StreamUnhealthy, match=r"bytes behind its source \(limits 300s, 10 bytes\)"):
        tight.poke({})
    event = {"status": "down", "reason": "stream kept is stopped", "stream": {}}
    with pytest.raises(StreamUnhealthy, match=r"^stream kept is stopped; check the dblog stream"):
        sensor.execute_complete({}, event)
    ok = {"name": "kept", "state": "running", "lag_s": 0.0, "lag_bytes": 0}
    assert sensor.execute_complete({}, {"status": "ok", "reason": None, "stream": ok}) == ok
