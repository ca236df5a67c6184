"""The streaming job end to end: `dblog stream` as a real process, Spark, Delta, Kafka, MariaDB/PG.

Writers change a composite-key table at random while a dump runs through the stream; afterwards
the Delta table equals the source table and its change feed shows no key going back in
``_dblog_position`` and no change applied twice; a read_committed consumer of the Kafka topic
sees per key only growing positions and rebuilds the source table. The same holds when the
stream is killed with SIGKILL mid-dump and started again. Live controls reach the running job
within seconds.
"""

from __future__ import annotations

import json
import re
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from services import read_committed, restart_local_service
from stream_process import Stream
from workload import Db, db_for, load, source_rows, writers

from airflow_dblog.cli import main as dblog
from airflow_dblog.config import Config, load_config
from airflow_dblog.metadata import MetadataStore

pytestmark = [pytest.mark.integration, pytest.mark.slow]

# ~100 transactions/s from three writers: busy, and within what one local Spark on a
# two-core machine merges into Delta while the dump runs
WRITER_PAUSE_S = 0.05
HA_SESSION_S = 4


def _write_config(
    db: Db,
    tmp_path: Path,
    chunk_size: int,
    delay_ms: int = 0,
    kafka: str | None = None,
    signal_topic: str | None = None,
    zookeeper: str | None = None,
    metadata_url: str | None = None,
) -> Path:
    path = tmp_path / "stream.yaml"
    name = f"st-{uuid.uuid4().hex[:8]}"
    signals = f", signal_topic: {signal_topic}" if signal_topic else ""
    kafka_sink = (
        f", kafka: {{bootstrap_servers: '{kafka}', topic_prefix: {name}{signals}}}" if kafka else ""
    )
    path.write_text(
        f"""
name: {name}
source:
  type: {db.kind}
  url: {db.url}
  tables: [{db.table()}]
metadata: {{url: "{metadata_url or f"sqlite:///{tmp_path}/meta.db"}"}}
dump: {{chunk_size: {chunk_size}, parallelism: 2, delay_ms: {delay_ms}}}
sinks: {{delta: {{path: {tmp_path}/delta}}{kafka_sink}}}
checkpoint: {tmp_path}/checkpoint
spark:
  master: "local[2]"
  conf: {{spark.ui.enabled: false, spark.sql.shuffle.partitions: 2}}
"""
        + (
            f"ha: {{zookeeper: '{zookeeper}', session_timeout_s: {HA_SESSION_S}}}\n"
            if zookeeper
            else ""
        )
    )
    return path


def _live_stream(
    config_path: Path, stream_factory: Callable[[Path], Stream]
) -> tuple[Config, MetadataStore, Stream]:
    """The config, its metadata store, and the stream started and capturing the log."""
    config = load_config(config_path)
    store = MetadataStore(config.metadata_url)
    stream = stream_factory(config_path)
    stream.start()
    stream.wait_capturing()
    return config, store, stream


def _until_first_changes_in_delta(config: Config, db: Db, stream: Stream) -> None:
    log = Path(_table_path(config, db)) / "_delta_log"
    _until("the writers' first changes in Delta", log.exists, 180, stream)


def _until(what: str, done: Callable[[], bool], timeout_s: float, stream: Stream) -> None:
    deadline = time.monotonic() + timeout_s
    while not done():
        stream.check_alive()
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.5)


def _table_path(config: Config, db: Db) -> str:
    assert config.delta is not None
    return f"{config.delta.path}/{db.table().db}/{db.table().table}"


def _delta_rows(
    spark: Any, config: Config, db: Db, columns: tuple[str, ...] = ("a", "b", "v", "note")
) -> dict[tuple[Any, ...], dict[str, Any]]:
    path = _table_path(config, db)
    rows = spark.read.format("delta").load(path).where("NOT _dblog_deleted").collect()
    return {(r["a"], r["b"]): {c: r[c] for c in columns} for r in rows}


def _change_feed(spark: Any, config: Config, db: Db) -> list[Any]:
    return (
        spark.read.format("delta")
        .option("readChangeFeed", "true")
        .option("startingVersion", 0)
        .load(_table_path(config, db))
        .where("_change_type IN ('insert', 'update_postimage')")
        .select("a", "b", "_dblog_position", "_commit_version")
        .collect()
    )


@pytest.fixture
def stream_factory() -> Iterator[Callable[[Path], Stream]]:
    streams: list[Stream] = []

    def make(path: Path) -> Stream:
        streams.append(Stream(path))
        return streams[-1]

    yield make
    for s in streams:
        if s.proc is not None:
            s.stop()


