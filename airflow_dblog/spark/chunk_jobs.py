"""Chunk SELECTs as Spark jobs: each chunk is one task on an executor, its rows written by Spark.

The task opens its own connection to the source (kept by the Python worker for its next chunk),
runs the strategy's SELECT and hands the rows to Spark as Arrow batches (``mapInArrow``);
Spark writes them as Parquet into the chunk's folder under ``<checkpoint>/chunks`` through
Hadoop's filesystem with the session's settings, so the rows never pass through the driver and
no object-store credential travels in a task. What the driver needs back (row count, last key,
what the snapshot saw) comes through an accumulator. Up to ``parallelism`` chunks run at once,
one driver thread waiting on each job.

A stream's first Spark job of this shape is many times slower than the later ones (the JVM's
Arrow-to-Parquet path and a Python worker that imports the source's driver):
:meth:`SparkChunkRunner.warm_up` runs one without rows when the stream starts, so the first
dump's first rows do not wait for it.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

from pyspark.accumulators import AccumulatorParam

from airflow_dblog.engine.chunk_file import SPARK_DDL, ChunkFiles, ChunkSelected, encode_rows
from airflow_dblog.engine.chunk_runner import MAX_WORKERS
from airflow_dblog.engine.chunk_task import ChunkTask, prepare, run_task

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import SparkSession

log = logging.getLogger(__name__)


class _Selected(AccumulatorParam):  # type: ignore[type-arg]
    """Chunk id -> ChunkSelected; a retried task reports the same chunk again."""

    def zero(self, value: dict[int, ChunkSelected]) -> dict[int, ChunkSelected]:
        return {}

    def addInPlace(
        self, value1: dict[int, ChunkSelected], value2: dict[int, ChunkSelected]
    ) -> dict[int, ChunkSelected]:
        value1.update(value2)
        return value1


class SparkChunkRunner:
    ready = True

    def __init__(self, spark: SparkSession, files: ChunkFiles) -> None:
        self.spark, self.files = spark, files
        self._pool = ThreadPoolExecutor(MAX_WORKERS, thread_name_prefix="dblog-chunk")

    def submit(self, task: ChunkTask) -> Future[ChunkSelected]:
        return self._pool.submit(self._run, task)

    def _run(self, task: ChunkTask) -> ChunkSelected:
        sc = self.spark.sparkContext
        results: Any = sc.accumulator({}, _Selected())
        sc.setJobDescription(f"dblog chunk {task.table}#{task.chunk_id}")

        def select() -> pa.Table:
            table, selected = run_task(task)
            results.add({task.chunk_id: selected})
            return table

        self._write(select, task.folder)
        selected: ChunkSelected = results.value[task.chunk_id]
        return selected

    def _write(self, select: Callable[[], pa.Table], folder: str) -> None:
        """One task runs ``select`` on an executor; Spark writes its table into ``folder``."""

        def rows(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
            for _ in batches:  # read to its end, or the Python worker is not used again
                pass
            yield from select().to_batches()

        job = self.spark.range(0, 1, 1, 1).mapInArrow(rows, SPARK_DDL)
        job.write.mode("errorifexists").parquet(self.files.uri(folder))

    def warm_up(self, source_kind: str, url: str) -> Future[None]:
        """Run a chunk's job without rows, its worker connected to the source (in the
        background: a chunk sent meanwhile runs as it would have; a failure is only logged)."""
        return self._pool.submit(self._warm_up, source_kind, url)

    def _warm_up(self, source_kind: str, url: str) -> None:
        def empty() -> pa.Table:
            prepare(source_kind, url)
            return encode_rows(0, [])[0]

        folder = f"warm-up-{uuid.uuid4().hex[:12]}"  # a restart's sweep removes one left behind
        started = time.monotonic()
        self.spark.sparkContext.setJobDescription("dblog chunk runner warm-up")
        try:
            self._write(empty, folder)
            self.files.delete(folder)
        except Exception as err:  # the first chunk then starts cold, that is all
            first = (str(err).strip().splitlines() or [""])[0]
            log.info("chunk jobs not warmed up (%s: %s)", type(err).__name__, first)
            return
        log.info("chunk jobs warmed up in %.1f s", time.monotonic() - started)

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
