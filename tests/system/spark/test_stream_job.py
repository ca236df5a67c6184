"""The streaming job end to end: `dblog stream` as a real process, Spark, Delta, Kafka, MariaDB/PG.

Writers change a composite-key table at random while the stream rides out what production
throws at it: a Kafka or metadata database outage mid-dump, a failed Delta batch, live controls
and signals, a dead or frozen leader with standbys waiting, a column added while streaming.
Afterwards the Delta table equals the source table, its change feed shows no key going back in
``_dblog_position`` and no change applied twice, and a read_committed consumer of the Kafka topic
sees per key only growing positions and rebuilds the source table. (A dump killed with SIGKILL
mid-dump and started again: tests/system/test_staleness.py, locally, and
tests/system/spark/test_cluster_stream.py on the cluster.)
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import unquote

import pytest

from airflow_dblog.cli import main as dblog
from airflow_dblog.config import Config, load_config
from airflow_dblog.engine.metadata import MetadataStore
from airflow_dblog.errors import MetadataError
from airflow_dblog.sinks.delta_sink import SEGMENT_BITS
from airflow_dblog.spark.stream_job import BatchCommitter, DeltaQuery
from tests.support.oracle import check_outputs, delta_path, delta_rows, delta_version
from tests.support.services import restart_local_service
from tests.support.stream_process import Stream, until, write_config
from tests.support.workload import Db, db_for, load, source_rows, writers

pytestmark = [pytest.mark.integration, pytest.mark.slow]

# ~100 transactions/s from three writers: busy, and within what one local Spark on a
# two-core machine merges into Delta while the dump runs
WRITER_PAUSE_S = 0.05


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
    path = delta_path(config, db.table())  # version 0: the table created at the stream's start
    until("the writers' first changes in Delta", lambda: delta_version(path) > 0, 180, stream)


def _until_done_restarting_once(
    store: MetadataStore,
    dump_id: int,
    stream: Stream,
    reason: str | None = None,
    past: Callable[[], bool] = lambda: True,
) -> int:
    """Until the dump is done and ``past()`` holds, starting the stream again once if it exits
    (what a supervisor does; ``reason``: the exit must say so); returns how often it exited."""
    exits = 0
    deadline = time.monotonic() + 600
    while store.progress(dump_id).state != "done" or not past():
        assert stream.proc is not None
        if stream.proc.poll() is not None:
            exits += 1
            assert exits == 1, "the restarted stream exited again"
            tail = _log_since(stream, stream.run_starts_at)
            assert reason is None or reason in tail, tail[-3000:]
            stream.start()
        assert time.monotonic() < deadline, "timed out waiting for the dump"
        time.sleep(0.5)
    return exits


@pytest.mark.alone  # restarts the Kafka broker or PostgreSQL every test uses
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
    config_path = write_config(
        db,
        tmp_path,
        chunk_size=200,
        delay_ms=600,
        kafka=kafka_server.bootstrap_servers,
        metadata_url=metadata_url,
    )
    config, store, stream = _live_stream(config_path, stream_factory)
    with writers(db, pause_s=WRITER_PAUSE_S):
        _until_first_changes_in_delta(config, db, stream)
        assert dblog(["dump", "-c", str(config_path), "--all"]) == 0
        (dump,) = store.dumps(config.name)
        until("a chunk", lambda: store.progress(dump.id).chunks_done >= 2, 300, stream)
        restart_local_service("kafka" if fault == "kafka" else "postgres", down_s=15)
        assert dblog(["set", "-c", str(config_path), "--delay-ms", "0"]) == 0
        exits = _until_done_restarting_once(store, dump.id, stream)
        time.sleep(2)
    _check_outputs(spark, config, db, stream)
    assert stream.stop() == 0
    errors = [line for line in stream.log.read_text().splitlines() if "dblog: error:" in line]
    print(f"{fault} outage of 15 s: the stream exited {exits} time(s): {errors}")
    if fault == "kafka":
        assert exits == 0, errors  # the producer reconnects; the commit waits for the broker
    else:
        assert exits == 1 and len(errors) == 1
        assert "the metadata database postgresql" in errors[0] and ":***@" in errors[0]


class _GoneStore:
    """A metadata store whose database went away (failure injection)."""

    def check_fence(self) -> None:
        raise MetadataError("the metadata database x failed: Connection refused", "start it")


def test_a_failed_delta_batch_is_reported_as_its_own_one_line_error(spark: Any) -> None:
    """Spark wraps a foreachBatch exception in pages of py4j traceback; the job reports the
    cause (e.g. the metadata database) in one line, whichever of its threads saw it first."""
    committer = BatchCommitter(sink=None, barrier=None, store=_GoneStore(), spool=None)  # type: ignore[arg-type]
    writer = spark.readStream.format("rate").option("rowsPerSecond", 1).load().writeStream
    query = DeltaQuery(writer.foreachBatch(committer).start, committer)
    try:
        with pytest.raises(MetadataError, match=r"^the metadata database x failed"):
            deadline = time.monotonic() + 120
            while not query.terminated(1.0):
                assert time.monotonic() < deadline, "the query did not fail"
    finally:
        query.stop()


def _check_outputs(spark: Any, config: Config, db: Db, stream: Stream) -> None:
    """Delta equals the source, its change feed never goes back per key, Kafka rebuilds it."""
    check_outputs(spark, config, [db], stream, ("a", "b", "v", "note"))


@pytest.mark.alone  # times how soon a pause reaches the stream
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
    config_path = write_config(
        db, tmp_path, chunk_size=200, delay_ms=300, kafka=servers, signal_topic=kafka_topic
    )
    config, store, stream = _live_stream(config_path, stream_factory)
    c = str(config_path)
    assert dblog(["dump", "-c", c, "--all"]) == 0
    (dump,) = store.dumps(config.name)

    def started() -> set[int]:
        return {ch.id for ch in store.chunks(dump.id) if ch.state != "pending"}

    until("chunks to start", lambda: len(started()) >= 3, 120, stream)
    assert dblog(["pause", "-c", c, "--dump", str(dump.id)]) == 0
    paused_at = time.monotonic()
    time.sleep(3)  # what was claimed before the pause reached the stream may still start
    settled = started()
    settle_s = time.monotonic() - paused_at
    time.sleep(5)
    # no other chunk starts; one claimed ahead of its start goes back to pending
    assert started() <= settled, "chunks kept starting after the pause"
    assert store.progress(dump.id).state == "paused"
    assert settle_s < 5

    assert dblog(["set", "-c", c, "--delay-ms", "0", "--chunk-size", "1000"]) == 0
    assert dblog(["resume", "-c", c, "--dump", str(dump.id)]) == 0
    until("the resumed dump", lambda: store.progress(dump.id).state == "done", 300, stream)
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
    until("the signalled dump", lambda: len(store.dumps(config.name)) == 3, 60, stream)
    third = max(d.id for d in store.dumps(config.name))
    assert store.dump(third).requested_by.startswith("kafka-signal")
    until(
        "the signalled dump to finish", lambda: store.progress(third).state == "done", 300, stream
    )
    assert "signal " in stream.log.read_text() and "skipped" in stream.log.read_text()
    assert stream.stop() == 0


@pytest.mark.alone  # ZooKeeper sessions of seconds: a busy machine's stall is a failover
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
    A freeze inside a metadata write is undone and tried again (see ``_sqlite_locked``).
    """
    db = db_for(request, "mysql")
    load(db)
    servers = kafka_server.bootstrap_servers
    config_path = write_config(
        db,
        tmp_path,
        200,
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

    def committed() -> int:
        state = store.stream_state(config.name)
        return int(((state.source_offset or {}) if state else {}).get("segment", -1))

    def takeover(new: Stream) -> float:
        since = time.monotonic()
        until(
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
        until("b to wait", lambda: "standby" in b.log.read_text(), 120, b)
        with writers(db, pause_s=WRITER_PAUSE_S):
            assert dblog(["dump", "-c", str(config_path), "--all"]) == 0
            (dump,) = store.dumps(config.name)
            until("a chunk", lambda: store.progress(dump.id).chunks_done >= 1, 300, a)
            a.kill()
            killed_s = takeover(b)
            until("a chunk under b", lambda: store.progress(dump.id).chunks_done >= 5, 300, b)
            c.start()
            until("c to wait", lambda: "standby" in c.log.read_text(), 120, c)
            for attempt in range(1, FREEZE_ATTEMPTS + 1):
                b.freeze(True)
                if not _sqlite_locked(config.metadata_url):
                    break
                print(f"freeze {attempt}: b froze inside a metadata write")
                b.freeze(False)
                time.sleep(0.3)
            else:
                pytest.fail(f"{FREEZE_ATTEMPTS} freezes all caught b inside a metadata write")
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
            # b, frozen between its fence check and its spool write, writes that segment when
            # woken: c finds the number taken, stops with one line, continues after it. The
            # dump may be done before c's first write: wait until c committed past b's segments
            spool = Path(config.checkpoint) / "spool"
            b_last = max([committed(), *(int(p.stem) for p in spool.glob("*.parquet"))])
            _until_done_restarting_once(
                store,
                dump.id,
                c,
                "was written by another process",
                past=lambda: committed() > b_last,
            )
            time.sleep(2)
        print(f"takeover: after kill -9 {killed_s:.1f} s, after SIGSTOP {frozen_s:.1f} s")
        _check_outputs(spark, config, db, c)
        assert c.stop() == 0
    finally:
        for s in (a, b, c):
            if s.proc is not None and s.proc.poll() is None:
                s.freeze(False)
                s.stop()


FREEZE_ATTEMPTS = 5
_COMMITTING = re.compile(r"delta batch (\d+): committing segments \d+-(\d+), \d+ events")
_COMMITTED = re.compile(r"delta batch (\d+): segments ")
_FENCE_LOW_BITS = (1 << SEGMENT_BITS) - 1  # a fence's version: (token << SEGMENT_BITS) - 1


def _log_since(stream: Stream, offset: int) -> str:
    with open(stream.log, "rb") as log:
        log.seek(offset)
        return log.read().decode(errors="replace")


def _lease_token(stream: Stream) -> int:
    found = re.search(r"with lease token (\d+)", _log_since(stream, stream.run_starts_at))
    assert found, f"{stream.log.name}: no lease token logged"
    return int(found.group(1))


def _txns(delta_log: Path, app_id: str) -> list[tuple[int, int]]:
    """(table version, transaction version) of each Delta commit carrying ``app_id``'s txn."""
    found = []
    commits = sorted((int(p.stem), p) for p in delta_log.glob("*.json") if p.stem.isdigit())
    for table_version, path in commits:
        for line in path.read_text().splitlines():
            txn = json.loads(line).get("txn")
            if txn and txn["appId"] == app_id:
                found.append((table_version, txn["version"]))
    return found


def _data_files(table: Path) -> set[Path]:
    """The table's data and change-data files, committed or being written."""
    return {p for p in table.rglob("*.parquet") if "_delta_log" not in p.parts}


def _committed_files(table: Path) -> set[Path]:
    """The files some commit of the table added (``add`` and ``cdc`` actions)."""
    added = set()
    for path in (table / "_delta_log").glob("*.json"):
        for line in path.read_text().splitlines():
            action = json.loads(line)
            for kind in ("add", "cdc"):
                if kind in action:
                    added.add(table / unquote(action[kind]["path"]))
    return added


def _sqlite_locked(url: str) -> bool:
    """Another process holds a lock on the SQLite metadata. A leader frozen inside a metadata
    transaction keeps its standby waiting in ``take_lead`` until it wakes (by design: the row
    is the leader's until then), so such a freeze cannot show a takeover; the test tries the
    next batch."""
    import sqlite3

    conn = sqlite3.connect(url.removeprefix("sqlite:///"), timeout=1.0, isolation_level=None)
    try:
        conn.execute("BEGIN EXCLUSIVE")
        conn.execute("ROLLBACK")
        return False
    except sqlite3.OperationalError:
        return True
    finally:
        conn.close()


def _freeze_during_merge(leader: Stream, table: Path, app_id: str, token: int) -> tuple[int, int]:
    """SIGSTOP ``leader``'s process tree while its next Delta batch writes its files, before its
    commit: (the batch, its transaction version), the version -1 if the batch committed first.
    """
    offset = leader.log.stat().st_size
    deadline = time.monotonic() + 180
    while not (starts := list(_COMMITTING.finditer(_log_since(leader, offset)))):
        leader.check_alive()
        assert time.monotonic() < deadline, "no Delta batch started"
        time.sleep(0.02)
    batch, version = int(starts[0].group(1)), token << SEGMENT_BITS | int(starts[0].group(2))

    def landed() -> bool:
        return any(v == version for _, v in _txns(table / "_delta_log", app_id))

    before, polls = _data_files(table), 0
    while not _data_files(table) - before:  # the MERGE's last step: its files, then its commit
        polls += 1
        if polls % 50 == 0 and landed():
            return batch, -1
        leader.check_alive()
        assert time.monotonic() < deadline, f"delta batch {batch} wrote no files"
        time.sleep(0.01)
    leader.freeze(True, tree=True)
    # in flight: files no commit holds (the batch's dumped rows and its log rows are two
    # commits, so the one frozen may be either) and the batch's last commit not yet made
    in_flight = bool(_data_files(table) - _committed_files(table)) and not landed()
    return batch, version if in_flight else -1


@pytest.mark.alone  # ZooKeeper sessions of seconds: a busy machine's stall is a failover
def test_a_leader_frozen_during_its_delta_commit_is_fenced_and_commits_nothing(
    request: pytest.FixtureRequest,
    tmp_path: Path,
    spark: Any,
    kafka_server: Any,
    zookeeper_server: Any,
    zk_path: str,
) -> None:
    """The leader's whole process tree (driver, Spark's JVM) SIGSTOPped while its Delta MERGE
    writes its files, past its ZooKeeper session; the standby takes over, fences Delta and
    commits a batch; the old leader's JVM, woken first, gets to its commit, which Delta's
    conflict check refuses (the fence); the old leader exits non-zero, nothing of that batch
    in Delta; the dump completes under the new leader, Delta and Kafka equal to the source,
    no change twice, no key going back.

    The freeze follows the batch's first new data file within ~10 ms, while its commit is
    still to come. A freeze that came too late (the batch's transaction version already in
    ``_delta_log``), or one that caught the leader inside a metadata write (its standby would
    wait for it), is undone at once, well within the session, and tried on the next batch,
    at most FREEZE_ATTEMPTS times; after that the test fails, it never passes without a
    commit frozen in flight. The driver stays frozen until the JVM, woken, rests: otherwise
    the driver's lease check may interrupt the MERGE before Delta's fence refuses it.
    """
    db = db_for(request, "mysql")
    load(db, rows=5_000)
    config_path = write_config(
        db,
        tmp_path,
        500,
        delay_ms=600,
        kafka=kafka_server.bootstrap_servers,
        zookeeper=zookeeper_server.connect_string(zk_path),
        # a's JVM stays frozen until b has led and committed a batch; past Spark's default
        # 120 s (a loaded 2-core machine) its executor would be dropped as dead on waking and
        # the MERGE fail before it reaches the fence this test is about
        spark_conf={"spark.network.timeout": "600s"},
    )
    config = load_config(config_path)
    store = MetadataStore(config.metadata_url)
    table = Path(delta_path(config, db.table()))
    app_id = f"dblog-{config.name}/segments"  # stream_job's Delta transaction app id
    a, b = Stream(config_path, "a"), Stream(config_path, "b")

    def leads(stream: Stream) -> bool:
        state = store.stream_state(config.name)
        assert stream.proc is not None
        return state is not None and (state.leader or "").endswith(f":{stream.proc.pid}")

    try:
        a.start()
        a.wait_capturing()
        b.start()
        until("b to wait", lambda: "standby" in b.log.read_text(), 120, b)
        a_token = _lease_token(a)
        with writers(db, pause_s=WRITER_PAUSE_S):
            assert dblog(["dump", "-c", str(config_path), "--all"]) == 0
            (dump,) = store.dumps(config.name)
            until("a chunk", lambda: store.progress(dump.id).chunks_done >= 1, 300, a)
            for attempt in range(1, FREEZE_ATTEMPTS + 1):
                batch, in_flight = _freeze_during_merge(a, table, app_id, a_token)
                if in_flight >= 0 and not _sqlite_locked(config.metadata_url):
                    break
                why = "committed first" if in_flight < 0 else "froze inside a metadata write"
                print(f"freeze {attempt}: delta batch {batch} {why}")
                a.freeze(False, tree=True)
            else:
                pytest.fail(f"none of {FREEZE_ATTEMPTS} freezes caught a Delta commit in flight")
            frozen_at = a.log.stat().st_size
            written = _data_files(table) - _committed_files(table)
            assert written, "the frozen MERGE wrote no files"
            since = time.monotonic()
            until("b to lead", lambda: leads(b), 120, b)
            takeover_s = time.monotonic() - since
            b_token = _lease_token(b)
            assert b_token > a_token
            until("a batch of b", lambda: bool(_COMMITTED.search(_log_since(b, 0))), 300, b)
            driver_s = a.wake_spark_first()
            assert a.proc is not None
            assert a.proc.wait(120) != 0
            woke = _log_since(a, frozen_at)
            assert "another leader fenced the Delta table" in woke, woke[-3000:]
            assert not _COMMITTED.search(woke), f"the deposed leader committed:\n{woke[-3000:]}"
            txns = _txns(table / "_delta_log", app_id)
            assert in_flight not in [v for _, v in txns], "the frozen batch landed"
            (fenced_at,) = [t for t, v in txns if v == (b_token << SEGMENT_BITS) - 1]
            late = [
                (t, v)
                for t, v in txns + _txns(table / "_delta_log", f"{app_id}/dump")
                if t > fenced_at
                and v >> SEGMENT_BITS == a_token
                and v & _FENCE_LOW_BITS != _FENCE_LOW_BITS
            ]
            assert not late, f"the deposed leader (token {a_token}) committed after the fence"
            assert not written & _committed_files(table), "the frozen MERGE's files landed"
            assert dblog(["set", "-c", str(config_path), "--delay-ms", "0"]) == 0
            until("the dump", lambda: store.progress(dump.id).state == "done", 600, b)
            time.sleep(2)
        error = [line for line in woke.splitlines() if line.startswith("dblog: error:")]
        print(
            f"froze a in delta batch {batch} (attempt {attempt}), {len(written)} files written;"
            f" b led after {takeover_s:.1f} s; a's driver woke {driver_s:.1f} s after its JVM;"
            f" a: {error}"
        )
        _check_outputs(spark, config, db, b)
        assert b.stop() == 0
    finally:
        for s in (a, b):
            if s.proc is not None and s.proc.poll() is None:
                s.freeze(False, tree=True)
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
    config_path = write_config(db, tmp_path, chunk_size=500)
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
        until("the dump", lambda: store.progress(dump.id).state == "done", 600, stream)
        time.sleep(2)
    columns = ("a", "b", "v", "note", "extra")
    expected = source_rows(db, columns)
    deadline = time.monotonic() + 180
    while (actual := delta_rows(spark, delta_path(config, db.table()), columns)) != expected:
        stream.check_alive()
        assert time.monotonic() < deadline, [k for k in expected if expected[k] != actual.get(k)][
            :5
        ]
        time.sleep(2)
    assert "source added columns ['extra']; added to Delta" in stream.log.read_text()
    assert stream.stop() == 0
