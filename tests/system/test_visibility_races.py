"""Commit-visibility races: a change is in the log before the source shows it to a SELECT.

PostgreSQL writes a transaction's commit record to the WAL before the transaction leaves the
ProcArray (with synchronous replication it waits for the standby in between); MariaDB under
semi-synchronous replication with ``AFTER_SYNC`` writes and sends the binlog before the engine
commit. A chunk SELECT that runs in that gap reads the *old* row while the stream has already
decoded the *new* one. If the dumped row is then placed after the logged change, the sink ends
with the old version for good.

Each race is made deterministic by holding one writer T in its COMMIT (a synchronous standby
that never answers; a semi-sync primary that no replica ACKs), dumping T's key while T is
held, and only then releasing T. The tests use a per-key version ``v`` that only grows and
assert that it never goes back, in the Delta change data feed and in Kafka (read_committed),
and that the sink ends with the new version. The MariaDB facts these races rest on are
asserted directly on a private server (semi-sync is server-wide: never on the shared one).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from airflow_dblog.cli import main as dblog
from airflow_dblog.config import Config, load_config
from airflow_dblog.core.events import ChangeEvent, TableId
from airflow_dblog.engine.metadata import MetadataStore
from airflow_dblog.sources.mysql.binlog_reader import BinlogReader
from tests.support.oracle import delta_version, until_delta_holds
from tests.support.private_mariadb import private_mariadb
from tests.support.services import MySQLServer, PostgresServer, read_committed_until
from tests.support.stream_process import TEST_SPARK_CONF, Stream

pytestmark = [pytest.mark.integration, pytest.mark.slow]

ROWS = 20  # ids 0..19, all at version 0
K = 7  # the key T updates and the dump reads
SENTINEL = 19  # changed after T's release: once it is in Delta, the stream has caught up
OLD, NEW = 0, 1


# ---------------------------------------------------------------------------------------------
# the held writer T


@dataclass
class HeldCommit:
    """T's COMMIT running in a background thread; it returns once the source releases T."""

    conn: Any
    thread: threading.Thread
    error: list[BaseException]
    notices: list[str] = dataclasses.field(default_factory=list)

    @classmethod
    def start(cls, conn: Any) -> HeldCommit:
        error: list[BaseException] = []

        def commit() -> None:
            try:
                conn.commit()
            except BaseException as err:  # reported by join()
                error.append(err)

        thread = threading.Thread(target=commit, name="held-commit", daemon=True)
        thread.start()
        return cls(conn, thread, error)

    @property
    def held(self) -> bool:
        return self.thread.is_alive()

    def join(self, timeout_s: float = 30) -> None:
        self.thread.join(timeout_s)
        assert not self.thread.is_alive(), "T's COMMIT did not return after its release"
        assert not self.error, f"T's COMMIT failed: {self.error[0]!r}"
        self.notices = list(getattr(self.conn, "notices", []))  # psycopg2 keeps the WARNINGs
        self.conn.close()


def _until(what: str, done: Callable[[], bool], timeout_s: float, stream: Stream | None) -> None:
    deadline = time.monotonic() + timeout_s
    while not done():
        if stream is not None:
            _check_alive(stream, what)
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.3)


def _check_alive(stream: Stream, what: str) -> None:
    """Fail with the stream's one-line error: its log tail is mostly JVM stack frames."""
    assert stream.proc is not None
    if stream.proc.poll() is not None:
        lines = stream.log.read_text(errors="replace").splitlines()
        errors = [line for line in lines if line.startswith("dblog: error:")]
        pytest.fail(
            f"the stream exited with {stream.proc.returncode} waiting for {what}: "
            f"{errors or lines[-20:]}"
        )


# ---------------------------------------------------------------------------------------------
# PostgreSQL: a synchronous standby that never answers, for one session only


