"""Chunk SELECTs as Spark jobs: each chunk is one task on an executor, which writes its rows.

The task opens its own connection to the source (kept by the Python worker for its next chunk),
runs the strategy's SELECT and writes the chunk file itself with ``pyarrow.fs``, opening the
store with the endpoint and credentials the driver uses
(:meth:`~airflow_dblog.engine.chunk_file.ChunkFiles.for_tasks`), so the rows never pass
through the driver. Only the summary (row count, last key, what the snapshot saw) comes back, as
the task's result. The file is staged under a name of the attempt's own and published by the
driver once the job returns, so an attempt Spark gave up on but that still runs never replaces
the rows the driver was told of. Up to ``parallelism`` chunks run at once, one driver thread
waiting on each job. Those threads are daemons: a job sent as the Spark context stops may never
return (Spark does not fail its wait), and the process must still exit; a chunk cut short is
selected again after the restart.

A plain task and not a DataFrame written by Spark: Spark's write (planning, its commit protocol,
Arrow into the JVM and the JVM's Parquet writer) cost several times the SELECT itself, and on
an object store its commit copies every file once more.

A chunk job on a new Python worker is many times slower than on one that ran a chunk before
(the worker imports the source's driver and connects): :meth:`SparkChunkRunner.warm_up` runs a
job without rows on as many workers as Spark runs tasks at once when the stream starts, so the
first dump's chunks do not wait for them.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any, TypeVar

from airflow_dblog.engine.chunk_file import ChunkFiles, ChunkSelected, encode_rows
from airflow_dblog.engine.chunk_runner import MAX_WORKERS
from airflow_dblog.engine.chunk_task import ChunkTask, prepare, run_task
from airflow_dblog.errors import DblogError

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

log = logging.getLogger(__name__)
T = TypeVar("T")


def _select_and_stage(files: ChunkFiles, task: ChunkTask) -> tuple[ChunkSelected, str | None]:
    """In the task: the SELECT, its rows staged in the chunk's folder (none on an error)."""
    table, selected = run_task(task)
    if selected.error is not None:
        return selected, None
    try:
        return selected, files.stage(task.folder, table)
    except OSError as err:  # pyarrow's for a store it cannot reach or may not write
        first = (str(err).strip().splitlines() or [type(err).__name__])[0]
        cannot = DblogError(
            f"an executor cannot write chunk files to {files.location}: {first}",
            "give the executors access to it (S3: spark.hadoop.fs.s3a.access.key and secret.key"
            " in the config's spark.conf, or AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY in the"
            " stream's environment; or a role on the executors)",
        )
        return ChunkSelected(error=(type(cannot).__name__, str(cannot))), None


def _stage_empty(files: ChunkFiles, folder: str, source_kind: str, url: str) -> str:
    prepare(source_kind, url)
    return files.stage(folder, encode_rows(0, [])[0])


class DaemonJobs:
    """Up to ``limit`` calls at once, each on a daemon thread of its own (a thread pool's
    threads are joined at the interpreter's exit)."""

    def __init__(self, limit: int) -> None:
        self._slots = threading.BoundedSemaphore(limit)
        self._futures: set[Future[Any]] = set()

    def submit(self, fn: Callable[..., T], *args: object) -> Future[T]:
        future: Future[T] = Future()

        def run() -> None:
            try:
                with self._slots:
                    if future.set_running_or_notify_cancel():  # else cancelled while it queued
                        try:
                            future.set_result(fn(*args))
                        except BaseException as err:  # the caller's, through the future
                            future.set_exception(err)
            finally:
                self._futures.discard(future)

        self._futures.add(future)
        threading.Thread(target=run, name="dblog-chunk", daemon=True).start()
        return future

    def cancel_queued(self) -> None:
        for future in list(self._futures):
            future.cancel()  # only those not running yet


class SparkChunkRunner:
    ready = True

    def __init__(self, spark: SparkSession, files: ChunkFiles) -> None:
        self.spark, self.files = spark, files
        self._task_files = files.for_tasks()
        self._pool = DaemonJobs(MAX_WORKERS)

    def submit(self, task: ChunkTask) -> Future[ChunkSelected]:
        return self._pool.submit(self._run, task)

    def _run(self, task: ChunkTask) -> ChunkSelected:
        self.spark.sparkContext.setJobDescription(f"dblog chunk {task.table}#{task.chunk_id}")
        selected, staged = self._in_task(_select_and_stage, self._task_files, task)
        if staged is not None:
            self.files.publish(task.folder, staged)
        return selected

    def _in_task(self, fn: Callable[..., T], *args: object, tasks: int = 1) -> T:
        """``fn(*args)`` as one Spark task (or ``tasks`` at once); its (first) result pickled
        back."""

        def call(partition: Iterable[int]) -> Iterator[T]:
            for _ in partition:  # read to its end, or the Python worker is not used again
                pass
            yield fn(*args)

        rdd = self.spark.sparkContext.parallelize(range(tasks), tasks)
        results: list[T] = rdd.mapPartitions(call).collect()
        return results[0]

    def warm_up(self, source_kind: str, url: str) -> Future[None]:
        """Run a chunk's job without rows, its workers connected to the source and writing to
        the store (in the background: a chunk sent meanwhile runs as it would have; a failure
        is only logged). As many tasks as Spark runs at once, up to :data:`MAX_WORKERS`: a
        chunk's task meets the workers the stream's batches hold (the changelog source reads
        in one), and on a new one it would pay the imports and the connection again."""
        return self._pool.submit(self._warm_up, source_kind, url)

    def _warm_up(self, source_kind: str, url: str) -> None:
        folder = f"warm-up-{uuid.uuid4().hex[:12]}"  # a restart's sweep removes one left behind
        started = time.monotonic()
        context = self.spark.sparkContext
        context.setJobDescription("dblog chunk runner warm-up")
        tasks = min(context.defaultParallelism, MAX_WORKERS)
        try:
            self._in_task(_stage_empty, self._task_files, folder, source_kind, url, tasks=tasks)
            self.files.delete(folder)
        except Exception as err:  # the first chunk then starts cold, that is all
            first = (str(err).strip().splitlines() or [""])[0]
            log.info("chunk jobs not warmed up (%s: %s)", type(err).__name__, first)
            return
        log.info("chunk jobs warmed up in %.1f s (%d workers)", time.monotonic() - started, tasks)

    def close(self) -> None:
        self._pool.cancel_queued()
