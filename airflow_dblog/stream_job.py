"""The long-lived streaming job (the data plane): capture thread, spool, Spark, sinks.

One process per source. A capture thread runs :class:`~airflow_dblog.capture.SpooledCapture`:
it reads the binlog/WAL, runs chunks between reads (low watermark, SELECT, high watermark),
merges them with the log and writes each merged batch as a durable spool segment. Each sink
has its own Spark Structured Streaming query (and checkpoint, ``<checkpoint>/spark/<sink>``)
reading the spool through the ``dblog_changelog`` source, so Kafka's latency does not include
Delta's MERGE. Once every sink holds a segment (:mod:`~airflow_dblog.sink_progress`), its
chunks are completed, the reader offset saved and the source acknowledged. A kill at any point
replays at most each query's batch in flight: Spark re-plans the same segments, the sinks skip
what they hold, the capture thread resumes after the last segment.

Memory on the driver is bounded by the batch size: one chunk of rows per open chunk in the
capture, and one micro-batch (at most 48 MB of spool) of Kafka messages; the events are parsed and
merged into Delta on the executors.
"""

from __future__ import annotations

import json
import logging
import signal
import threading
import time
from collections.abc import Callable, Collection, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from airflow_dblog.capture import SpooledCapture
from airflow_dblog.config import Config
from airflow_dblog.errors import DblogError
from airflow_dblog.events import TableId
from airflow_dblog.leader import LeaderLease
from airflow_dblog.metadata import MetadataStore
from airflow_dblog.sink_progress import SinkProgress
from airflow_dblog.sources import open_reader, open_source
from airflow_dblog.sources.base import TableSchema
from airflow_dblog.spark_env import build_spark_session
from airflow_dblog.spool import Spool, dump_bounds

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

log = logging.getLogger(__name__)

TRIGGER = "500 milliseconds"
# Kafka's latency is the point of Kafka; Delta's MERGE costs about the same for 1 or 10,000 rows
TRIGGERS = {"kafka": "100 milliseconds", "delta": "1 second"}
_DEFAULT_MASTER = object()

# The spool's event line as Spark parses it; row images stay JSON text for each sink to type.
EVENT_DDL = (
    "table STRING, op STRING, key STRING, position STRING, before STRING, after STRING,"
    " ts_ms BIGINT, dump_id BIGINT, chunk_id BIGINT, unavailable ARRAY<STRING>, source STRING"
)


class FrameSink(Protocol):
    """A Spark sink: ``write_frame`` is idempotent per version and never moves a key back."""

    name: str

    def write_frame(
        self,
        version: int,
        events: DataFrame,
        tables: Collection[str],
        dump_bounds: Mapping[str, tuple[Any, Any]] | None = None,
    ) -> None:
        """``version``: the batch's last spool segment; a sink that holds it writes nothing.

        ``events`` carries each event's spool segment (``seq``); ``tables``: the ``db.table``
        names with events in the batch; ``dump_bounds``: those with dumped rows only, and the
        range of their first key column (a sink may use it to skip files).
        """
        ...

    def close(self) -> None: ...


def build_sinks(
    spark: SparkSession,
    config: Config,
    schemas: Mapping[TableId, TableSchema],
    describe: Callable[[TableId], TableSchema] | None = None,
) -> list[FrameSink]:
    """The sinks the config names, in the order a batch is written through them.

    ``describe`` reads a table's current schema at every batch that touches it (ALTER TABLE
    while streaming: columns added, key changed).
    """
    sinks: list[FrameSink] = []
    if config.delta is not None:
        from airflow_dblog.sinks.delta_sink import DeltaSink

        # versions are spool segments; the plain name held Spark batch ids (before 0.2)
        app_id = f"dblog-{config.name}/segments"
        sinks.append(DeltaSink(spark, config.delta, schemas, app_id, describe))
    if config.kafka is not None:
        from airflow_dblog.sinks.kafka_sink import KafkaSink

        sinks.append(KafkaSink(config.kafka, config.name, config.source.type, schemas))
    return sinks


