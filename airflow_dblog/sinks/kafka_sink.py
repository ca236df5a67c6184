"""Kafka sink: Debezium-style change events, one topic per table, exactly once per batch.

Topic ``<prefix>.<db>.<table>``; message key = the primary key as a JSON object, so a key always
lands on one partition and stays in order; value = ``{before, after, op, ts_ms, source}``; a
tombstone (null value) follows each delete so compacted topics forget the key.

Every micro-batch is one Kafka transaction of a producer whose ``transactional.id`` is the
stream's: a consumer with ``isolation.level=read_committed`` sees a batch completely or not at
all, and a restarted job fences off the old producer. The batch's last spool segment is written
in the same transaction, as a message on the stream's own marker topic
``<prefix>.__dblog_batches.<stream>`` (compacted, one partition, written only by this producer):
events of segments up to the marker are skipped, so a crash between Kafka's commit and Spark's,
or a batch cut differently after Spark's checkpoint was lost, writes nothing twice.
(A marker message, not a consumer-group offset via ``send_offsets_to_transaction``: librdkafka
can block in that call past its timeout when the group coordinator restarts.)
"""

from __future__ import annotations

import json
import logging
from collections.abc import Collection, Iterable, Mapping
from typing import TYPE_CHECKING, Any

from airflow_dblog.config import KafkaSinkConfig
from airflow_dblog.errors import DblogError
from airflow_dblog.events import TableId
from airflow_dblog.sources.base import TableSchema

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

log = logging.getLogger(__name__)

TIMEOUT_S = 30.0
COMMIT_ATTEMPTS = 3  # a commit that timed out (broker restarting) may be retried
CONNECTORS = {"mysql": "mysql", "postgres": "postgresql"}

Message = tuple[str, str, str, bool]  # topic, key, value, tombstone after it


class KafkaSinkError(DblogError):
    """The broker refused a batch (unreachable, fenced, topic not creatable)."""


def topic_name(prefix: str, table: TableId) -> str:
    return f"{prefix}.{table.db}.{table.table}"


# One top-level scalar of a JSON array (the spool's key): a string with its escapes, or a bare
# number / true / false / null. Key values are scalars (plain_value makes JSON columns text).
_JSON_SCALAR = r'"(?:[^"\\]|\\.)*"|[^,\[\]"]+'


def message_frame(
    events: DataFrame,
    schemas: Mapping[TableId, TableSchema],
    tables: Collection[str],
    stream: str,
    source_kind: str,
    config: KafkaSinkConfig,
) -> DataFrame:
    """The batch's Kafka messages: ``topic``, ``key``, ``value``, ``tombstone``, in event order.

    Built with Spark expressions on the executors, so the driver only hands bytes to the
    producer. The spool's row images are already JSON objects and are spliced in as text.
    """
    from pyspark.sql import functions as F

    topic = key = F.lit(None).cast("string")
    for name in tables:
        table = TableId.parse(name)
        columns = schemas[table].key
        if len(columns) == 1:  # the common case: the array's one element, no regex
            values = [F.expr("substr(key, 2, length(key) - 2)")]
        else:
            found = F.regexp_extract_all(F.col("key"), F.lit(_JSON_SCALAR), 0)
            values = [found[i] for i in range(len(columns))]
        pairs = [
            piece
            for i, (column, value) in enumerate(zip(columns, values, strict=True))
            for piece in (F.lit(("{" if i == 0 else ",") + json.dumps(column) + ":"), value)
        ]
        this = F.col("table") == name
        topic = F.when(this, F.lit(topic_name(config.topic_prefix, table))).otherwise(topic)
        key = F.when(this, F.concat(*pairs, F.lit("}"))).otherwise(key)
    before, after = F.col("before"), F.col("after")
    if config.image_mode == "NEW_IMAGE":
        before = F.lit(None).cast("string")
    elif config.image_mode == "OLD_IMAGE":
        after = F.lit(None).cast("string")
    elif config.image_mode == "KEYS_ONLY":
        before = F.when(before.isNotNull(), key)
        after = F.when(after.isNotNull(), key)
    dot = F.instr(F.col("table"), ".")
    db = F.col("table").substr(F.lit(1), dot - 1)
    source = F.to_json(
        F.struct(
            F.lit(CONNECTORS.get(source_kind, source_kind)).alias("connector"),
            F.lit(stream).alias("name"),
            db.alias("db"),
            db.alias("schema" if source_kind == "postgres" else "database"),
            F.col("table").substr(dot + 1, F.length("table")).alias("table"),
            F.col("position"),
            F.col("ts_ms"),
            F.when(F.col("op") == "r", "incremental").otherwise("false").alias("snapshot"),
            F.col("dump_id"),
            F.col("chunk_id"),
        ),
        {"ignoreNullFields": "false"},
    )
    extra = F.col("source")  # the reader's own fields (gtid, xid, pk_change): appended
    source = F.when(extra.isNull() | (extra == "{}"), source).otherwise(
        F.concat(
            source.substr(F.lit(1), F.length(source) - 1),
            F.lit(","),
            extra.substr(F.lit(2), F.length(extra)),
        )
    )
    value = F.concat(
        F.lit('{"before":'),
        F.coalesce(before, F.lit("null")),
        F.lit(',"after":'),
        F.coalesce(after, F.lit("null")),
        F.lit(',"op":"'),
        F.col("op"),
        F.lit('","ts_ms":'),
        F.coalesce(F.col("ts_ms").cast("string"), F.lit("null")),
        F.lit(',"source":'),
        source,
        F.lit("}"),
    )
    return events.select(
        topic.alias("topic"),
        key.alias("key"),
        value.alias("value"),
        (F.col("op") == "d").alias("tombstone"),
    )


