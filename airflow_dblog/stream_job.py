"""The long-lived streaming job (the data plane): capture thread, spool, Spark, sinks.

One process per source. A capture thread runs :class:`~airflow_dblog.capture.SpooledCapture`:
it reads the binlog/WAL, runs chunks between reads (low watermark, SELECT, high watermark),
merges them with the log and writes each merged batch as a durable spool segment. A Spark
Structured Streaming query reads the spool through the ``dblog_changelog`` source and, in
``foreachBatch``, writes the batch through every sink (Delta MERGE, keyed and guarded), then
completes the batch's chunks, saves the reader offset and lets the capture thread acknowledge
the source. A kill at any point replays at most the batch in flight: Spark re-plans the same
segments, the sinks skip what they hold, the capture thread resumes after the last segment.

Memory on the driver is bounded by the batch size: one chunk of rows per open chunk in the
capture, and one micro-batch (at most 40 segments) of Kafka messages; the events are parsed and
merged into Delta on the executors.
"""

from __future__ import annotations

import json
import logging
import signal
import threading
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from airflow_dblog.capture import SpooledCapture
from airflow_dblog.config import Config
from airflow_dblog.errors import DblogError
from airflow_dblog.events import TableId
from airflow_dblog.leader import LeaderLease
from airflow_dblog.metadata import MetadataStore
from airflow_dblog.sources import open_reader, open_source
from airflow_dblog.sources.base import TableSchema
from airflow_dblog.spark_env import build_spark_session
from airflow_dblog.spool import Spool

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

log = logging.getLogger(__name__)

TRIGGER = "500 milliseconds"
_DEFAULT_MASTER = object()

# The spool's event line as Spark parses it; row images stay JSON text for each sink to type.
EVENT_DDL = (
    "table STRING, op STRING, key STRING, position STRING, before STRING, after STRING,"
    " ts_ms BIGINT, dump_id BIGINT, chunk_id BIGINT, unavailable ARRAY<STRING>, source STRING"
)


class FrameSink(Protocol):
    """A Spark sink: ``write_frame`` is idempotent per batch id and never moves a key back."""

    name: str

    def write_frame(self, batch_id: int, events: DataFrame, tables: Collection[str]) -> None:
        """``tables``: the ``db.table`` names with events in the batch."""
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

        app_id = f"dblog-{config.name}"
        sinks.append(DeltaSink(spark, config.delta, schemas, app_id, describe))
    if config.kafka is not None:
        from airflow_dblog.sinks.kafka_sink import KafkaSink

        sinks.append(KafkaSink(config.kafka, config.name, config.source.type, schemas))
    return sinks


class BatchCommitter:
    """``foreachBatch``: sinks first, then chunks, offsets and the source acknowledgement."""

    def __init__(self, capture: SpooledCapture, sinks: Sequence[FrameSink], spool: Spool) -> None:
        self.capture, self.sinks, self.spool = capture, list(sinks), spool

    def _write_sinks(
        self, batch_id: int, events: DataFrame, tables: Collection[str]
    ) -> dict[str, float]:
        """Every sink writes the batch at once, each in its own thread; returns seconds per sink.

        The sinks share only the cached events: the Kafka sink's producer runs on the driver
        while Delta's MERGE keeps the executors busy, so a batch lasts about as long as its
        slowest sink, not their sum. The first failure is raised once all have finished.
        """
        from pyspark import InheritableThread  # keeps the query's job group and properties

        took: dict[str, float] = {}
        errors: list[BaseException] = []

        def write(sink: FrameSink) -> None:
            sink_started = time.monotonic()
            try:
                sink.write_frame(batch_id, events, tables)
            except BaseException as err:
                errors.append(err)
            took[sink.name] = time.monotonic() - sink_started

        threads = [InheritableThread(target=write, args=(sink,)) for sink in self.sinks[1:]]
        for thread in threads:
            thread.start()
        write(self.sinks[0])
        for thread in threads:
            thread.join()
        if errors:
            raise errors[0]
        return took

    def __call__(self, lines: DataFrame, batch_id: int) -> None:
        from pyspark.sql import functions as F

        started = time.monotonic()
        self.capture.store.check_fence()
        # parsed once and cached: every sink reads the same events, in spool (= log) order
        parsed = lines.select(
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
            events = parsed.where(~F.col("footer")).select("e.*")
            count = sum(f["events"] for f in footers)
            tables = sorted({table for f in footers for table in f["tables"]})
            read_s = time.monotonic() - started
            sink_s = self._write_sinks(batch_id, events, tables) if count else {}
            self.capture.committed(footers)
            closed = sum(len(f["closed"]) for f in footers)
            first = min(f["seq"] for f in footers)
            # segments before this batch belong to batches Spark has committed
            self.spool.drop_before(first)
            if count or closed:
                log.info(
                    "batch %d: segments %d-%d, %d events, %d chunks completed in %.1f s"
                    " (read %.1f s%s)",
                    batch_id,
                    first,
                    max(f["seq"] for f in footers),
                    count,
                    closed,
                    time.monotonic() - started,
                    read_s,
                    "".join(f", {name} {s:.1f} s" for name, s in sink_s.items()),
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
    query = (
        spark.readStream.format(NAME)
        .option("path", str(spool.dir))
        .load()
        .writeStream.queryName(f"dblog-{config.name}")
        .foreachBatch(BatchCommitter(capture, sinks, spool))
        .option("checkpointLocation", str(checkpoint / "spark"))
        .trigger(processingTime=TRIGGER)
        .start()
    )
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
            if _terminated(query):
                break
    finally:
        thread.stopping.set()
        thread.join(timeout=30)
        query.stop()
        capture.close()
        for sink in sinks:
            sink.close()
        schema_source.close()
        spark.stop()
        if lease is not None:
            lease.close()
    return 0


def _terminated(query: Any) -> bool:
    """Whether the query ended; its failure as one line (Spark's message spans pages)."""
    from pyspark.errors import StreamingQueryException

    try:
        return bool(query.awaitTermination(1.0))
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
