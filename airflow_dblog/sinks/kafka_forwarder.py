"""Kafka's side of the stream: a driver thread sends each spool segment in a transaction.

Kafka is written by one transactional producer anyway (exactly once needs a single
``transactional.id``), so a Spark query in front of it only added a Spark batch per segment:
a second or more of CPU however small, which made Kafka's latency seconds and, on a small
machine, took the CPU the capture thread and Delta needed. The forwarder follows the spool as
the capture thread writes it, so Kafka's latency is a segment's (a fraction of a second) and
Kafka starts before Spark has. A dumped chunk's rows are read from its chunk file in batches
where the chunk stands among the events, so memory holds a batch of rows, not a chunk.

Idempotence is the sink's marker: a transaction carries its last segment, and a restarted
forwarder sends from the segment after the committed marker. It first reports the segments
the marker covers that are still on disk, since the crash may have come between Kafka's commit
and the report (:mod:`~airflow_dblog.engine.sink_barrier` needs every sink's word for a segment).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Iterator

from airflow_dblog.engine.chunk_file import ChunkRef
from airflow_dblog.engine.event_text import EventText
from airflow_dblog.engine.segment import Item
from airflow_dblog.engine.sink_barrier import SinkBarrier
from airflow_dblog.engine.spool import Spool
from airflow_dblog.sinks.kafka_sink import KafkaSink

log = logging.getLogger(__name__)

# One transaction takes at most this much spool (~50,000 events): a backlog goes in a few
# transactions, each well inside the transaction timeout, and a failure replays little
MAX_TRANSACTION_BYTES = 16 << 20
IDLE_WAIT_S = 0.5  # the spool's append wakes the forwarder; this only bounds a missed wake-up


class KafkaForwarder:
    def __init__(
        self,
        sink: KafkaSink,
        spool: Spool,
        barrier: SinkBarrier,
        check_fence: Callable[[], None],
    ) -> None:
        self.sink, self.spool, self.barrier, self.check_fence = sink, spool, barrier, check_fence

    def run(self, stopping: threading.Event) -> None:
        """Follow the spool until ``stopping`` is set; a failure raises (and stops the job)."""
        committed = self.sink.committed_segment()
        held = [seq for seq in self.spool.segments() if seq <= committed]
        if held:
            self.barrier.held(self.sink.name, [self.spool.footer(seq) for seq in held])
        while not stopping.is_set():
            self.spool.appended.clear()  # before listing: an append after it wakes us
            batch = self._next_batch(committed)
            if not batch:
                self.spool.appended.wait(IDLE_WAIT_S)
                continue
            self.send(batch)
            committed = batch[-1]

    def _next_batch(self, committed: int) -> list[int]:
        batch: list[int] = []
        taken = 0
        for seq, entry in self.spool.entries(after=committed).items():  # one listing
            taken += entry.size
            if batch and taken > MAX_TRANSACTION_BYTES:
                break
            batch.append(seq)
        return batch

    def send(self, batch: list[int]) -> None:
        """One transaction for these segments (none if they hold no event), then report them."""
        started = time.monotonic()
        segments = [self.spool.read(seq) for seq in batch]
        footers = [segment.footer for segment in segments]
        count = sum(f["events"] for f in footers)
        if count:  # heartbeats alone need no transaction: the next one moves the marker
            self.check_fence()  # a deposed leader must not write the new one's segments
            items = (item for segment in segments for item in segment.items)
            self.sink.write(batch[-1], map(self.sink.message, self._events(items)))
        committed = self.barrier.held(self.sink.name, footers)
        closed = sum(len(f["closed"]) for f in committed)
        if count or closed:
            log.info(
                "kafka: segments %d-%d, %d events in %.2f s; %d chunks completed",
                batch[0],
                batch[-1],
                count,
                time.monotonic() - started,
                closed,
            )

    def _events(self, items: Iterable[Item]) -> Iterator[EventText]:
        """The events in order, a chunk's rows read from its file where the chunk stands."""
        for item in items:
            if not isinstance(item, ChunkRef):
                yield item
            elif item.emitted:
                yield from item.texts(self.spool.chunks)
