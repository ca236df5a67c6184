"""A rehearsal of a dump's Delta batches when the stream starts, on a scratch table.

A young JVM runs a plan many times slower than a warm one: it loads classes, generates and
compiles code for each operator, and interprets until the JIT has compiled the hot paths. A
stream is started once and asked for dumps later, yet its first dump's first batch would pay
all of that while the dump waits for it. So beside Delta's query as it starts, the stream runs
the batches a dump brings on a few rows of the first table's shape: a chunk's rows appended to
a table holding nothing, log events merged, then a chunk's rows and log events merged and the
range checked for keys the source lacks, read from a spool and chunk files of their own, in a
Spark session of its own (its transaction ids never reach the stream's). Everything goes under
``<checkpoint>/warm-up`` and is removed after; a failure is logged and the stream goes on cold.
"""

from __future__ import annotations

import datetime as dt
import decimal
import logging
import time
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from airflow_dblog.config import DeltaSinkConfig
from airflow_dblog.core.events import ChangeEvent
from airflow_dblog.core.keys import to_json
from airflow_dblog.core.position import Position
from airflow_dblog.engine.chunk_file import ChunkRef, encode_rows
from airflow_dblog.engine.spool import Spool
from airflow_dblog.engine.spool_store import join
from airflow_dblog.engine.typed_values import stored_columns
from airflow_dblog.sinks.delta_sink import DeltaSink, key_types
from airflow_dblog.sinks.hadoop_folders import remove
from airflow_dblog.sources.base import TableSchema
from airflow_dblog.spark.delta_batches import spool_batch

if TYPE_CHECKING:
    from collections.abc import Mapping

    from pyspark.sql import SparkSession
    from pyspark.sql.types import DataType

log = logging.getLogger(__name__)


def warm_up(
    spark: SparkSession,
    config: DeltaSinkConfig,
    schema: TableSchema,
    checkpoint: str,
    conf: Mapping[str, str],
) -> None:
    """Rehearse a dump's batches of ``schema``'s table under ``<checkpoint>/warm-up``."""
    scratch = join(checkpoint, "warm-up")
    started = time.monotonic()
    session = spark.newSession()
    session.sparkContext.setJobDescription("dblog Delta warm-up")
    try:
        remove(session, scratch)  # what a kill during an earlier warm-up left
        _rehearse(session, config, schema, scratch, conf)
        remove(session, scratch)
    except Exception as err:  # the first batch then runs cold, that is all
        first = (str(err).strip().splitlines() or [""])[0]
        log.info("Delta not warmed up (%s: %s)", type(err).__name__, first)
        return
    finally:
        session.sparkContext.setJobDescription(None)  # type: ignore[arg-type]
    log.info("Delta warmed up in %.1f s", time.monotonic() - started)


def _rehearse(
    spark: SparkSession,
    config: DeltaSinkConfig,
    schema: TableSchema,
    scratch: str,
    conf: Mapping[str, str],
) -> None:
    table = schema.table
    spool = Spool(join(scratch, "spool"), conf=conf)
    sink = DeltaSink(
        spark, replace(config, path=join(scratch, "delta")), {table: schema}, "warm-up"
    )
    sink.create_tables()
    types = key_types(schema)
    keys = [tuple(_sample(t, i) for t in types) for i in range(1, 6)]
    rows = {
        k: {c.name: None for c in schema.columns} | dict(zip(schema.key, k, strict=True))
        for k in keys
    }

    def event(op: str, i: int, at: int) -> ChangeEvent:
        row = rows[keys[i]]
        before, after = (row, None) if op == "d" else (None, row)
        return ChangeEvent(table, op, keys[i], Position((at, 0, 0)), before=before, after=after)  # type: ignore[arg-type]

    def chunk(chunk_id: int, picked: list[int], lower: int | None, at: int, last: bool) -> ChunkRef:
        folder = spool.chunks.new_folder(chunk_id)
        picks = [(keys[i], rows[keys[i]]) for i in picked]
        data, selected = encode_rows(chunk_id, picks, typed=stored_columns(schema.columns))
        spool.chunks.write(folder, data)
        window = str(Position((at + 1, 0, 0)))
        return ChunkRef(
            str(table), chunk_id, 1, folder, window, 0, selected.count, (), 0,
            key_span=selected.key_span, low=str(Position((at, 0, 0))),
            covers=[None if lower is None else to_json(keys[lower]), selected.last_key],
            beyond=window if last else "", typed=[list(c) for c in selected.typed],
        )  # fmt: skip

    # a first chunk alone into the table holding nothing (an append), log events (a MERGE, as
    # a stream's every batch), then a table's last chunk with log events in the range the
    # table holds (one MERGE of both); each checked as the stream does
    batches = [
        [chunk(1, [0, 1], None, 10, False)],
        [event("c", 2, 20), event("u", 0, 21), event("d", 1, 22)],
        [event("u", 0, 26), event("c", 4, 27), chunk(2, [2, 3, 4], 1, 30, True)],
    ]
    for items in batches:
        seq = spool.append(items, {})
        batch = spool_batch(spark, spool, [seq])
        assert batch.frame is not None
        sink.write(seq, batch.frame)
        sink.extra_keys(batch.closed, spool.chunks)


def _sample(target: DataType, i: int) -> Any:
    """A key value of the Spark type, the ``i``-th in its order."""
    from pyspark.sql import types as T

    if isinstance(target, T.DecimalType):
        return decimal.Decimal(i)
    if isinstance(target, T.DoubleType):
        return float(i)
    if isinstance(target, T.DateType):
        return dt.date(2000, 1, i)
    if isinstance(target, T.TimestampType):
        return dt.datetime(2000, 1, 1, 0, 0, i)
    if isinstance(target, T.BooleanType):
        return i % 2 == 0
    if isinstance(target, T.BinaryType):
        return bytes([i])
    if isinstance(target, T.LongType):
        return i
    return f"k{i}"
