"""The staleness oracle itself (tests/support/oracle.py), on hand-made histories: no services.

An end-to-end check that never fails proves nothing; these show that it fails on the stale
states it is meant to catch and passes on the legitimate ones.
"""

from __future__ import annotations

import pytest

from tests.support.oracle import Step, check_history, kafka_histories


def _steps(*states: tuple[str, int | None, bool]) -> list[Step]:
    """(op, ver, deleted) in order, at positions p01, p02, ..."""
    return [
        Step(f"#{i}", op, f"p{i:02d}", ver, deleted)
        for i, (op, ver, deleted) in enumerate(states, 1)
    ]


def test_growing_versions_a_delete_and_a_reinsert_pass() -> None:
    check_history(
        "k",
        _steps(("r", 1, False), ("u", 2, False), ("d", None, True), ("c", 3, False)),
        ranked=True,
    )
    check_history("k", _steps(("u", 2, False), ("r", 2, False)), ranked=True)  # same state


def test_a_stale_row_is_caught_although_its_position_is_newer() -> None:
    with pytest.raises(AssertionError, match=r"is stale \(rank 2 after 4\)"):
        check_history("k", _steps(("u", 2, False), ("r", 1, False), ("u", 3, False)), True)


def test_a_stale_row_bringing_back_a_deleted_key_is_caught() -> None:
    # the Delta tombstone carries no ver: it ranks as the deletion of ver 2 (rank 5)
    with pytest.raises(AssertionError, match=r"is stale \(rank 4 after 5\)"):
        check_history("k", _steps(("u", 2, False), ("d", None, True), ("r", 2, False)), True)


def test_a_change_applied_twice_or_going_back_is_caught() -> None:
    twice = [Step("#1", "u", "p1", 1, False), Step("#2", "u", "p1", 1, False)]
    with pytest.raises(AssertionError, match="applied twice"):
        check_history("k", twice, ranked=False)
    back = [Step("#1", "u", "p2", 1, False), Step("#2", "u", "p1", 2, False)]
    with pytest.raises(AssertionError, match="went back"):
        check_history("k", back, ranked=False)


def test_kafka_ranks_a_delete_by_its_before_image_and_replays_the_table() -> None:
    def msg(op: str, before: int | None, after: int | None, pos: str) -> tuple[object, object]:
        image = {"a": 1, "b": "k1", "note": "n"}
        return {"a": 1, "b": "k1"}, {
            "op": op,
            "before": None if before is None else {**image, "ver": before},
            "after": None if after is None else {**image, "ver": after},
            "source": {"position": pos},
        }

    messages = [msg("c", None, 1, "p1"), msg("d", 1, None, "p2"), ({"a": 1, "b": "k1"}, None)]
    histories, replayed = kafka_histories(messages, ("a", "b", "ver", "note"), "ver")
    assert [(s.op, s.ver, s.deleted) for s in histories[(1, "k1")]] == [
        ("c", 1, False),
        ("d", 1, True),
    ]
    assert replayed == {}
    stale = [*messages, msg("r", None, 1, "p3")]  # the dump brings ver 1 back after the delete
    histories, _ = kafka_histories(stale, ("a", "b", "ver", "note"), "ver")
    with pytest.raises(AssertionError, match="is stale"):
        check_history((1, "k1"), histories[(1, "k1")], ranked=True)
