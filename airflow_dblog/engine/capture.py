"""The capture loop: read the log, run chunks between reads, merge, hand the output on, commit.

One ``step`` is one batch: chunks whose SELECT is done are registered, the items the reader has
now are fed to the merge and the output is published (log events, and a
:class:`~airflow_dblog.engine.chunk_file.ChunkRef` where a closed chunk's rows belong; the rows
are in its chunk file); once it is durable downstream the reader offset is saved, chunks whose
rows it holds are completed, and only then is the source told it may free the log. A crash
between any two of these replays the batch: sinks are idempotent and refuse older positions,
and chunks not completed are selected again. New chunks are sent to the runner at the end of a
step; their SELECTs run while the next steps read the log.

:class:`SpooledCapture` is the streaming job's: the batch is written to the spool and the commit
(offset, chunks, acknowledgement) runs once every sink holds the segment (Delta's
``foreachBatch``, Kafka's forwarder). :class:`Capture` is the loop without the output.
"""

from __future__ import annotations

import collections
import logging
import threading
import time
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from typing import Any

from airflow_dblog.config import Config, DumpSettings
from airflow_dblog.core.events import ChangeEvent, LogItem
from airflow_dblog.core.keys import to_json
from airflow_dblog.core.merge import HISTORY_LIMIT, DumpedRows, WatermarkMerge, removed
from airflow_dblog.engine.chunk_executor import ChunkExecutor
from airflow_dblog.engine.chunk_file import ChunkFiles, ChunkRef, ChunkRows
from airflow_dblog.engine.chunk_runner import ChunkRunner, ThreadChunkRunner
from airflow_dblog.engine.lag import source_time_ms
from airflow_dblog.engine.metadata import MetadataStore
from airflow_dblog.engine.metadata.database import utcnow
from airflow_dblog.engine.signals import SignalChannel
from airflow_dblog.engine.spool import Spool
from airflow_dblog.engine.spool_store import join
from airflow_dblog.engine.watermarks import watermark_strategy
from airflow_dblog.errors import DblogError
from airflow_dblog.sources.base import ChangelogReader, Offset, Source, Wake

Published = ChangeEvent | ChunkRef

log = logging.getLogger(__name__)

CONTROLS_REFRESH_S = 1.0
# With no chunk to claim (no dump running), look for one at most this often: a busy log makes
# many small steps, and a metadata query in each held the log back
IDLE_CLAIM_S = 0.2
SEGMENT_S = 0.25  # a segment holds at most this much of the log...
SEGMENT_EVENTS = 5000  # ...or this many events
IDLE_SEGMENT_S = 1.0  # heartbeats alone: a segment a second
UNSELECTED_EVERY_S = 1.0  # a running dump's chunks left to select: one metadata read a second
# Dump rows in the spool that not every sink holds yet: beyond this many the next chunk waits,
# so a busy log and a dump share the sinks' throughput and neither starves. Two chunks' worth
# (x parallelism), and at least a few sink batches' worth: a sink's batch costs seconds however
# small, and a dump that waited for each batch before selecting more would crawl (a floor of
# 200,000 keeps several sink batches' worth of dumped rows in flight).
DUMP_ROWS_IN_FLIGHT_CHUNKS = 2
DUMP_ROWS_IN_FLIGHT_MIN = 200_000


@dataclass
class StepResult:
    items: int
    emitted: int
    chunks_started: int
    chunks_completed: int


