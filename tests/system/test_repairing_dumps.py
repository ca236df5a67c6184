"""Dumps that repair, on the real stream (`dblog stream`, Spark, Delta, Kafka, MariaDB or PG).

The lake drifts where the log cannot see it: on MariaDB, writes with ``sql_log_bin = 0``; on
PostgreSQL (whose WAL carries every write), rows changed or added in the Delta table by hand.
One stream carries two tables. In the loads' table, keyed ``(a int, b text)``, a second full dump
writes to Delta exactly the rows that differ (an equal row gets no update and no change-feed row)
and Kafka every row, as Debezium's snapshots do, and once its last chunk is in, asks again for the
keys Delta holds that no chunk selected (a text key's order is the source's, so not per chunk);
a dump of keys the source lacks deletes them in Delta (tombstones) and in Kafka (a delete and a
tombstone). In ``ranged``, keyed by an integer,
the same full dump finds the keys Delta holds in its chunks' ranges that the source lost (the
first key, one inside and the largest on MariaDB; on PostgreSQL rows added below the smallest
key, above the largest and in a deleted key's place) and asks for a key-list dump of them, which
deletes them in log order. Afterwards Delta equals the source and a read_committed consumer of
each topic rebuilds it.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from airflow_dblog.cli import main as dblog
from airflow_dblog.config import Config, load_config
from airflow_dblog.engine.metadata import MetadataStore
from airflow_dblog.engine.repairs import repaired_chunks
from tests.support.oracle import (
    SENTINEL,
    Rows,
    assert_equal,
    delta_path,
    delta_version,
    kafka_histories,
    sentinel_key,
    settle,
    until_delta_holds,
)
from tests.support.services import read_committed_until
from tests.support.stream_process import Stream, until, write_config
from tests.support.workload import Db, db_for, execute, key_of, load, source_rows

RangedRows = dict[int, tuple[int, str]]

pytestmark = [pytest.mark.integration, pytest.mark.slow]

ROWS = 600
COLUMNS = ("a", "b", "v", "note")
DRIFTED = [7, 70, 140, 300, 450, 599]  # 1% of the rows
# rows the source lost without the log (MariaDB), or rows Delta gained by hand (PostgreSQL)
GONE = {"mysql": [11, 222], "postgres": [ROWS + 100, ROWS + 200]}
NEVER = 9_999  # a key no one ever wrote
RANGED_SENTINEL = 999_999


def _dump(
    config_path: Path, store: MetadataStore, config: Config, stream: Stream, *args: str
) -> int:
    assert dblog(["dump", "-c", str(config_path), *args]) == 0
    dump_id = max(d.id for d in store.dumps(config.name))
    until("the dump", lambda: store.progress(dump_id).state == "done", 300, stream)
    return dump_id


def _caught_up(spark: Any, db: Db, config: Config, stream: Stream) -> Rows:
    """Delta's live rows once the stream has applied everything logged so far."""
    execute(db, f"DELETE FROM {db.quoted()} WHERE a = %s", (SENTINEL,))  # settle inserts it
    path = delta_path(config, db.table())
    until_delta_holds(spark, path, sentinel_key(), stream, live=False)
    return settle(spark, [db], config, COLUMNS, stream)[db.table()]


def _without_log(db: Db, sql: str) -> None:
    """One MariaDB statement the binlog does not carry (replication filters, a repair by hand)."""
    conn = db.connect()
    try:
        with conn.cursor() as cur:
            cur.execute("SET SESSION sql_log_bin = 0")
            cur.execute(sql)
        conn.commit()
    finally:
        conn.close()


def _drift(spark: Any, db: Db, path: str) -> None:
    """DRIFTED rows differ between the source and Delta; GONE rows are in Delta only."""
    keys = " OR ".join(f"(a = {a} AND b = '{key_of(a)[1]}')" for a in DRIFTED)
    if db.kind == "mysql":
        _without_log(db, f"UPDATE {db.quoted()} SET v = v + 1000 WHERE {keys}")
        gone = " OR ".join(f"(a = {a} AND b = '{key_of(a)[1]}')" for a in GONE[db.kind])
        _without_log(db, f"DELETE FROM {db.quoted()} WHERE {gone}")
        return
    table = f"delta.`{path}`"
    spark.sql(f"UPDATE {table} SET v = v - 1000 WHERE {keys}")
    for a in GONE[db.kind]:
        spark.sql(
            f"INSERT INTO {table} (a, b, v, note, _dblog_position, _dblog_op, _dblog_deleted,"
            f" _dblog_ts) VALUES ({a}, '{key_of(a)[1]}', 1, 'by hand',"
            " '0', 'c', false, current_timestamp())"
        )


def _feed_after(spark: Any, path: str, after_version: int, where: str) -> list[Any]:
    """The change feed's rows matching ``where`` in the commits after ``after_version``."""
    return (
        spark.read.format("delta")
        .option("readChangeFeed", "true")
        .option("startingVersion", after_version + 1)
        .load(path)
        .where(where)
        .collect()
    )


