"""Kafka sink: Debezium-style change events, one topic per table, exactly once per batch.

Topic ``<prefix>.<db>.<table>``; message key = the primary key as a JSON object, so a key always
lands on one partition and stays in order; value = ``{before, after, op, ts_ms, source}``; a
tombstone (null value) follows each delete so compacted topics forget the key.

Each batch of spool segments is one Kafka transaction of a producer whose ``transactional.id``
is the stream's: a consumer with ``isolation.level=read_committed`` sees a batch completely or
not at all, and a restarted job fences off the old producer. The batch's last spool segment is
written in the same transaction, as a message on the stream's own marker topic
``<prefix>.__dblog_batches.<stream>`` (compacted, one partition, written only by this producer):
a restarted job sends from the segment after it, so nothing is written twice.

Messages are concatenated in Python on the driver from the spool's event text
(:class:`MessageBuilder`), not built by Spark: a Spark batch costs a second or more of CPU
however small, which made Kafka's latency and the job's throughput Spark's (see
:mod:`~airflow_dblog.sinks.kafka_forwarder`).
(A marker message, not a consumer-group offset via ``send_offsets_to_transaction``: librdkafka
can block in that call past its timeout when the group coordinator restarts.)
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable, Mapping
from typing import Any

from airflow_dblog.config import KafkaSinkConfig
from airflow_dblog.core.events import TableId
from airflow_dblog.engine.event_text import EventText
from airflow_dblog.engine.kafka_admin import ensure_topics
from airflow_dblog.errors import DblogError
from airflow_dblog.sources.base import TableSchema
from airflow_dblog.sources.registry import source_kind as source_kind_facts

log = logging.getLogger(__name__)

TIMEOUT_S = 30.0
COMMIT_ATTEMPTS = 3  # a commit that timed out (broker restarting) may be retried

Message = tuple[str, str, str, bool]  # topic, key, value, tombstone after it


class KafkaSinkError(DblogError):
    """The broker refused a batch (unreachable, fenced, topic not creatable)."""


def topic_name(prefix: str, table: TableId) -> str:
    return f"{prefix}.{table.db}.{table.table}"


_json = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False).encode


class MessageBuilder:
    """An event as its Kafka message: ``(topic, key, value, tombstone)``.

    Concatenated from the event's JSON text (the same the spool line is made of): per table the
    topic, the key's column names and the constant start of the ``source`` block are prepared
    once; per event nothing is parsed or encoded but a multi-column key.
    """

    def __init__(
        self,
        schemas: Mapping[TableId, TableSchema],
        stream: str,
        source_kind: str,
        config: KafkaSinkConfig,
    ) -> None:
        self.image_mode = config.image_mode
        self._tables: dict[str, tuple[str, tuple[str, ...], str]] = {}
        kind = source_kind_facts(source_kind)
        connector, db_field = kind.debezium_connector, kind.envelope_db_field
        for table, schema in schemas.items():
            head = _json(
                {"connector": connector, "name": stream, "db": table.db, db_field: table.db}
            )
            self._tables[str(table)] = (
                topic_name(config.topic_prefix, table),
                tuple(schema.key),
                f'{head[:-1]},"table":{_json(table.table)},"position":',
            )

    def __call__(self, event: EventText) -> Message:
        topic, columns, source_head = self._tables[event.table]
        if len(columns) == 1:  # the array's one scalar is the value's JSON text
            key = f"{{{_json(columns[0])}:{event.key[1:-1]}}}"
        else:
            key = _json(dict(zip(columns, json.loads(event.key), strict=True)))
        before, after = event.before, event.after
        mode = self.image_mode
        if mode == "NEW_IMAGE":
            before = "null"
        elif mode == "OLD_IMAGE":
            after = "null"
        elif mode == "KEYS_ONLY":
            before = "null" if before == "null" else key
            after = "null" if after == "null" else key
        op = event.op
        extra = event.source[1:-1]  # the reader's own fields, appended to the source block
        value = "".join(
            (
                '{"before":',
                before,
                ',"after":',
                after,
                ',"op":"',
                op,
                '","ts_ms":',
                event.ts_ms,
                ',"source":',
                source_head,
                _json(event.position),
                ',"ts_ms":',
                event.ts_ms,
                ',"snapshot":',
                '"incremental"' if op == "r" else '"false"',
                ',"dump_id":',
                event.dump_id,
                ',"chunk_id":',
                event.chunk_id,
                "," if extra else "",
                extra,
                "}}",
            )
        )
        return topic, key, value, op == "d"


class KafkaSink:
    name = "kafka"

    def __init__(
        self,
        config: KafkaSinkConfig,
        stream: str,
        source_kind: str,
        schemas: Mapping[TableId, TableSchema],
    ) -> None:
        from confluent_kafka import Consumer, Producer

        self.config, self.stream, self.source_kind = config, stream, source_kind
        self.schemas = dict(schemas)
        self.message = MessageBuilder(schemas, stream, source_kind, config)
        self.marker_topic = f"{config.topic_prefix}.__dblog_batches.{stream}"
        common = {"bootstrap.servers": config.bootstrap_servers}
        self._ensure_topics()
        self.producer = Producer(
            {
                **common,
                "transactional.id": f"dblog-{stream}",
                "enable.idempotence": True,
                "linger.ms": 20,
                "compression.type": "lz4",
                "transaction.timeout.ms": 120_000,
            }
        )
        self._call(
            "initialise the transactional producer", self.producer.init_transactions, TIMEOUT_S
        )
        self.consumer = Consumer(  # reads the marker topic back; joins no group
            {
                **common,
                "group.id": f"dblog-{stream}-kafka-sink",
                "enable.auto.commit": False,
                "enable.partition.eof": True,
                "isolation.level": "read_committed",
            }
        )
        self._committed: int | None = None

    def committed_segment(self) -> int:
        """The last spool segment this sink committed (-1 if none)."""
        if self._committed is None:
            self._committed = self._last_marker()
        return self._committed

    def _last_marker(self) -> int:
        """The newest committed marker's segment, read backwards in growing windows.

        ``init_transactions`` has aborted whatever the previous producer left open, so the
        partition is readable to its end; aborted markers are invisible under read_committed.
        """
        from confluent_kafka import TopicPartition

        tp = TopicPartition(self.marker_topic, 0)
        low, end = self._call(
            "read the batch marker's offsets", self.consumer.get_watermark_offsets, tp, TIMEOUT_S
        )
        window = 16
        while end > low:
            start = max(low, end - window)
            found = self._read_markers(start, end)
            if found is not None:
                return found
            end, window = start, window * 4
        return -1

    def _read_markers(self, start: int, end: int) -> int | None:
        from confluent_kafka import KafkaError, TopicPartition

        self.consumer.assign([TopicPartition(self.marker_topic, 0, start)])
        found: int | None = None
        try:
            while True:
                msg = self.consumer.poll(TIMEOUT_S)
                if msg is None:
                    raise KafkaSinkError(
                        f"Kafka at {self.config.bootstrap_servers} did not return the batch"
                        f" marker topic {self.marker_topic} within {TIMEOUT_S:.0f} s",
                        "check that the brokers are up",
                    )
                if msg.error() is not None:
                    if msg.error().code() == KafkaError._PARTITION_EOF:
                        return found
                    raise KafkaSinkError(
                        f"Kafka at {self.config.bootstrap_servers} could not read the batch"
                        f" marker topic {self.marker_topic}: {msg.error()}",
                        "check that the brokers are up and the stream's user may read it",
                    )
                if msg.offset() >= end:
                    return found
                # markers of versions before 0.2 carry Spark batch ids, not segments: ignored
                segment = json.loads(msg.value()).get("segment")
                found = found if segment is None else int(segment)
        finally:
            self.consumer.unassign()

    def write(self, segment: int, batch: Iterable[Message]) -> int:
        """One transaction: every message (a tombstone after each delete), then the marker of
        ``segment`` (the :class:`~airflow_dblog.sinks.base.Sink` contract). Returns the
        messages sent."""
        self._call("begin a transaction", self.producer.begin_transaction)
        sent = 0
        try:
            for topic, key, value, tombstone in batch:
                self._produce(topic, key, value)
                if tombstone:
                    self._produce(topic, key, None)
                sent += 1 + tombstone
            self._produce(self.marker_topic, self.stream, _json({"segment": segment}))
            self._commit()
        except BaseException:
            try:
                self.producer.abort_transaction(TIMEOUT_S)
            except Exception as err:  # the original error matters more
                log.warning("kafka: aborting the transaction failed too: %s", err)
            raise
        self._committed = segment
        return sent

    def _commit(self) -> None:
        from confluent_kafka import KafkaException

        for attempt in range(1, COMMIT_ATTEMPTS + 1):
            try:
                self.producer.commit_transaction(TIMEOUT_S)
                return
            except KafkaException as err:
                if attempt == COMMIT_ATTEMPTS or not err.args[0].retriable():
                    raise KafkaSinkError(
                        f"Kafka at {self.config.bootstrap_servers} could not commit the"
                        f" transaction: {err.args[0]}",
                        "check that the brokers are up and the stream's user may write"
                        " transactions",
                    ) from None
                log.warning("kafka: commit attempt %d failed, retrying: %s", attempt, err.args[0])

    def _produce(self, topic: str, key: str, value: str | None) -> None:
        while True:
            try:
                self.producer.produce(topic, value=value, key=key)
                return
            except BufferError:  # local queue full: let the network catch up
                self.producer.poll(0.1)

    def _ensure_topics(self) -> None:
        partitions = {
            topic_name(self.config.topic_prefix, t): self.config.partitions for t in self.schemas
        }
        ensure_topics(
            self.config.bootstrap_servers,
            {self.marker_topic: 1, **partitions},
            {self.marker_topic: {"cleanup.policy": "compact"}},
        )

    def _call(self, what: str, fn: Any, *args: Any, **kwargs: Any) -> Any:
        from confluent_kafka import KafkaException

        try:
            return fn(*args, **kwargs)
        except KafkaException as err:
            raise KafkaSinkError(
                f"Kafka at {self.config.bootstrap_servers} could not {what}: {err.args[0]}",
                "check that the brokers are up and the stream's user may write transactions",
            ) from None

    def close(self) -> None:
        from confluent_kafka import KafkaException

        try:
            self.producer.flush(TIMEOUT_S)
        except KafkaException as err:  # a fenced or failed producer: nothing left to deliver
            log.warning("kafka: closing the producer: %s", err.args[0])
        self.consumer.close()
