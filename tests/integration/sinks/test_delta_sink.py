"""The Delta sink on a real Spark with Delta Lake: MERGE, guard, tombstones, idempotent batches."""

from __future__ import annotations

import dataclasses
import datetime as dt
import decimal
import io
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from airflow_dblog.config import DeltaSinkConfig
from airflow_dblog.core.events import ChangeEvent, TableId
from airflow_dblog.core.position import Position
from airflow_dblog.engine import dump_keys, segment
from airflow_dblog.engine.chunk_file import ChunkFiles, ChunkRef, encode_rows
from airflow_dblog.engine.event_text import EventText
from airflow_dblog.engine.spool import DumpSpan
from airflow_dblog.engine.typed_values import stored_columns
from airflow_dblog.errors import DblogError, FencedError
from airflow_dblog.sinks.delta_sink import (
    DeltaSink,
    FrameBatch,
    optimize,
    ordered_key,
    spark_type,
)
from airflow_dblog.sources.base import Column, TableSchema

pytestmark = pytest.mark.integration

NOW_MS = int(time.time() * 1000)
TABLE = TableId("shop", "items")
SCHEMA = TableSchema(
    TABLE,
    (
        Column("a", "int(11)", False),
        Column("b", "varchar(10)", False),
        Column("qty", "int(11)", True),
        Column("price", "decimal(10,2)", True),
        Column("at", "datetime(6)", True),
        Column("blob", "blob", True),
    ),
    ("a", "b"),
)


def _event(op: str, a: int, qty: int | None, offset: int, **extra: Any) -> ChangeEvent:
    row = {
        "a": a,
        "b": "x",
        "qty": qty,
        "price": decimal.Decimal("1.25"),
        "at": dt.datetime(2024, 1, 2, 3, 4, 5, 600000),
        "blob": b"\x00\xff",
    }
    return ChangeEvent(
        TABLE,
        op,  # type: ignore[arg-type]
        (a, "x"),
        Position.mysql(1, offset),
        before=row if op == "d" else None,
        after=None if op == "d" else row,
        ts_ms=NOW_MS + offset,  # recent: tombstones stay within their retention
        extra=extra,
    )


# the spool's event columns as Spark reads them from a segment (segment.SPARK_DDL)
EVENT_DDL = ", ".join(
    column.strip()
    for column in segment.SPARK_DDL.split(",")
    if column.split()[0] in segment.EVENT_COLUMNS
)


def _frame(spark: Any, events: list[ChangeEvent]) -> Any:
    """The events as Delta's batch has them: the event rows of a spool segment, typed as the
    segment stores them (``segment.EVENT_COLUMNS``)."""
    import pyarrow.parquet as pq

    data = segment.encode([EventText.of(e) for e in events], {})
    rows = [r for r in pq.read_table(io.BytesIO(data)).to_pylist() if r["kind"] == "event"]
    return spark.createDataFrame(
        [tuple(r[c] for c in segment.EVENT_COLUMNS) for r in rows], EVENT_DDL
    )


@pytest.fixture
def sink(spark: Any, tmp_path: Path) -> DeltaSink:
    return DeltaSink(spark, DeltaSinkConfig(str(tmp_path / "delta")), {TABLE: SCHEMA}, "dblog-test")


def _write(
    sink: DeltaSink,
    batch_id: int,
    events: list[ChangeEvent],
    dump_bounds: dict[str, tuple[Any, Any]] | None = None,
    logged: set[str] | None = None,
    row_bounds: dict[str, tuple[Any, Any]] | None = None,
) -> None:
    """``dump_bounds`` without ``logged``: the batch holds dumped rows alone."""
    frame = _frame(sink.spark, events)
    tables = {str(e.table) for e in events}
    batch = FrameBatch(frame, tables, dump_bounds or {}, logged or (), row_bounds or {})
    sink.write(batch_id, batch)


def _feed(sink: DeltaSink) -> list[Any]:
    """Every insert and update post-image of the change data feed, in commit order."""
    return (
        sink.spark.read.format("delta")
        .option("readChangeFeed", "true")
        .option("startingVersion", 0)
        .load(sink.table_path(TABLE))
        .where("_change_type IN ('insert', 'update_postimage')")
        .orderBy("_commit_version")
        .collect()
    )


def _state(sink: DeltaSink) -> dict[int, dict[str, Any]]:
    df = sink.spark.read.format("delta").load(sink.table_path(TABLE))
    return {r["a"]: r.asDict() for r in df.collect()}


def _version(sink: DeltaSink) -> int:
    from delta.tables import DeltaTable

    history = DeltaTable.forPath(sink.spark, sink.table_path(TABLE)).history(1)
    return int(history.collect()[0]["version"])


def test_merge_keeps_latest_per_key_and_types_values(sink: DeltaSink) -> None:
    _write(sink, 1, [_event("c", 1, 5, 10), _event("u", 1, 6, 11), _event("c", 2, 7, 12)])
    state = _state(sink)
    assert state[1]["qty"] == 6 and state[2]["qty"] == 7
    row = state[1]
    assert row["price"] == decimal.Decimal("1.25")
    assert row["at"] == dt.datetime(2024, 1, 2, 3, 4, 5, 600000)
    assert bytes(row["blob"]) == b"\x00\xff"
    assert row["_dblog_op"] == "u" and row["_dblog_deleted"] is False
    assert row["_dblog_position"] == str(Position.mysql(1, 11))


