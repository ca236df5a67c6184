"""Appends under an idempotent-write id on real Delta tables (the conflict with a concurrent
fence is in test_delta_sink.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from airflow_dblog.sinks.delta_appends import append_once

pytestmark = pytest.mark.integration


def _table(spark: Any, path: Path) -> str:
    spark.sql(
        f"CREATE TABLE delta.`{path}` (id bigint, v string) USING delta TBLPROPERTIES"
        " (delta.enableChangeDataFeed = true, delta.enableDeletionVectors = true)"
    )
    return str(path)


def _rows(spark: Any, low: int, high: int) -> Any:
    return spark.range(low, high).selectExpr("id", "cast(id AS string) AS v")


def _jobs(spark: Any) -> int:
    return len(spark.sparkContext.statusTracker().getJobIdsForGroup("append"))


def _count(spark: Any, path: str) -> int:
    return int(spark.read.format("delta").load(path).count())


def test_an_append_under_an_app_id_runs_only_its_write_job_and_a_replay_none(
    spark: Any, tmp_path: Path
) -> None:
    """Delta's writer would rebuild the table's state (Spark jobs over its log) to find the
    app's version; the checksum holds it."""
    path = _table(spark, tmp_path / "t")
    for version in range(3):
        assert append_once(spark, path, _rows(spark, version * 10, version * 10 + 10), "a", version)
    spark.sparkContext.setJobGroup("append", "append")
    try:
        assert append_once(spark, path, _rows(spark, 30, 40), "a", 3)
        assert _jobs(spark) == 1
        assert not append_once(spark, path, _rows(spark, 30, 40), "a", 3)  # a replay
        assert not append_once(spark, path, _rows(spark, 50, 60), "a", 2)  # an older one
        assert _jobs(spark) == 1
    finally:
        spark.sparkContext.setJobGroup(None, None)  # type: ignore[arg-type]
    assert append_once(spark, path, _rows(spark, 40, 50), "b", 1)  # another app's own count
    assert _count(spark, path) == 50


def test_a_table_without_checksums_is_asked_through_deltas_own_lookup(
    spark: Any, tmp_path: Path
) -> None:
    path = _table(spark, tmp_path / "t")
    assert append_once(spark, path, _rows(spark, 0, 10), "a", 5)
    for crc in (tmp_path / "t" / "_delta_log").glob("*.crc"):
        crc.unlink()
    spark._jvm.org.apache.spark.sql.delta.DeltaLog.clearCache()  # its snapshot's checksum too
    assert not append_once(spark, path, _rows(spark, 0, 10), "a", 5)
    assert append_once(spark, path, _rows(spark, 10, 20), "a", 6)
    assert _count(spark, path) == 20