@pytest.fixture
def pg_sync_standby_missing(postgres_server: PostgresServer) -> Iterator[None]:
    """``synchronous_standby_names`` names a standby that does not exist, but the server-wide
    ``synchronous_commit`` is ``local``: every session (other tests, the stream) commits as
    before, and only a session that runs ``SET synchronous_commit = on`` waits in COMMIT
    (``SyncRep``). Both settings are reset in any case; resetting the standby names also
    releases any session still waiting."""
    conn = postgres_server.connect()
    try:
        with conn.cursor() as cur:
            cur.execute(
                "SELECT name FROM pg_file_settings WHERE name IN "
                "('synchronous_commit', 'synchronous_standby_names') AND applied"
            )
            if cur.fetchall():  # another test holds them: never clobber what it set
                pytest.skip("synchronous commit settings are already changed on this server")
            try:
                # local first, so no session waits once the standby names take effect
                _pg_alter_system(cur, "synchronous_commit", "local")
                _pg_alter_system(cur, "synchronous_standby_names", "dblog_never")
                yield
            finally:
                _pg_alter_system(cur, "synchronous_standby_names", None)
                _pg_alter_system(cur, "synchronous_commit", None)
    finally:
        conn.close()


def _pg_alter_system(cur: Any, name: str, value: str | None) -> None:
    """ALTER SYSTEM SET (or RESET, for None), reload, and wait until new sessions see it."""
    if value is None:
        cur.execute(f"ALTER SYSTEM RESET {name}")
    else:
        cur.execute(f"ALTER SYSTEM SET {name} = %s", (value,))
    cur.execute("SELECT pg_reload_conf()")
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        cur.execute("SELECT setting, boot_val FROM pg_settings WHERE name = %s", (name,))
        setting, boot = cur.fetchone()
        if setting == (boot if value is None else value):
            break
        time.sleep(0.1)
    time.sleep(0.5)  # other backends apply the reload at their next command


def _pg_wait_event(conn: Any, pid: int) -> str | None:
    with conn.cursor() as cur:
        cur.execute("SELECT wait_event FROM pg_stat_activity WHERE pid = %s", (pid,))
        row = cur.fetchone()
    return row[0] if row else None


def _pg_held_update(db: Any, table: str) -> tuple[HeldCommit, int]:
    """T: ``v = v + 1`` on K; its COMMIT waits for the missing standby. Returns T and its pid."""
    conn = db.connect(autocommit=False)
    with conn.cursor() as cur:
        cur.execute("SET synchronous_commit = on")
        cur.execute(f"UPDATE {table} SET v = v + 1, note = 'T' WHERE id = %s", (K,))
    return HeldCommit.start(conn), conn.get_backend_pid()


# ---------------------------------------------------------------------------------------------
# the table, the stream, the sinks


def _create_items(conn: Any, table: str, kind: str) -> None:
    text = "varchar(32)" if kind == "mysql" else "text"
    with conn.cursor() as cur:
        cur.execute(f"CREATE TABLE {table} (id int PRIMARY KEY, v int NOT NULL, note {text})")
        if kind == "postgres":
            cur.execute(f"ALTER TABLE {table} REPLICA IDENTITY FULL")
        cur.executemany(
            f"INSERT INTO {table} (id, v, note) VALUES (%s, %s, %s)",
            [(i, OLD, "seed") for i in range(ROWS)],
        )
    conn.commit()


def _read_v(conn: Any, table: str, key: int) -> int:
    with conn.cursor() as cur:
        cur.execute(f"SELECT v FROM {table} WHERE id = %s", (key,))
        return int(cur.fetchone()[0])


def _write_config(
    tmp_path: Path, kind: str, url: str, table: TableId, watermark: str, kafka: str
) -> Path:
    path = tmp_path / "stream.yaml"
    name = f"race-{uuid.uuid4().hex[:8]}"
    path.write_text(
        f"""
name: {name}
source: {{type: {kind}, url: "{url}", tables: [{table}], watermark: {watermark}}}
metadata: {{url: "sqlite:///{tmp_path}/meta.db"}}
dump: {{chunk_size: 5, parallelism: 1, delay_ms: 0}}
sinks:
  delta: {{path: {tmp_path}/delta}}
  kafka: {{bootstrap_servers: '{kafka}', topic_prefix: {name}}}
checkpoint: {tmp_path}/checkpoint
spark:
  master: "local[2]"
  conf: {json.dumps({**TEST_SPARK_CONF, "spark.sql.shuffle.partitions": "2"})}
"""
    )
    return path