class Capture:
    """The loop; a subclass publishes each step's output (:meth:`_publish`)."""

    def __init__(
        self,
        config: Config,
        store: MetadataStore,
        source: Source,
        reader: ChangelogReader,
        worker: str = "capture",
        batch_id: int = 0,
        resumed: bool | None = None,
        durable: Collection[int] = (),
        runner: ChunkRunner | None = None,
        files: ChunkFiles | None = None,
        chunk_folders: Collection[str] = (),
    ) -> None:
        """``resumed``: the reader continues a stream that emitted before (default: the store
        holds an offset); a new stream's first position is saved here, before anything else.
        ``durable``: chunks in flight whose rows are already downstream (not selected again).
        ``runner`` runs chunk SELECTs into ``files`` (default: driver threads, into
        ``<checkpoint>/chunks``); ``chunk_folders``: those the output still refers to (the
        others are of chunks that never closed, and are deleted)."""
        self.config, self.store, self.reader = config, store, reader
        self.files = files or ChunkFiles(join(config.checkpoint, "chunks"), config.spark.conf)
        self.runner = runner or ThreadChunkRunner(self.files)
        state = store.stream_state(config.name)
        if resumed is None:
            resumed = bool(state and state.source_offset)
        source.lineage_epoch = reader.lineage_epoch  # its positions follow the reader's history
        strategy = watermark_strategy(config.source.watermark, source, config.name)
        if not (state and state.source_offset):
            # a restart before the first commit begins here, and dump bounds are read after it
            store.save_stream_state(
                config.name,
                source_offset={"reader": reader.offset(), "batch_id": batch_id},
                heartbeat_at=utcnow(),
            )
        self.wake = Wake()
        self.merge = WatermarkMerge(
            history_limit=HISTORY_LIMIT if strategy.history else 0,
            unknown_past=strategy.unknown_past() if resumed and strategy.history else None,
        )
        self.executor = ChunkExecutor(
            source,
            store,
            self.merge,
            config.name,
            strategy,
            worker,
            self.runner,
            self.files,
            config.source.url,
            self.wake,
            typed=config.delta is not None,
        )
        self.batch_id = batch_id
        self.settings: DumpSettings = config.dump
        self._controls_at = 0.0
        self._last_chunk_at = 0.0
        self._nothing_to_claim_at = float("-inf")
        self._verify_modes: dict[int, str] = {}
        self.signals: SignalChannel | None = None  # Kafka signals, polled with the controls
        # the source time the log read so far stands for (engine/lag.py: seconds behind)
        self.source_ts_ms: int | None = None
        requeued = store.requeue_inflight(config.name, keep=durable)
        if requeued:
            log.info("restart: %d chunks in flight will be selected again", requeued)
        stale = self.files.delete_except(chunk_folders)
        if stale:
            log.info("restart: deleted %d chunk files of chunks that never closed", stale)

    def step(self, max_items: int = 5000, timeout_s: float = 0.2) -> StepResult:
        self._refresh_controls()
        self.wake.clear()  # a SELECT that ends from here on ends the read's wait
        # the next chunk's SELECT first, then the work that closes the ended one's window
        started = self._start_chunks() if self.executor.selects_ended() else 0
        self.executor.poll()
        items: list[LogItem] = self.reader.read(max_items, timeout_s, self.wake)
        self.source_ts_ms = source_time_ms(items, int(time.time() * 1000), self.source_ts_ms)
        output: list[Published] = []
        for item in items:
            for out in self.merge.feed(item):
                if isinstance(out, DumpedRows):
                    ref = self._placed(out)
                    output.append(ref)
                    if out.deleted and not ref.verify:
                        output.extend(removed(out, self.executor.key_columns(out.table)))
                else:
                    output.append(out)
        if output or items:
            self.batch_id += 1
            self._publish(output, items)
        started += self._start_chunks()
        refs = [o for o in output if isinstance(o, ChunkRef)]
        emitted = len(output) - len(refs) + sum(r.emitted for r in refs)
        return StepResult(len(items), emitted, started, len(refs))

    def _placed(self, dumped: DumpedRows) -> ChunkRef:
        """A closed chunk as the spool holds it: which of its file's rows the window dropped."""
        rows: ChunkRows = dumped.rows
        folder, drops = rows.folder, self.files.dropped(rows.folder, dumped.changed)
        if not dumped.selected:
            self.files.delete(folder)  # nothing to read back
            folder = ""
        low = str(dumped.low if dumped.low is not None else dumped.position)
        covers, beyond = rows.covers, ""
        if covers is not None and covers.last:
            bound = covers.bound_position
            beyond = low if bound is None else min(low, bound)
        verify = self._verify_mode(dumped.dump_id)
        return ChunkRef(
            str(dumped.table),
            dumped.chunk_id,
            dumped.dump_id,
            folder,
            str(dumped.position),
            dumped.first_index,
            dumped.selected,
            drops,
            dumped.ts_ms,
            rows.key_span,
            deleted=0 if verify else len(dumped.deleted),
            low=low if covers is not None else "",
            covers=None if covers is None else [covers.lower, covers.upper],
            beyond=beyond,
            verify=verify,
            absent=[to_json(k) for k in dumped.deleted] if verify else [],
            typed=[list(c) for c in rows.typed],
        )

    def _verify_mode(self, dump_id: int) -> str:
        """The dump's verify mode ("": an ordinary dump), asked once per dump.

        A stream without a Delta table has nothing to compare a verify chunk with (the planner
        refuses, but the config may have changed since): the dump fails rather than end done
        with nothing compared, and its chunks still write nothing."""
        if dump_id not in self._verify_modes:
            mode = self.store.verify_mode(dump_id) or ""
            if mode and self.config.delta is None:
                self.store.fail(
                    dump_id,
                    "verify compares chunks with the Delta tables, and this stream has no"
                    " sinks.delta",
                )
            self._verify_modes[dump_id] = mode
        return self._verify_modes[dump_id]

    def _publish(self, output: list[Published], items: list[LogItem]) -> None:
        """Hand one step's output on; commit (:meth:`_record_commit`) once it is durable."""
        raise NotImplementedError

    def _record_commit(
        self,
        source_offset: dict[str, Any],
        position: str | None,
        had_events: bool,
        closed: Sequence[dict[str, Any]],
        source_ts_ms: int | None = None,
    ) -> None:
        """The sinks hold the batch: where the log stands and its chunks done, in one write.

        ``source_ts_ms``: the source time that position stands for (:attr:`source_ts_ms`).
        """
        self.store.record_commit(
            self.config.name,
            closed,
            source_offset=source_offset,
            position=position,
            heartbeat_at=utcnow(),
            **({"last_event_at": utcnow()} if had_events else {}),
            **({"source_ts_ms": source_ts_ms} if source_ts_ms is not None else {}),
        )

    def _start_chunks(self) -> int:
        """Run chunks up to the parallelism, honouring the delay between chunks."""
        settings = self.settings
        now = time.monotonic()
        if now - self._last_chunk_at < settings.delay_ms / 1000:
            return 0
        if now - self._nothing_to_claim_at < IDLE_CLAIM_S:
            return 0
        started = 0
        while self.executor.has_room(settings.parallelism) and self.executor.ready():
            chunk = self.executor.claim(settings.chunk_size)
            if chunk is None:
                self._nothing_to_claim_at = time.monotonic()
                return started
            self.executor.start(chunk, settings.chunk_size)
            self._last_chunk_at = time.monotonic()
            started += 1
            if settings.delay_ms:
                break
        if self.executor.in_flight and not self.executor.claim_ahead(settings.chunk_size):
            self._nothing_to_claim_at = time.monotonic()
        return started

    def _refresh_controls(self) -> None:
        now = time.monotonic()
        if now - self._controls_at >= CONTROLS_REFRESH_S:
            if self.signals is not None:
                self.signals.poll()
            self.settings = self.store.controls(self.config.name, self.config.dump)
            self.executor.refresh_horizon()
            self._controls_at = now
            for dump in self.store.dumps(self.config.name, ("cancelled",)):
                self.executor.cancel_dump(dump.id)

    def close(self) -> None:
        self.executor.close()
        self.runner.close()
        if self.signals is not None:
            self.signals.close()
        self.reader.close()
        self.wake.close()