def ensure_topics(
    bootstrap_servers: str,
    partitions: Mapping[str, int],
    configs: Mapping[str, Mapping[str, str]] | None = None,
) -> None:
    """Create the topics that do not exist yet (broker-default replication)."""
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap_servers})
    try:
        existing = set(admin.list_topics(timeout=TIMEOUT_S).topics)
    except KafkaException as err:
        raise KafkaSinkError(
            f"Kafka at {bootstrap_servers} could not list topics: {err.args[0]}",
            "check that the brokers are up",
        ) from None
    missing = [
        NewTopic(t, n, replication_factor=-1, config=dict((configs or {}).get(t, {})))
        for t, n in partitions.items()
        if t not in existing
    ]
    if not missing:
        return
    for topic, future in admin.create_topics(missing, request_timeout=TIMEOUT_S).items():
        try:
            future.result()
            log.info("kafka: created topic %s", topic)
        except Exception as err:
            if "TOPIC_ALREADY_EXISTS" not in str(err):
                raise KafkaSinkError(
                    f"Kafka topic {topic} cannot be created: {err}",
                    "create it, or give the stream's user CreateTopics on the cluster",
                ) from None


def _json(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"))


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

    def write_frame(
        self,
        version: int,
        events: DataFrame,
        tables: Collection[str],
        dump_bounds: Mapping[str, Any] | None = None,
    ) -> None:
        committed = self.committed_segment()
        if version <= committed:
            log.info("kafka: segments up to %d are already committed; skipped", version)
            return
        if "seq" in events.columns:  # a batch that starts inside what Kafka holds
            events = events.where(events["seq"] > committed)
        messages = message_frame(
            events, self.schemas, tables, self.stream, self.source_kind, self.config
        )
        # the frame is in spool order, which is log order (no shuffle in its plan); Arrow
        # brings it to the driver in columnar batches, far cheaper than pickled rows
        table = messages.toArrow()
        self.write_messages(
            version,
            (
                message
                for batch in table.to_batches()
                for message in zip(*(column.to_pylist() for column in batch.columns), strict=True)
            ),
        )

    def write_messages(self, version: int, messages: Iterable[Message]) -> int:
        """One transaction: every message (a tombstone after each delete), then the version.

        Returns the messages sent.
        """
        self._call("begin a transaction", self.producer.begin_transaction)
        sent = 0
        try:
            for topic, key, value, tombstone in messages:
                self._produce(topic, key, value)
                if tombstone:
                    self._produce(topic, key, None)
                sent += 1 + tombstone
            self._produce(self.marker_topic, self.stream, _json({"segment": version}))
            self._commit()
        except BaseException:
            try:
                self.producer.abort_transaction(TIMEOUT_S)
            except Exception as err:  # the original error matters more
                log.warning("kafka: aborting the transaction failed too: %s", err)
            raise
        self._committed = version
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