def _dump_writes(spark: Any, path: str, after_version: int) -> set[tuple[Any, ...]]:
    """The keys whose dumped rows Delta's change feed shows after ``after_version``."""
    written = "_change_type IN ('insert', 'update_postimage') AND _dblog_op = 'r'"
    return {(r["a"], r["b"]) for r in _feed_after(spark, path, after_version, written)}


def _create_ranged(db: Db) -> None:
    text = "varchar(32)" if db.kind == "mysql" else "text"
    execute(db, f"CREATE TABLE {db.quoted()} (a int PRIMARY KEY, v int NOT NULL, note {text})")
    if db.kind == "postgres":
        execute(db, f"ALTER TABLE {db.quoted()} REPLICA IDENTITY FULL")
    rows = [(a, a, "seed") for a in range(ROWS)]
    execute(db, f"INSERT INTO {db.quoted()} VALUES (%s, %s, %s)", rows)


def _ranged_source(db: Db) -> RangedRows:
    conn = db.connect()
    try:
        with conn.cursor() as cur:
            cur.execute(f"SELECT a, v, note FROM {db.quoted()}")
            return {a: (v, note) for a, v, note in cur.fetchall()}
    finally:
        conn.close()


def _ranged_lake(spark: Any, path: str) -> RangedRows:
    if delta_version(path) < 0:
        return {}
    rows = spark.read.format("delta").load(path).where("NOT _dblog_deleted").collect()
    return {r["a"]: (r["v"], r["note"]) for r in rows}


def _ranged_caught_up(spark: Any, db: Db, path: str, stream: Stream) -> RangedRows:
    """``ranged``'s live rows in Delta once a sentinel row inserted and deleted now has come
    and gone."""
    sentinel = RANGED_SENTINEL
    execute(db, f"INSERT INTO {db.quoted()} VALUES (%s, 0, 'sentinel')", (sentinel,))
    until_delta_holds(spark, path, {"a": sentinel}, stream)
    execute(db, f"DELETE FROM {db.quoted()} WHERE a = %s", (sentinel,))
    until_delta_holds(spark, path, {"a": sentinel}, stream, live=False)
    return _ranged_lake(spark, path)


def _ranged_drift(spark: Any, db: Db, path: str, stream: Stream) -> list[int]:
    """Keys Delta holds live that the source lacks, made where the log cannot see it."""
    if db.kind == "mysql":
        gone = [0, 250, ROWS - 1]  # the first key, one inside, the largest
        _without_log(db, f"DELETE FROM {db.quoted()} WHERE a IN ({', '.join(map(str, gone))})")
        return gone
    execute(db, f"DELETE FROM {db.quoted()} WHERE a = 300")  # logged: a tombstone in Delta
    until_delta_holds(spark, path, {"a": 300}, stream, live=False)
    table = f"delta.`{path}`"
    for a in (-10, ROWS + 400):  # below the smallest key, above the largest
        spark.sql(
            f"INSERT INTO {table} (a, v, note, _dblog_position, _dblog_op, _dblog_deleted,"
            f" _dblog_ts) VALUES ({a}, 1, 'by hand', '0', 'c', false, current_timestamp())"
        )
    spark.sql(f"UPDATE {table} SET _dblog_deleted = false, v = 1, note = 'by hand' WHERE a = 300")
    return [-10, 300, ROWS + 400]


def _deletes_in_feed(spark: Any, path: str, after_version: int) -> set[int]:
    deleted = "_change_type = 'update_postimage' AND _dblog_deleted"
    return {r["a"] for r in _feed_after(spark, path, after_version, deleted)}


