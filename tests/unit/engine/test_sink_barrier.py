"""Sinks follow the spool apart: a segment commits once all hold it, goes once none replays it."""

from __future__ import annotations

from typing import Any

from airflow_dblog.engine.sink_barrier import SinkBarrier


def _footers(*seqs: int) -> list[dict[str, Any]]:
    return [{"seq": s, "closed": [{"chunk_id": s}]} for s in seqs]


def test_a_segment_is_committed_when_the_slowest_sink_holds_it_and_trimmed_behind_it() -> None:
    committed: list[int] = []
    trims: list[int] = []
    barrier = SinkBarrier(
        ["delta", "kafka"], lambda fs: committed.extend(f["seq"] for f in fs), trims.append
    )
    assert barrier.held("kafka", _footers(0, 1, 2)) == []  # Delta holds nothing yet
    assert trims == []  # Delta's query has not run: nothing may go
    assert [f["seq"] for f in barrier.held("kafka", _footers(3, 4))] == []
    assert [f["seq"] for f in barrier.held("delta", _footers(0, 1, 2, 3))] == [0, 1, 2, 3]
    assert trims == []  # Delta may still replay its batch from segment 0
    assert [f["seq"] for f in barrier.held("delta", _footers(4, 5))] == [4]
    assert trims == [3]  # Kafka's current batch began at 3, Delta's at 4
    assert committed == [0, 1, 2, 3, 4]  # each once, in order


def test_the_spool_is_trimmed_only_when_the_slowest_sinks_batch_moves_on() -> None:
    """A trim lists the spool: a fast sink's batches behind a slow one's must not each list it."""
    trims: list[int] = []
    barrier = SinkBarrier(["delta", "kafka"], lambda fs: None, trims.append)
    barrier.held("delta", _footers(10, 11))
    for seq in range(12, 20):
        barrier.held("kafka", _footers(seq))
    assert trims == [10]  # once, when Kafka's first batch put the line at Delta's batch
    barrier.held("delta", _footers(12, 13))
    assert trims == [10, 12]


def test_after_a_restart_the_sink_that_replays_reports_what_the_other_held() -> None:
    """Kafka held 0-5 before a crash, Delta 0-2: Delta replays 3-5 and commits them."""
    committed: list[int] = []
    barrier = SinkBarrier(
        ["delta", "kafka"], lambda fs: committed.extend(f["seq"] for f in fs), lambda seq: 0
    )
    assert barrier.held("delta", _footers(3, 4, 5)) == []  # Kafka has run no batch yet
    assert [f["seq"] for f in barrier.held("kafka", _footers(6))] == [3, 4, 5]
    assert committed == [3, 4, 5]