def _check_kafka(servers: str, config: Config, db: Db, expected: dict[Any, Any]) -> None:
    """Per key: positions only grow, no change twice, and replaying gives the source table."""
    table = db.table()
    messages = read_committed(servers, f"{config.name}.{table.db}.{table.table}", quiet_s=5)
    changes = [((key["a"], key["b"]), value) for key, value in messages]
    state: dict[tuple[Any, ...], dict[str, Any] | None] = {}
    last: dict[tuple[Any, ...], str] = {}
    for key, value in changes:
        if value is None:
            assert state.get(key) is None, f"tombstone for {key} without its delete"
            continue
        position = value["source"]["position"]
        assert key not in last or last[key] < position, f"{key}: {position} after {last[key]}"
        last[key] = position
        state[key] = None if value["op"] == "d" else value["after"]
    rebuilt = {k: {c: row[c] for c in ("a", "b", "v", "note")} for k, row in state.items() if row}
    assert rebuilt == expected


@pytest.mark.parametrize("kill", [False, True], ids=["straight", "kill-9"])
@pytest.mark.parametrize("kind", ["mysql", "postgres"])
def test_stream_dump_into_delta_and_kafka_converges(
    request: pytest.FixtureRequest,
    tmp_path: Path,
    spark: Any,
    kafka_server: Any,
    stream_factory: Callable[[Path], Stream],
    kind: str,
    kill: bool,
) -> None:
    db = db_for(request, kind)
    load(db)
    config_path = _write_config(
        db,
        tmp_path,
        chunk_size=500,
        delay_ms=600 if kill else 0,
        kafka=kafka_server.bootstrap_servers,
    )
    config, store, stream = _live_stream(config_path, stream_factory)
    with writers(db, pause_s=WRITER_PAUSE_S) as counts:
        _until_first_changes_in_delta(config, db, stream)
        assert dblog(["dump", "-c", str(config_path), "--all"]) == 0
        (dump,) = store.dumps(config.name)
        if kill:
            _until("a chunk", lambda: store.progress(dump.id).chunks_done >= 1, 300, stream)
            stream.kill()
            assert store.progress(dump.id).state == "running"
            stream.start()
            assert dblog(["set", "-c", str(config_path), "--delay-ms", "0"]) == 0  # finish fast
        _until("the dump", lambda: store.progress(dump.id).state == "done", 600, stream)
        time.sleep(2)
    _check_outputs(spark, kafka_server.bootstrap_servers, config, db, stream)
    assert stream.stop() == 0
    assert counts["insert"] and counts["update"] and counts["delete"]
    assert store.progress(dump.id).rows_emitted > 0
    attempts = [c.attempts for c in store.chunks(dump.id)]
    assert max(attempts) <= (2 if kill else 1)


@pytest.mark.parametrize("fault", ["kafka", "metadata"])
def test_a_kafka_or_metadata_database_outage_mid_dump_loses_nothing(
    request: pytest.FixtureRequest,
    tmp_path: Path,
    spark: Any,
    kafka_server: Any,
    stream_factory: Callable[[Path], Stream],
    _servers: Any,
    fault: str,
) -> None:
    """The Kafka broker, or the metadata database (PostgreSQL here), stops for 15 s mid-dump
    and comes back, writers running: the stream rides it out or exits with one line; either
    way, once (re)started, Delta and read_committed Kafka equal the source, no change twice."""
    if _servers.backend != "local":
        pytest.skip("restarts the local services only (a container's mapped port would change)")
    db = db_for(request, "mysql")
    load(db)
    metadata_url = (
        request.getfixturevalue("postgres_db").sqlalchemy_url if fault == "metadata" else None
    )
    config_path = _write_config(
        db,
        tmp_path,
        chunk_size=500,
        delay_ms=600,
        kafka=kafka_server.bootstrap_servers,
        metadata_url=metadata_url,
    )
    config, store, stream = _live_stream(config_path, stream_factory)
    with writers(db, pause_s=WRITER_PAUSE_S):
        _until_first_changes_in_delta(config, db, stream)
        assert dblog(["dump", "-c", str(config_path), "--all"]) == 0
        (dump,) = store.dumps(config.name)
        _until("a chunk", lambda: store.progress(dump.id).chunks_done >= 2, 300, stream)
        restart_local_service("kafka" if fault == "kafka" else "postgres", down_s=15)
        assert dblog(["set", "-c", str(config_path), "--delay-ms", "0"]) == 0
        exits = 0
        deadline = time.monotonic() + 600
        while store.progress(dump.id).state != "done":
            assert stream.proc is not None
            if stream.proc.poll() is not None:  # what a supervisor does
                exits += 1
                assert exits == 1, "the restarted stream exited again"
                stream.start()
            assert time.monotonic() < deadline, "timed out waiting for the dump"
            time.sleep(0.5)
        time.sleep(2)
    _check_outputs(spark, kafka_server.bootstrap_servers, config, db, stream)
    assert stream.stop() == 0
    errors = [line for line in stream.log.read_text().splitlines() if "dblog: error:" in line]
    print(f"{fault} outage of 15 s: the stream exited {exits} time(s): {errors}")
    if fault == "kafka":
        assert exits == 0, errors  # the producer reconnects; the commit waits for the broker
    else:
        assert exits == 1 and len(errors) == 1
        assert "the metadata database postgresql" in errors[0] and ":***@" in errors[0]


