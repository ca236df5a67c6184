"""The long-lived streaming job (the data plane): capture thread, spool, Spark, sinks.

One process per source. A capture thread runs :class:`~airflow_dblog.engine.capture.SpooledCapture`:
it reads the binlog/WAL, sends chunk SELECTs to the executors as Spark jobs
(:mod:`~airflow_dblog.spark.chunk_jobs`: rows written by Spark into chunk files on the
checkpoint's store), merges the chunks' windows with the log and writes each merged batch as a
durable spool segment, a chunk's rows as a reference to its file. Each sink
follows the spool on its own, so neither waits for the other: Kafka in a driver thread
(:mod:`~airflow_dblog.sinks.kafka_forwarder`, one transaction per batch of segments, started before
Spark), Delta in a Spark Structured Streaming query (checkpoint ``<checkpoint>/spark/delta``)
reading the spool through the ``dblog_changelog`` source. Once every sink holds a segment
(:mod:`~airflow_dblog.engine.sink_barrier`), its chunks are completed, the reader offset saved
and the source acknowledged. A kill at any point replays at most each sink's batch in flight: Spark
re-plans the same segments, Kafka resends after its marker, the sinks skip what they hold, the
capture thread resumes after the last segment.

Memory on the driver does not grow with chunks or tables: the capture keeps the keys changed
inside each open window, Kafka's forwarder reads chunk files in batches of rows, and Delta's
events are read, parsed and merged on the executors.
"""

from __future__ import annotations

import contextlib
import json
import logging
import re
import signal
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from airflow_dblog.config import Config
from airflow_dblog.core.events import TableId
from airflow_dblog.engine.capture import SpooledCapture
from airflow_dblog.engine.chunk_runner import LateRunner, ProcessChunkRunner
from airflow_dblog.engine.configured_source import open_reader, open_source
from airflow_dblog.engine.leader import LeaderLease
from airflow_dblog.engine.metadata import MetadataStore
from airflow_dblog.engine.signals import SignalChannel
from airflow_dblog.engine.sink_barrier import SinkBarrier
from airflow_dblog.engine.spool import Spool
from airflow_dblog.engine.spool_store import S3_ENDPOINT, join
from airflow_dblog.errors import DblogError
from airflow_dblog.sinks.base import ReadBack, Sink
from airflow_dblog.sinks.delta_sink import DeltaSink, FrameBatch
from airflow_dblog.sinks.hadoop_folders import remove_unless_holding
from airflow_dblog.sinks.kafka_forwarder import KafkaForwarder
from airflow_dblog.sinks.kafka_sink import KafkaSink
from airflow_dblog.sinks.lake_checks import LakeChecks
from airflow_dblog.sources.base import TableSchema
from airflow_dblog.spark.chunk_jobs import SparkChunkRunner
from airflow_dblog.spark.delta_batches import spool_batch
from airflow_dblog.spark.delta_warm_up import warm_up
from airflow_dblog.spark.session import build_spark_session

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

log = logging.getLogger(__name__)

# How often Spark asks the spool for a batch; the source takes one only when it is due
# (changelog_source.batch_due: old enough, big enough, or completing a dump chunk)
DELTA_TRIGGER = "1 second"
QUERY_STARTS = 3  # Delta's query is started again twice after a Python worker's slow start
_SLOW_PYTHON_WORKER = "Python worker failed to connect back"
_BATCH_FILE = re.compile(r"\d+$")  # offsets/<batch id>; Spark's temporary files start with a dot
FORWARDED_IN_MEMORY = 50_000  # events of the newest segments (~30 MB); older ones: from disk
_DEFAULT_MASTER = object()


class BatchCommitter:
    """``foreachBatch`` of Delta's query: write the batch, then report the segments held.

    The batch's idempotence id is its last spool segment: segments are numbered on from the
    spool (a stream whose spool was deleted refuses to start), so a replayed batch, or one cut
    differently after ``<checkpoint>/spark`` was deleted, is recognised by the sink whatever
    Spark's batch ids.
    """

    def __init__(
        self,
        sink: Sink[FrameBatch],
        barrier: SinkBarrier,
        store: MetadataStore,
        spool: Spool,
        lake: ReadBack | None = None,
    ) -> None:
        """``lake``: the sink, read back after each batch for what the batch's chunks found it
        holding that the source lacks, and for verify chunks (:class:`LakeChecks`; None: not
        looked at)."""
        self.sink, self.barrier, self.store, self.spool = sink, barrier, store, spool
        self.checks = (
            None if lake is None else LakeChecks(lake, store, spool.chunks, spool.dump_keys)
        )
        # Spark reports a failed batch as a py4j traceback; the job reports this one line
        self.failure: DblogError | None = None

    def __call__(self, segments: DataFrame, batch_id: int) -> None:
        try:
            self._commit(segments, batch_id)
        except DblogError as err:
            self.failure = err
            raise

    def _commit(self, segments: DataFrame, batch_id: int) -> None:
        started = time.monotonic()
        self.store.check_fence()
        seqs = sorted(row["seq"] for row in segments.collect())  # a handful of numbers
        if not seqs:
            return
        footers, closed_refs, batch = spool_batch(segments.sparkSession, self.spool, seqs)
        if not footers:
            return
        count = sum(f["events"] for f in footers)
        first, last = min(f["seq"] for f in footers), max(f["seq"] for f in footers)
        if batch is not None:
            log.info(
                "%s batch %d: committing segments %d-%d, %d events",
                self.sink.name, batch_id, first, last, count,
            )  # fmt: skip
            self.sink.write(last, batch)
        written = time.monotonic()
        if self.checks is not None:
            self.checks.after_batch(closed_refs)
        checked = time.monotonic()
        committed = self.barrier.held(self.sink.name, footers)
        closed = sum(len(f["closed"]) for f in committed)
        if count or closed:
            log.info(
                "%s batch %d: segments %d-%d, %d events in %.1f s (written in %.1f s, checked in"
                " %.1f s); %d chunks completed",
                self.sink.name,
                batch_id,
                first,
                last,
                count,
                time.monotonic() - started,
                written - started,
                checked - written,
                closed,
            )


