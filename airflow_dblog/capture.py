"""The capture loop without Spark: read the log, run chunks between reads, merge, write, commit.

One ``step`` is one batch: the items the reader has now are fed to the merge, the output is
written through every sink under one batch id, then the reader offset is saved, chunks whose
rows every sink holds are completed, and only then is the source told it may free the log. A
crash between any two of these replays the batch: sinks are idempotent per batch id and refuse
older positions, and chunks not completed are selected again.

The Spark job runs the same steps inside ``foreachBatch``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass

from airflow_dblog.chunk_executor import ChunkExecutor
from airflow_dblog.config import Config, DumpSettings
from airflow_dblog.events import ChangeEvent, LogItem
from airflow_dblog.merge import WatermarkMerge
from airflow_dblog.metadata import MetadataStore
from airflow_dblog.metadata.store import utcnow
from airflow_dblog.sinks.base import Sink
from airflow_dblog.sources.base import ChangelogReader, Source

log = logging.getLogger(__name__)

CONTROLS_REFRESH_S = 1.0


@dataclass
class StepResult:
    items: int
    emitted: int
    chunks_started: int
    chunks_completed: int


class Capture:
    def __init__(
        self,
        config: Config,
        store: MetadataStore,
        source: Source,
        reader: ChangelogReader,
        sinks: Sequence[Sink],
        worker: str = "capture",
        batch_id: int = 0,
    ) -> None:
        self.config, self.store, self.reader, self.sinks = config, store, reader, list(sinks)
        self.merge = WatermarkMerge()
        self.executor = ChunkExecutor(
            source, store, self.merge, config.name, config.source.watermark, worker
        )
        self.batch_id = batch_id
        self.settings: DumpSettings = config.dump
        self._controls_at = 0.0
        self._last_chunk_at = 0.0
        requeued = store.requeue_inflight(config.name)
        if requeued:
            log.info("restart: %d chunks in flight will be selected again", requeued)

    def step(self, max_items: int = 5000, timeout_s: float = 0.2) -> StepResult:
        self._refresh_controls()
        items: list[LogItem] = self.reader.read(max_items, timeout_s)
        output: list[ChangeEvent] = []
        for item in items:
            output.extend(self.merge.feed(item))
        closed = self.merge.pop_closed()
        if output or closed or items:
            self.batch_id += 1
            for sink in self.sinks:
                sink.write(self.batch_id, output)
            offset = self.reader.offset()
            self.store.save_stream_state(
                self.config.name,
                source_offset={"reader": offset, "batch_id": self.batch_id},
                position=str(items[-1].position) if items else None,
                heartbeat_at=utcnow(),
                **({"last_event_at": utcnow()} if output else {}),
            )
            for c in closed:
                self.store.complete_chunk(c.chunk_id, c.selected, c.dropped, c.emitted)
            self.reader.acknowledge(offset)
        started = self._start_chunks()
        return StepResult(len(items), len(output), started, len(closed))

    def _start_chunks(self) -> int:
        """Run chunks up to the parallelism, honouring the delay between chunks."""
        settings = self.settings
        if time.monotonic() - self._last_chunk_at < settings.delay_ms / 1000:
            return 0
        started = 0
        while self.merge.open_count() < settings.parallelism:
            chunk = self.executor.claim(settings.chunk_size)
            if chunk is None:
                break
            self.executor.run(chunk, settings.chunk_size)
            self._last_chunk_at = time.monotonic()
            started += 1
            if settings.delay_ms:
                break
        return started

    def _refresh_controls(self) -> None:
        now = time.monotonic()
        if now - self._controls_at >= CONTROLS_REFRESH_S:
            self.settings = self.store.controls(self.config.name, self.config.dump)
            self._controls_at = now
            for dump in self.store.dumps(self.config.name, ("cancelled",)):
                self.merge.cancel_dump(dump.id)

    def close(self) -> None:
        self.reader.close()
        for sink in self.sinks:
            sink.close()
