"""The worker pool behind a Kafka-only stream's chunk SELECTs: real spawned processes."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import Future, wait

import psutil
import pytest

from airflow_dblog.engine.chunk_runner import WorkerPool
from airflow_dblog.errors import DblogError


def _pid_after(seconds: float) -> int:
    time.sleep(seconds)
    return os.getpid()


def _fail() -> None:
    raise ValueError("no such chunk")


@pytest.fixture
def pool() -> Iterator[WorkerPool]:
    pool = WorkerPool(limit=2)
    yield pool
    pool.close()


def _gone(pid: int, within_s: float = 10) -> bool:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        try:
            if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:  # exited, not reaped yet
                return True
        except psutil.NoSuchProcess:
            return True
        time.sleep(0.05)
    return False


def test_a_call_sent_when_the_last_one_ends_reuses_its_worker(pool: WorkerPool) -> None:
    pids: list[int] = []
    done: Future[None] = Future()

    def next_call(future: Future[int]) -> None:
        pids.append(future.result())
        if len(pids) < 20:
            pool.call(_pid_after, 0).add_done_callback(next_call)
        else:
            done.set_result(None)

    pool.call(_pid_after, 0).add_done_callback(next_call)
    done.result(timeout=60)
    assert len(set(pids)) == 1
    assert pool.pids == pids[:1]


def test_calls_at_once_get_a_worker_each_up_to_the_limit_then_queue(pool: WorkerPool) -> None:
    futures = [pool.call(_pid_after, 1.0) for _ in range(3)]
    wait(futures, timeout=60)
    pids = [f.result() for f in futures]
    assert len(set(pids)) == 2  # the third waited for one of the two
    assert sorted(pool.pids) == sorted(set(pids))


def test_a_call_cancelled_while_it_waits_never_runs(pool: WorkerPool) -> None:
    busy = [pool.call(_pid_after, 1.0) for _ in range(2)]
    waiting = pool.call(_pid_after, 0)
    assert waiting.cancel()
    after = pool.call(_pid_after, 0)
    wait([*busy, after], timeout=60)
    assert waiting.cancelled() and after.result() in pool.pids
    assert len(pool.pids) == 2


def test_a_call_waiting_when_its_worker_dies_gets_a_new_one(pool: WorkerPool) -> None:
    first, second = (pool.call(_pid_after, 30) for _ in range(2))
    waiting = pool.call(_pid_after, 0)
    time.sleep(1.0)
    for pid in pool.pids:
        os.kill(pid, signal.SIGKILL)
    for dead in (first, second):
        with pytest.raises(DblogError, match="exited"):
            dead.result(timeout=10)
    assert waiting.result(timeout=60) in pool.pids


def test_an_error_in_the_worker_comes_back_on_the_future(pool: WorkerPool) -> None:
    with pytest.raises(ValueError, match="no such chunk"):
        pool.call(_fail).result(timeout=60)
    assert pool.call(_pid_after, 0).result(timeout=60) in pool.pids  # the worker carries on


def test_a_worker_killed_mid_call_fails_that_call_in_one_line(pool: WorkerPool) -> None:
    pid = pool.call(_pid_after, 0).result(timeout=60)
    running = pool.call(_pid_after, 30)
    time.sleep(0.5)
    os.kill(pid, signal.SIGKILL)
    with pytest.raises(DblogError, match=f"chunk worker pid {pid} exited"):
        running.result(timeout=10)
    assert pool.pids == []
    assert pool.call(_pid_after, 0).result(timeout=60) != pid  # a new worker takes over


def test_closing_the_pool_ends_its_workers_once_their_calls_end(pool: WorkerPool) -> None:
    pid = pool.call(_pid_after, 0).result(timeout=60)
    running = pool.call(_pid_after, 1.0)
    queued = [pool.call(_pid_after, 0) for _ in range(2)]  # one starts on a second worker
    pool.close()
    assert running.result(timeout=60) == pid
    assert sum(f.cancelled() for f in queued) >= 1
    assert _gone(pid)
    with pytest.raises(RuntimeError, match="closed"):
        pool.call(_pid_after, 0)


def test_a_worker_exits_when_its_stream_is_killed() -> None:
    script = (
        "import os, sys, time\n"
        "from airflow_dblog.engine.chunk_runner import WorkerPool\n"
        "print(WorkerPool().call(os.getpid).result(timeout=60), flush=True)\n"
        "time.sleep(600)\n"
    )
    stream = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        assert stream.stdout is not None
        worker = int(stream.stdout.readline())
        os.kill(stream.pid, signal.SIGKILL)
        stream.wait(timeout=10)
        assert _gone(worker)
    finally:
        stream.kill()