def _started_stream(
    config_path: Path, stream_factory: Callable[[Path], Stream]
) -> tuple[Config, MetadataStore, Stream]:
    config = load_config(config_path)
    stream = stream_factory(config_path)
    stream.start()
    stream.wait_capturing()
    return config, MetadataStore(config.metadata_url), stream


def _delta_path(config: Config, table: TableId) -> Path:
    assert config.delta is not None
    return Path(config.delta.path) / table.db / table.table


def _delta_v(spark: Any, config: Config, table: TableId) -> dict[int, int]:
    """id -> v of the live rows in Delta ({} before the table's first commit)."""
    path = _delta_path(config, table)
    if delta_version(str(path)) < 0:
        return {}
    rows = spark.read.format("delta").load(str(path)).where("NOT _dblog_deleted").collect()
    return {r["id"]: r["v"] for r in rows}


def _until_in_delta(
    spark: Any, config: Config, table: TableId, key: int, stream: Stream, timeout_s: float
) -> None:
    """Until Delta's live row ``key`` holds ``v = NEW``."""
    path = str(_delta_path(config, table))
    until_delta_holds(spark, path, {"id": key, "v": NEW}, stream, timeout_s=timeout_s)


def _feed_versions(spark: Any, config: Config, table: TableId, key: int) -> list[int]:
    """K's versions in the Delta change data feed, in commit order."""
    rows = (
        spark.read.format("delta")
        .option("readChangeFeed", "true")
        .option("startingVersion", 0)
        .load(str(_delta_path(config, table)))
        .where(f"id = {key} AND _change_type IN ('insert', 'update_postimage')")
        .select("v", "_commit_version")
        .collect()
    )
    return [r["v"] for r in sorted(rows, key=lambda r: r["_commit_version"])]


def _kafka_versions(messages: list[tuple[Any, Any]], key: int) -> list[int | None]:
    """``key``'s versions in a topic's read_committed messages (None: a delete or tombstone)."""
    out: list[int | None] = []
    for msg_key, value in messages:
        if msg_key.get("id") == key:
            row = value and value.get("after")
            out.append(row["v"] if row else None)
    return out


def _request_dump_of_k(
    config_path: Path, store: MetadataStore, config: Config, table: TableId
) -> int:
    assert dblog(["dump", "-c", str(config_path), "--table", str(table), "--pk", str(K)]) == 0
    return max(d.id for d in store.dumps(config.name))


def _until_dump_ends(store: MetadataStore, dump_id: int, stream: Stream) -> None:
    _until(
        "the dump of K to end",
        lambda: store.progress(dump_id).state in ("done", "failed", "cancelled"),
        120,
        stream,
    )
    progress = store.progress(dump_id)
    assert progress.state == "done", f"the dump of K ended {progress.state}: {progress.reason}"


def _check_k_never_goes_back(spark: Any, servers: str, config: Config, table: TableId) -> None:
    """The oracle: K's version only grows in Delta's feed and in Kafka, and ends at NEW."""
    current = _delta_v(spark, config, table).get(K)
    feed = _feed_versions(spark, config, table, K)
    topic = f"{config.name}.{table.db}.{table.table}"
    messages = read_committed_until(servers, topic, lambda m: _kafka_versions(m, K)[-1:] == [NEW])
    kafka = _kafka_versions(messages, K)
    print(f"K={K}: Delta now v={current}; change feed {feed}; Kafka {kafka}")
    assert feed == sorted(feed), f"K's version went back in the Delta change feed: {feed}"
    assert None not in kafka and kafka == sorted(kafka), f"K's version went back in Kafka: {kafka}"
    assert current == NEW, f"Delta ends with K at v={current}, the source has {NEW}"
    assert kafka and kafka[-1] == NEW, f"Kafka's last message for K has v={kafka[-1:]}"


