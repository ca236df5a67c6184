"""The Delta warm-up rehearses a dump's batches on a scratch table and leaves nothing behind."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest

from airflow_dblog.config import DeltaSinkConfig
from airflow_dblog.core.events import TableId
from airflow_dblog.sources.base import Column, TableSchema
from airflow_dblog.spark import delta_warm_up
from airflow_dblog.spark.delta_warm_up import warm_up

pytestmark = pytest.mark.integration

ORDERS = TableId("shop", "orders")
# a key of two columns Spark and the source order alike, values of several types beside it
SCHEMA = TableSchema(
    ORDERS,
    (
        Column("day", "date", False),
        Column("id", "bigint", False),
        Column("note", "varchar(20)", True),
        Column("price", "decimal(10,2)", True),
        Column("doc", "json", True),
    ),
    ("day", "id"),
)


def test_a_warm_up_rehearses_a_dumps_batches_then_leaves_nothing_in_the_checkpoint(
    spark: Any, tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    from delta.tables import DeltaTable

    seen: dict[str, Any] = {}
    rehearse = delta_warm_up._rehearse

    def watched(session: Any, config: Any, schema: Any, scratch: str, conf: Any) -> None:
        rehearse(session, config, schema, scratch, conf)
        table = DeltaTable.forPath(session, f"{scratch}/delta/shop/orders")
        seen["operations"] = [r["operation"] for r in table.history().orderBy("version").collect()]
        seen["rows"] = {
            (r["day"].day, r["id"]): r["_dblog_deleted"] for r in table.toDF().collect()
        }

    monkeypatch.setattr(delta_warm_up, "_rehearse", watched)
    checkpoint = tmp_path / "checkpoint"
    (checkpoint / "warm-up" / "spool").mkdir(parents=True)  # what a kill in a warm-up left
    with caplog.at_level(logging.INFO, logger=delta_warm_up.__name__):
        warm_up(spark, DeltaSinkConfig(str(tmp_path / "delta")), SCHEMA, str(checkpoint), {})
    # after the table's creation: the first chunk appended, log events merged, then the last
    # chunk merged with log events (key 2 deleted by the log, key 5 created)
    assert seen["operations"][1:] == ["WRITE", "MERGE", "MERGE"]
    assert seen["rows"] == {
        (1, 1): False,
        (2, 2): True,
        (3, 3): False,
        (4, 4): False,
        (5, 5): False,
    }
    assert "Delta warmed up in" in caplog.text
    assert list(checkpoint.iterdir()) == []
    assert not (tmp_path / "delta").exists()  # the stream's own tables are not touched


def test_a_failed_warm_up_is_one_logged_line_and_the_stream_goes_on_cold(
    spark: Any, tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(*_: Any) -> None:
        raise OSError("the store refused the write\nand a trace after it")

    monkeypatch.setattr(delta_warm_up, "_rehearse", broken)
    with caplog.at_level(logging.INFO, logger=delta_warm_up.__name__):
        warm_up(spark, DeltaSinkConfig(str(tmp_path / "delta")), SCHEMA, str(tmp_path), {})
    assert "Delta not warmed up (OSError: the store refused the write)" in caplog.text
    assert "trace" not in caplog.text
