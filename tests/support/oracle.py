"""The checks every end-to-end stream test makes: nothing goes back, nothing is stale, all equal.

Positions alone pass when a stale row is applied and overwritten later (a dumped row carries
its chunk's high-watermark position, newer than the change it missed). With the versioned load
of tests/support/workload.py (``ver`` only grows per key, in commit order) each state of a key has a
rank, ``2*ver`` for the row and ``2*ver + 1`` for its deletion, and no output may show a key's
rank going down:

- the Delta change data feed, per key in ``_commit_version`` order (insert and
  update_postimage rows). A tombstone (``_dblog_deleted``) keeps only the key, so it ranks as
  the deletion of the ``ver`` before it: a stale row bringing back a just-deleted key is caught;
- Kafka read_committed, per key in topic order: ``after.ver`` for c/u/r, ``before.ver`` for d;
- once the stream has caught up (a sentinel row is in Delta), Delta and the replayed Kafka topic
  equal the source table.

Without a version column (the older load) only positions are checked: they must grow per key,
and the same change must not be applied twice.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from airflow_dblog.config import Config
from airflow_dblog.core.events import TableId
from tests.support.services import read_committed_until
from tests.support.stream_process import Stream
from tests.support.workload import Db, insert_rows, key_of, source_rows

KEY = ("a", "b")
SENTINEL = 999_999  # the ``a`` of the catch-up marker row (see settle); no load writes it
Rows = dict[tuple[Any, ...], dict[str, Any]]


def rank(ver: int, deleted: bool) -> int:
    return 2 * ver + int(deleted)


@dataclass(frozen=True)
class Step:
    """One output of a key: where it was seen, what it says, from which source position."""

    at: str  # "delta v12" or "kafka #345"
    op: str
    position: str
    ver: int | None
    deleted: bool

    def __str__(self) -> str:
        gone = " (deleted)" if self.deleted else ""
        return f"{self.at}: {self.op} ver={self.ver}{gone} @ {self.position}"


def check_history(key: Any, steps: Sequence[Step], ranked: bool) -> None:
    """Positions strictly grow; with ``ranked``, the rank never decreases (see the module doc)."""
    last_position: str | None = None
    last_rank = last_ver = None
    for i, step in enumerate(steps):
        problem = None
        if last_position is not None and step.position <= last_position:
            problem = "applied twice" if step.position == last_position else "went back"
        ver = step.ver if step.ver is not None else last_ver  # a Delta tombstone has no ver
        if ranked and ver is not None:
            now = rank(ver, step.deleted)
            if last_rank is not None and now < last_rank:
                problem = f"is stale (rank {now} after {last_rank})"
            last_rank, last_ver = now, ver
        if problem:
            shown = "\n  ".join(str(s) for s in steps[max(0, i - 8) : i + 1])
            raise AssertionError(f"key {key} {problem} at step {i} of {len(steps)}:\n  {shown}")
        last_position = step.position


def difference(what: str, expected: Rows, actual: Rows) -> str | None:
    """One line naming the keys missing, extra and different (the first few of each)."""
    missing = sorted(expected.keys() - actual.keys())
    extra = sorted(actual.keys() - expected.keys())
    differ = sorted(k for k in expected.keys() & actual.keys() if expected[k] != actual[k])
    if not (missing or extra or differ):
        return None
    return (
        f"{what} is not the source table: {len(missing)} keys missing {missing[:10]}, "
        f"{len(extra)} extra {extra[:10]}, {len(differ)} differ "
        f"{[(k, expected[k], actual[k]) for k in differ[:5]]}"
    )


def assert_equal(tables: Sequence[tuple[str, Rows, Rows]]) -> None:
    """Every (what, expected, actual) at once, so a failure names all the tables that differ."""
    problems = [p for p in (difference(*t) for t in tables) if p]
    assert not problems, "\n".join(problems)


# ---------------------------------------------------------------------------------------------
# Delta


def delta_path(config: Config, table: TableId) -> str:
    assert config.delta is not None
    return f"{config.delta.path}/{table.db}/{table.table}"


def delta_version(path: str) -> int:
    """The table's latest commit version (-1: no table yet), read from ``_delta_log``."""
    log = Path(path) / "_delta_log"
    return max((int(p.stem) for p in log.glob("*.json") if p.stem.isdigit()), default=-1)


def delta_rows(spark: Any, path: str, columns: Sequence[str]) -> Rows:
    """The live rows (tombstones left out); a table never written is empty."""
    if delta_version(path) < 0:
        return {}
    rows = spark.read.format("delta").load(path).where("NOT _dblog_deleted").collect()
    return {tuple(r[c] for c in KEY): {c: r[c] for c in columns} for r in rows}


def delta_holds(spark: Any, path: str, key: Mapping[str, Any]) -> bool:
    """Whether Delta holds ``key`` (column: value) as a live row: a query of the files whose
    statistics can hold it, not a read of the whole table (the stream shares the cores)."""
    from pyspark.sql import functions as F

    if delta_version(path) < 0:
        return False
    row = ~F.col("_dblog_deleted")
    for column, value in key.items():
        row = row & (F.col(column) == F.lit(value))
    return bool(spark.read.format("delta").load(path).where(row).limit(1).count())


