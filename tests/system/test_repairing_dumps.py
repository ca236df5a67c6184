"""Dumps that repair, on the real stream (`dblog stream`, Spark, Delta, Kafka, MariaDB or PG).

The lake drifts where the log cannot see it: on MariaDB, writes with ``sql_log_bin = 0``; on
PostgreSQL (whose WAL carries every write), rows changed or added in the Delta table by hand.
A second full dump then writes to Delta exactly the rows that differ (an equal row gets no
update and no change-feed row) and Kafka every row, as Debezium's snapshots do; a dump of keys
the source lacks deletes them in Delta (tombstones) and in Kafka (a delete and a tombstone).
Afterwards Delta equals the source and a read_committed consumer of the topic rebuilds it.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from airflow_dblog.cli import main as dblog
from airflow_dblog.config import Config, load_config
from airflow_dblog.engine.metadata import MetadataStore
from tests.support.oracle import (
    SENTINEL,
    Rows,
    assert_equal,
    delta_path,
    delta_rows,
    delta_version,
    kafka_histories,
    settle,
)
from tests.support.services import read_committed_until
from tests.support.stream_process import Stream, until, write_config
from tests.support.workload import Db, db_for, execute, key_of, load, source_rows

pytestmark = [pytest.mark.integration, pytest.mark.slow]

ROWS = 600
COLUMNS = ("a", "b", "v", "note")
DRIFTED = [7, 70, 140, 300, 450, 599]  # 1% of the rows
# rows the source lost without the log (MariaDB), or rows Delta gained by hand (PostgreSQL)
GONE = {"mysql": [11, 222], "postgres": [ROWS + 100, ROWS + 200]}
NEVER = 9_999  # a key no one ever wrote


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
    gone = lambda: key_of(SENTINEL) not in delta_rows(spark, path, COLUMNS)  # noqa: E731
    until("the last sentinel's delete in Delta", gone, 300, stream)
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


def _dump_writes(spark: Any, path: str, after_version: int) -> set[tuple[Any, ...]]:
    """The keys whose dumped rows Delta's change feed shows after ``after_version``."""
    feed = (
        spark.read.format("delta")
        .option("readChangeFeed", "true")
        .option("startingVersion", after_version + 1)
        .load(path)
        .where("_change_type IN ('insert', 'update_postimage') AND _dblog_op = 'r'")
        .collect()
    )
    return {(r["a"], r["b"]) for r in feed}


@pytest.mark.parametrize("kind", ["mysql", "postgres"])
def test_a_redump_writes_only_what_differs_and_a_key_dump_deletes_what_the_source_lacks(
    request: pytest.FixtureRequest,
    tmp_path: Path,
    spark: Any,
    kafka_server: Any,
    stream_factory: Callable[[Path], Stream],
    kind: str,
) -> None:
    db = db_for(request, kind)
    load(db, rows=ROWS)
    config_path = write_config(db, tmp_path, chunk_size=200, kafka=kafka_server.bootstrap_servers)
    config = load_config(config_path)
    store = MetadataStore(config.metadata_url)
    stream = stream_factory(config_path)
    stream.start()
    stream.wait_capturing()
    path = delta_path(config, db.table())

    _dump(config_path, store, config, stream, "--all")
    _caught_up(spark, db, config, stream)
    _drift(spark, db, path)
    before = delta_version(path)
    _dump(config_path, store, config, stream, "--all")
    _caught_up(spark, db, config, stream)
    assert _dump_writes(spark, path, before) == {key_of(a) for a in DRIFTED}

    gone = GONE[kind]
    named = [json.dumps(list(key_of(a))) for a in [*gone, NEVER, 1]]
    dump_id = _dump(config_path, store, config, stream, "--table", str(db.table()),
                    *(arg for key in named for arg in ("--pk", key)))  # fmt: skip
    lake = _caught_up(spark, db, config, stream)
    expected = source_rows(db)
    assert_equal([(f"Delta {db.table()}", expected, lake)])
    assert store.progress(dump_id).rows_emitted == 4  # key 1's row and three deletes

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
    assert stream.stop() == 0
