"""Chunk SELECTs as Spark jobs (local[2]; the cluster e2e runs them on real executors).

Each chunk is one Spark task that selects on its own connection and writes the chunk folder
itself; the driver gets only the summary. The rows read back from the
folder must be exactly the SELECT's, in key order, for both databases and every strategy's
way of selecting; a chunk's own error comes back as its one-line error, of its class.
"""

from __future__ import annotations

import json
import os
import uuid
from pathlib import Path
from typing import Any

import pytest

from airflow_dblog.core.events import TableId
from airflow_dblog.engine.chunk_file import ChunkFiles, ChunkSelected
from airflow_dblog.engine.chunk_task import ChunkTask, error_of
from airflow_dblog.engine.spool_store import S3_ACCESS_KEY, S3_SECRET_KEY
from airflow_dblog.engine.watermarks import STRATEGIES
from airflow_dblog.errors import InputError
from airflow_dblog.sources import source_for
from airflow_dblog.spark.chunk_jobs import SparkChunkRunner
from tests.support.workload import db_for, execute, load

pytestmark = [pytest.mark.integration, pytest.mark.slow]

CASES = [(kind, mode) for mode, kind in STRATEGIES if (mode, kind) != ("gtid", "mysql")]


def _first_chunk(
    spark: Any, files: ChunkFiles, kind: str, url: str, table: TableId, upper: Any
) -> ChunkSelected:
    """What the table's first chunk up to ``upper`` (table mode) reports, selected by Spark."""
    runner = SparkChunkRunner(spark, files)
    task = ChunkTask(
        1, files.new_folder(1), table, STRATEGIES[("table", kind)], kind, url, 0, None, upper, 100
    )
    selected = runner.submit(task).result(timeout=120)
    runner.close()
    return selected


@pytest.mark.parametrize(("kind", "mode"), CASES, ids=[f"{k}-{m}" for k, m in CASES])
def test_a_chunk_selected_by_spark_reads_back_as_the_select(
    request: pytest.FixtureRequest, tmp_path: Path, spark: Any, kind: str, mode: str
) -> None:
    db = db_for(request, kind)
    load(db, 300)
    source = source_for(kind, db.url)
    table = db.table()
    files = ChunkFiles(str(tmp_path / "chunks"))
    runner = SparkChunkRunner(spark, files)
    strategy = STRATEGIES[(mode, kind)]
    lower, upper = source.coerce_key(table, [9, "k2"]), source.coerce_key(table, [250, "k5"])
    tasks = [
        ChunkTask(1, files.new_folder(1), table, strategy, kind, db.url, 0, lower, upper, 100),
        ChunkTask(2, files.new_folder(2), table, strategy, kind, db.url, 0, upper, upper, 100),
    ]
    results = [runner.submit(task).result(timeout=120) for task in tasks]
    runner.close()

    expected = source.select_range(table, lower, upper, 100)
    first, empty = results
    assert (first.count, first.error, empty.count) == (len(expected), None, 0)
    assert first.last_key == [expected[-1][0][0], expected[-1][0][1]]
    assert first.key_span is not None  # int first key column
    assert (first.info is None) == (mode == "table" and kind == "mysql")
    rows = [
        r for b in files.batches(tasks[0].folder, ("idx", "key", "after")) for r in b.to_pylist()
    ]
    assert [r["idx"] for r in rows] == list(range(len(expected)))
    assert [tuple(json.loads(r["key"])) for r in rows] == [k for k, _ in expected]
    assert [json.loads(r["after"])["v"] for r in rows] == [row["v"] for _, row in expected]
    assert not list(files.batches(tasks[1].folder, ("idx",)))
    source.close()


def test_a_chunk_of_a_dropped_table_comes_back_as_its_error(
    request: pytest.FixtureRequest, tmp_path: Path, spark: Any
) -> None:
    db = db_for(request, "mysql")
    load(db, 10)
    table = db.table()
    key = source_for("mysql", db.url).coerce_key(table, [5, "k5"])
    execute(db, f"DROP TABLE {db.quoted()}")
    files = ChunkFiles(str(tmp_path / "chunks"))
    selected = _first_chunk(spark, files, "mysql", db.url, table, key)
    error = error_of(selected)
    assert isinstance(error, InputError), selected.error  # its class comes back too
    assert f"table {table} does not exist" in str(error) and "\n" not in str(error)


