"""The chunk runner's job threads (the Spark jobs themselves: tests/integration/spark)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import threading
import time

from airflow_dblog.spark.chunk_jobs import DaemonJobs


def test_a_job_that_never_returns_does_not_hold_the_process_at_exit() -> None:
    """As a Spark job sent while the context stops does: the stream must still exit."""
    program = textwrap.dedent(
        """
        import threading
        from airflow_dblog.spark.chunk_jobs import DaemonJobs

        jobs = DaemonJobs(2)
        jobs.submit(threading.Event().wait)
        jobs.cancel_queued()
        print("exiting", flush=True)
        """
    )
    done = subprocess.run([sys.executable, "-c", program], capture_output=True, timeout=60)
    assert done.returncode == 0 and done.stdout.strip() == b"exiting"


def test_calls_past_the_limit_queue_and_queued_ones_can_be_cancelled() -> None:
    jobs, release = DaemonJobs(1), threading.Event()
    first = jobs.submit(release.wait)
    queued = jobs.submit(lambda: "ran")
    time.sleep(0.2)
    assert first.running() and not queued.running()
    jobs.cancel_queued()
    release.set()
    assert first.result(5) is True
    assert queued.cancelled()
    assert jobs.submit(lambda x: x * 2, 21).result(5) == 42


def test_an_error_reaches_the_caller_through_the_future() -> None:
    def fail() -> None:
        raise ValueError("no")

    error = DaemonJobs(1).submit(fail).exception(5)
    assert isinstance(error, ValueError)
