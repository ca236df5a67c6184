"""Delta's query survives a Python worker that started too slowly, and nothing else."""

from __future__ import annotations

import pytest

from airflow_dblog.errors import DblogError
from airflow_dblog.spark.stream_job import QUERY_STARTS, DeltaQuery

pyspark_errors = pytest.importorskip("pyspark.errors")

_SLOW = (
    "[STREAM_FAILED] Query [id = 1, runId = 2] terminated with exception:"
    " Python worker failed to connect back.\n\tat org.apache.spark.api.python..."
)


class _Query:
    """A started query (failure injection: a real slow worker start needs a starved host)."""

    def __init__(self, failure: str | None) -> None:
        self.failure, self.stopped = failure, False

    def awaitTermination(self, timeout: float) -> bool:
        if self.failure is not None:
            raise pyspark_errors.StreamingQueryException(message=self.failure)
        return True

    def stop(self) -> None:
        self.stopped = True


class _Committer:
    failure: DblogError | None = None


def _starts(*failures: str | None) -> tuple[list[_Query], DeltaQuery]:
    queries = [_Query(f) for f in failures]
    pending = iter(queries)
    return queries, DeltaQuery(lambda: next(pending), _Committer())  # type: ignore[arg-type]


def test_a_query_whose_python_worker_connected_back_too_late_is_started_again() -> None:
    queries, query = _starts(_SLOW, None)

    assert query.terminated(0.1) is False  # started again, not failed
    assert query.query is queries[1]
    assert query.terminated(0.1) is True
    query.stop()
    assert queries[1].stopped


def test_a_python_worker_that_keeps_failing_to_connect_back_stops_the_job_in_one_line() -> None:
    _, query = _starts(*[_SLOW] * QUERY_STARTS)

    for _ in range(QUERY_STARTS - 1):
        assert query.terminated(0.1) is False
    one_line = r"^the Spark query failed: \[STREAM_FAILED\][^\n]*connect back\.; see the job log"
    with pytest.raises(DblogError, match=one_line):
        query.terminated(0.1)


def test_any_other_query_failure_is_not_retried() -> None:
    _, query = _starts("[STREAM_FAILED] Query terminated with exception: disk full", None)

    with pytest.raises(DblogError, match="disk full"):
        query.terminated(0.1)


def test_a_failed_batch_is_reported_as_the_committer_saw_it_and_not_retried() -> None:
    queries, query = _starts(_SLOW, None)
    query.committer.failure = DblogError("the metadata database x failed", "start it")

    with pytest.raises(DblogError, match=r"^the metadata database x failed"):
        query.terminated(0.1)
    assert query.query is queries[0]
