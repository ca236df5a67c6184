"""The capture engine end to end on real MariaDB and PostgreSQL, for every watermark strategy.

Three writer threads insert, update and delete (reusing deleted keys) in a table with a
composite key while a dump with ~100-row chunks runs. The table is loaded before the reader
starts, so its original rows can reach the output only through the dump. Afterwards replaying
the output gives exactly the source table, and no key's positions ever go backwards.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest

from airflow_dblog.cli import main as dblog
from airflow_dblog.config import Config, parse_config
from airflow_dblog.core.events import TableId
from airflow_dblog.core.keys import MAX_KEYS_PER_CHUNK
from airflow_dblog.engine.capture import Capture
from airflow_dblog.engine.configured_source import open_reader, open_source
from airflow_dblog.engine.metadata import MetadataStore
from airflow_dblog.engine.metadata.dumps import TablePlan
from airflow_dblog.engine.planner import plan_dump
from airflow_dblog.errors import DblogError, SourceError
from tests.support.memory_sink import MemoryCapture, MemorySink
from tests.support.services import restart_local_service
from tests.support.workload import Db, db_for, execute, load, restricted_user, source_rows, writers

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def _config(db: Db, watermark: str, tmp_path: Path, parallelism: int = 2) -> Config:
    return parse_config(
        f"""
name: cap-{uuid.uuid4().hex[:8]}
source:
  type: {db.kind}
  url: {db.url}
  tables: [{db.table()}]
  watermark: {watermark}