class BatchCommitter:
    """``foreachBatch`` of one sink's query: write the batch, then report the segments held.

    The batch's idempotence id is its last spool segment: segments are numbered on from the
    spool (a stream whose spool was deleted refuses to start), so a replayed batch, or one cut
    differently after ``<checkpoint>/spark`` was deleted, is recognised by the sink whatever
    Spark's batch ids.
    """

    def __init__(self, sink: FrameSink, progress: SinkProgress, store: MetadataStore) -> None:
        self.sink, self.progress, self.store = sink, progress, store

    def __call__(self, lines: DataFrame, batch_id: int) -> None:
        from pyspark.sql import functions as F

        started = time.monotonic()
        self.store.check_fence()
        parsed = lines.select(
            "seq",
            "footer",
            F.when(F.col("footer"), F.col("line")).alias("line"),
            F.when(~F.col("footer"), F.from_json("line", EVENT_DDL)).alias("e"),
        ).persist()
        try:
            footers = [
                json.loads(r["line"])["footer"]
                for r in parsed.where("footer").select("line").collect()
            ]
            if not footers:
                return
            count = sum(f["events"] for f in footers)
            if count:
                events = parsed.where(~F.col("footer")).select("seq", "e.*")
                tables = sorted({table for f in footers for table in f["tables"]})
                version = max(f["seq"] for f in footers)
                self.sink.write_frame(version, events, tables, dump_bounds(footers))
            committed = self.progress.held(self.sink.name, footers)
            closed = sum(len(f["closed"]) for f in committed)
            if count or closed:
                log.info(
                    "%s batch %d: segments %d-%d, %d events in %.1f s; %d chunks completed",
                    self.sink.name,
                    batch_id,
                    min(f["seq"] for f in footers),
                    max(f["seq"] for f in footers),
                    count,
                    time.monotonic() - started,
                    closed,
                )
        finally:
            parsed.unpersist()


class CaptureThread(threading.Thread):
    def __init__(self, capture: SpooledCapture) -> None:
        super().__init__(name="dblog-capture", daemon=True)
        self.capture = capture
        self.stopping = threading.Event()
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            while not self.stopping.is_set():
                self.capture.step(timeout_s=0.2)
        except BaseException as err:  # surfaced by the main loop, which stops the job
            self.error = err


def run_stream(
    config: Config, master: Any = _DEFAULT_MASTER, stop: threading.Event | None = None
) -> int:
    """Run until SIGTERM/SIGINT (or ``stop``); a failure of either half stops both.

    With ``ha`` configured, first wait as a standby until this process holds the leader lease.
    """
    from airflow_dblog.changelog_source import NAME, ChangelogSource

    stop = stop or threading.Event()
    _stop_on_signals(stop)
    store = MetadataStore(config.metadata_url)
    lease = LeaderLease(config.ha, config.name) if config.ha is not None else None
    if lease is not None:
        fence = lease.acquire(stop)
        if fence is None:
            lease.close()
            return 0
        store.take_lead(fence, lease.identity)
    # the log position first (Spark takes many seconds to start): from here on every change is
    # captured, and the bounds of dumps already requested are read after it
    source = open_source(config)
    checkpoint = Path(config.checkpoint)
    spool = Spool(checkpoint / "spool")
    capture = SpooledCapture(
        config, store, source, lambda offset: open_reader(config, offset), spool
    )
    spark = build_spark_session(
        f"dblog-{config.name}",
        master=config.spark.master if master is _DEFAULT_MASTER else master,
        extra_conf=config.spark.conf,
    )
    spark.dataSource.register(ChangelogSource)
    schemas = {table: source.describe(table) for table in config.source.tables}
    schema_source = open_source(config)  # the Spark thread's own: sources are not thread-safe
    sinks = build_sinks(spark, config, schemas, schema_source.describe)
    if config.kafka is not None and config.kafka.signal_topic:
        from airflow_dblog.signals import SignalChannel

        capture.signals = SignalChannel(config, store)
    thread = CaptureThread(capture)
    progress = SinkProgress([sink.name for sink in sinks], capture.committed, spool.drop_before)
    queries = [
        spark.readStream.format(NAME)
        .option("path", str(spool.dir))
        .load()
        .writeStream.queryName(f"dblog-{config.name}-{sink.name}")
        .foreachBatch(BatchCommitter(sink, progress, store))
        .option("checkpointLocation", str(checkpoint / "spark" / sink.name))
        .trigger(processingTime=TRIGGERS.get(sink.name, TRIGGER))
        .start()
        for sink in sinks
    ]
    thread.start()
    log.info(
        "stream %s running: %s -> %s", config.name, config.source.type, [s.name for s in sinks]
    )
    try:
        while not stop.is_set():
            if lease is not None:
                lease.check()
            if thread.error is not None:
                raise thread.error
            if not thread.is_alive():
                raise DblogError("the capture thread stopped", "see the log above for why")
            if any(_terminated(query, 1.0 / len(queries)) for query in queries):
                break
    finally:
        thread.stopping.set()
        thread.join(timeout=30)
        for query in queries:
            query.stop()
        capture.close()
        for sink in sinks:
            sink.close()
        schema_source.close()
        spark.stop()
        if lease is not None:
            lease.close()
    return 0


def _terminated(query: Any, wait_s: float) -> bool:
    """Whether the query ended; its failure as one line (Spark's message spans pages)."""
    from pyspark.errors import StreamingQueryException

    try:
        return bool(query.awaitTermination(wait_s))
    except StreamingQueryException as err:
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise DblogError(
            f"the Spark query failed: {first}", "see the job log for the cause"
        ) from None


def _stop_on_signals(stop: threading.Event) -> None:
    if threading.current_thread() is not threading.main_thread():
        return
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