# ---------------------------------------------------------------------------------------------
# A. PostgreSQL


@pytest.mark.parametrize("watermark", ["table", "snapshot"])
def test_postgres_dump_during_a_held_commit_never_puts_the_old_version_back(
    postgres_db: Any,
    pg_sync_standby_missing: None,
    tmp_path: Path,
    spark: Any,
    kafka_server: Any,
    stream_factory: Callable[[Path], Stream],
    watermark: str,
) -> None:
    """T's commit record is decoded (K = NEW reaches Delta) while T is still invisible; a dump
    of K then reads K = OLD and must not place that row after T's change."""
    table, quoted = TableId("public", "items"), '"public"."items"'
    admin = postgres_db.connect()
    _create_items(admin, quoted, "postgres")
    servers = kafka_server.bootstrap_servers
    config_path = _write_config(tmp_path, "postgres", postgres_db.url, table, watermark, servers)
    config, store, stream = _started_stream(config_path, stream_factory)

    held, pid = _pg_held_update(postgres_db, quoted)
    try:
        _until(
            "T to wait for the standby", lambda: _pg_wait_event(admin, pid) == "SyncRep", 30, stream
        )
        _until_in_delta(spark, config, table, K, stream, 300)
        assert _read_v(admin, quoted, K) == OLD, "T is already visible: the race did not happen"

        dump_id = _request_dump_of_k(config_path, store, config, table)
        _until_dump_ends(store, dump_id, stream)
        assert _pg_wait_event(admin, pid) == "SyncRep" and held.held, "T was released too early"
        assert _read_v(admin, quoted, K) == OLD
    finally:
        with admin.cursor() as cur:  # T commits locally and becomes visible (a WARNING for T)
            cur.execute("SELECT pg_cancel_backend(%s)", (pid,))
    held.join()
    assert any("canceling wait for synchronous replication" in n for n in held.notices)
    assert _read_v(admin, quoted, K) == NEW

    with admin.cursor() as cur:
        cur.execute(f"UPDATE {quoted} SET v = v + 1 WHERE id = %s", (SENTINEL,))
    _until_in_delta(spark, config, table, SENTINEL, stream, 120)
    admin.close()
    _check_k_never_goes_back(spark, servers, config, table)
    assert stream.stop() == 0


# ---------------------------------------------------------------------------------------------
# B. MariaDB: semi-synchronous replication, AFTER_SYNC, and no replica to ACK


SEMI_SYNC_OPTIONS = {
    "rpl_semi_sync_master_wait_point": "AFTER_SYNC",
    # longer than any test: T stays held until the test releases it; shorter than forever
    "rpl_semi_sync_master_timeout": "300000",
}
MARIADB_TABLE = TableId("races", "items")
MARIADB_QUOTED = "`races`.`items`"
SEMI_SYNC_WAIT = "Waiting for semi-sync ACK from slave"


@pytest.fixture
def semisync_mariadb() -> Iterator[MySQLServer]:
    """A private MariaDB (semi-sync is server-wide) with ``races.items`` loaded, semi-sync
    configured with AFTER_SYNC but not yet enabled: enable it with :func:`_semi_sync`."""
    with private_mariadb(options=SEMI_SYNC_OPTIONS) as server:
        conn = server.connect()
        with conn.cursor() as cur:
            cur.execute("CREATE DATABASE races")
        _create_items(conn, MARIADB_QUOTED, "mysql")
        conn.close()
        yield server


def _semi_sync(server: MySQLServer, enabled: bool) -> None:
    """Switching semi-sync off also releases every COMMIT waiting for an ACK, at once."""
    conn = server.connect()
    with conn.cursor() as cur:
        cur.execute(f"SET GLOBAL rpl_semi_sync_master_enabled = {'ON' if enabled else 'OFF'}")
    conn.close()


def _query_one(server: MySQLServer, sql: str) -> tuple[Any, ...]:
    conn = server.connect()
    try:
        with conn.cursor() as cur:
            cur.execute(sql)
            return cur.fetchone()
    finally:
        conn.close()


