"""Operators, sensor and hook against real MariaDB and a SQLite metadata store."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from airflow_dblog.errors import DblogError
from airflow_dblog.provider.hooks.dblog import DblogHook
from airflow_dblog.provider.operators.dblog import (
    DblogBackfillOperator,
    DblogControlOperator,
    DblogDumpOperator,
    DblogSetOperator,
)
from airflow_dblog.provider.sensors.dblog import DblogDumpSensor, DumpFailed


@pytest.fixture()
def config_path(mysql_db: Any, tmp_path: Path) -> str:
    conn = mysql_db.connect()
    with conn.cursor() as cur:
        cur.execute(
            "CREATE TABLE orders (id INT, region VARCHAR(8), total INT, PRIMARY KEY (id, region))"
        )
        cur.executemany(
            "INSERT INTO orders VALUES (%s, %s, %s)", [(i, r, i) for i in range(50) for r in "ab"]
        )
    conn.close()
    file = tmp_path / "dblog.yaml"
    file.write_text(
        f"""
name: inventory
source: {{type: mysql, url: "{mysql_db.url}", tables: [{mysql_db.name}.orders]}}
metadata: {{url: "sqlite:///{tmp_path}/meta.db"}}
dump: {{chunk_size: 40}}
sinks: {{delta: {{path: {tmp_path}/delta}}}}
checkpoint: {tmp_path}/cp
"""
    )
    return str(file)


def _dumps(config_path: str) -> int:
    hook = DblogHook(config_path=config_path)
    return len(hook.store.dumps(hook.config.name))


@pytest.mark.integration
def test_dump_backfill_control_and_set(config_path: str, mysql_db: Any) -> None:
    table = f"{mysql_db.name}.orders"
    dump_id = DblogDumpOperator(task_id="d", config_path=config_path).execute({})
    hook = DblogHook(config_path=config_path)
    assert hook.progress(dump_id).chunks_total == 3  # 100 rows / 40

    backfill = DblogBackfillOperator(
        task_id="b",
        table=table,
        keys='[1, "a"]\n{"id": 2, "region": "b"}\n[1, "a"]',
        config_path=config_path,
    ).execute({})
    (plan,) = hook.store.dump_tables(backfill)
    assert hook.store.progress(backfill).chunks_total == 1
    assert [c.keys for c in hook.store.chunks(backfill)] == [[[1, "a"], [2, "b"]]]
    assert plan.key_columns == ["id", "region"]

    state = DblogControlOperator(
        task_id="c", dump_id=str(dump_id), action="pause", config_path=config_path
    ).execute({})
    assert state == "paused"
    DblogSetOperator(task_id="s", chunk_size="500", config_path=config_path).execute({})
    assert hook.store.controls("inventory", hook.config.dump).chunk_size == 500


@pytest.mark.integration
@pytest.mark.parametrize(
    ("table", "keys", "message"),
    [
        ("{db}.nope", "1", "is not captured by stream inventory"),
        ("{db}.orders; DROP TABLE orders", "1", "is not captured by stream inventory"),
        ("{db}.orders", '["x", "a"]', "id"),
        ("{db}.orders", '[1, "a"', "not valid JSON"),
        ("{db}.orders", "[1]", "has 1 value(s)"),
        ("{db}.orders", "5", "is a single value"),
        ("{db}.orders", "", "no primary keys given"),
    ],
)
def test_bad_backfill_input_fails_first_task_and_writes_nothing(
    config_path: str, mysql_db: Any, table: str, keys: str, message: str
) -> None:
    before = _dumps(config_path)
    operator = DblogBackfillOperator(
        task_id="b", table=table.format(db=mysql_db.name), keys=keys, config_path=config_path
    )
    with pytest.raises(DblogError) as info:
        operator.execute({})
    assert message in str(info.value) and "\n" not in str(info.value)
    assert _dumps(config_path) == before


@pytest.mark.integration
def test_classic_sensor_logs_progress_and_fails_on_cancel(
    config_path: str, capsys: pytest.CaptureFixture[str]
) -> None:
    hook = DblogHook(config_path=config_path)
    dump_id = DblogDumpOperator(task_id="d", config_path=config_path).execute({})
    sensor = DblogDumpSensor(
        task_id="w", dump_id=dump_id, config_path=config_path, deferrable=False, log_interval_s=0
    )
    assert sensor.poke({}) is False
    chunk = hook.store.cut_range_chunk(hook.store.dump_tables(dump_id)[0].id, None, [19, "b"], "w")
    assert chunk is not None
    hook.store.complete_chunk(chunk.id, 40, 2, 38)
    assert sensor.poke({}) is False
    out = capsys.readouterr().out
    assert f"dump {dump_id} [running] chunks 1/3 (33.3%), rows emitted 38" in out
    assert "dropped as conflicting 2" in out and "ETA" in out
    hook.store.apply(dump_id, "cancel")
    with pytest.raises(DumpFailed, match=f"dump {dump_id} cancelled"):
        sensor.poke({})


@pytest.mark.integration
def test_hook_test_connection_reports_without_secrets(
    config_path: str, tmp_path: Path, mysql_db: Any
) -> None:
    ok, message = DblogHook(config_path=config_path).test_connection()
    assert ok, message
    bad = tmp_path / "bad.yaml"
    password = mysql_db.url.split(":")[2].split("@")[0]
    bad.write_text(Path(config_path).read_text().replace(f":{password}@", ":wrong-secret@"))
    ok, message = DblogHook(config_path=str(bad)).test_connection()
    assert not ok and "refused" in message and "wrong-secret" not in message


@pytest.mark.integration
def test_hook_stream_status_reads_real_lag(config_path: str, mysql_db: Any) -> None:
    hook = DblogHook(config_path=config_path)
    never = hook.stream_status()
    assert (never.state, never.lag_bytes, never.note) == ("unknown", None, "the stream never ran")
    from airflow_dblog.engine.metadata.database import utcnow
    from airflow_dblog.sources.mysql.source import MysqlSource

    with MysqlSource(mysql_db.url) as source:
        hook.store.save_stream_state(
            "inventory",
            position=str(source.binlog_position()),
            source_offset={"reader": {"server": source.identity()}},
            heartbeat_at=utcnow(),
            source_ts_ms=int(time.time() * 1000) - 60_000,
            leader="worker-1:77",
        )
    conn = mysql_db.connect()
    with conn.cursor() as cur:
        cur.executemany("INSERT INTO orders VALUES (%s, 'c', 1)", [(i,) for i in range(100)])
    conn.close()
    status = hook.stream_status()
    assert (status.state, status.leader) == ("running", "worker-1:77")
    assert status.lag_bytes is not None and status.lag_bytes > 500, status  # 100 small rows: ~1 kB
    lag_s = hook.stream_lag_s()
    assert lag_s is not None and lag_s >= 60
    assert "bytes behind" in str(status.problem(max_lag_s=30, max_lag_bytes=1 << 30))