def test_a_chunk_its_executor_cannot_write_is_one_line_naming_the_fix_not_the_secret(
    request: pytest.FixtureRequest, spark: Any
) -> None:
    if not os.environ.get("DBLOG_S3_ENDPOINT") or not os.environ.get("AWS_ACCESS_KEY_ID"):
        pytest.skip('DBLOG_S3_ENDPOINT not set: eval "$(scripts/services.sh env)"')
    db = db_for(request, "postgres")
    load(db, 10)
    table = db.table()
    key = source_for("postgres", db.url).coerce_key(table, [9, "k9"])
    wrong = {S3_ACCESS_KEY: os.environ["AWS_ACCESS_KEY_ID"], S3_SECRET_KEY: "not-the-s3cret"}
    files = ChunkFiles(f"s3a://dblog/tests/{uuid.uuid4().hex}/chunks", wrong)
    message = str(error_of(_first_chunk(spark, files, "postgres", db.url, table, key)))
    assert message.startswith(f"an executor cannot write chunk files to {files.location}: ")
    assert "spark.hadoop.fs.s3a.access.key" in message and "\n" not in message
    assert "not-the-s3cret" not in message


def test_the_python_worker_is_used_again_for_the_next_chunk(
    request: pytest.FixtureRequest, tmp_path: Path, spark: Any
) -> None:
    """A worker that is not read to its end is not reused: a new Python process (imports, a
    new connection) for every chunk cost 0.5 s each."""
    db = db_for(request, "postgres")
    load(db, 50)
    table = db.table()
    upper = source_for("postgres", db.url).coerce_key(table, [49, "k0"])
    files = ChunkFiles(str(tmp_path / f"chunks-{uuid.uuid4().hex[:6]}"))
    runner = SparkChunkRunner(spark, files)
    strategy = STRATEGIES[("snapshot", "postgres")]
    pids = []
    for chunk in range(6):  # one after the other: a worker is free each time
        task = ChunkTask(
            chunk, files.new_folder(chunk), table, strategy, "postgres", db.url, 0, None, upper, 10
        )
        pids.append(runner.submit(task).result(timeout=120).pid)
    runner.close()
    assert len(set(pids)) < len(pids), pids  # idle workers are taken in turn: not one pid


def test_the_warm_up_runs_a_chunk_job_on_every_core_and_leaves_nothing(
    request: pytest.FixtureRequest, tmp_path: Path, spark: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """A chunk job on a new Python worker is seconds slower than on a warm one: the warm-up
    runs one without rows on each core's worker, connected to the source, when the stream
    starts (a dump's second chunk used to meet a cold worker while the first Delta batch held
    the warm one)."""
    db = db_for(request, "mysql")
    files = ChunkFiles(str(tmp_path / "chunks"))
    runner = SparkChunkRunner(spark, files)
    with caplog.at_level("INFO", logger="airflow_dblog.spark.chunk_jobs"):
        runner.warm_up("mysql", db.url).result(timeout=120)
    runner.close()
    assert "chunk jobs warmed up in" in caplog.text, caplog.text
    assert f"({spark.sparkContext.defaultParallelism} workers)" in caplog.text, caplog.text
    assert files.folders() == []


def test_a_warm_up_that_cannot_reach_the_source_is_only_logged_without_the_password(
    tmp_path: Path, spark: Any, caplog: pytest.LogCaptureFixture
) -> None:
    files = ChunkFiles(str(tmp_path / "chunks"))
    runner = SparkChunkRunner(spark, files)
    url = "mysql://dblog:s3cret-pw@127.0.0.1:1/nowhere"  # nothing listens on port 1
    with caplog.at_level("INFO", logger="airflow_dblog.spark.chunk_jobs"):
        assert runner.warm_up("mysql", url).result(timeout=120) is None
    runner.close()
    assert "chunk jobs not warmed up" in caplog.text, caplog.text
    assert "s3cret-pw" not in caplog.text