def _binlog_end(server: MySQLServer) -> tuple[str, int]:
    file, pos, *_ = _query_one(server, "SHOW MASTER STATUS")
    return file, int(pos)


@dataclass
class HeldMariadbCommit:
    """T on the private server, held in COMMIT, and the binlog before it."""

    server: MySQLServer
    commit: HeldCommit
    gtid_before: str
    binlog_before: tuple[str, int]


@contextlib.contextmanager
def _held_mariadb_update(server: MySQLServer) -> Iterator[HeldMariadbCommit]:
    """T: ``v = v + 1`` on K; semi-sync on, so its COMMIT waits for an ACK no replica sends.

    Semi-sync is switched off (releasing T) on the way out, whatever happened."""
    (gtid_before,) = _query_one(server, "SELECT @@gtid_binlog_pos")
    binlog_before = _binlog_end(server)
    conn = server.connect(autocommit=False)
    with conn.cursor() as cur:
        cur.execute(f"UPDATE {MARIADB_QUOTED} SET v = v + 1, note = 'T' WHERE id = %s", (K,))
    thread_id = conn.thread_id()
    _semi_sync(server, True)
    try:
        commit = HeldCommit.start(conn)

        def waiting() -> bool:
            (state,) = _query_one(
                server, f"SELECT state FROM information_schema.processlist WHERE id = {thread_id}"
            )
            return state == SEMI_SYNC_WAIT

        _until("T to wait for a semi-sync ACK", waiting, 30, None)
        yield HeldMariadbCommit(server, commit, gtid_before, binlog_before)
    finally:
        _semi_sync(server, False)


def _next_gtid(gtid_pos: str) -> str:
    domain, server_id, seq = gtid_pos.split("-")
    return f"{domain}-{server_id}-{int(seq) + 1}"


def test_mariadb_gtid_binlog_pos_counts_a_held_commit_no_one_can_see_yet(
    semisync_mariadb: MySQLServer,
) -> None:
    """Fact 1: under AFTER_SYNC, T's GTID is in ``@@gtid_binlog_pos`` (and
    ``@@gtid_current_pos``) while every other session still reads the old K: a ``gtid`` window
    that reads the GTID position counts T as seen by a SELECT that did not see it."""
    server = semisync_mariadb
    with _held_mariadb_update(server) as t:
        binlog_pos, current_pos = _query_one(server, "SELECT @@gtid_binlog_pos, @@gtid_current_pos")
        other = server.connect()
        assert t.commit.held
        assert binlog_pos == _next_gtid(t.gtid_before)  # T's GTID: one past what was there
        assert current_pos == binlog_pos
        assert _read_v(other, MARIADB_QUOTED, K) == OLD
        other.close()
    t.commit.join()


def test_mariadb_consistent_snapshot_position_excludes_a_held_commit(
    semisync_mariadb: MySQLServer,
) -> None:
    """Fact 2: a ``START TRANSACTION WITH CONSISTENT SNAPSHOT`` taken while T is held reports
    ``binlog_snapshot_position`` = the binlog end *before* T (T's events end further on), and
    the snapshot does not see T, not even after T is released: the position is exact."""
    server = semisync_mariadb
    with _held_mariadb_update(server) as t:
        snap = server.connect(autocommit=False)
        with snap.cursor() as cur:
            cur.execute("START TRANSACTION WITH CONSISTENT SNAPSHOT")
            cur.execute("SHOW STATUS LIKE 'binlog_snapshot_%'")
            status = dict(cur.fetchall())
        snapshot = (status["Binlog_snapshot_file"], int(status["Binlog_snapshot_position"]))
        t_end = _binlog_end(server)
        assert snapshot == t.binlog_before, (snapshot, t.binlog_before, t_end)
        assert snapshot < t_end
        assert _read_v(snap, MARIADB_QUOTED, K) == OLD
    t.commit.join()
    assert _read_v(snap, MARIADB_QUOTED, K) == OLD  # T released: still not in this snapshot
    snap.close()


