"""Where chunk SELECTs run: a :class:`ChunkRunner` takes a
:class:`~airflow_dblog.engine.chunk_task.ChunkTask` and answers with a future of what it
selected, the rows already in the chunk file.

The streaming job runs them as Spark jobs on the executors
(:class:`~airflow_dblog.spark.chunk_jobs.SparkChunkRunner`); a stream without Spark (Kafka
alone) runs them in worker processes beside it (:class:`ProcessChunkRunner`), the engine's
tests in driver threads (:class:`ThreadChunkRunner`). All write the same Parquet folders and
report the same :class:`~airflow_dblog.engine.chunk_file.ChunkSelected`.
"""

from __future__ import annotations

import multiprocessing
import os
import threading
import time
from concurrent.futures import Future, ProcessPoolExecutor, ThreadPoolExecutor
from typing import Protocol

from airflow_dblog.engine.chunk_file import ChunkFiles, ChunkSelected, encode_rows, parquet_bytes
from airflow_dblog.engine.chunk_task import ChunkTask, prepare, run_task

MAX_THREADS = 16  # parallelism above this queues (it may be raised while a dump runs)
PARENT_CHECK_S = 1.0


class ChunkRunner(Protocol):
    @property
    def ready(self) -> bool:
        """Whether it takes chunks now."""
        ...

    def submit(self, task: ChunkTask) -> Future[ChunkSelected]:
        """Run the SELECT and write the chunk file; the future holds the summary."""
        ...

    def close(self) -> None: ...


def _select_into(files: ChunkFiles, task: ChunkTask) -> ChunkSelected:
    table, selected = run_task(task)
    if selected.error is None:
        files.write(task.folder, table)
    return selected


class ThreadChunkRunner:
    """Driver threads, each with its own source connection."""

    ready = True

    def __init__(self, files: ChunkFiles) -> None:
        self.files = files
        self._pool = ThreadPoolExecutor(MAX_THREADS, thread_name_prefix="dblog-chunk")

    def submit(self, task: ChunkTask) -> Future[ChunkSelected]:
        return self._pool.submit(_select_into, self.files, task)

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)


_worker_files: dict[str, ChunkFiles] = {}  # in a worker process: one per chunk location


def _select_in_worker(files: ChunkFiles, task: ChunkTask) -> ChunkSelected:
    return _select_into(_worker_files.setdefault(files.location, files), task)  # fs opened once


def _exit_with(parent: int) -> None:
    """A worker's initializer: exit once the stream's process is gone (even by ``kill -9``,
    which leaves a worker waiting for work forever, holding its source connection)."""

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(PARENT_CHECK_S)
        os._exit(0)

    threading.Thread(target=watch, name="dblog-parent-watch", daemon=True).start()


def _warm_up(source_kind: str, url: str) -> None:
    prepare(source_kind, url)
    parquet_bytes(encode_rows(0, [])[0])


class ProcessChunkRunner:
    """Worker processes, each with its own source connection: the SELECT's rows are decoded
    and encoded under another interpreter lock than the capture's and Kafka's threads, so the
    process's two halves use two cores. Processes are spawned, not forked: the stream's
    threads and connections stay out of them."""

    ready = True

    def __init__(self, files: ChunkFiles) -> None:
        self.files = files
        spawn = multiprocessing.get_context("spawn")
        self._pool = ProcessPoolExecutor(
            MAX_THREADS, mp_context=spawn, initializer=_exit_with, initargs=(os.getpid(),)
        )

    def warm_up(self, source_kind: str, url: str) -> Future[None]:
        """Start a worker, import what a chunk needs and open its connection now, not on the
        first chunk's clock."""
        return self._pool.submit(_warm_up, source_kind, url)

    def submit(self, task: ChunkTask) -> Future[ChunkSelected]:
        return self._pool.submit(_select_in_worker, self.files, task)

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
