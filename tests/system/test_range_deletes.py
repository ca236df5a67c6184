"""A plain full dump deletes what the source lost without the log (`dblog stream`, Spark, Delta,
Kafka, MariaDB or PostgreSQL).

The lake holds keys the source lacks: on MariaDB, rows deleted with ``sql_log_bin = 0`` (the
table's first key and its largest among them, so the next dump's bound lies below it); on
PostgreSQL, whose WAL carries every write, rows added to the Delta table by hand, below the
smallest key, above the largest and in a deleted key's place. A full dump cuts range chunks
only; each closed chunk's batch finds the keys Delta holds in its range that its rows lack and
asks for a key-list dump of them, which deletes them in log order: Delta ends equal to the
source with a delete in its change feed for each, and a read_committed consumer of the topic
rebuilds the source (each of those keys ending in a delete and a tombstone).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from airflow_dblog.cli import main as dblog
from airflow_dblog.config import Config, load_config
from airflow_dblog.engine.metadata import MetadataStore
from airflow_dblog.engine.repairs import repaired_chunks
from tests.support.oracle import delta_path, delta_version
from tests.support.services import read_committed_until
from tests.support.stream_process import Stream, until, write_config
from tests.support.workload import Db, db_for, execute

pytestmark = [pytest.mark.integration, pytest.mark.slow]

ROWS = 600
SENTINEL = 999_999
Rows = dict[int, tuple[int, str]]


def _create(db: Db) -> None:
    text = "varchar(32)" if db.kind == "mysql" else "text"
    execute(db, f"CREATE TABLE {db.quoted()} (a int PRIMARY KEY, v int NOT NULL, note {text})")
    if db.kind == "postgres":
        execute(db, f"ALTER TABLE {db.quoted()} REPLICA IDENTITY FULL")
    rows = [(a, a, "seed") for a in range(ROWS)]
    execute(db, f"INSERT INTO {db.quoted()} VALUES (%s, %s, %s)", rows)


def _source(db: Db) -> Rows:
    conn = db.connect()
    try:
        with conn.cursor() as cur:
            cur.execute(f"SELECT a, v, note FROM {db.quoted()}")
            return {a: (v, note) for a, v, note in cur.fetchall()}
    finally:
        conn.close()


def _lake(spark: Any, path: str) -> Rows:
    if delta_version(path) < 0:
        return {}
    rows = spark.read.format("delta").load(path).where("NOT _dblog_deleted").collect()
    return {r["a"]: (r["v"], r["note"]) for r in rows}


def _caught_up(spark: Any, db: Db, path: str, stream: Stream) -> Rows:
    """Delta's live rows once the stream applied everything logged so far (a sentinel row
    inserted and deleted now has come and gone)."""
    execute(db, f"INSERT INTO {db.quoted()} VALUES (%s, 0, 'sentinel')", (SENTINEL,))
    until("the sentinel in Delta", lambda: SENTINEL in _lake(spark, path), 300, stream)
    execute(db, f"DELETE FROM {db.quoted()} WHERE a = %s", (SENTINEL,))
    until("the sentinel gone from Delta", lambda: SENTINEL not in _lake(spark, path), 300, stream)
    return _lake(spark, path)


def _dump(config_path: Path, store: MetadataStore, config: Config, stream: Stream) -> int:
    assert dblog(["dump", "-c", str(config_path), "--all"]) == 0
    dump_id = max(d.id for d in store.dumps(config.name))
    until("the dump", lambda: store.progress(dump_id).state == "done", 300, stream)
    return dump_id


def _without_log(db: Db, sql: str) -> None:
    conn = db.connect()
    try:
        with conn.cursor() as cur:
            cur.execute("SET SESSION sql_log_bin = 0")
            cur.execute(sql)
        conn.commit()
    finally:
        conn.close()


def _drift(spark: Any, db: Db, path: str, stream: Stream) -> list[int]:
    """Keys Delta holds live that the source lacks, made where the log cannot see it."""
    if db.kind == "mysql":
        gone = [0, 250, ROWS - 1]  # the first key, one inside, the largest
        _without_log(db, f"DELETE FROM {db.quoted()} WHERE a IN ({', '.join(map(str, gone))})")
        return gone
    execute(db, f"DELETE FROM {db.quoted()} WHERE a = 300")  # logged: a tombstone in Delta
    until("key 300's tombstone", lambda: 300 not in _lake(spark, path), 300, stream)
    table = f"delta.`{path}`"
    for a in (-10, ROWS + 400):  # below the smallest key, above the largest
        spark.sql(
            f"INSERT INTO {table} (a, v, note, _dblog_position, _dblog_op, _dblog_deleted,"
            f" _dblog_ts) VALUES ({a}, 1, 'by hand', '0', 'c', false, current_timestamp())"
        )
    spark.sql(f"UPDATE {table} SET _dblog_deleted = false, v = 1, note = 'by hand' WHERE a = 300")
    return [-10, 300, ROWS + 400]


def _deletes_in_feed(spark: Any, path: str, after_version: int) -> set[int]:
    feed = (
        spark.read.format("delta")
        .option("readChangeFeed", "true")
        .option("startingVersion", after_version + 1)
        .load(path)
        .where("_change_type = 'update_postimage' AND _dblog_deleted")
        .collect()
    )
    return {r["a"] for r in feed}


@pytest.mark.parametrize("kind", ["mysql", "postgres"])
def test_a_full_dump_deletes_the_keys_the_source_lost_without_the_log(
    request: pytest.FixtureRequest,
    tmp_path: Path,
    spark: Any,
    kafka_server: Any,
    stream_factory: Callable[[Path], Stream],
    kind: str,
) -> None:
    db = dataclasses.replace(db_for(request, kind), name="ranged")
    _create(db)
    config_path = write_config(db, tmp_path, chunk_size=200, kafka=kafka_server.bootstrap_servers)
    config = load_config(config_path)
    store = MetadataStore(config.metadata_url)
    stream = stream_factory(config_path)
    stream.start()
    stream.wait_capturing()
    path = delta_path(config, db.table())

    first = _dump(config_path, store, config, stream)
    assert _caught_up(spark, db, path, stream) == _source(db)
    assert not [d for d in store.dumps(config.name) if d.id != first]  # nothing was extra

    gone = _drift(spark, db, path, stream)
    assert set(gone) <= set(_lake(spark, path)) and not set(gone) & set(_source(db))
    before = delta_version(path)
    dump_id = _dump(config_path, store, config, stream)
    # a chunk completes after its batch asked for the follow-up: they all exist by now (one
    # per batch that found keys)
    repairs = [d for d in store.dumps(config.name) if d.id > dump_id]
    assert repairs and all(
        d.kind == "keys" and repaired_chunks(d.requested_by, dump_id) for d in repairs
    ), [(d.id, d.kind, d.requested_by) for d in repairs]
    named = [c for d in repairs for c in repaired_chunks(d.requested_by, dump_id)]
    assert len(named) == len(set(named))  # no chunk asked for twice
    done = lambda: all(store.progress(d.id).state == "done" for d in repairs)  # noqa: E731
    until("the follow-up dumps", done, 300, stream)
    # each key read again and found missing: a delete each, and no row
    asked = sorted(k[0] for d in repairs for c in store.chunks(d.id) for k in c.keys or [])
    assert asked == sorted(gone), [(d.id, d.requested_by) for d in repairs]
    assert sum(store.progress(d.id).rows_emitted for d in repairs) == len(gone)
    expected = _source(db)
    assert _caught_up(spark, db, path, stream) == expected
    assert _deletes_in_feed(spark, path, before) >= set(gone)

    assert config.kafka is not None
    topic = f"{config.kafka.topic_prefix}.{db.table().db}.{db.table().table}"
    messages = read_committed_until(  # until the last sentinel's delete is in
        config.kafka.bootstrap_servers,
        topic,
        lambda m: sum(k == {"a": SENTINEL} and v is not None and v["op"] == "d" for k, v in m) == 2,
    )
    state: dict[int, tuple[int, str] | None] = {}
    last: dict[int, tuple[str, bool]] = {}  # per key: its last event's op, and a tombstone after
    for key, value in messages:
        a = key["a"]
        if value is None:
            assert state.get(a) is None, f"a tombstone for {a} without its delete"
            last[a] = (last[a][0], True)
            continue
        after = value["after"]
        state[a] = None if value["op"] == "d" else (after["v"], after["note"])
        last[a] = (value["op"], False)
    assert {a: row for a, row in state.items() if row is not None} == expected
    for a in gone:  # Kafka never saw the rows made by hand on PG: it gets their delete too
        assert last[a] == ("d", True), (a, [v for k, v in messages if k == {"a": a}])
    assert stream.stop() == 0