def _check_outputs(spark: Any, servers: str, config: Config, db: Db, stream: Stream) -> None:
    """Delta equals the source, its change feed never goes back per key, Kafka rebuilds it."""
    expected = source_rows(db)
    deadline = time.monotonic() + 180
    while (actual := _delta_rows(spark, config, db)) != expected and time.monotonic() < deadline:
        stream.check_alive()
        time.sleep(2)
    missing = expected.keys() - actual.keys()
    extra = actual.keys() - expected.keys()
    differ = [k for k in expected.keys() & actual.keys() if expected[k] != actual[k]]
    assert (len(missing), len(extra), len(differ)) == (0, 0, 0), (
        sorted(missing)[:5],
        sorted(extra)[:5],
        differ[:5],
    )
    last: dict[tuple[Any, ...], str] = {}
    seen: set[tuple[Any, ...]] = set()
    for row in sorted(_change_feed(spark, config, db), key=lambda r: r["_commit_version"]):
        key, position = (row["a"], row["b"]), row["_dblog_position"]
        assert (key, position) not in seen, f"change {position} of {key} applied twice"
        seen.add((key, position))
        assert key not in last or last[key] < position, f"{key} went back to {position}"
        last[key] = position
    _check_kafka(servers, config, db, expected)


def test_live_controls_and_signals_reach_the_running_stream(
    request: pytest.FixtureRequest,
    tmp_path: Path,
    kafka_server: Any,
    kafka_topic: str,
    stream_factory: Callable[[Path], Stream],
) -> None:
    db = db_for(request, "mysql")
    load(db)
    servers = kafka_server.bootstrap_servers
    config_path = _write_config(
        db, tmp_path, chunk_size=200, delay_ms=300, kafka=servers, signal_topic=kafka_topic
    )
    config, store, stream = _live_stream(config_path, stream_factory)
    c = str(config_path)
    assert dblog(["dump", "-c", c, "--all"]) == 0
    (dump,) = store.dumps(config.name)

    def started() -> int:
        return sum(ch.state != "pending" for ch in store.chunks(dump.id))

    _until("chunks to start", lambda: started() >= 3, 120, stream)
    assert dblog(["pause", "-c", c, "--dump", str(dump.id)]) == 0
    paused_at = time.monotonic()
    time.sleep(3)  # what was claimed before the pause reached the stream may still start
    settled = started()
    settle_s = time.monotonic() - paused_at
    time.sleep(5)
    assert started() == settled, "chunks kept starting after the pause"
    assert store.progress(dump.id).state == "paused"
    assert settle_s < 5

    assert dblog(["set", "-c", c, "--delay-ms", "0", "--chunk-size", "1000"]) == 0
    assert dblog(["resume", "-c", c, "--dump", str(dump.id)]) == 0
    _until("the resumed dump", lambda: store.progress(dump.id).state == "done", 300, stream)
    sizes = {ch.rows_selected for ch in store.chunks(dump.id) if ch.rows_selected}
    assert max(sizes) > 200, "the new chunk size never reached the stream"

    assert dblog(["dump", "-c", c, "--all"]) == 0
    second = max(d.id for d in store.dumps(config.name))
    assert dblog(["cancel", "-c", c, "--dump", str(second)]) == 0
    time.sleep(3)
    assert store.progress(second).state == "cancelled"
    assert all(ch.state in ("pending", "cancelled", "done") for ch in store.chunks(second))

    from confluent_kafka import Producer

    producer = Producer(kafka_server.config())
    execute = {"type": "execute-snapshot", "data": {"data-collections": [str(db.table())]}}
    producer.produce(kafka_topic, key=config.name.encode(), value=b"{malformed")
    producer.produce(kafka_topic, key=config.name.encode(), value=json.dumps(execute).encode())
    producer.flush(30)
    _until("the signalled dump", lambda: len(store.dumps(config.name)) == 3, 60, stream)
    third = max(d.id for d in store.dumps(config.name))
    assert store.dump(third).requested_by.startswith("kafka-signal")
    _until(
        "the signalled dump to finish", lambda: store.progress(third).state == "done", 300, stream
    )
    assert "signal " in stream.log.read_text() and "skipped" in stream.log.read_text()
    assert stream.stop() == 0


