"""Verify dumps on the real stream (`dblog stream`, Spark, Delta, Kafka, MariaDB or PostgreSQL),
with writers running.

The lake drifts where the log cannot see it: on MariaDB, inserts, updates and deletes with
``sql_log_bin = 0``; on PostgreSQL (whose WAL carries every write), rows deleted, tombstoned,
changed and added in the Delta table by hand. Writers keep changing other keys of the same
table throughout, so every chunk's window sees the log move. ``dblog verify --dry-run`` finds
exactly the drift and writes nothing; ``dblog verify``, killed with -9 halfway and restarted,
finds the same counts, repairs each difference once, and leaves Delta equal to the source, its
change feed never taking a key back, and a read_committed consumer of the topic rebuilding the
same table.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from airflow_dblog.cli import main as dblog
from airflow_dblog.config import Config, load_config
from airflow_dblog.engine.capture import CONTROLS_REFRESH_S
from airflow_dblog.engine.metadata import MetadataStore
from airflow_dblog.engine.repairs import repaired_chunks
from tests.support.oracle import (
    SENTINEL,
    assert_equal,
    check_history,
    delta_histories,
    delta_path,
    delta_version,
    kafka_histories,
    sentinel_key,
    settle,
    until_delta_holds,
)
from tests.support.services import read_committed_until
from tests.support.stream_process import Stream, until, write_config
from tests.support.workload import Db, db_for, execute, insert_rows, key_of, source_rows, writers

pytestmark = [pytest.mark.integration, pytest.mark.slow]

ROWS = 1_000
COLUMNS = ("a", "b", "v", "note")
WRITTEN = 300  # the writers' keys: 0 .. WRITTEN - 1; the drift is above them
DIFFERENT = [450, 620, 777]
GONE = {"mysql": [333, 888], "postgres": [1_500, 1_600]}  # the lake holds them, the source not
MISSING = {"mysql": [1_500, 1_600], "postgres": [500, 700, 800]}  # the source only (800: deleted)


def _create(db: Db) -> None:
    """The loads' columns keyed by ``a`` alone (``b`` follows from it): an integer key, whose
    order Spark and the source share, so keys the lake holds beyond the source are looked for.
    Empty: its rows are inserted once the stream reads the log, and reach Delta through it."""
    text = "varchar(16)" if db.kind == "mysql" else "text"
    execute(
        db,
        f"CREATE TABLE {db.quoted()} (a int PRIMARY KEY, b {text} NOT NULL, v int NOT NULL,"
        f" note {text}, UNIQUE (a, b))",  # the writers' upsert names (a, b)
    )
    if db.kind == "postgres":
        execute(db, f"ALTER TABLE {db.quoted()} REPLICA IDENTITY FULL")


def _without_log(db: Db, *statements: str) -> None:
    conn = db.connect()
    try:
        with conn.cursor() as cur:
            cur.execute("SET SESSION sql_log_bin = 0")
            for sql in statements:
                cur.execute(sql)
        conn.commit()
    finally:
        conn.close()


def _drift(spark: Any, db: Db, path: str) -> None:
    keys = lambda found: ", ".join(map(str, found[db.kind]))  # noqa: E731
    different = ", ".join(map(str, DIFFERENT))
    if db.kind == "mysql":
        missing = ", ".join(f"({a}, '{key_of(a)[1]}', 7, 'unlogged')" for a in MISSING["mysql"])
        _without_log(
            db,
            f"UPDATE {db.quoted()} SET v = v + 1000 WHERE a IN ({different})",
            f"DELETE FROM {db.quoted()} WHERE a IN ({keys(GONE)})",
            f"INSERT INTO {db.quoted()} VALUES {missing}",
        )
        return
    table = f"delta.`{path}`"
    _by_hand(spark, f"UPDATE {table} SET v = v - 1000 WHERE a IN ({different})")
    _by_hand(spark, f"DELETE FROM {table} WHERE a IN (500, 700)")
    _by_hand(spark, f"UPDATE {table} SET _dblog_deleted = true, v = null WHERE a = 800")
    for a in GONE["postgres"]:
        _by_hand(
            spark,
            f"INSERT INTO {table} (a, b, v, note, _dblog_position, _dblog_op, _dblog_deleted,"
            f" _dblog_ts) VALUES ({a}, '{key_of(a)[1]}', 1, 'by hand', '0', 'c', false,"
            " current_timestamp())",
        )


def _by_hand(spark: Any, sql: str) -> None:
    """An edit of the Delta table beside the stream's MERGEs: again when one commits first."""
    for attempt in range(10):
        try:
            spark.sql(sql)
            return
        except Exception as err:  # Delta's ConcurrentAppendException and kin, through py4j
            if "Concurrent" not in type(err).__name__ + str(err)[:300] or attempt == 9:
                raise


def _verify(config_path: Path, store: MetadataStore, config: Config, *args: str) -> int:
    assert dblog(["verify", "-c", str(config_path), "--all", *args]) == 0
    return max(d.id for d in store.dumps(config.name))


