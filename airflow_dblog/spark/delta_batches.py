"""Delta's batches as Spark reads them from the spool: segments (and the chunks they close)
into one :class:`~airflow_dblog.sinks.delta_sink.FrameBatch`, read by the executors."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, NamedTuple

from airflow_dblog.engine.chunk_file import ChunkRef
from airflow_dblog.engine.segment import EVENT_COLUMNS, Footer
from airflow_dblog.engine.segment import SPARK_DDL as SEGMENT_DDL
from airflow_dblog.engine.spool import (
    Spool,
    dump_bounds,
    logged_tables,
    row_bounds,
    sole_dump_spans,
)
from airflow_dblog.sinks.delta_sink import FrameBatch

if TYPE_CHECKING:
    from pyspark.sql import DataFrame


class SpoolBatch(NamedTuple):
    """Segments as one batch: their footers, the chunks they close, and the batch of their
    events and chunks' rows (None without events)."""

    footers: list[Footer]
    closed: list[ChunkRef]
    frame: FrameBatch | None


def spool_batch(spark: Any, spool: Spool, seqs: Sequence[int]) -> SpoolBatch:
    """The segments ``seqs`` as one batch. Footers and chunk references come from the spool's
    memory where this process wrote them, else from the files (an earlier run's segments)."""
    rows = segment_rows(spark, [spool.uri(seq) for seq in seqs])
    known = spool.outlines(seqs)
    unknown = [spool.uri(seq) for seq in seqs if seq not in known]
    footers, refs = _outlines(segment_rows(spark, unknown)) if unknown else ([], [])
    footers += [o.footer for o in known.values()]
    refs += [(seq, ref) for seq, o in known.items() for ref in o.refs]
    closed = [ref for _, ref in refs]
    if not sum(f["events"] for f in footers):
        return SpoolBatch(footers, closed, None)
    events = rows.where("kind = 'event'").select("seq", *EVENT_COLUMNS)
    logged = logged_tables(footers)
    frame = FrameBatch(
        events,
        sorted({table for f in footers for table in f["tables"]}),
        dump_bounds(footers),
        logged,
        row_bounds(footers),
        sole_dump_spans(closed, logged),
        [(seq, ref) for seq, ref in refs if ref.emitted],
        spool.chunks,
    )
    return SpoolBatch(footers, closed, frame)


def _outlines(rows: DataFrame) -> tuple[list[Footer], list[tuple[int, ChunkRef]]]:
    """The segments' footers and chunk references (with each one's segment), read by Spark."""
    footers, refs = [], []
    for r in rows.where("kind != 'event'").select("seq", "kind", "record").collect():
        if r["kind"] == "footer":
            footers.append(json.loads(r["record"]))
        else:
            refs.append((r["seq"], ChunkRef.from_record(json.loads(r["record"]))))
    return footers, refs


def segment_rows(spark: Any, uris: Sequence[str]) -> DataFrame:
    """The segments' rows (:mod:`~airflow_dblog.engine.segment`) and each one's ``seq``, read by
    the executors through Hadoop's filesystem (the session's s3a/abfs/gs settings), never from
    the driver's disk. Row order does not matter: the sinks order events by their positions."""
    from pyspark.sql import functions as F

    seq = F.regexp_extract(F.col("_metadata.file_name"), r"^(\d+)\.", 1).cast("long")
    return spark.read.schema(SEGMENT_DDL).parquet(*uris).withColumn("seq", seq)