def test_mariadb_binlog_replica_receives_a_held_commit(semisync_mariadb: MySQLServer) -> None:
    """Fact 3: the binlog dump thread sends T's events to a (non-semi-sync) replica connection
    while T is held: the stream decodes K = NEW before any SELECT can read it."""
    server = semisync_mariadb
    with _held_mariadb_update(server) as t:
        file, pos = t.binlog_before
        url = f"mysql://dblog:dblog@{server.host}:{server.port}/races"
        reader = BinlogReader(
            url, [MARIADB_TABLE], offset={"file": file, "pos": pos, "after": None}
        )
        try:
            changes = []
            deadline = time.monotonic() + 20
            while not changes and time.monotonic() < deadline:
                changes = [i for i in reader.read(100, 1.0) if isinstance(i, ChangeEvent)]
        finally:
            reader.close()
        assert t.commit.held, "T was released before the reader got its change"
        (change,) = changes
        assert (change.op, change.key, change.after and change.after["v"]) == ("u", (K,), NEW)
        assert change.gtid == _next_gtid(t.gtid_before)
    t.commit.join()


def test_mariadb_switching_semi_sync_off_releases_a_held_commit(
    semisync_mariadb: MySQLServer,
) -> None:
    """Fact 4: T stays held (until ``rpl_semi_sync_master_timeout``); ``SET GLOBAL
    rpl_semi_sync_master_enabled = OFF`` releases it at once, and then it is visible."""
    server = semisync_mariadb
    with _held_mariadb_update(server) as t:
        time.sleep(2)
        assert t.commit.held
        (status,) = _query_one(server, "SHOW STATUS LIKE 'Rpl_semi_sync_master_status'")[1:]
        assert status == "ON"
        released_at = time.monotonic()
        _semi_sync(server, False)
        t.commit.join(timeout_s=5)
        assert time.monotonic() - released_at < 2
    other = server.connect()
    assert _read_v(other, MARIADB_QUOTED, K) == NEW
    other.close()


# gtid is refused on MariaDB (the fact test above shows why; tests/engine/test_capture.py the
# refusal)
@pytest.mark.parametrize("watermark", ["snapshot"])
def test_mariadb_semi_sync_dump_during_a_held_commit_never_puts_the_old_version_back(
    semisync_mariadb: MySQLServer,
    tmp_path: Path,
    spark: Any,
    kafka_server: Any,
    stream_factory: Callable[[Path], Stream],
    watermark: str,
) -> None:
    """As the PostgreSQL test, on MariaDB: T's events are decoded (K = NEW reaches Delta) while
    T waits for a semi-sync ACK; a dump of K then reads K = OLD and must not place that row
    after T's change. (No ``table`` watermark here: its writes would wait for an ACK too.)"""
    server = semisync_mariadb
    servers = kafka_server.bootstrap_servers
    url = f"mysql://dblog:dblog@{server.host}:{server.port}/races"
    config_path = _write_config(tmp_path, "mysql", url, MARIADB_TABLE, watermark, servers)
    config, store, stream = _started_stream(config_path, stream_factory)
    admin = server.connect()

    with _held_mariadb_update(server) as t:
        _until_in_delta(spark, config, MARIADB_TABLE, K, stream, 300)
        assert _read_v(admin, MARIADB_QUOTED, K) == OLD, "T is visible: the race did not happen"
        dump_id = _request_dump_of_k(config_path, store, config, MARIADB_TABLE)
        _until_dump_ends(store, dump_id, stream)
        assert t.commit.held, "T was released too early"
        assert _read_v(admin, MARIADB_QUOTED, K) == OLD
    t.commit.join()
    assert _read_v(admin, MARIADB_QUOTED, K) == NEW

    with admin.cursor() as cur:
        cur.execute(f"UPDATE {MARIADB_QUOTED} SET v = v + 1 WHERE id = %s", (SENTINEL,))
    _until_in_delta(spark, config, MARIADB_TABLE, SENTINEL, stream, 120)
    admin.close()
    _check_k_never_goes_back(spark, servers, config, MARIADB_TABLE)
    assert stream.stop() == 0