class Worker(threading.Thread):
    """A daemon thread running ``loop(stopping)``; its failure is kept for the main loop."""

    def __init__(self, name: str, loop: Callable[[threading.Event], None]) -> None:
        super().__init__(name=name, daemon=True)
        self.loop = loop
        self.stopping = threading.Event()
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            self.loop(self.stopping)
        except BaseException as err:  # surfaced by the main loop, which stops the job
            self.error = err


def run_stream(
    config: Config, master: Any = _DEFAULT_MASTER, stop: threading.Event | None = None
) -> int:
    """Run until SIGTERM/SIGINT (or ``stop``); a failure of any part stops the whole job.

    With ``ha`` configured, first wait as a standby until this process holds the leader lease.
    """
    stop = stop or threading.Event()
    _stop_on_signals(stop)
    store = MetadataStore(config.metadata_url)
    lease: LeaderLease | None = None
    with contextlib.ExitStack() as cleanup:  # undone in reverse: Spark, threads, sinks, lease
        if config.ha is not None:
            lease = LeaderLease(config.ha, config.name)
            cleanup.callback(lease.close)
            fence = lease.acquire(stop)
            if fence is None:
                return 0
            store.take_lead(fence, lease.identity)
        # the log position first: from here on every change is captured, and the bounds of
        # dumps already requested are read after it
        source = open_source(config)
        # Kafka's forwarder takes new segments from memory: nothing parsed, nothing encoded twice
        spool = Spool(
            join(config.checkpoint, "spool"),
            FORWARDED_IN_MEMORY if config.kafka else 0,
            conf=config.spark.conf,
        )
        # chunk SELECTs run as Spark jobs once Spark is up (worker processes without Spark)
        runner: LateRunner | ProcessChunkRunner
        runner = LateRunner() if config.delta is not None else ProcessChunkRunner(spool.chunks)
        capture = SpooledCapture(
            config, store, source, lambda offset: open_reader(config, offset), spool, runner=runner
        )
        cleanup.callback(capture.close)
        if isinstance(runner, ProcessChunkRunner):
            runner.warm_up(config.source.type, capture.executor.url)
        schemas = {table: source.describe(table) for table in config.source.tables}
        names = [name for name, on in (("delta", config.delta), ("kafka", config.kafka)) if on]
        barrier = SinkBarrier(names, capture.committed, spool.drop_before)
        threads = [Worker("dblog-capture", capture.run)]
        if config.kafka is not None:  # Kafka follows the spool at once, Spark or not
            kafka = KafkaSink(config.kafka, config.name, config.source.type, schemas)
            cleanup.callback(kafka.close)
            forwarder = KafkaForwarder(kafka, spool, barrier, store.check_fence)
            threads.append(Worker("dblog-kafka", forwarder.run))
            if config.kafka.signal_topic:
                capture.signals = SignalChannel(config, store)
        for thread in threads:
            thread.start()
        cleanup.callback(_stop_threads, threads)
        query: DeltaQuery | None = None
        if config.delta is not None:
            query = _start_delta_query(config, master, schemas, spool, barrier, store, cleanup)
            assert isinstance(runner, LateRunner)
            chunks = SparkChunkRunner(query.committer.spark, spool.chunks)
            chunks.warm_up(config.source.type, capture.executor.url)  # looked up once
            runner.runner = chunks
        log.info("stream %s running: %s -> %s", config.name, config.source.type, names)
        while not stop.is_set():
            if lease is not None:
                lease.check()
            for thread in threads:
                if thread.error is not None:
                    raise thread.error
                if not thread.is_alive():
                    raise DblogError(f"the {thread.name} thread stopped", "see the log for why")
            if query is None:
                stop.wait(1.0)
            elif query.terminated(1.0):
                break
    return 0