def _check_ranged_topic(config: Config, db: Db, gone: list[int]) -> None:
    """A read_committed consumer rebuilds ``ranged``; each lost key ends in a delete and a
    tombstone (on PostgreSQL Kafka never saw the rows made by hand: it gets their delete)."""
    assert config.kafka is not None
    topic = f"{config.kafka.topic_prefix}.{db.table().db}.{db.table().table}"
    sentinel = {"a": RANGED_SENTINEL}
    messages = read_committed_until(  # until the second sentinel's delete is in
        config.kafka.bootstrap_servers,
        topic,
        lambda m: sum(k == sentinel and v is not None and v["op"] == "d" for k, v in m) == 2,
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
    assert {a: row for a, row in state.items() if row is not None} == _ranged_source(db)
    for a in gone:
        assert last[a] == ("d", True), (a, [v for k, v in messages if k == {"a": a}])


def _check_follow_ups(
    store: MetadataStore, config: Config, dump_id: int, stream: Stream
) -> list[Any]:
    """The key-list dumps ``dump_id``'s batches asked for: each names its chunks, none twice;
    returns them once done. A chunk completes after its batch asked, so all exist by now."""
    repairs = [d for d in store.dumps(config.name) if d.id > dump_id]
    assert repairs and all(
        d.kind == "keys" and repaired_chunks(d.requested_by, dump_id) for d in repairs
    ), [(d.id, d.kind, d.requested_by) for d in repairs]
    named = [c for d in repairs for c in repaired_chunks(d.requested_by, dump_id)]
    assert len(named) == len(set(named))  # no chunk asked for twice
    done = lambda: all(store.progress(d.id).state == "done" for d in repairs)  # noqa: E731
    until("the follow-up dumps", done, 300, stream)
    return repairs


@pytest.mark.parametrize("kind", ["mysql", "postgres"])
def test_a_redump_writes_what_differs_and_deletes_what_the_source_lost_as_does_a_key_dump(
    request: pytest.FixtureRequest,
    tmp_path: Path,
    spark: Any,
    kafka_server: Any,
    stream_factory: Callable[[Path], Stream],
    kind: str,
) -> None:
    db = db_for(request, kind)
    load(db, rows=ROWS)
    ranged = dataclasses.replace(db, name="ranged")
    _create_ranged(ranged)
    tables = [str(db.table()), str(ranged.table())]
    config_path = write_config(
        db, tmp_path, chunk_size=200, kafka=kafka_server.bootstrap_servers, tables=tables
    )
    config = load_config(config_path)
    store = MetadataStore(config.metadata_url)
    stream = stream_factory(config_path)
    stream.start()
    stream.wait_capturing()
    path, ranged_path = delta_path(config, db.table()), delta_path(config, ranged.table())

    first = _dump(config_path, store, config, stream, "--all")
    _caught_up(spark, db, config, stream)
    assert _ranged_caught_up(spark, ranged, ranged_path, stream) == _ranged_source(ranged)
    assert [d.id for d in store.dumps(config.name)] == [first]  # nothing was extra

    _drift(spark, db, path)
    gone_ranged = _ranged_drift(spark, ranged, ranged_path, stream)
    lake = _ranged_lake(spark, ranged_path)
    assert set(gone_ranged) <= set(lake) and not set(gone_ranged) & set(_ranged_source(ranged))
    before, ranged_before = delta_version(path), delta_version(ranged_path)
    dump_id = _dump(config_path, store, config, stream, "--all")
    _caught_up(spark, db, config, stream)
    assert _dump_writes(spark, path, before) == {key_of(a) for a in DRIFTED}
    # ``ranged`` is checked chunk by chunk; (a int, b text), whose key order Spark and the source
    # do not share, once its last chunk is in
    repairs = _check_follow_ups(store, config, dump_id, stream)
    asked: dict[str, list[Any]] = {}
    for d in repairs:
        keys = [tuple(k) for c in store.chunks(d.id) for k in c.keys or []]
        asked.setdefault(d.tables[0], []).extend(keys)
    # each key read again and found missing: a delete each, and no row
    assert {t: sorted(k) for t, k in asked.items()} == {
        str(ranged.table()): sorted((a,) for a in gone_ranged),
        str(db.table()): sorted(key_of(a) for a in GONE[kind]),
    }, [(d.id, d.requested_by) for d in repairs]
    emitted = sum(store.progress(d.id).rows_emitted for d in repairs)
    assert emitted == len(gone_ranged) + len(GONE[kind])
    assert _ranged_caught_up(spark, ranged, ranged_path, stream) == _ranged_source(ranged)
    assert _deletes_in_feed(spark, ranged_path, ranged_before) >= set(gone_ranged)

    gone = GONE[kind]
    named = [json.dumps(list(key_of(a))) for a in [*gone, NEVER, 1]]
    key_dump = _dump(config_path, store, config, stream, "--table", str(db.table()),
                     *(arg for key in named for arg in ("--pk", key)))  # fmt: skip
    lake_rows = _caught_up(spark, db, config, stream)
    expected = source_rows(db)
    assert_equal([(f"Delta {db.table()}", expected, lake_rows)])
    assert store.progress(key_dump).rows_emitted == 4  # key 1's row and three deletes

    assert config.kafka is not None
    topic = f"{config.kafka.topic_prefix}.{db.table().db}.{db.table().table}"
    sentinel = {"a": SENTINEL, "b": key_of(SENTINEL)[1]}
    messages = read_committed_until(  # until the third settle's sentinel is in
        config.kafka.bootstrap_servers,
        topic,
        lambda m: sum(k == sentinel and v is not None and v["op"] == "c" for k, v in m) == 3,
    )
    histories, replayed = kafka_histories(messages, COLUMNS, None)
    assert_equal([(f"Kafka {topic} replayed", expected, replayed)])
    for a in [*gone, NEVER]:
        last = histories[key_of(a)][-1]
        assert (last.op, last.deleted) == ("d", True), histories[key_of(a)]
    tombstones = [key for key, value in messages if value is None]
    assert {(k["a"], k["b"]) for k in tombstones} >= {key_of(a) for a in [*gone, NEVER]}
    _check_ranged_topic(config, ranged, gone_ranged)
    assert stream.stop() == 0
