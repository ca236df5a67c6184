"""Where chunk SELECTs run: a :class:`ChunkRunner` takes a
:class:`~airflow_dblog.engine.chunk_task.ChunkTask` and answers with a future of what it
selected, the rows already in the chunk file.

The streaming job runs them as Spark jobs on the executors
(:class:`~airflow_dblog.spark.chunk_jobs.SparkChunkRunner`); a stream without Spark (Kafka
alone) and the engine's tests run them in driver threads (:class:`ThreadChunkRunner`). Both
write the same Parquet folders and report the same
:class:`~airflow_dblog.engine.chunk_file.ChunkSelected`.
"""

from __future__ import annotations

from concurrent.futures import Future, ThreadPoolExecutor
from typing import Protocol

from airflow_dblog.engine.chunk_file import ChunkFiles, ChunkSelected
from airflow_dblog.engine.chunk_task import ChunkTask, run_task

MAX_THREADS = 16  # parallelism above this queues (it may be raised while a dump runs)


class ChunkRunner(Protocol):
    @property
    def ready(self) -> bool:
        """Whether it takes chunks now."""
        ...

    def submit(self, task: ChunkTask) -> Future[ChunkSelected]:
        """Run the SELECT and write the chunk file; the future holds the summary."""
        ...

    def close(self) -> None: ...


class ThreadChunkRunner:
    """Driver threads, each with its own source connection."""

    ready = True

    def __init__(self, files: ChunkFiles) -> None:
        self.files = files
        self._pool = ThreadPoolExecutor(MAX_THREADS, thread_name_prefix="dblog-chunk")

    def submit(self, task: ChunkTask) -> Future[ChunkSelected]:
        return self._pool.submit(self._run, task)

    def _run(self, task: ChunkTask) -> ChunkSelected:
        table, selected = run_task(task)
        if selected.error is None:
            self.files.write(task.folder, table)
        return selected

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)


class LateRunner:
    """A runner that is not there yet (Spark still starting): chunks wait, the log does not."""

    def __init__(self) -> None:
        self.runner: ChunkRunner | None = None

    @property
    def ready(self) -> bool:
        return self.runner is not None

    def submit(self, task: ChunkTask) -> Future[ChunkSelected]:
        assert self.runner is not None, "chunk sent before its runner started"
        return self.runner.submit(task)

    def close(self) -> None:
        if self.runner is not None:
            self.runner.close()
