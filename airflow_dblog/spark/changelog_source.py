"""The stream's Spark source: the spool's segment numbers, as a PySpark Python data source.

An offset is ``{"segment": N}``: everything before segment N. The planning side (on the driver)
lists the spool through :mod:`~airflow_dblog.engine.spool_store`; a batch's rows are only its
segment numbers, so ``read()``, which Spark runs on executors, touches no file at all. The
batch's ``foreachBatch`` reads the segments themselves with ``spark.read.parquet`` (Hadoop's
filesystem, with the session's object-store settings) on the executors
(:func:`~airflow_dblog.spark.delta_batches.segment_rows`). Offsets are plain segment numbers and
segments are immutable, so a batch Spark re-plans after a crash reads exactly the same rows.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator, Sequence
from typing import Any, NamedTuple

from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition
from pyspark.sql.types import LongType, StructField, StructType

from airflow_dblog.engine.spool import Spool

NAME = "dblog_changelog"

SEGMENTS = StructType([StructField("seq", LongType(), False)])

# A backlog is taken in bites of this much spool (~150,000 events): memory stays bounded, and
# a sink with a high cost per batch (Delta's MERGE) catches up with bigger batches, not more
MAX_BATCH_BYTES = 48 << 20
# A batch of at least this many events goes without waiting for its age: a MERGE of 5,000 rows
# costs about what one of 10 does, so waiting for more gains little ...
FULL_BATCH_EVENTS = 5000
# ... once the log paused this long (no newer segment): a burst still arriving is one MERGE, not
# one at 5,000 events and another for the rest (one MERGE costs less than two)
QUIET_S = 1.0
# A due batch waits while a dump's chunk is selected or its window is open (the newest segment
# says so), as long as the last batch took and at least this long: a chunk that closes just after
# a batch starts waits for that batch to end and then for a batch of its own, so waiting up to
# one batch's time for it costs its rows nothing and saves a batch's fixed cost. A batch already
# holding FULL_BATCH_EVENTS log events waits only this long: under a heavy log each such wait
# makes the next batch bigger and slower, and the wait after it longer, until the log outruns Delta
CHUNK_WAIT_S = 1.0
# ... and longer while the dump's last chunks are due (at the pace its chunks closed at in the
# pending segments) before the longest wait runs out: this many times a batch's time, and at
# least DUMP_END_S. A batch before them costs the dump's end time rather than saving it: they
# would wait for it and then make a batch of their own, and on a small machine it takes cores
# from their SELECTs; a dump due within DUMP_END_S commits once, at its end
DUMP_END_WAITS = 3
DUMP_END_S = 10.0
# A batch waiting for a chunk looks again every FOLLOW_EVERY_S for this long within one call,
# under the trigger's second: it starts when the chunk lands, not at the next trigger
FOLLOW_S = 0.8
FOLLOW_EVERY_S = 0.1
# Segments of heartbeats alone (an idle log) wait at least this long for a batch: they only move
# the committed offset
IDLE_BATCH_S = 5.0


class _Counts(NamedTuple):
    """What a batch's timing needs of a segment's footer."""

    events: int
    dumped: int  # of the events, rows of dump chunks
    closed: int  # chunks it closes
    selecting: int  # chunks being selected when it was written
    unselected: int  # chunks of running dumps not selected yet then (an estimate)


class SegmentPartition(InputPartition):
    """A batch's segment numbers (all of them: reading the files is Spark's own job)."""

    def __init__(self, seqs: list[int]) -> None:
        super().__init__(tuple(seqs))
        self.seqs = seqs


def batch_due(age_s: float, quiet_s: float, events: int, closes_chunk: bool, wait_s: float) -> bool:
    """Whether the pending segments make a batch now (``age_s``: of the oldest, ``quiet_s``:
    since the newest was written).

    Each Delta batch costs seconds of CPU however small (a MERGE's fixed work), so on a quiet
    log a batch every second would keep most of a small machine's cores busy for a few events
    a second. A batch
    waits until its oldest segment is ``wait_s`` old, unless it is big enough to be worth its
    cost and the log paused, or it completes a dump chunk (a dump waits for its chunks to be
    held, not for the clock).
    """
    if closes_chunk or (events >= FULL_BATCH_EVENTS and quiet_s >= QUIET_S):
        return True
    return age_s >= (wait_s if events else max(wait_s, IDLE_BATCH_S))


class ChangelogStreamReader(DataSourceStreamReader):
    def __init__(
        self, directory: str, conf: dict[str, str] | None = None, wait_s: float = 0.0
    ) -> None:
        self.directory, self.conf, self.wait_s = directory, conf or {}, wait_s
        # from each pending segment's footer, read once
        self._footer_counts: dict[int, _Counts] = {}
        # (first segment, since when) of a batch waiting for a chunk being selected
        self._waiting: tuple[int, float] | None = None
        # when the last batch was handed to Spark, until the next call (Spark asks again once
        # that batch is written), and how long the last batch took from there
        self._handed_at: float | None = None
        self._last_batch_s = 0.0

    def _spool(self) -> Spool:
        return Spool(self.directory, conf=self.conf)

    def initialOffset(self) -> dict[str, Any]:
        seqs = self._spool().segments()
        return {"segment": seqs[0] if seqs else 0}

    def latestOffset(self, start: dict[str, Any] | None = None, limit: Any = None) -> dict:
        spool = self._spool()
        if start is None:
            seqs = spool.segments()
            return {"segment": seqs[-1] + 1 if seqs else 0}
        offset, waiting = self._latest(spool, start)
        for _ in range(round(FOLLOW_S / FOLLOW_EVERY_S)):
            if not waiting:
                break
            time.sleep(FOLLOW_EVERY_S)
            offset, waiting = self._latest(spool, start)
        return offset

    def _latest(self, spool: Spool, start: dict[str, Any]) -> tuple[dict[str, Any], bool]:
        """The end of the next batch from ``start`` (``start`` itself: none yet), and whether
        it waits for a chunk being selected."""
        now = time.time()
        if self._handed_at is not None:
            self._last_batch_s, self._handed_at = now - self._handed_at, None
        first = int(start["segment"])
        entries = spool.entries(after=first - 1)  # one listing: sizes and times come with it
        taken: list[int] = []
        size = 0
        for seq in entries:
            size += entries[seq].size
            if size > MAX_BATCH_BYTES and taken:  # at least one segment, however big
                break
            taken.append(seq)
        if not taken:
            return {"segment": first}, False
        if len(taken) < len(entries):  # a backlog's full bite: due, whatever its events
            return self._hand(taken[-1] + 1, now), False
        self._footer_counts = {seq: o for seq, o in self._footer_counts.items() if seq >= first}
        age, quiet = now - entries[taken[0]].mtime, now - entries[taken[-1]].mtime
        events, closes = 0, False
        for seq in taken:  # footers only until the batch is due (a GET each on S3)
            if batch_due(age, quiet, events, closes, self.wait_s):
                break
            counts = self._counts(spool, seq)
            events += counts.events
            closes = closes or bool(counts.closed)
        if not batch_due(age, quiet, events, closes, self.wait_s):
            return {"segment": first}, False
        if self._waits_for_chunk(spool, first, {seq: entries[seq].mtime for seq in taken}, now):
            return {"segment": first}, True
        return self._hand(taken[-1] + 1, now), False

    def _hand(self, end: int, now: float) -> dict[str, Any]:
        self._handed_at = now
        return {"segment": end}

    def _counts(self, spool: Spool, seq: int) -> _Counts:
        if seq not in self._footer_counts:
            footer = spool.footer(seq)
            self._footer_counts[seq] = _Counts(
                footer["events"],
                footer.get("dumped", 0),
                len(footer["closed"]),
                footer.get("selecting", 0),
                footer.get("unselected", 0),
            )
        return self._footer_counts[seq]

    def _waits_for_chunk(
        self, spool: Spool, first: int, written: dict[int, float], now: float
    ) -> bool:
        """Whether the batch from ``first`` (``written``: its segments' times) waits for a
        chunk the newest segment says is being selected: from the first time it was due, as
        long as the last batch took (at least :data:`CHUNK_WAIT_S`; only that while it holds
        :data:`FULL_BATCH_EVENTS` log events), or longer while the dump's end is due before
        the longest wait (:data:`DUMP_END_WAITS`, :data:`DUMP_END_S`) runs out."""
        newest = self._counts(spool, max(written))
        if not newest.selecting:
            return False
        if self._waiting is None or self._waiting[0] != first:
            self._waiting = (first, now)
        waited, budget = now - self._waiting[1], CHUNK_WAIT_S
        if waited < budget:
            return True
        counts = [self._counts(spool, seq) for seq in written]
        if sum(c.events - c.dumped for c in counts) < FULL_BATCH_EVENTS:
            budget = max(budget, self._last_batch_s)
            if waited < budget:
                return True
        longest = max(DUMP_END_WAITS * budget, DUMP_END_S)
        if waited >= longest:
            return False
        by_seq = sorted(zip(written, counts, strict=True))
        closes = [(written[seq], c.closed) for seq, c in by_seq if c.closed]
        # the pace of the later half: a dump's first chunks are slower (the short first one,
        # then the first full chunk's cut) and do not say when its last ones close
        recent = closes[len(closes) // 2 :] if len(closes) > 2 else closes
        after_first = sum(n for _, n in recent[1:])
        if not after_first:
            return False  # no pace to judge by
        pace = (recent[-1][0] - recent[0][0]) / after_first
        return (newest.selecting + newest.unselected) * pace < longest - waited

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> Sequence[InputPartition]:
        first, stop = int(start["segment"]), int(end["segment"])
        seqs = [seq for seq in self._spool().segments() if first <= seq < stop]
        return [SegmentPartition(seqs)] if seqs else []

    def read(self, partition: InputPartition) -> Iterator[tuple[int]]:
        """On an executor: the numbers only, no file (the spool may be the driver's disk)."""
        assert isinstance(partition, SegmentPartition)
        for seq in partition.seqs:
            yield (seq,)

    def commit(self, end: dict[str, Any]) -> None:
        """Spark committed up to ``end``; the batch committer deletes old segments itself."""


class ChangelogSource(DataSource):
    """``spark.readStream.format("dblog_changelog").option("path", <spool dir or URI>)``, and
    ``option("conf", <JSON of the stream's spark.conf filesystem settings>)`` for the store's
    endpoint (credentials: the driver's environment), ``option("wait_s", seconds)``: how long a
    small batch waits for more (:func:`batch_due`)."""

    @classmethod
    def name(cls) -> str:
        return NAME

    def schema(self) -> StructType:
        return SEGMENTS

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        directory = self.options.get("path")
        if not directory:
            raise ValueError("the dblog_changelog source needs option path (the spool directory)")
        conf = json.loads(self.options.get("conf") or "{}")
        return ChangelogStreamReader(directory, conf, float(self.options.get("wait_s") or 0))