def _start_delta_query(
    config: Config,
    master: Any,
    schemas: Mapping[TableId, TableSchema],
    spool: Spool,
    barrier: SinkBarrier,
    store: MetadataStore,
    cleanup: contextlib.ExitStack,
) -> DeltaQuery:
    """Delta's Structured Streaming query over the spool (checkpoint: ``spark/delta``)."""
    from airflow_dblog.spark.changelog_source import NAME, ChangelogSource

    assert config.delta is not None
    spark = build_spark_session(
        f"dblog-{config.name}",
        master=config.spark.master if master is _DEFAULT_MASTER else master,
        extra_conf=config.spark.conf,
        paths=(config.checkpoint, config.delta.path),
    )
    cleanup.callback(spark.stop)
    spark.dataSource.register(ChangelogSource)
    describer = open_source(config)  # the Spark thread's own: sources are not thread-safe
    cleanup.callback(describer.close)
    # versions are spool segments; the plain app id held Spark batch ids (before 0.2)
    app_id = f"dblog-{config.name}/segments"
    token = store.fence.token if store.fence is not None else 0
    delta = DeltaSink(spark, config.delta, schemas, app_id, describer.describe, token)
    cleanup.callback(delta.close)
    delta.fence()  # a deposed leader's batch, even one under way, now commits nothing
    delta.create_tables()
    if config.delta.warm_up and schemas:  # the first table's shape stands for them all
        first = next(iter(schemas.values()))
        args = (spark, config.delta, first, config.checkpoint, config.spark.conf)
        # beside the query: a backlog after a restart is not held back by it
        threading.Thread(target=warm_up, args=args, name="dblog-delta-warm-up", daemon=True).start()
    committer = BatchCommitter(delta, barrier, store, spool, lake=delta)
    committer.spark = spark
    endpoint = {k: v for k, v in config.spark.conf.items() if k == S3_ENDPOINT}  # no secrets
    checkpoint = join(config.checkpoint, "spark", "delta")
    writer = (
        spark.readStream.format(NAME)
        .option("path", spool.location)
        .option("conf", json.dumps(endpoint))
        .option("wait_s", str(config.delta.batch_wait_s))
        .load()
        .writeStream.queryName(f"dblog-{config.name}-delta")
        .foreachBatch(committer)
        .option("checkpointLocation", checkpoint)
        .trigger(processingTime=DELTA_TRIGGER)
    )

    def start() -> Any:
        clear_unrecorded_offsets(spark, checkpoint)
        return writer.start()

    query = DeltaQuery(start, committer)
    cleanup.callback(query.stop)
    return query


def clear_unrecorded_offsets(spark: Any, checkpoint: str) -> None:
    """Remove what an interrupted first offsets write left in a query's checkpoint.

    Spark writes a batch's offsets to a hidden temporary file and then renames it; a kill
    between the two leaves the temporary file and no batch. With no batch recorded, Spark takes
    the checkpoint for a new query's and refuses to start unless ``offsets`` is empty, so the
    stream could never start again. Once one batch is recorded, nothing here is touched.
    """
    remove_unless_holding(spark, f"{checkpoint}/offsets", _BATCH_FILE, "an interrupted first write")


def _stop_threads(threads: Sequence[Worker]) -> None:
    for thread in threads:
        thread.stopping.set()
    for thread in threads:
        thread.join(timeout=30)


class DeltaQuery:
    """Delta's Structured Streaming query, started again when Spark gave up on its Python worker.

    Spark waits a fixed few seconds for the Python process behind the ``dblog_changelog``
    source to connect back; on a driver host busy enough (a JVM compiling beside other jobs) it
    gives up and the query fails before it has read anything. That is the host's moment, not
    the stream's fault: the query starts again from its checkpoint (what a restart of the whole
    job would do, without dropping the capture and Kafka's progress), a few times at most.
    """

    def __init__(
        self, start: Callable[[], Any], committer: BatchCommitter, starts: int = QUERY_STARTS
    ) -> None:
        self.start, self.committer, self.starts = start, committer, starts
        self.query = start()
        self.started = 1

    def terminated(self, wait_s: float) -> bool:
        """Whether the query ended; its failure as one line (Spark's message spans pages)."""
        from pyspark.errors import StreamingQueryException

        try:
            return bool(self.query.awaitTermination(wait_s))
        except StreamingQueryException as err:
            if self.committer.failure is not None:
                raise self.committer.failure from None
            text = str(err).strip()
            if _SLOW_PYTHON_WORKER in text and self.started < self.starts:
                self.started += 1
                log.warning(
                    "Spark's Python worker for the spool did not connect back in time (a busy"
                    " host); starting Delta's query again (start %d of %d)",
                    self.started,
                    self.starts,
                )
                self.query = self.start()
                return False
            first = text.splitlines()[0] if text else type(err).__name__
            raise DblogError(
                f"the Spark query failed: {first}", "see the job log for the cause"
            ) from None

    def stop(self) -> None:
        self.query.stop()


def _stop_on_signals(stop: threading.Event) -> None:
    if threading.current_thread() is not threading.main_thread():
        return
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
