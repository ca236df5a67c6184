"""Chunk SELECTs as Spark jobs: each chunk is one task on an executor, its rows written by Spark.

The task opens its own connection to the source (kept by the Python worker for its next chunk),
runs the strategy's SELECT and hands the rows to Spark as Arrow batches (``mapInArrow``);
Spark writes them as Parquet into the chunk's folder under ``<checkpoint>/chunks`` through
Hadoop's filesystem with the session's settings, so the rows never pass through the driver and
no object-store credential travels in a task. What the driver needs back (row count, last key,
what the snapshot saw) comes through an accumulator. Up to ``parallelism`` chunks run at once,
one driver thread waiting on each job.
"""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

from pyspark.accumulators import AccumulatorParam

from airflow_dblog.engine.chunk_file import SPARK_DDL, ChunkFiles, ChunkSelected
from airflow_dblog.engine.chunk_runner import MAX_THREADS
from airflow_dblog.engine.chunk_task import ChunkTask, run_task

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import SparkSession


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
        self._pool = ThreadPoolExecutor(MAX_THREADS, thread_name_prefix="dblog-chunk")

    def submit(self, task: ChunkTask) -> Future[ChunkSelected]:
        return self._pool.submit(self._run, task)

    def _run(self, task: ChunkTask) -> ChunkSelected:
        sc = self.spark.sparkContext
        results: Any = sc.accumulator({}, _Selected())
        sc.setJobDescription(f"dblog chunk {task.table}#{task.chunk_id}")

        def select(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
            for _ in batches:  # read to its end, or the Python worker is not used again
                pass
            table, selected = run_task(task)
            results.add({task.chunk_id: selected})
            yield from table.to_batches()

        rows = self.spark.range(0, 1, 1, 1).mapInArrow(select, SPARK_DDL)
        rows.write.mode("errorifexists").parquet(self.files.uri(task.folder))
        selected: ChunkSelected = results.value[task.chunk_id]
        return selected

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