def test_each_row_image_is_parsed_once_however_many_columns_the_table_has(
    sink: DeltaSink,
) -> None:
    events = _frame(sink.spark, [_event("c", 1, 5, 10), _event("d", 2, None, 11)])
    rows = DeltaSink._typed_rows(SCHEMA, events, "key")
    plan = rows._jdf.queryExecution().executedPlan().toString()
    assert plan.count("from_json(") == 1
    assert {r["a"]: r["qty"] for r in rows.collect()} == {1: 5, 2: None}


def test_an_integer_key_read_as_text_equals_the_key_json_parsed(spark: Any) -> None:
    from pyspark.sql import types as T

    from airflow_dblog.sinks.delta_sink import _typed_key

    texts = ["[5,-7]", '["18446744073709551615",0]', "[-9223372036854775808,12]"]
    keys = spark.createDataFrame([(t,) for t in texts], "key STRING")

    def read(*types: Any) -> list[tuple[int, ...]]:  # text keys: JSON parsed
        rows = keys.select(*_typed_key(types, ["k0", "k1"])).collect()
        return [tuple(int(v) for v in r) for r in rows]

    assert (
        read(T.DecimalType(20, 0), T.LongType())
        == read(T.StringType(), T.StringType())
        == [(5, -7), (18446744073709551615, 0), (-9223372036854775808, 12)]
    )


def test_replayed_batch_changes_nothing(sink: DeltaSink) -> None:
    _write(sink, 1, [_event("c", 1, 5, 10)])
    _write(sink, 2, [_event("u", 1, 6, 11)])
    version, state = _version(sink), _state(sink)
    _write(sink, 2, [_event("u", 1, 6, 11)])  # the same batch again after a crash
    _write(sink, 2, [_event("u", 1, 99, 50)])  # same batch id: skipped whatever it holds
    assert _version(sink) == version
    assert _state(sink) == state


def test_the_first_batch_into_a_new_table_is_an_append_with_the_merges_result(
    sink: DeltaSink,
) -> None:
    """Nothing to match in a table without files: the batch is appended (Delta's WRITE), the
    newest event of each key and the tombstones, as a MERGE would leave them; a replay of it
    commits nothing, and a restarted stream's next batch MERGEs with the position guard."""
    from delta.tables import DeltaTable

    def operations() -> list[str]:
        history = DeltaTable.forPath(sink.spark, sink.table_path(TABLE)).history()
        return [r["operation"] for r in history.orderBy("version").collect()]

    first = [_event("c", 1, 5, 10), _event("u", 1, 6, 11), _event("c", 2, 7, 12)]
    first.append(_event("d", 3, 1, 13))
    _write(sink, 1, first)
    assert operations()[-1] == "WRITE"
    state = _state(sink)
    assert (state[1]["qty"], state[2]["qty"], state[3]["qty"]) == (6, 7, None)
    assert state[1]["_dblog_position"] == str(Position.mysql(1, 11))
    assert state[3]["_dblog_deleted"] is True and state[3]["_dblog_op"] == "d"
    version = _version(sink)
    restarted = DeltaSink(sink.spark, sink.config, {TABLE: SCHEMA}, "dblog-test")
    _write(restarted, 1, first)
    assert _version(sink) == version
    _write(restarted, 2, [_event("u", 1, 4, 9), _event("c", 3, 8, 14)])
    assert operations()[-1] == "MERGE"
    state = _state(sink)
    assert (state[1]["qty"], state[3]["qty"], state[3]["_dblog_deleted"]) == (6, 8, False)


def test_the_stream_start_creates_each_captured_table_empty_once(sink: DeltaSink) -> None:
    sink.create_tables()
    assert _state(sink) == {} and _version(sink) == 0
    sink.create_tables()
    assert _version(sink) == 0
    _write(sink, 1, [_event("c", 1, 5, 10)])
    assert _state(sink)[1]["qty"] == 5


def test_a_table_whose_creation_was_killed_before_its_first_commit_is_created(
    sink: DeltaSink,
) -> None:
    """A kill -9 during the table's creation leaves ``_delta_log/_staged_commits`` and no
    commit; Delta then neither reads nor creates the table. The next start creates it.
    (Found by tests/system/test_staleness.py, a random kill landing in the first batch.)"""
    staged = Path(sink.table_path(TABLE)) / "_delta_log" / "_staged_commits"
    staged.mkdir(parents=True)
    _write(sink, 1, [_event("c", 1, 5, 10)])
    assert _state(sink)[1]["qty"] == 5