def test_standbys_take_over_a_dead_or_frozen_leader_and_the_old_one_writes_nothing(
    request: pytest.FixtureRequest,
    tmp_path: Path,
    spark: Any,
    kafka_server: Any,
    zookeeper_server: Any,
    zk_path: str,
) -> None:
    """kill -9 of the leader mid-dump, then SIGSTOP of the next one past its ZooKeeper session.

    Each time a standby takes the lease; the frozen one, woken up, stops without committing.
    """
    db = db_for(request, "mysql")
    load(db)
    servers = kafka_server.bootstrap_servers
    config_path = _write_config(
        db,
        tmp_path,
        500,
        delay_ms=600,
        kafka=servers,
        zookeeper=zookeeper_server.connect_string(zk_path),
    )
    config = load_config(config_path)
    store = MetadataStore(config.metadata_url)
    a, b, c = (Stream(config_path, name) for name in "abc")

    def leader() -> str | None:
        state = store.stream_state(config.name)
        return state.leader if state else None

    def takeover(new: Stream) -> float:
        since = time.monotonic()
        _until(
            "a standby to lead",
            lambda: leader() is not None and leader().endswith(f":{new.proc.pid}"),
            120,
            new,
        )
        return time.monotonic() - since

    try:
        a.start()
        a.wait_capturing()
        b.start()
        _until("b to wait", lambda: "standby" in b.log.read_text(), 120, b)
        with writers(db, pause_s=WRITER_PAUSE_S):
            assert dblog(["dump", "-c", str(config_path), "--all"]) == 0
            (dump,) = store.dumps(config.name)
            _until("a chunk", lambda: store.progress(dump.id).chunks_done >= 1, 300, a)
            a.kill()
            killed_s = takeover(b)
            _until("a chunk under b", lambda: store.progress(dump.id).chunks_done >= 5, 300, b)
            c.start()
            _until("c to wait", lambda: "standby" in c.log.read_text(), 120, c)
            b.freeze(True)
            frozen_s = takeover(c)
            woken_at = b.log.stat().st_size
            b.freeze(False)
            assert b.proc is not None
            b.proc.wait(120)
            assert b.proc.returncode != 0
            after = b.log.read_text(errors="replace")[woken_at:]
            assert "lost its ZooKeeper session" in after or "newer leader" in after, after[-2000:]
            # its in-flight MERGE may be interrupted; it must never get to record a batch
            assert not re.search(r"batch \d+: segments", after), "the deposed leader committed"
            assert dblog(["set", "-c", str(config_path), "--delay-ms", "0"]) == 0
            _until("the dump", lambda: store.progress(dump.id).state == "done", 600, c)
            time.sleep(2)
        print(f"takeover: after kill -9 {killed_s:.1f} s, after SIGSTOP {frozen_s:.1f} s")
        _check_outputs(spark, servers, config, db, c)
        assert c.stop() == 0
    finally:
        for s in (a, b, c):
            if s.proc is not None and s.proc.poll() is None:
                s.freeze(False)
                s.stop()


@pytest.mark.parametrize("kind", ["mysql", "postgres"])
def test_a_column_added_while_streaming_reaches_delta_and_a_dump_fills_old_rows(
    request: pytest.FixtureRequest,
    tmp_path: Path,
    spark: Any,
    stream_factory: Callable[[Path], Stream],
    kind: str,
) -> None:
    """ALTER TABLE ADD COLUMN under writes: Delta gains the column from the next change that
    carries it; rows the ALTER filled without a log event get it from a dump."""
    db = db_for(request, kind)
    load(db, rows=5_000)
    config_path = _write_config(db, tmp_path, chunk_size=500)
    config, store, stream = _live_stream(config_path, stream_factory)
    with writers(db, pause_s=WRITER_PAUSE_S):
        _until_first_changes_in_delta(config, db, stream)
        conn = db.connect()
        with conn.cursor() as cur:
            cur.execute(f"ALTER TABLE {db.quoted()} ADD COLUMN extra int NOT NULL DEFAULT 7")
            cur.execute(f"UPDATE {db.quoted()} SET extra = a % 5 WHERE a < 300")
        conn.close()
        assert dblog(["dump", "-c", str(config_path), "--all"]) == 0
        (dump,) = store.dumps(config.name)
        _until("the dump", lambda: store.progress(dump.id).state == "done", 600, stream)
        time.sleep(2)
    columns = ("a", "b", "v", "note", "extra")
    expected = source_rows(db, columns)
    deadline = time.monotonic() + 180
    while (actual := _delta_rows(spark, config, db, columns)) != expected:
        stream.check_alive()
        assert time.monotonic() < deadline, [k for k in expected if expected[k] != actual.get(k)][
            :5
        ]
        time.sleep(2)
    assert "source added columns ['extra']; added to Delta" in stream.log.read_text()
    assert stream.stop() == 0