def _counts(store: MetadataStore, dump_id: int) -> dict[str, Any]:
    report = store.progress(dump_id).verify
    assert report is not None
    found = report.as_dict()
    return {k: found[k] for k in ("missing", "extra", "different", "extra_not_checked")}


def _compared_chunks(store: MetadataStore, dump_id: int) -> int:
    report = store.progress(dump_id).verify
    return 0 if report is None else report.chunks


def _dumped_rows_in_feed(spark: Any, path: str, after_version: int) -> int:
    feed = (
        spark.read.format("delta")
        .option("readChangeFeed", "true")
        .option("startingVersion", after_version + 1)
        .load(path)
    )
    return feed.where("_dblog_op = 'r'").count()


@pytest.mark.parametrize("kind", ["mysql", "postgres"])
def test_verify_finds_the_drift_exactly_and_repairs_it_once_across_a_kill_9(
    request: pytest.FixtureRequest,
    tmp_path: Path,
    spark: Any,
    kafka_server: Any,
    stream_factory: Callable[[Path], Stream],
    kind: str,
) -> None:
    db = db_for(request, kind)
    _create(db)
    config_path = write_config(db, tmp_path, chunk_size=250, kafka=kafka_server.bootstrap_servers)
    config = load_config(config_path)
    store = MetadataStore(config.metadata_url)
    stream = stream_factory(config_path)
    stream.start()
    stream.wait_capturing()
    path = delta_path(config, db.table())
    insert_rows(db, range(ROWS), 0, "seed")
    with writers(db, pause_s=0.05, key_space=WRITTEN):
        settle(spark, [db], config, COLUMNS, stream)
        _drift(spark, db, path)
        drifted = delta_version(path)

        expected = {
            "missing": len(MISSING[kind]),
            "extra": len(GONE[kind]),
            "different": len(DIFFERENT),
            "extra_not_checked": [],
        }
        dry = _verify(config_path, store, config, "--dry-run")
        until("the dry run", lambda: store.progress(dry).state == "done", 300, stream)
        assert _counts(store, dry) == expected
        report = store.progress(dry).verify
        assert report is not None and report.repaired == 0
        assert (
            report.checked + store.progress(dry).rows_dropped == store.progress(dry).rows_selected
        )
        assert [d.id for d in store.dumps(config.name)][-1] == dry  # no follow-up
        assert _dumped_rows_in_feed(spark, path, drifted) == 0  # nothing written

        # time to kill it halfway: one chunk at a time, 30 s apart (longer than any Delta batch
        # that reports a chunk compared, so one batch never reports them all), once the stream
        # reads the controls
        store.set_controls(config.name, delay_ms=30_000, parallelism=1)
        time.sleep(CONTROLS_REFRESH_S + 1)
        repair = _verify(config_path, store, config)
        halfway = lambda: _compared_chunks(store, repair) >= 1  # noqa: E731
        until("a compared chunk", halfway, 300, stream)
        assert store.progress(repair).state == "running"
        stream.kill()
        store.set_controls(config.name, delay_ms=0, parallelism=2)
        stream.start()
        until("the verify", lambda: store.progress(repair).state == "done", 300, stream)
        assert _counts(store, repair) == expected
        follow_ups = [d for d in store.dumps(config.name) if d.id > repair]
        named = [c for d in follow_ups for c in repaired_chunks(d.requested_by, repair)]
        assert follow_ups and len(named) == len(set(named))  # no chunk repaired twice
        asked = sorted(k[0] for d in follow_ups for c in store.chunks(d.id) for k in c.keys or [])
        assert asked == sorted([*DIFFERENT, *GONE[kind], *MISSING[kind]])
        repaired = store.progress(repair).verify
        assert repaired is not None and repaired.repaired == len(asked)
        done = lambda: all(store.progress(d.id).state == "done" for d in follow_ups)  # noqa: E731
        until("the repairs", done, 300, stream)
    execute(db, f"DELETE FROM {db.quoted()} WHERE a = %s", (SENTINEL,))
    until_delta_holds(spark, path, sentinel_key(), stream, live=False)
    lake = settle(spark, [db], config, COLUMNS, stream)[db.table()]
    source = source_rows(db)
    assert_equal([(f"Delta {db.table()}", source, lake)])
    # the hand edits (PostgreSQL) went back by design; from the repairs on, nothing does
    for key, steps in delta_histories(spark, path, None).items():
        check_history(key, [s for s in steps if int(s.at.split("v")[1]) > drifted], ranked=False)

    assert config.kafka is not None
    topic = f"{config.kafka.topic_prefix}.{db.table().db}.{db.table().table}"
    sentinel = {"a": SENTINEL}
    messages = read_committed_until(
        config.kafka.bootstrap_servers,
        topic,
        lambda m: sum(k == sentinel and v is not None and v["op"] == "c" for k, v in m) == 2,
    )
    # keyed by ``a`` alone; the oracle names a key by (a, b)
    keyed = [({**k, "b": key_of(k["a"])[1]}, v) for k, v in messages]
    histories, replayed = kafka_histories(keyed, COLUMNS, None)
    assert_equal([(f"Kafka {topic} replayed", source, replayed)])
    for key, steps in histories.items():
        check_history(key, steps, ranked=False)
    assert stream.stop() == 0