def test_a_deposed_leader_commits_nothing_once_the_new_leader_fenced_the_table(
    spark: Any, tmp_path: Path
) -> None:
    """Lease tokens take part in Delta's commit: after the leader of token 8 fenced the table,
    a batch of the leader of token 7 (frozen past its lease, now awake) is skipped, even one
    with newer positions and a later segment, while the new leader's batches apply."""
    config = DeltaSinkConfig(str(tmp_path / "delta"))
    old = DeltaSink(spark, config, {TABLE: SCHEMA}, "dblog-test", lease_token=7)
    new = DeltaSink(spark, config, {TABLE: SCHEMA}, "dblog-test", lease_token=8)
    _write(old, 5, [_event("c", 1, 5, 10)])
    new.fence()
    version = _version(new)
    _write(old, 6, [_event("u", 1, 6, 11), _event("c", 2, 1, 12)])
    _write(old, 1 << 20, [_event("c", 3, 1, 13)])
    assert _version(new) == version and set(_state(new)) == {1}
    _write(new, 0, [_event("u", 1, 7, 11)])  # the new leader replays from the spool
    assert _state(new)[1]["qty"] == 7


@pytest.mark.parametrize("dumped", [False, True], ids=["merge", "dump-append"])
def test_a_deposed_leaders_merge_under_way_fails_when_the_new_leader_fences(
    spark: Any, tmp_path: Path, dumped: bool
) -> None:
    """The fence lands while the old leader's MERGE runs (its source is slowed down by a UDF):
    Delta's conflict check fails that commit, reported as fenced, and nothing of it lands.
    Also a batch of dumped rows only, into a key range with no rows yet: an append, not a
    MERGE, and the same conflict."""
    from pyspark.sql import functions as F

    config = DeltaSinkConfig(str(tmp_path / "delta"))
    old = DeltaSink(spark, config, {TABLE: SCHEMA}, "dblog-test", lease_token=7)
    _write(old, 1, [_event("c", 1, 5, 10)])
    version = _version(old)

    @F.udf("bigint", useArrow=False)
    def slow(ts: int) -> int:
        time.sleep(0.5)
        return ts

    events = [_event("c", a, 1, 10 + a) for a in range(2, 12)]
    frame = _frame(spark, events).repartition(1).withColumn("ts_ms", slow("ts_ms"))
    failed: list[BaseException] = []

    def merge() -> None:
        try:
            bounds = {str(TABLE): (2, 11)} if dumped else None
            old.write(2, FrameBatch(frame, {str(TABLE)}, bounds or {}))
        except BaseException as err:  # handed to the test thread
            failed.append(err)

    thread = threading.Thread(target=merge)
    thread.start()
    time.sleep(2.5)  # the MERGE has started its transaction and waits for its source
    new = DeltaSink(spark.newSession(), config, {TABLE: SCHEMA}, "dblog-test", lease_token=8)
    new.fence()
    thread.join(120)
    assert len(failed) == 1 and isinstance(failed[0], FencedError), failed
    assert _version(new) == version + 2  # the fence (one commit per app id), not the old MERGE
    assert set(_state(new)) == {1}


def test_older_event_never_overwrites_and_tombstone_blocks_resurrection(sink: DeltaSink) -> None:
    _write(sink, 1, [_event("u", 1, 6, 20), _event("d", 2, 7, 21)])
    _write(sink, 2, [_event("u", 1, 5, 15), _event("r", 2, 7, 16)])  # older: both ignored
    state = _state(sink)
    assert state[1]["qty"] == 6
    assert state[2]["_dblog_deleted"] is True and state[2]["qty"] is None
    assert state[2]["b"] == "x"  # the key stays on the tombstone
    _write(sink, 3, [_event("c", 2, 8, 30)])  # a real re-insert of the key is newer
    assert _state(sink)[2]["qty"] == 8 and _state(sink)[2]["_dblog_deleted"] is False


def test_unavailable_columns_keep_the_stored_value(sink: DeltaSink) -> None:
    _write(sink, 1, [_event("c", 1, 5, 10)])
    _write(sink, 2, [_event("u", 1, 6, 11, unavailable_columns=["price", "qty"])])
    row = _state(sink)[1]
    assert row["qty"] == 5 and row["price"] == decimal.Decimal("1.25")
    assert row["_dblog_position"] == str(Position.mysql(1, 11))