class SpooledCapture(Capture):
    """The capture loop of the Spark job: batches go to the spool, Spark commits them.

    Chunks are completed and the source is acknowledged by :meth:`committed`, which the Spark
    batch calls once every sink holds the segments; the reader is only touched on this loop's
    thread. After a restart the reader continues after the last segment written (Spark has yet
    to commit it, or already did), and chunks closed in a segment still on disk are not selected
    again: their rows are in it.
    """

    def __init__(
        self,
        config: Config,
        store: MetadataStore,
        source: Source,
        reader_factory: Callable[[Offset | None], ChangelogReader],
        spool: Spool,
        worker: str = "stream",
        runner: ChunkRunner | None = None,
    ) -> None:
        converted = spool.convert_legacy()
        if converted:
            log.info("%d JSON-lines spool segments rewritten as Parquet", converted)
        seqs = spool.segments()
        spool.continue_after(seqs[-1] if seqs else None)
        footers = [spool.footer(seq) for seq in seqs]
        state = store.stream_state(config.name)
        saved = (state.source_offset or {}) if state else {}
        last = footers[-1] if footers else saved
        if not seqs and "segment" in saved:
            # sinks key batches by segment number: numbering again from 0 would skip batches
            raise DblogError(
                f"{spool.location} holds no segment but stream {config.name} committed segment"
                f" {saved['segment']}: the checkpoint was deleted, and the sinks may hold"
                " segments numbered after it",
                "restore the checkpoint directory (deleting only <checkpoint>/spark is safe),"
                " or start a new stream (new name, Delta path, topic prefix) with a full dump",
            )
        super().__init__(
            config,
            store,
            source,
            reader_factory(last.get("reader")),
            worker,
            int(last.get("batch_id", 0)),
            resumed=bool(footers or saved),
            # chunks closed in a segment still on disk: their rows are in it
            durable={c["chunk_id"] for f in footers for c in f["closed"]},
            runner=runner,
            files=spool.chunks,
            chunk_folders=[folder for f in footers for folder in f.get("chunk_folders", ())],
        )
        self.spool = spool
        self._ack_lock = threading.Lock()
        self._ack: Offset | None = None
        self._spooled_at = 0.0
        # dump rows per segment that not every sink holds yet (the dump's share of the backlog)
        self._dump_in_flight: collections.deque[tuple[int, int]] = collections.deque()
        self._pending: list[Published] = []
        self._pending_position: str | None = None
        self._unselected, self._unselected_at = 0, -UNSELECTED_EVERY_S

    def _start_chunks(self) -> int:
        settings = self.settings
        budget = max(
            DUMP_ROWS_IN_FLIGHT_MIN,
            DUMP_ROWS_IN_FLIGHT_CHUNKS * settings.chunk_size * settings.parallelism,
        )
        with self._ack_lock:
            in_flight = sum(rows for _, rows in self._dump_in_flight)
        if in_flight >= budget:
            return 0  # the sinks have not caught up with the dump's last chunks: log first
        return super()._start_chunks()

    def run(self, stopping: threading.Event) -> None:
        """Step until ``stopping`` is set (the stream job's capture thread)."""
        while not stopping.is_set():
            self.step(timeout_s=0.2)

    def step(self, max_items: int = 5000, timeout_s: float = 0.2) -> StepResult:
        with self._ack_lock:
            ack, self._ack = self._ack, None
        if ack is not None:
            self.reader.acknowledge(ack)
        return super().step(max_items, timeout_s)

    def _publish(self, output: list[Published], items: list[LogItem]) -> None:
        """Buffer the step; write a segment when it is big or old enough.

        A busy log gives many small reads; one file per read would cost an fsync each and give
        Spark thousands of tiny segments. Until it is written, a crash just reads it again.
        """
        self._pending.extend(output)
        if items:
            self._pending_position = str(items[-1].position)
        now = time.monotonic()
        age = now - self._spooled_at
        has_data = bool(self._pending)
        if len(self._pending) < SEGMENT_EVENTS and age < (
            SEGMENT_S if has_data else IDLE_SEGMENT_S
        ):
            return
        self._spooled_at = now
        self.store.check_fence()  # a deposed leader must not add to the new one's spool
        refs = [r for r in self._pending if isinstance(r, ChunkRef)]
        dumped = sum(r.emitted for r in refs)
        seq = self.spool.append(
            self._pending,
            {
                "batch_id": self.batch_id,
                "reader": self.reader.offset(),
                "position": self._pending_position,
                "source_ts_ms": self.source_ts_ms,
                "closed": [r.closed_record() for r in refs],
                # chunks selected or with a window open, and those of running dumps not
                # selected yet: Delta's next batch may wait for them
                "selecting": self.executor.busy(),
                "unselected": self._chunks_to_select(now),
            },
        )
        self._pending = []
        if dumped:
            with self._ack_lock:
                self._dump_in_flight.append((seq, dumped))

    def _chunks_to_select(self, now: float) -> int:
        """The running dumps' chunks not selected yet, read again at most every
        :data:`UNSELECTED_EVERY_S` while a chunk is being selected."""
        if not self.executor.busy():
            return 0
        if now - self._unselected_at >= UNSELECTED_EVERY_S:
            self._unselected = self.store.chunks_to_select(self.config.name)
            self._unselected_at = now
        return self._unselected

    def committed(self, footers: Sequence[dict[str, Any]]) -> None:
        """Every sink holds these segments: complete their chunks, save and free the log."""
        if not footers:
            return
        last = max(footers, key=lambda f: f["seq"])
        positions = [f["position"] for f in footers if f["position"]]
        times = [f["source_ts_ms"] for f in footers if f.get("source_ts_ms") is not None]
        self._record_commit(
            {"reader": last["reader"], "batch_id": last["batch_id"], "segment": last["seq"]},
            max(positions) if positions else None,
            any(f["events"] for f in footers),
            [c for f in footers for c in f["closed"]],
            max(times) if times else None,
        )
        with self._ack_lock:
            self._ack = last["reader"]
            while self._dump_in_flight and self._dump_in_flight[0][0] <= last["seq"]:
                self._dump_in_flight.popleft()
