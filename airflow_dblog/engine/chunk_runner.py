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

import contextlib
import multiprocessing
import threading
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from multiprocessing.connection import Connection
from typing import Any, Protocol, TypeVar

from airflow_dblog.engine.chunk_file import ChunkFiles, ChunkSelected, encode_rows, parquet_bytes
from airflow_dblog.engine.chunk_task import ChunkTask, prepare, run_task
from airflow_dblog.errors import DblogError

MAX_WORKERS = 16  # parallelism above this queues (it may be raised while a dump runs)
T = TypeVar("T")


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
        self._pool = ThreadPoolExecutor(MAX_WORKERS, thread_name_prefix="dblog-chunk")

    def submit(self, task: ChunkTask) -> Future[ChunkSelected]:
        return self._pool.submit(_select_into, self.files, task)

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)


_worker_files: dict[str, ChunkFiles] = {}  # in a worker process: one per chunk location


def _select_in_worker(files: ChunkFiles, task: ChunkTask) -> ChunkSelected:
    return _select_into(_worker_files.setdefault(files.location, files), task)  # fs opened once


def _warm_up(source_kind: str, url: str) -> None:
    prepare(source_kind, url)
    parquet_bytes(encode_rows(0, [])[0])


def _serve(conn: Connection) -> None:
    """A worker's loop: one call at a time, until the stream's end of the pipe closes. A
    stream gone by ``kill -9`` closes it too, so no worker outlives it holding a connection."""
    while True:
        try:
            call = conn.recv()
        except (EOFError, OSError):
            return
        if call is None:  # the stream closed the pool
            return
        fn, args = call
        try:
            outcome: tuple[bool, Any] = (True, fn(*args))
        except BaseException as err:  # it travels back to the caller's future
            outcome = (False, err)
        try:
            conn.send(outcome)
        except (BrokenPipeError, EOFError, OSError):
            return
        except Exception as err:  # a result or error that does not pickle
            conn.send((False, DblogError(f"a chunk worker's answer did not pickle: {err}")))


class _Worker:
    def __init__(self, context: Any) -> None:
        self.conn, child = context.Pipe()
        self.process = context.Process(
            target=_serve, args=(child,), name="dblog-chunk-worker", daemon=True
        )
        self.process.start()
        child.close()  # the worker's end lives in the worker only: its exit reads as EOF here
        self.future: Future[Any] | None = None


class WorkerPool:
    """Spawned worker processes, one call at a time each, over a pipe apiece.

    A worker is started only when none is free, and is free again before its caller's future
    completes, so a caller that sends its next call from the future's callback reuses it: the
    pool holds as many processes (and source connections) as calls ran at once, not more.
    ``ProcessPoolExecutor`` started a new worker whenever its own bookkeeping lagged behind.
    """

    def __init__(self, limit: int = MAX_WORKERS) -> None:
        self._context = multiprocessing.get_context("spawn")
        self._limit = limit
        self._lock = threading.Lock()
        self._idle: list[_Worker] = []
        self._queued: deque[tuple[Future[Any], Callable[..., Any], tuple[Any, ...]]] = deque()
        self._workers: list[_Worker] = []
        self._closed = False

    @property
    def pids(self) -> list[int]:
        return [w.process.pid for w in self._workers if w.process.pid is not None]

    def call(self, fn: Callable[..., T], *args: Any) -> Future[T]:
        """Run ``fn(*args)`` in a worker (``fn`` and ``args`` pickle; so must its answer)."""
        future: Future[T] = Future()
        with self._lock:
            if self._closed:
                raise RuntimeError("the chunk worker pool is closed")
            self._queued.append((future, fn, args))
            self._dispatch()
        return future

    def _dispatch(self) -> None:
        """Under the lock: hand waiting calls to free workers, starting one when none is."""
        while self._queued:
            if self._idle:
                worker = self._idle.pop()
            elif len(self._workers) < self._limit:
                worker = _Worker(self._context)
                self._workers.append(worker)
                threading.Thread(
                    target=self._answers, args=(worker,), name="dblog-chunk-answers", daemon=True
                ).start()
            else:
                return
            future, fn, args = self._queued.popleft()
            if not future.set_running_or_notify_cancel():  # cancelled while it waited
                self._idle.append(worker)
                continue
            worker.future = future
            with contextlib.suppress(OSError):  # a worker gone: its answers thread fails the call
                worker.conn.send((fn, args))

    def _answers(self, worker: _Worker) -> None:
        """Per worker: complete each call's future, the worker freed first."""
        while True:
            try:
                ok, value = worker.conn.recv()
            except (EOFError, OSError):
                self._lost(worker)
                return
            with self._lock:
                future, worker.future = worker.future, None
                self._idle.append(worker)
                if not self._closed:
                    self._dispatch()
            assert future is not None
            if ok:
                future.set_result(value)
            else:
                future.set_exception(value)

    def _lost(self, worker: _Worker) -> None:
        with self._lock:
            self._workers.remove(worker)
            if worker in self._idle:
                self._idle.remove(worker)
            if not self._closed:
                self._dispatch()  # a call waiting for a free worker gets a new one
        worker.process.join(timeout=1)
        if worker.future is not None:
            worker.future.set_exception(
                DblogError(
                    f"chunk worker pid {worker.process.pid} exited (code"
                    f" {worker.process.exitcode}) while selecting a chunk",
                    "see the stream's log and the system's (out of memory?); a restarted stream"
                    " selects the chunk again",
                )
            )

    def close(self) -> None:
        """Workers exit once their call ends; calls not started are cancelled."""
        with self._lock:
            self._closed = True
            queued, self._queued = list(self._queued), deque()
            workers = list(self._workers)
        for future, _fn, _args in queued:
            future.cancel()
        for worker in workers:
            with contextlib.suppress(OSError):
                worker.conn.send(None)


class ProcessChunkRunner:
    """Worker processes, each with its own source connection: the SELECT's rows are decoded
    and encoded under another interpreter lock than the capture's and Kafka's threads, so the
    process's two halves use two cores. Processes are spawned, not forked: the stream's
    threads and connections stay out of them."""

    ready = True

    def __init__(self, files: ChunkFiles) -> None:
        self.files = files
        self._pool = WorkerPool()

    def warm_up(self, source_kind: str, url: str) -> Future[None]:
        """Start a worker, import what a chunk needs and open its connection now, not on the
        first chunk's clock."""
        return self._pool.call(_warm_up, source_kind, url)

    def submit(self, task: ChunkTask) -> Future[ChunkSelected]:
        return self._pool.call(_select_in_worker, self.files, task)

    def close(self) -> None:
        self._pool.close()


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