def test_tombstones_past_their_retention_are_purged(
    spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from airflow_dblog.sinks import delta_sink

    config = DeltaSinkConfig(str(tmp_path / "delta"), tombstone_retention_hours=1)
    sink = DeltaSink(spark, config, {TABLE: SCHEMA}, "dblog-test")
    _write(sink, 0, [_event("c", 9, 1, 9)])
    assert sink._purge_due == {}  # not in the first minutes after a start
    monkeypatch.setattr(delta_sink, "_PURGE_FIRST_S", 0.0)
    sink = DeltaSink(spark, config, {TABLE: SCHEMA}, "dblog-test")
    two_hours_ms = 2 * 3600 * 1000
    old = _event("d", 1, 5, 10)
    expired = dataclasses.replace(old, ts_ms=NOW_MS - two_hours_ms)
    _write(sink, 1, [expired, _event("d", 2, 5, 11), _event("c", 3, 1, 12)])
    assert set(_state(sink)) == {2, 3, 9}  # the fresh tombstone and the live rows stay


def test_change_data_feed_and_deletion_vectors_are_on(sink: DeltaSink) -> None:
    _write(sink, 1, [_event("c", 1, 5, 10)])
    _write(sink, 2, [_event("u", 1, 6, 11)])
    assert [r["qty"] for r in _feed(sink)] == [5, 6]
    detail = sink.spark.sql(f"DESCRIBE DETAIL delta.`{sink.table_path(TABLE)}`").first()
    assert detail["properties"]["delta.enableDeletionVectors"] == "true"


@pytest.mark.parametrize(
    ("declared", "expected"),
    [
        ("int(11) unsigned", "LongType()"),
        ("bigint(20) unsigned", "DecimalType(20,0)"),
        ("integer", "LongType()"),
        ("numeric(12,3)", "DecimalType(12,3)"),
        ("numeric", "StringType()"),
        ("double precision", "DoubleType()"),
        ("boolean", "BooleanType()"),
        ("timestamp with time zone", "TimestampType()"),
        ("datetime(6)", "TimestampType()"),
        ("date", "DateType()"),
        ("bytea", "BinaryType()"),
        ("mediumblob", "BinaryType()"),
        ("jsonb", "StringType()"),
        ("character varying(20)", "StringType()"),
        ("uuid", "StringType()"),
    ],
)
def test_spark_type_of_source_columns(declared: str, expected: str) -> None:
    assert repr(spark_type(Column("c", declared, True))) == expected


def test_source_columns_added_or_dropped_while_streaming_and_a_new_key_is_refused(
    spark: Any, tmp_path: Path
) -> None:
    extra = Column("extra", "int(11)", True)
    current = {"schema": dataclasses.replace(SCHEMA, columns=(*SCHEMA.columns, extra))}
    sink = DeltaSink(
        spark,
        DeltaSinkConfig(str(tmp_path / "delta")),
        {TABLE: SCHEMA},
        "dblog-test",
        describe=lambda table: current["schema"],
    )
    _write(sink, 1, [_event("c", 1, 5, 10), _event("c", 2, 5, 11)])
    later = _event("u", 1, 6, 12)
    _write(sink, 2, [dataclasses.replace(later, after={**(later.after or {}), "extra": 9})])
    state = _state(sink)
    assert (state[1]["qty"], state[1]["extra"], state[2]["extra"]) == (6, 9, None)

    # ALTER TABLE DROP COLUMN qty: later images lack it; Delta keeps the column, left null
    current["schema"] = dataclasses.replace(
        current["schema"], columns=tuple(c for c in current["schema"].columns if c.name != "qty")
    )
    dropped = _event("u", 2, 8, 13)
    image = {k: v for k, v in (dropped.after or {}).items() if k != "qty"}
    _write(sink, 3, [dataclasses.replace(dropped, after={**image, "extra": 4})])
    state = _state(sink)
    assert (state[1]["qty"], state[2]["qty"], state[2]["extra"]) == (6, None, 4)

    current["schema"] = dataclasses.replace(current["schema"], key=("a",))
    last = _event("u", 2, 7, 14)  # same columns: the key change alone is refused
    with pytest.raises(
        DblogError, match=r"primary key of shop.items changed from \(a, b\) to \(a\)"
    ):
        _write(sink, 4, [last])
    assert _state(sink) == state


def test_a_batch_of_dumped_rows_bounded_by_its_key_range_keeps_the_guard(
    sink: DeltaSink,
) -> None:
    _write(sink, 1, [_event("c", 1, 1, 20), _event("c", 2, 1, 21), _event("c", 9, 1, 22)])
    dumped = [
        _event("r", 1, 2, 30),  # newer than the stored row: replaces it
        _event("r", 2, 2, 15),  # older: ignored, though inside the range
        _event("r", 4, 2, 31),  # a key Delta does not hold: inserted
    ]
    _write(sink, 2, dumped, dump_bounds={str(TABLE): (1, 4)})
    state = _state(sink)
    assert {a: state[a]["qty"] for a in state} == {1: 2, 2: 1, 4: 2, 9: 1}
    version = _version(sink)
    _write(sink, 2, dumped, dump_bounds={str(TABLE): (1, 4)})  # replayed: skipped
    assert _version(sink) == version

    # a range Delta holds nothing of (a first dump): appended, with the same idempotence
    fresh = [_event("r", 20, 5, 40), _event("r", 21, 5, 41)]
    _write(sink, 3, fresh, dump_bounds={str(TABLE): (20, 21)})
    _write(sink, 3, fresh, dump_bounds={str(TABLE): (20, 21)})
    state = _state(sink)
    assert (state[20]["qty"], state[21]["_dblog_position"]) == (5, str(Position.mysql(1, 41)))
    assert _version(sink) == version + 1 and len(state) == 6


def test_a_dumped_row_equal_to_the_live_row_is_not_written_again(sink: DeltaSink) -> None:
    """A re-dump writes to Delta only the rows that differ from what it holds: an equal row
    (decimals, times, bytes and NULLs included) gets no update and no change-feed row, and keeps
    its position; a different row, a tombstoned key and a missing key are written."""
    _write(
        sink,
        1,
        [
            _event("c", 1, 1, 11),
            _event("c", 2, 1, 12),
            _event("c", 3, None, 13),
            _event("c", 4, 1, 14),
            _event("d", 4, 1, 15),
        ],
    )
    dumped = [
        _event("r", 1, 1, 30),  # equal: skipped
        _event("r", 2, 5, 31),  # qty differs: updated
        _event("r", 3, None, 32),  # equal, NULL included: skipped
        _event("r", 4, 1, 33),  # Delta holds a tombstone: written
        _event("r", 5, 1, 34),  # Delta lacks it: inserted
    ]
    _write(sink, 2, dumped, dump_bounds={str(TABLE): (1, 5)})
    version = _version(sink)
    written = {r["a"] for r in _feed(sink) if r["_commit_version"] == version}
    assert written == {2, 4, 5}
    state = _state(sink)
    assert {a: state[a]["_dblog_position"] for a in (1, 3)} == {
        1: str(Position.mysql(1, 11)),
        3: str(Position.mysql(1, 13)),
    }
    assert (state[2]["qty"], state[4]["_dblog_deleted"], state[5]["qty"]) == (5, False, 1)


STOCK = TableId("shop", "stock")
STOCK_SCHEMA = TableSchema(
    STOCK,
    (Column("id", "bigint", False), Column("day", "date", False), Column("v", "text", True)),
    ("id", "day"),
)
DAY = dt.date(2024, 1, 1)
NEXT = dt.date(2024, 1, 2)


def _stock(op: str, id_: int, day: dt.date, offset: int) -> ChangeEvent:
    row = {"id": id_, "day": day, "v": f"v{offset}"}
    return ChangeEvent(
        STOCK,
        op,  # type: ignore[arg-type]
        (id_, day),
        Position.mysql(1, offset),
        before=row if op == "d" else None,
        after=None if op == "d" else row,
        ts_ms=NOW_MS + offset,
    )


def _chunk_file(files: ChunkFiles, chunk_id: int, keys: list[tuple[int, dt.date]]) -> str:
    folder = ChunkFiles.new_folder(chunk_id)
    rows = [((i, d), {"id": i, "day": d, "v": "dumped"}) for i, d in keys]
    files.write(folder, encode_rows(chunk_id, rows)[0])
    return folder


def test_the_keys_delta_holds_that_range_chunks_lacked_are_exactly_the_stale_live_ones_in_range(
    spark: Any, tmp_path: Path
) -> None:
    """Live, inside the covered range (composite keys compared as rows; the first chunk open
    below, the last above its bound for keys last changed before the bound was read), last
    changed before the window began, and not among the chunk's rows: nothing else."""
    sink = DeltaSink(spark, DeltaSinkConfig(str(tmp_path / "delta")), {STOCK: STOCK_SCHEMA}, "t")
    events = [
        _stock("c", 1, DAY, 10),  # A: extra
        _stock("c", 2, DAY, 10),  # A: in its file
        _stock("c", 3, DAY, 10),  # A: in its file (as a row its window dropped)
        _stock("c", 0, DAY, 10),
        _stock("d", 0, DAY, 11),  # A: a tombstone
        _stock("c", -5, DAY, 150),  # A: changed after its window began
        _stock("c", 3, NEXT, 10),  # B (above (3, DAY)): extra
        _stock("c", 5, DAY, 250),  # B: changed after its window began
        _stock("c", 6, DAY, 20),  # B: its upper end: extra
        _stock("c", 7, DAY, 20),  # C's lower end, excluded; B is not the last: in no range
        _stock("c", 8, DAY, 20),  # C: in its file
        _stock("c", 9, DAY, 20),  # C: extra
        _stock("c", 12, DAY, 20),  # above C's bound, before the bound was read: extra
        _stock("c", 13, DAY, 60),  # above the bound, after it was read: the log's
    ]
    _write(sink, 1, events)
    files = ChunkFiles(str(tmp_path / "chunks"))
    at = lambda offset: str(Position.mysql(1, offset))  # noqa: E731
    base = dict(table=str(STOCK), dump_id=4, position=at(400), first=0, drops=(), ts_ms=1)
    day = DAY.isoformat()
    a = ChunkRef(
        chunk_id=21, folder=_chunk_file(files, 21, [(2, DAY), (3, DAY)]), selected=2,
        low=at(100), covers=[None, [3, day]], **base,  # type: ignore[arg-type]
    )  # fmt: skip
    b = ChunkRef(
        chunk_id=22, folder="", selected=0, low=at(200), covers=[[3, day], [6, day]],
        **base,  # type: ignore[arg-type]
    )  # fmt: skip
    c = ChunkRef(
        chunk_id=23, folder=_chunk_file(files, 23, [(8, DAY)]), selected=1, low=at(300),
        covers=[[7, day], [9, day]], beyond=at(50), **base,  # type: ignore[arg-type]
    )  # fmt: skip
    key_list = ChunkRef(chunk_id=24, folder="", selected=0, **base)  # type: ignore[arg-type]
    old = dataclasses.replace(a, chunk_id=25, low="")  # a record from before ranges were kept
    expected = {
        str(STOCK): {
            21: [[1, "2024-01-01"]],
            22: [[3, "2024-01-02"], [6, "2024-01-01"]],
            23: [[9, "2024-01-01"], [12, "2024-01-01"]],
        }
    }
    sort = lambda found: {t: {c: sorted(k) for c, k in by.items()} for t, by in found.items()}  # noqa: E731
    assert sort(sink.extra_keys([a, b, c, key_list, old], files)) == expected
    assert sink.extra_keys([key_list, old], files) == {}
    # another dump's chunk over A's range that selected nothing: A's rows are not its rows
    other = dataclasses.replace(a, chunk_id=26, dump_id=5, folder="", selected=0)
    assert sort(sink.extra_keys([a, other], files)) == {
        str(STOCK): {21: [[1, day]], 26: [[1, day], [2, day], [3, day]]}
    }
    # the same from the keys kept until the table's last chunk is in (the chunk files gone)
    keys = ChunkFiles(str(tmp_path / "keys"))
    for ref in (a, b, c):
        dump_keys.record(files, keys, ref)
    for ref in (a, c):
        files.delete(ref.folder)
    assert sort(sink.extra_keys(dump_keys.refs(keys, keys.folders()), keys)) == expected


IDS = TableId("shop", "ids")
IDS_SCHEMA = TableSchema(IDS, (Column("id", "bigint", False), Column("v", "text", True)), ("id",))


def test_one_dumps_chunks_into_a_span_delta_held_none_of_are_not_sought_extra_keys(
    spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Appended alone where Delta held no row of the span they cover (a one-column key's lower
    bound excluded: the chunk before holds it), a dump's chunks are all Delta holds there, so
    no key is looked for; once Delta held a key in the span, the chunk is checked and the key
    the source lost is found."""
    from delta.tables import DeltaTable

    sink = DeltaSink(spark, DeltaSinkConfig(str(tmp_path / "delta")), {IDS: IDS_SCHEMA}, "t")
    files = ChunkFiles(str(tmp_path / "chunks"))
    looked: list[int] = []
    extras = sink._extras

    def spied(name: str, schema: Any, types: Any, checks: Any, chunk_files: Any) -> Any:
        looked.extend(r.chunk_id for r in checks)
        return extras(name, schema, types, checks, chunk_files)

    monkeypatch.setattr(sink, "_extras", spied)

    def event(op: str, key: int, offset: int) -> ChangeEvent:
        row = {"id": key, "v": f"v{offset}"}
        return ChangeEvent(IDS, op, (key,), Position.mysql(1, offset), after=row)  # type: ignore[arg-type]

    def dump(batch: int, chunk_id: int, keys: list[int], covers: list[Any], low: int) -> Any:
        """The chunk's rows in their own batch, as the stream's committer hands them over."""
        folder = files.new_folder(chunk_id)
        files.write(folder, encode_rows(chunk_id, [((k,), {"id": k, "v": "d"}) for k in keys])[0])
        at = str(Position.mysql(1, low))
        ref = ChunkRef(
            str(IDS), chunk_id, 1, folder, at, 0, len(keys), (), 1, low=at, covers=covers
        )
        name = str(IDS)
        lower, upper = covers
        sole = {name: DumpSpan(frozenset({chunk_id}), lower and lower[0], upper[0])}
        frame = _frame(spark, [event("r", k, low + 1) for k in keys])
        sink.write(batch, FrameBatch(frame, {name}, {name: (keys[0], keys[-1])}, (), {}, sole))
        return sink.extra_keys([ref], files)

    def operation() -> str:
        history = DeltaTable.forPath(spark, sink.table_path(IDS)).history(1)
        return str(history.collect()[0]["operation"])

    assert dump(1, 11, [1, 2, 3], [None, [3]], 10) == {}
    assert dump(2, 12, [4, 6], [[3], [6]], 20) == {}
    assert (operation(), looked) == ("WRITE", [])
    logged = FrameBatch(_frame(spark, [event("c", 8, 30)]), {str(IDS)}, logged={str(IDS)})
    sink.write(3, logged)  # key 8 arrives by the log, then the source loses it unlogged
    assert dump(4, 13, [7, 9], [[6], [10]], 40) == {str(IDS): {13: [[8]]}}
    assert (operation(), looked) == ("MERGE", [13])


def test_a_key_spark_and_the_source_may_order_differently_is_not_checked(spark: Any) -> None:
    assert ordered_key(STOCK_SCHEMA)
    assert not ordered_key(SCHEMA)  # (int, varchar): the source's collation decides
    decimal_key = TableSchema(TABLE, (Column("n", "numeric(12,2)", False),), ("n",))
    assert ordered_key(decimal_key)
    timestamp_key = TableSchema(TABLE, (Column("t", "timestamp", False),), ("t",))
    assert not ordered_key(timestamp_key)


def test_a_batch_of_dumped_rows_and_log_rows_commits_them_apart(sink: DeltaSink) -> None:
    """Dumped rows go in bounded by their range (an append where Delta holds none of it),
    then the log rows through their own MERGE; each part is idempotent on its own, so a crash
    between them replays only the log part, and no key's version goes back in the feed."""
    from delta.tables import DeltaTable

    name = str(TABLE)
    _write(sink, 1, [_event("c", 50, 1, 10)], logged={name}, row_bounds={name: (50, 50)})
    dumped = [dataclasses.replace(_event("r", a, 2, 40), chunk_id=1, dump_id=1) for a in (1, 2, 3)]
    logged = [
        _event("u", 2, 3, 41),  # after the window: newer than the dumped row of key 2
        _event("c", 3, 9, 5),  # older than the dumped row of key 3: kept out by the guard
        _event("u", 50, 4, 42),  # a key outside the dumped range
    ]
    # a crash after the dumped part: the batch had committed only that
    _write(sink, 2, dumped, {name: (1, 3)})
    restarted = DeltaSink(sink.spark, sink.config, sink.schemas, sink.app_id)
    _write(restarted, 2, dumped + logged, {name: (1, 3)}, {name})  # replayed: the log part only
    _write(restarted, 2, dumped + logged, {name: (1, 3)}, {name})  # and again: nothing
    state = _state(sink)
    assert {a: state[a]["qty"] for a in state} == {1: 2, 2: 3, 3: 2, 50: 4}
    operations = [
        r["operation"]
        for r in DeltaTable.forPath(sink.spark, sink.table_path(TABLE)).history().collect()
    ]
    assert operations[:2] == ["MERGE", "WRITE"]  # newest first: the log MERGE, the append
    assert len(operations) == 4  # the table's creation, batch 1, then batch 2's two parts
    feed = [(r["a"], r["_dblog_position"]) for r in _feed(sink)]
    for key in {a for a, _ in feed}:
        positions = [p for a, p in feed if a == key]
        assert positions == sorted(positions), (key, positions)


def test_dumped_and_log_rows_into_a_table_holding_nothing_are_one_append_of_the_newest(
    sink: DeltaSink,
) -> None:
    from delta.tables import DeltaTable

    sink.create_tables()
    dumped = [dataclasses.replace(_event("r", a, 2, 40), chunk_id=1, dump_id=1) for a in (1, 2, 3)]
    logged = [
        _event("u", 2, 3, 41),  # after the window: newer than the dumped row of key 2
        _event("c", 3, 9, 5),  # older than the dumped row of key 3
        _event("c", 60, 4, 6),
        _event("d", 60, None, 43),  # deleted: a tombstone
        _event("c", 70, 5, 44),  # outside the dumped range
    ]
    name = str(TABLE)
    _write(sink, 1, dumped + logged, {name: (1, 3)}, {name})
    state = _state(sink)
    assert {a: (r["qty"], r["_dblog_deleted"]) for a, r in state.items()} == {
        1: (2, False), 2: (3, False), 3: (2, False), 60: (None, True), 70: (5, False)
    }  # fmt: skip
    history = DeltaTable.forPath(sink.spark, sink.table_path(TABLE)).history().collect()
    assert [r["operation"] for r in history][:2] == ["WRITE", "CREATE TABLE"]


def test_dumped_and_log_rows_where_delta_holds_dumped_keys_go_in_one_merge(
    sink: DeltaSink,
) -> None:
    """A re-dump under writes: one commit for the batch, bounded by the range of all its keys;
    replayed, it commits nothing, and no key's version goes back in the feed."""
    from delta.tables import DeltaTable

    _write(sink, 1, [_event("c", a, 1, 10) for a in (1, 2, 3, 50)])
    dumped = [dataclasses.replace(_event("r", a, 2, 40), chunk_id=1, dump_id=1) for a in (1, 2, 3)]
    logged = [
        _event("u", 2, 3, 41),  # after the window: newer than the dumped row of key 2
        _event("u", 50, 4, 42),  # a key outside the dumped range
        _event("c", 60, 5, 43),  # a new key
    ]
    name = str(TABLE)
    for _ in range(2):  # replayed: nothing
        _write(sink, 2, dumped + logged, {name: (1, 3)}, {name}, {name: (1, 60)})
    state = _state(sink)
    assert {a: state[a]["qty"] for a in state} == {1: 2, 2: 3, 3: 2, 50: 4, 60: 5}
    history = DeltaTable.forPath(sink.spark, sink.table_path(TABLE)).history().collect()
    assert [r["operation"] for r in history][:2] == ["MERGE", "WRITE"]  # batch 2, batch 1
    assert len(history) == 3  # the table's creation, batch 1, batch 2
    feed = [(r["a"], r["_dblog_position"]) for r in _feed(sink)]
    for key in {a for a, _ in feed}:
        positions = [p for a, p in feed if a == key]
        assert positions == sorted(positions), (key, positions)


def test_optimize_compacts_and_keeps_every_row(sink: DeltaSink) -> None:
    for batch in range(1, 5):
        _write(
            sink, batch, [_event("c", a, batch, 10 * a) for a in range(batch * 3, batch * 3 + 3)]
        )
    state = _state(sink)
    done = optimize(sink.spark, sink.table_path(TABLE), "a")
    assert done["files_removed"] > done["files_added"] == 1
    assert _state(sink) == state


TYPED = TableId("shop", "typed")
TYPED_SCHEMA = TableSchema(
    TYPED,
    (
        Column("id", "int", False),
        Column("big", "bigint unsigned", True),
        Column("amount", "decimal(12,2)", True),
        Column("ratio", "double", True),
        Column("flag", "boolean", True),
        Column("day", "date", True),
        Column("at", "datetime(6)", True),
        Column("tz", "timestamp with time zone", True),
        Column("data", "blob", True),
        Column("name", "varchar(20)", True),
        Column("doc", "json", True),
        Column("uid", "uuid", True),
        Column("clock", "time", True),
    ),
    ("id",),
)
TYPED_ROWS = [
    {
        "id": 1,
        "big": 2**64 - 1,
        "amount": decimal.Decimal("-1234567890.5"),
        "ratio": float("nan"),
        "flag": True,
        "day": dt.date(1, 1, 1),
        "at": dt.datetime(2024, 2, 29, 23, 59, 59, 999999),
        "tz": dt.datetime(2024, 1, 1, 1, 0, tzinfo=dt.timezone(dt.timedelta(hours=5))),
        "data": b"\x00\xff",
        "name": "é ☃",
        "doc": {"a": [1, 2.5, None]},
        "uid": uuid.UUID(int=7),
        "clock": dt.time(12, 30, 0, 5),
    },
    {"id": 2, **{c.name: None for c in TYPED_SCHEMA.columns[1:]}},
    {
        "id": 3,
        "big": 0,
        "amount": 5,
        "ratio": float("-inf"),
        "flag": False,
        "day": dt.date(9999, 12, 31),
        "at": dt.datetime(1970, 1, 1),
        "tz": dt.datetime(2024, 6, 1, tzinfo=dt.UTC),
        "data": b"",
        "name": "",
        "doc": "[]",
        "uid": uuid.UUID(int=0),
        "clock": dt.time(0, 0),
    },
]


@pytest.mark.parametrize("held", [False, True], ids=["append", "merge"])
def test_a_chunk_read_typed_writes_what_its_json_would(
    spark: Any, tmp_path: Path, held: bool
) -> None:
    """The same rows, one chunk file with the columns typed and one with the JSON alone, into
    two tables (appended; merged where the log put keys first): the tables hold the same."""
    files = ChunkFiles(str(tmp_path / "chunks"))
    name, stored = str(TYPED), stored_columns(TYPED_SCHEMA.columns)
    tables = []
    for typed in (stored, ()):
        sink = DeltaSink(
            spark,
            DeltaSinkConfig(str(tmp_path / f"delta-{bool(typed)}")),
            {TYPED: TYPED_SCHEMA},
            "dblog-test",
        )
        sink.create_tables()
        if held:  # keys 1 and 9 by the log before the dump
            logged = [
                ChangeEvent(TYPED, "c", (k,), Position.mysql(1, k), after={"id": k, "name": "log"})  # type: ignore[arg-type]
                for k in (1, 9)
            ]
            sink.write(1, FrameBatch(_frame(spark, logged), {name}, logged={name}))
        folder = files.new_folder(7)
        data, selected = encode_rows(7, [((r["id"],), r) for r in TYPED_ROWS], typed=typed)
        assert selected.typed == tuple(typed)
        if typed:  # the typed columns alone say what the rows hold
            data = data.set_column(4, "after", pa.array(["{}"] * 3))
        files.write(folder, data)
        at = str(Position.mysql(1, 20))
        ref = ChunkRef(
            name, 7, 1, folder, at, 0, 3, (), NOW_MS, [1, 3], typed=[list(c) for c in typed]
        )
        batch = FrameBatch(
            _frame(spark, []), {name}, {name: (1, 3)}, chunks=[(2, ref)], files=files
        )
        sink.write(2, batch)
        table = spark.read.format("delta").load(sink.table_path(TYPED))
        tables.append(sorted(repr(tuple(r)) for r in table.drop("_dblog_ts").collect()))  # NaN
    assert tables[0] == tables[1]
    assert len(tables[0]) == (4 if held else 3)


def test_a_chunk_typed_under_other_column_types_is_read_from_its_json(
    spark: Any, tmp_path: Path
) -> None:
    """A chunk selected before an ALTER changed a column's type holds it typed the old way:
    Delta reads that chunk's JSON, cast to the type the table stores now."""
    files = ChunkFiles(str(tmp_path / "chunks"))
    name = str(TABLE)
    sink = DeltaSink(spark, DeltaSinkConfig(str(tmp_path / "delta")), {TABLE: SCHEMA}, "t")
    sink.create_tables()
    old = TableSchema(TABLE, (*SCHEMA.columns[:2], Column("qty", "varchar(5)", True)), SCHEMA.key)
    folder = files.new_folder(3)
    rows = [((a, "x"), {"a": a, "b": "x", "qty": str(a * 10)}) for a in (1, 2)]
    data, selected = encode_rows(3, rows, typed=stored_columns(old.columns))
    files.write(folder, data)
    at = str(Position.mysql(1, 5))
    ref = ChunkRef(
        name, 3, 1, folder, at, 0, 2, (), NOW_MS, [1, 2], typed=[list(c) for c in selected.typed]
    )
    sink.write(
        1, FrameBatch(_frame(spark, []), {name}, {name: (1, 2)}, chunks=[(1, ref)], files=files)
    )
    table = spark.read.format("delta").load(sink.table_path(TABLE))
    assert sorted((r["a"], r["qty"]) for r in table.collect()) == [(1, 10), (2, 20)]
