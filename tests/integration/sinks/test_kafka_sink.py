"""The Kafka sink on a real broker: envelope, tombstones, transactions, the spool follower."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from airflow_dblog.config import KafkaSinkConfig
from airflow_dblog.core.events import ChangeEvent
from airflow_dblog.core.position import Position
from airflow_dblog.engine.chunk_file import ChunkRef, encode_rows
from airflow_dblog.engine.sink_barrier import SinkBarrier
from airflow_dblog.engine.spool import Spool
from airflow_dblog.sinks.kafka_forwarder import KafkaForwarder
from airflow_dblog.sinks.kafka_sink import KafkaSink, topic_name
from airflow_dblog.spark.stream_job import Worker
from tests.support.services import read_committed
from tests.unit.sinks.test_kafka_sink import SCHEMA, TABLE, _event, _messages, _row


@pytest.fixture
def sink_factory(kafka_server: Any) -> Iterator[Any]:
    prefix = f"t{uuid.uuid4().hex[:10]}"
    sinks: list[KafkaSink] = []

    def make(image_mode: str = "NEW_AND_OLD_IMAGES", stream: str | None = None) -> KafkaSink:
        config = KafkaSinkConfig(kafka_server.bootstrap_servers, prefix, image_mode)
        sinks.append(KafkaSink(config, stream or prefix, "mysql", {TABLE: SCHEMA}))
        return sinks[-1]

    yield make
    for sink in sinks:
        sink.close()


@pytest.mark.integration  # a real broker
def test_batch_becomes_envelopes_with_a_tombstone_after_each_delete(
    kafka_server: Any, sink_factory: Any
) -> None:
    sink = sink_factory()
    rows = [_row("r", 1, 5, 10), _row("u", 1, 6, 11), _row("c", 2, 1, 12), _row("d", 2, 1, 13)]
    assert sink.write(0, _messages(rows, prefix=sink.config.topic_prefix)) == 5
    messages = read_committed(
        kafka_server.bootstrap_servers, topic_name(sink.config.topic_prefix, TABLE)
    )
    assert [k for k, _ in messages] == [{"a": 1, "b": "x"}] * 2 + [{"a": 2, "b": "x"}] * 3
    ops = [v and v["op"] for _, v in messages]
    assert ops == ["r", "u", "c", "d", None]
    dumped, updated = messages[0][1], messages[1][1]
    assert dumped["source"]["snapshot"] == "incremental" and dumped["source"]["chunk_id"] == 2
    assert updated["before"] == {"a": 1, "b": "x", "qty": 6} and updated["after"]["qty"] == 6
    assert updated["source"]["position"] == str(Position.mysql(1, 11))
    assert updated["source"]["gtid"] == "0-1-5" and updated["source"]["connector"] == "mysql"


def _spool_with(spool: Spool, *segments: list[ChangeEvent | ChunkRef]) -> None:
    for events in segments:
        spool.append(events, {"closed": [], "reader": None, "position": None})


def _forward(sink: KafkaSink, spool: Spool) -> list[int]:
    """Run a forwarder until it has sent and reported every segment on disk; the reported."""
    reported: list[int] = []
    barrier = SinkBarrier(
        ["kafka"], lambda footers: reported.extend(f["seq"] for f in footers), lambda seq: None
    )
    thread = Worker("dblog-kafka", KafkaForwarder(sink, spool, barrier, lambda: None).run)
    thread.start()
    deadline = time.monotonic() + 60
    while (not reported or reported[-1] < spool.end() - 1) and thread.error is None:
        assert time.monotonic() < deadline, "the forwarder did not catch up in 60 s"
        time.sleep(0.05)
    thread.stopping.set()
    thread.join(10)
    assert thread.error is None
    return reported


@pytest.mark.integration  # a real broker
def test_a_restarted_forwarder_sends_after_the_marker_and_reports_what_kafka_held(
    kafka_server: Any, sink_factory: Any, tmp_path: Any
) -> None:
    """A crash between Kafka's commit and the report: the next run reports, sends nothing twice."""
    spool = Spool(tmp_path / "spool")
    _spool_with(spool, [_event("c", 1, 5, 10)], [], [_event("u", 1, 6, 11)])
    first = sink_factory(stream="replay")
    assert _forward(first, spool) == [0, 1, 2]
    first.close()
    _spool_with(spool, [_event("u", 1, 7, 12), _event("u", 1, 8, 13)], [])
    again = sink_factory(stream="replay")  # a new process: same transactional id, fences the old
    assert again.committed_segment() == 2
    # segments 0-2 reported from the marker, 3-4 sent
    assert _forward(again, spool) == [0, 1, 2, 3, 4]
    topic = topic_name(again.config.topic_prefix, TABLE)
    values = [v["after"]["qty"] for _, v in read_committed(kafka_server.bootstrap_servers, topic)]
    assert values == [5, 6, 7, 8]
    assert again.committed_segment() == 4  # the marker is the batch's last segment


def _chunk(spool: Spool, chunk_id: int, rows: list[tuple[int, int]], **ref: Any) -> ChunkRef:
    """A closed chunk of rows (a, qty) with b="x": its file written, the spool's reference."""
    pytest.importorskip("pyarrow")
    arrow, selected = encode_rows(
        chunk_id, [((a, "x"), {"a": a, "b": "x", "qty": qty}) for a, qty in rows]
    )
    folder = spool.chunks.new_folder(chunk_id)
    spool.chunks.write(folder, arrow)
    fields: dict[str, Any] = {"position": str(Position.mysql(1, 10)), "first": 0, "drops": ()}
    fields.update(ref)
    return ChunkRef(
        str(TABLE), chunk_id, 1, folder, fields["position"], fields["first"], selected.count,
        fields["drops"], 2000 + chunk_id, selected.key_span,
    )  # fmt: skip


