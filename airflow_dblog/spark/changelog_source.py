"""The stream's Spark source: the spool's segments as a PySpark Python data source.

An offset is ``{"segment": N}``: everything before segment N. A micro-batch's segments are
split into a few input partitions, read by Python workers as raw JSON lines (``seq``,
``footer``, ``line``); Spark parses the lines itself (``from_json``) on the executors. Offsets are
plain segment numbers and segments are immutable, so a batch Spark re-plans after a crash reads
exactly the same lines.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from typing import Any

from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition
from pyspark.sql.types import BooleanType, LongType, StringType, StructField, StructType

from airflow_dblog.engine.spool import Spool, is_footer

NAME = "dblog_changelog"

LINES = StructType(
    [
        StructField("seq", LongType(), False),
        StructField("footer", BooleanType(), False),
        StructField("line", StringType(), False),
    ]
)


MAX_PARTITIONS = 4  # a batch's segments are split into at most this many Spark tasks
PARTITION_BYTES = 8 << 20  # ...of about this much spool each: a small batch is one task
# A backlog is taken in bites of this much spool (~150,000 events): memory stays bounded, and
# a sink with a high cost per batch (Delta's MERGE) catches up with bigger batches, not more
MAX_BATCH_BYTES = 48 << 20
# Segments of heartbeats alone (an idle log) wait this long for a batch: each batch costs Spark
# about a second of CPU, and they only move the committed offset
IDLE_BATCH_S = 5.0


class SegmentPartition(InputPartition):
    """Consecutive segments, read by one task."""

    def __init__(self, directory: str, seqs: list[int]) -> None:
        super().__init__(tuple(seqs))
        self.directory, self.seqs = directory, seqs


class ChangelogStreamReader(DataSourceStreamReader):
    def __init__(self, directory: str) -> None:
        self.directory = directory

    def initialOffset(self) -> dict[str, Any]:
        seqs = Spool(self.directory).segments()
        return {"segment": seqs[0] if seqs else 0}

    def latestOffset(self, start: dict[str, Any] | None = None, limit: Any = None) -> dict:
        spool = Spool(self.directory)
        seqs = spool.segments()
        if start is None or not seqs:
            return {"segment": seqs[-1] + 1 if seqs else 0}
        first = int(start["segment"])
        taken: list[int] = []
        size = 0
        for seq in (seq for seq in seqs if seq >= first):
            size += spool.size(seq)
            if size > MAX_BATCH_BYTES and taken:  # at least one segment, however big
                break
            taken.append(seq)
        if not taken or _fresh_heartbeats(spool, taken):
            return {"segment": first}
        return {"segment": taken[-1] + 1}

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> Sequence[InputPartition]:
        first, stop = int(start["segment"]), int(end["segment"])
        spool = Spool(self.directory)
        seqs = [seq for seq in spool.segments() if first <= seq < stop]
        total = sum(spool.size(seq) for seq in seqs)
        tasks = min(MAX_PARTITIONS, len(seqs), 1 + total // PARTITION_BYTES)
        size = max(1, -(-len(seqs) // max(1, tasks)))  # ceiling division
        return [
            SegmentPartition(self.directory, seqs[i : i + size]) for i in range(0, len(seqs), size)
        ]

    def read(self, partition: InputPartition) -> Iterator[tuple[int, bool, str]]:
        assert isinstance(partition, SegmentPartition)
        spool = Spool(partition.directory)
        for seq in partition.seqs:
            for line in spool.lines(seq):
                yield seq, is_footer(line), line

    def commit(self, end: dict[str, Any]) -> None:
        """Spark committed up to ``end``; the batch committer deletes old segments itself."""


def _fresh_heartbeats(spool: Spool, seqs: Sequence[int]) -> bool:
    """The segments hold heartbeats only, the oldest written less than IDLE_BATCH_S ago."""
    age = time.time() - spool.path(seqs[0]).stat().st_mtime
    return age < IDLE_BATCH_S and all(spool.heartbeat_only(seq) for seq in seqs)


class ChangelogSource(DataSource):
    """``spark.readStream.format("dblog_changelog").option("path", <spool dir>)``."""

    @classmethod
    def name(cls) -> str:
        return NAME

    def schema(self) -> StructType:
        return LINES

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        directory = self.options.get("path")
        if not directory:
            raise ValueError("the dblog_changelog source needs option path (the spool directory)")
        return ChangelogStreamReader(directory)