def until_delta_holds(
    spark: Any,
    path: str,
    key: Mapping[str, Any],
    stream: Stream,
    live: bool = True,
    timeout_s: float = 300,
) -> None:
    """Until Delta holds ``key`` (column: value) as a live row (``live``), or no longer does;
    Delta is asked again only when its version moved."""
    seen: int | None = None
    holds = not live
    deadline = time.monotonic() + timeout_s
    while holds != live:
        version = delta_version(path)
        if version != seen:
            seen, holds = version, delta_holds(spark, path, key)
            continue
        stream.check_alive()
        assert time.monotonic() < deadline, f"timed out waiting for {key} {live=} in {path}"
        time.sleep(0.5)


def sentinel_key() -> dict[str, Any]:
    return dict(zip(KEY, key_of(SENTINEL), strict=True))


def delta_histories(spark: Any, path: str, version: str | None) -> dict[Any, list[Step]]:
    """Per key, the change data feed's new images in commit order."""
    columns = [*KEY, *([version] if version else []), "_dblog_position", "_dblog_op"]
    feed = (
        spark.read.format("delta")
        .option("readChangeFeed", "true")
        .option("startingVersion", 0)
        .load(path)
        .where("_change_type IN ('insert', 'update_postimage')")
        .select(*columns, "_dblog_deleted", "_commit_version")
    )
    rows = feed.collect()
    histories: dict[Any, list[Step]] = {}
    for r in sorted(rows, key=lambda r: (r["_commit_version"], r["_dblog_position"])):
        histories.setdefault(tuple(r[c] for c in KEY), []).append(
            Step(
                f"delta v{r['_commit_version']}",
                r["_dblog_op"],
                r["_dblog_position"],
                None if version is None or r["_dblog_deleted"] else r[version],
                bool(r["_dblog_deleted"]),
            )
        )
    return histories


# ---------------------------------------------------------------------------------------------
# Kafka


def kafka_histories(
    messages: Sequence[tuple[Any, Any]], columns: Sequence[str], version: str | None
) -> tuple[dict[Any, list[Step]], Rows]:
    """Per key, the change events in topic order; and the table they replay to."""
    histories: dict[Any, list[Step]] = {}
    state: dict[Any, dict[str, Any] | None] = {}
    for i, (key_json, value) in enumerate(messages):
        key = tuple(key_json[c] for c in KEY)
        if value is None:
            assert state.get(key) is None, f"kafka #{i}: tombstone for {key} without its delete"
            continue
        deleted = value["op"] == "d"
        image = value["before"] if deleted else value["after"]
        ver = image.get(version) if version and image else None
        histories.setdefault(key, []).append(
            Step(f"kafka #{i}", value["op"], value["source"]["position"], ver, deleted)
        )
        state[key] = None if deleted else {c: value["after"][c] for c in columns}
    return histories, {k: row for k, row in state.items() if row is not None}


# ---------------------------------------------------------------------------------------------
# all of it


def settle(
    spark: Any,
    dbs: Sequence[Db],
    config: Config,
    columns: Sequence[str],
    stream: Stream,
) -> dict[TableId, Rows]:
    """Delta's rows of every table once the stream has caught up with the log.

    Caught up: a sentinel row inserted now into each table has reached its Delta table; every
    change logged before it is then applied too (batches follow log order), so what Delta
    lacks now it lacks for good. Each table is read whole once, when its sentinel is there.
    """
    for db in dbs:
        insert_rows(db, [SENTINEL], 0, "sentinel")
    paths = {db.table(): delta_path(config, db.table()) for db in dbs}
    for path in paths.values():
        until_delta_holds(spark, path, sentinel_key(), stream)
    return {table: delta_rows(spark, path, columns) for table, path in paths.items()}


def check_outputs(
    spark: Any,
    config: Config,
    dbs: Sequence[Db],
    stream: Stream,
    columns: Sequence[str],
    version: str | None = None,
) -> None:
    """Every table of ``dbs``: Delta (when the stream has a Delta sink) equals the source once
    caught up, its change feed and (when the stream has a Kafka sink) its read_committed topic
    never take a key back."""
    if config.delta is None:
        for db in dbs:
            insert_rows(db, [SENTINEL], 0, "sentinel")  # Kafka is read until it holds this
        expected = {db.table(): source_rows(db, columns) for db in dbs}
    else:
        actual = settle(spark, dbs, config, columns, stream)
        expected = {db.table(): source_rows(db, columns) for db in dbs}
        paths = {db.table(): delta_path(config, db.table()) for db in dbs}
        assert_equal([(f"Delta {t}", expected[t], actual[t]) for t in expected])
        for table in expected:
            for key, steps in delta_histories(spark, paths[table], version).items():
                check_history(key, steps, ranked=version is not None)
    if config.kafka is None:
        return
    for table in expected:
        topic = f"{config.kafka.topic_prefix}.{table.db}.{table.table}"
        messages = read_committed_until(
            config.kafka.bootstrap_servers,
            topic,
            lambda m: key_of(SENTINEL) in kafka_histories(m, columns, version)[1],
        )
        histories, replayed = kafka_histories(messages, columns, version)
        for key, steps in histories.items():
            check_history(key, steps, ranked=version is not None)
        assert_equal([(f"Kafka {topic} replayed", expected[table], replayed)])