@pytest.mark.integration  # a real broker
def test_the_forwarder_sends_a_chunks_rows_from_its_file_where_the_chunk_stands(
    kafka_server: Any, sink_factory: Any, tmp_path: Any
) -> None:
    """Rows dropped by the window are left out; the rest are placed after the watermark, among
    the log events, in one transaction with them."""
    spool = Spool(tmp_path / "spool")
    dumped = _chunk(spool, 3, [(1, 50), (2, 60), (3, 70), (4, 80)], drops=(1,), first=5)
    all_dropped = _chunk(spool, 4, [(9, 1)], drops=(0,))
    _spool_with(
        spool,
        [_event("c", 1, 5, 10), dumped, _event("u", 3, 71, 11)],
        [all_dropped],  # closes a chunk, sends nothing
        [_event("d", 4, 80, 12)],
    )
    sink = sink_factory()
    assert _forward(sink, spool) == [0, 1, 2]
    topic = topic_name(sink.config.topic_prefix, TABLE)
    messages = read_committed(kafka_server.bootstrap_servers, topic)
    assert [(k["a"], v and v["op"]) for k, v in messages] == [
        (1, "c"),
        (1, "r"),  # idx 0, 2, 3 of the chunk; idx 1 (a=2) changed inside the window
        (3, "r"),
        (4, "r"),
        (3, "u"),
        (4, "d"),
        (4, None),
    ]
    rows = [v for _, v in messages[1:4]]
    base = Position.mysql(1, 10)
    expected = [str(base.dumped_row(5 + idx)) for idx in (0, 2, 3)]
    assert [v["source"]["position"] for v in rows] == expected
    assert expected == [dumped.row_position(idx) for idx in (0, 2, 3)]
    assert [v["after"] for v in rows] == [
        {"a": 1, "b": "x", "qty": 50},
        {"a": 3, "b": "x", "qty": 70},
        {"a": 4, "b": "x", "qty": 80},
    ]
    assert {
        (v["before"] is None, v["ts_ms"], v["source"]["snapshot"], v["source"]["chunk_id"])
        for v in rows
    } == {(True, 2003, "incremental", 3)}
    positions = [v["source"]["position"] for _, v in messages if v]
    assert positions == sorted(positions)  # the rows sit between the events around them
    assert sink.committed_segment() == 2


@pytest.mark.integration  # a real broker
def test_a_failed_batch_leaves_nothing_visible(kafka_server: Any, sink_factory: Any) -> None:
    sink = sink_factory()
    prefix = sink.config.topic_prefix
    first_two = _messages([_row("c", 1, 5, 10), _row("c", 2, 5, 11)], prefix=prefix)

    def broken() -> Iterator[tuple[Any, ...]]:
        yield from first_two
        raise OSError("the spool disappeared")  # failure injection mid-batch

    with pytest.raises(OSError):
        sink.write(0, broken())
    assert sink.committed_segment() == -1
    sink.write(0, _messages([_row("c", 3, 5, 12)], prefix=prefix))
    messages = read_committed(
        kafka_server.bootstrap_servers, topic_name(sink.config.topic_prefix, TABLE)
    )
    assert [k["a"] for k, _ in messages] == [3]
    for batch_id in range(1, 21):  # 20 aborted markers: more than the first window read back
        with pytest.raises(OSError):
            sink.write(batch_id, broken())
    assert sink_factory(stream=sink.stream).committed_segment() == 0


@pytest.mark.integration  # a real broker
def test_spark_reads_the_topic_with_a_schema(
    kafka_server: Any, sink_factory: Any, spark: Any
) -> None:
    """Consumers need nothing of ours: Spark's Kafka source plus a schema for the envelope."""
    sink = sink_factory()
    rows = [_row("c", 1, 5, 10), _row("u", 1, 6, 11), _row("d", 1, 6, 12)]
    sink.write(0, _messages(rows, prefix=sink.config.topic_prefix))
    topic = topic_name(sink.config.topic_prefix, TABLE)
    image = "a BIGINT, b STRING, qty BIGINT"
    envelope_ddl = (
        f"before STRUCT<{image}>, after STRUCT<{image}>, op STRING, ts_ms BIGINT,"
        " source STRUCT<db: STRING, `table`: STRING, position: STRING, snapshot: STRING>"
    )
    rows = (
        spark.read.format("kafka")
        .option("kafka.bootstrap.servers", kafka_server.bootstrap_servers)
        .option("subscribe", topic)
        .option("startingOffsets", "earliest")
        .option("kafka.isolation.level", "read_committed")
        .load()
        .where("value IS NOT NULL")
        .selectExpr(f"from_json(CAST(value AS STRING), '{envelope_ddl}') AS e", "offset")
        .orderBy("offset")
        .select("e.op", "e.after.qty", "e.before.qty", "e.source.position", "e.source.table")
        .collect()
    )
    assert [tuple(r) for r in rows] == [
        ("c", 5, None, str(Position.mysql(1, 10)), "items"),
        ("u", 6, 6, str(Position.mysql(1, 11)), "items"),
        ("d", None, 6, str(Position.mysql(1, 12)), "items"),
    ]
