"""The stream's Delta query starts again over what a kill left in its Spark checkpoint."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pytest

from airflow_dblog.spark.stream_job import clear_unrecorded_offsets

pytestmark = pytest.mark.integration


def _start(spark: Any, checkpoint: Path) -> Any:
    return (
        spark.readStream.format("rate")
        .load()
        .writeStream.format("noop")
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start()
    )


def _interrupted_write(offsets: Path, batch: int) -> Path:
    """What Spark leaves when a kill lands between writing a batch's offsets and renaming them."""
    offsets.mkdir(parents=True, exist_ok=True)
    stray = offsets / f".{batch}.{uuid.uuid4()}.tmp"
    stray.write_text('v1\n{"batchWatermarkMs":0,')
    return stray


def test_a_first_offsets_write_cut_by_a_kill_no_longer_stops_the_query_from_starting(
    spark: Any, tmp_path: Path
) -> None:
    checkpoint = tmp_path / "checkpoint"
    _interrupted_write(checkpoint / "offsets", 0)
    refused = _start(spark, checkpoint)
    with pytest.raises(Exception, match="STATE_STORE_CHECKPOINT_LOCATION_NOT_EMPTY"):
        refused.awaitTermination(60)

    clear_unrecorded_offsets(spark, str(checkpoint))
    query = _start(spark, checkpoint)
    query.awaitTermination(60)
    assert query.exception() is None
    assert (checkpoint / "commits" / "0").exists()


def test_a_checkpoint_with_a_recorded_batch_is_left_as_it_is(spark: Any, tmp_path: Path) -> None:
    checkpoint = tmp_path / "checkpoint"
    _start(spark, checkpoint).awaitTermination(60)
    stray = _interrupted_write(checkpoint / "offsets", 1)
    before = sorted(p.name for p in (checkpoint / "offsets").iterdir())

    clear_unrecorded_offsets(spark, str(checkpoint))

    assert sorted(p.name for p in (checkpoint / "offsets").iterdir()) == before
    assert stray.exists()