metadata: {{url: "sqlite:///{tmp_path}/meta.db"}}
dump: {{chunk_size: 100, parallelism: {parallelism}}}
sinks: {{delta: {{path: {tmp_path}/delta}}}}
checkpoint: {tmp_path}/checkpoint
""",
        env={},
    )


def _open(config: Config, store: MetadataStore, sink: MemorySink) -> Capture:
    state = store.stream_state(config.name)
    saved = (state.source_offset or {}) if state else {}
    reader = open_reader(config, saved.get("reader"))
    return MemoryCapture(
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
    ("mysql", "snapshot"),
    ("postgres", "table"),
    ("postgres", "snapshot"),
]


@pytest.mark.parametrize(("kind", "watermark"), CASES, ids=[f"{k}-{w}" for k, w in CASES])
def test_dump_under_concurrent_writes_converges_across_a_crash(
    request: pytest.FixtureRequest, tmp_path: Path, kind: str, watermark: str
) -> None:
    """The capture crashes after a third of the dump and a new one finishes it. (The capture
    before the crash is the straight run; a run without a crash, chunk attempts <= 1, is the
    staleness and start-gap tests' with Spark.)"""
    db = db_for(request, kind)
    load(db)
    config = _config(db, watermark, tmp_path)
    store = MetadataStore(config.metadata_url)
    sink = MemorySink()
    capture = _open(config, store, sink)  # the log starts here: seed rows come only by dump
    with writers(db) as counts:
        _run_until(capture, lambda: counts.total() > 200, 60)
        dump_id = plan_dump(config, store, requested_by="test")
        _run_until(capture, lambda: store.progress(dump_id).chunks_done >= 20, 300)
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

    # selected again: at most the chunks in flight at the crash, the SELECTs running, the
    # windows waiting for their high watermark and the one claimed ahead
    attempts = [c.attempts for c in store.chunks(dump_id)]
    assert max(attempts) <= 2
    assert sum(a - 1 for a in attempts) <= 2 * config.dump.parallelism + 1


SECRET = f"Pw-{uuid.uuid4().hex[:12]}-never-logged"
LEAST_PRIVILEGE = {
    # read-only strategies: SELECT on the data, the replication grants, nothing else
    ("mysql", "snapshot"): [
        "GRANT SELECT ON `{db}`.* TO {user}",
        "GRANT REPLICATION SLAVE, REPLICATION CLIENT ON *.* TO {user}",
    ],
    # table strategy: plus writes to the (existing) watermark table only
    ("mysql", "table"): [
        "GRANT SELECT ON `{db}`.* TO {user}",
        "GRANT REPLICATION SLAVE, REPLICATION CLIENT ON *.* TO {user}",
        "GRANT SELECT, INSERT, UPDATE ON dblog.dblog_watermarks TO {user}",
    ],
    ("postgres", "snapshot"): ["GRANT SELECT ON public.items TO {user}"],
    ("postgres", "table"): [
        "GRANT SELECT ON public.items TO {user}",
        "GRANT USAGE ON SCHEMA dblog TO {user}",
        "GRANT SELECT, INSERT, UPDATE ON dblog.dblog_watermarks TO {user}",
    ],
}


@pytest.mark.parametrize(
    ("kind", "watermark"), list(LEAST_PRIVILEGE), ids=[f"{k}-{w}" for k, w in LEAST_PRIVILEGE]
)
def test_least_privilege_capture_and_no_password_in_any_output(
    request: pytest.FixtureRequest,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
    capfd: pytest.CaptureFixture[str],
    kind: str,
    watermark: str,
) -> None:
    """The documented grants suffice for a dump under writes; the password is never printed."""
    caplog.set_level(logging.DEBUG)
    db = db_for(request, kind)
    load(db)
    admin_source = open_source(_config(db, "table", tmp_path))
    admin_source.ensure_watermark_table()  # an administrator creates it; the user only writes
    with restricted_user(db, LEAST_PRIVILEGE[(kind, watermark)], SECRET) as restricted:
        config = _config(restricted, watermark, tmp_path)
        config = dataclasses.replace(config, dump=dataclasses.replace(config.dump, chunk_size=2000))
        store = MetadataStore(config.metadata_url)
        sink = MemorySink()
        capture = _open(config, store, sink)
        # another stream's watermark in the log: a read-only user cannot even describe that table
        admin_source.write_watermark("another-stream", str(uuid.uuid4()))
        admin_source.close()
        with writers(db):
            _run_until(capture, lambda: bool(sink.received), 60)
            dump_id = plan_dump(config, store, requested_by="test")
            _run_until(capture, lambda: store.progress(dump_id).state == "done", 300)
        _drain(capture)
        capture.close()
        assert sink.rows(db.table()) == source_rows(db)

        config_file = tmp_path / "lp.yaml"
        config_file.write_text(
            f"""
name: {config.name}
source: {{type: {kind}, url: "{restricted.url}", tables: [{db.table()}]}}
metadata: {{url: "{config.metadata_url}"}}
sinks: {{delta: {{path: {tmp_path}/delta}}}}
checkpoint: {tmp_path}/checkpoint
"""
        )
        wrong = config_file.read_text().replace(quote(SECRET, safe=""), f"{SECRET}-wrong")
        (tmp_path / "wrong.yaml").write_text(wrong)
        for args in (
            ["status", "-c", str(config_file), "--dump", str(dump_id), "--json"],
            ["dump", "-c", str(config_file), "--table", f"{db.table().db}.missing"],
            ["dump", "-c", str(tmp_path / "wrong.yaml"), "--all"],
        ):
            dblog(args)
    out, err = capfd.readouterr()
    assert "refused user" in out + err or "authentication failed" in out + err
    for text in (out, err, caplog.text):
        assert SECRET not in text and quote(SECRET, safe="") not in text


def test_a_missing_replication_grant_is_named(
    request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    db = db_for(request, "mysql")
    load(db)
    with restricted_user(db, ["GRANT SELECT ON `{db}`.* TO {user}"], SECRET) as restricted:
        config = _config(restricted, "snapshot", tmp_path)
        with pytest.raises(DblogError, match="GRANT REPLICATION SLAVE, REPLICATION CLIENT") as err:
            capture = _open(config, MetadataStore(config.metadata_url), MemorySink())
            capture.step(timeout_s=1)
    assert "\n" not in str(err.value) and SECRET not in str(err.value)


def test_gtid_watermarks_are_refused_on_mariadb_before_anything_is_written(
    request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    """MariaDB advances @@gtid_binlog_pos before a transaction is visible (group commit,
    semi-sync AFTER_SYNC): a GTID window could count an unseen change as seen."""
    db = db_for(request, "mysql")
    load(db, rows=10)
    config = _config(db, "gtid", tmp_path)
    store = MetadataStore(config.metadata_url)
    with pytest.raises(SourceError) as err:
        _open(config, store, MemorySink())
    message = str(err.value)
    assert "not exact on MariaDB" in message and "source.watermark: snapshot" in message
    assert "\n" not in message
    assert store.stream_state(config.name) is None  # no offset saved for a stream that never ran


# quotes of both dialects, a semicolon, SQL, unicode: identifiers are quoted, never spliced
STRANGE_TABLE = "we'ird;\"x` DROP ördërs"


@pytest.mark.parametrize("kind", ["mysql", "postgres"])
def test_strange_table_names_and_a_backfill_of_100_000_keys(
    request: pytest.FixtureRequest, tmp_path: Path, kind: str
) -> None:
    db = db_for(request, kind)
    conn = db.connect()
    q = "`" if kind == "mysql" else '"'
    table = f"{q}{db.schema}{q}.{q}{STRANGE_TABLE.replace(q, q + q)}{q}"
    with conn.cursor() as cur:
        cur.execute(
            f"CREATE TABLE {table} (id bigint, tag varchar(8), v int, PRIMARY KEY (id, tag))"
        )
        numbers = "seq, 't', seq FROM seq_0_to_149999"  # MariaDB's sequence engine
        if kind == "postgres":
            numbers = "i, 't', i FROM generate_series(0, 149999) AS i"
        cur.execute(f"INSERT INTO {table} SELECT {numbers}")
    conn.commit()
    conn.close()
    config = _config(db, "table", tmp_path)
    tid = TableId(db.schema, STRANGE_TABLE)
    config = dataclasses.replace(
        config,
        source=dataclasses.replace(config.source, tables=(tid,)),
        dump=dataclasses.replace(config.dump, chunk_size=5000),
    )
    store = MetadataStore(config.metadata_url)
    sink = MemorySink()
    capture = _open(config, store, sink)
    conn = db.connect()
    with conn.cursor() as cur:  # live changes of the strange table go through the log too
        cur.execute(f"UPDATE {table} SET v = -1 WHERE id = 0")
        cur.execute(f"INSERT INTO {table} VALUES (999999, 't', 7)")
    conn.commit()
    conn.close()
    wanted = [[i, "t"] for i in range(0, 200_000, 2)]  # 100,000 keys, a quarter not in the table
    started = time.monotonic()
    dump_id = plan_dump(config, store, [str(tid)], wanted, requested_by="test")
    planned_s = time.monotonic() - started
    assert store.progress(dump_id).chunks_total == 20
    _run_until(capture, lambda: store.progress(dump_id).state == "done", 300)
    dumped_s = time.monotonic() - started
    print(f"{kind}: 100,000 keys planned in {planned_s:.1f} s, dumped in {dumped_s:.1f} s")
    capture.close()
    rows = sink.rows(tid)
    assert rows.keys() == {(i, "t") for i in range(0, 150_000, 2)} | {(999999, "t")}
    assert (rows[(0, "t")]["v"], rows[(999999, "t")]["v"]) == (-1, 7)
    with pytest.raises(DblogError, match="is not captured by stream"):
        plan_dump(config, store, [f"{db.schema}.{STRANGE_TABLE}x"], requested_by="test")
    with pytest.raises(DblogError, match="expects"):
        plan_dump(config, store, [str(tid)], [["not-a-number", "t"]], requested_by="test")
    assert len(store.dumps(config.name)) == 1, "a refused request wrote a dump"


@pytest.mark.parametrize("kind", ["mysql", "postgres"])
def test_a_bad_chunk_fails_its_dump_and_the_stream_goes_on(
    request: pytest.FixtureRequest, tmp_path: Path, kind: str
) -> None:
    """A key list over what one chunk accepts crash-looped the stream: every restart selected
    the same chunk again. Now the planner cuts lists to that limit, and a chunk that fails
    anyway (here one recorded as an older planner did) fails only its dump, with its reason."""
    db = db_for(request, kind)
    load(db, rows=2000)
    config = _config(db, "snapshot", tmp_path)
    store = MetadataStore(config.metadata_url)
    sink = MemorySink()
    capture = _open(config, store, sink)
    table = str(db.table())
    keys = [[a, f"k{a % 7}"] for a in range(MAX_KEYS_PER_CHUNK + 2000)]
    too_big = store.create_dump(
        config.name, "keys", [TablePlan(table, ["a", "b"], len(keys), key_chunks=[keys])]
    )
    store.set_controls(config.name, chunk_size=50_000)
    planned = plan_dump(config, store, [table], keys, requested_by="test")
    assert [len(c.keys or []) for c in store.chunks(planned)] == [MAX_KEYS_PER_CHUNK, 2000]
    _run_until(
        capture,
        lambda: (
            store.progress(too_big).state != "pending" and store.progress(planned).state == "done"
        ),
        120,
    )
    failed = store.progress(too_big)
    assert failed.state == "failed" and failed.reason is not None
    assert f"key-list chunks hold at most {MAX_KEYS_PER_CHUNK} keys" in failed.reason
    assert "\n" not in failed.reason
    execute(db, f"UPDATE {db.quoted()} SET v = 77 WHERE a = 1")  # the log goes on
    _run_until(capture, lambda: sink.rows(db.table()).get((1, "k1"), {}).get("v") == 77, 60)
    capture.close()
    assert len(sink.rows(db.table())) == 2000


@pytest.mark.parametrize("kind", ["mysql", "postgres"])
def test_a_source_restart_mid_dump_loses_nothing(
    request: pytest.FixtureRequest, tmp_path: Path, _servers: Any, kind: str
) -> None:
    """The server restarts while the capture runs: it reconnects, or stops with one line and a
    restart of the capture (what a supervisor or an HA standby does) finishes the dump."""
    if _servers.backend != "local":
        pytest.skip("restarts the local services only (a container's mapped port would change)")
    db = db_for(request, kind)
    load(db)
    config = _config(db, "table", tmp_path)
    store = MetadataStore(config.metadata_url)
    sink = MemorySink()
    capture = _open(config, store, sink)
    with writers(db) as counts:
        _run_until(capture, lambda: counts.total() > 200, 60)
        dump_id = plan_dump(config, store, requested_by="test")
        _run_until(capture, lambda: store.progress(dump_id).chunks_done >= 20, 300)
    failures: list[BaseException] = []
    stop = threading.Event()

    def keep_stepping() -> None:
        try:
            while not stop.is_set():
                capture.step(timeout_s=0.05)
        except DblogError as err:
            failures.append(err)
            capture.close()  # as the job's exit would: an idle replication connection left
            # open holds PostgreSQL's fast shutdown for wal_sender_timeout (60 s)

    stepping = threading.Thread(target=keep_stepping)
    stepping.start()
    restart_local_service("mariadb" if kind == "mysql" else "postgres")
    time.sleep(3)
    stop.set()
    stepping.join(60)
    if failures:
        text = str(failures[0])
        print(f"capture stopped on the restart: {text}")
        assert "\n" not in text and "password" not in text.lower()
        capture = _open(config, store, sink)
    with writers(db):
        _run_until(capture, lambda: store.progress(dump_id).state == "done", 600)
    _drain(capture)
    capture.close()
    assert sink.rows(db.table()) == source_rows(db)
    last: dict[tuple[Any, ...], Any] = {}
    for event in sink.received:
        assert event.key not in last or last[event.key] < event.position, event
        last[event.key] = event.position


def _alter_after_first_select(
    monkeypatch: pytest.MonkeyPatch, capture: Capture, db: Db, ddl: str
) -> None:
    """Run ``ddl`` right after the first chunk SELECT returns, before its high watermark:
    the one moment a real ALTER can straddle a chunk, made certain. The SELECT runs on the
    runner's own connection (a driver thread here), so the source's class is patched. Use
    it with one chunk in flight: another chunk whose window closes while the ALTER waits for
    that chunk's metadata lock rightly keeps the old shape, ahead of the ALTER in the log."""
    kind = type(capture.executor.source)
    done: list[bool] = []

    def then_alter(select: Callable[..., Any]) -> Callable[..., Any]:
        def select_then_alter(*args: Any, **kwargs: Any) -> Any:
            rows = select(*args, **kwargs)
            if not done:
                done.append(True)
                execute(db, ddl)
            return rows

        return select_then_alter

    # PostgreSQL's table watermark selects in a snapshot too (it judges the log by it)
    for name in ("select_range", "snapshot_select_range"):
        monkeypatch.setattr(kind, name, then_alter(getattr(kind, name)))


@pytest.mark.parametrize("change", ["add", "drop"])
@pytest.mark.parametrize("kind", ["mysql", "postgres"])
def test_a_chunk_straddling_an_alter_is_selected_again(
    request: pytest.FixtureRequest,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    kind: str,
    change: str,
) -> None:
    """ADD/DROP COLUMN between a chunk's SELECT and its high watermark: rows of the old shape
    would land after the change; the chunk is selected again and the output has the new shape."""
    db = db_for(request, kind)
    load(db, rows=1_000)
    config = _config(db, "table", tmp_path, parallelism=1)
    store = MetadataStore(config.metadata_url)
    sink = MemorySink()
    capture = _open(config, store, sink)
    if change == "add":
        ddl, columns = "ADD COLUMN extra int NOT NULL DEFAULT 7", ("a", "b", "v", "note", "extra")
    else:
        ddl, columns = "DROP COLUMN note", ("a", "b", "v")
    _alter_after_first_select(monkeypatch, capture, db, f"ALTER TABLE {db.quoted()} {ddl}")
    caplog.set_level(logging.INFO, logger="airflow_dblog.engine.chunk_executor")
    dump_id = plan_dump(config, store, requested_by="test")
    _run_until(capture, lambda: store.progress(dump_id).state == "done", 300)
    _drain(capture)
    capture.close()
    assert sink.rows(db.table()) == source_rows(db, columns)
    assert "schema changed while it was selected; selecting it again" in caplog.text


@pytest.mark.parametrize("kind", ["mysql", "postgres"])
def test_a_primary_key_change_mid_dump_fails_the_dump_with_the_reason(
    request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, kind: str
) -> None:
    db = db_for(request, kind)
    load(db, rows=1_000)
    config = _config(db, "table", tmp_path, parallelism=1)
    store = MetadataStore(config.metadata_url)
    capture = _open(config, store, MemorySink())
    if kind == "mysql":
        ddl = f"ALTER TABLE {db.quoted()} DROP PRIMARY KEY, ADD PRIMARY KEY (a, b, v)"
    else:
        ddl = (
            f"ALTER TABLE {db.quoted()} DROP CONSTRAINT {db.table().table}_pkey,"
            " ADD PRIMARY KEY (a, b, v)"
        )
    _alter_after_first_select(monkeypatch, capture, db, ddl)
    dump_id = plan_dump(config, store, requested_by="test")
    _run_until(capture, lambda: store.dump(dump_id).state == "failed", 120)
    capture.close()
    reason = store.dump(dump_id).reason or ""
    assert "\n" not in reason
    assert f"primary key of {db.table()} changed from (a, b) to (a, b, v)" in reason
    assert "run a new dump of the table" in reason
    assert store.progress(dump_id).chunks_done == 0
