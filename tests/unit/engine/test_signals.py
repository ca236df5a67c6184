"""Kafka signals: Debezium's message format parsed (tests/integration/engine/test_signals.py
applies them from a real topic)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from airflow_dblog.engine.signals import Signal, SignalError, parse_signal


def _doc(kind: str, **data: Any) -> bytes:
    return json.dumps({"type": kind, "data": data}).encode()


def test_parse_debezium_signals() -> None:
    execute = _doc("execute-snapshot", **{"data-collections": ["db.t"], "type": "INCREMENTAL"})
    assert parse_signal(execute) == Signal("execute-snapshot", ("db.t",))
    assert parse_signal(b'{"type": "pause-snapshot"}') == Signal("pause-snapshot", None)
    assert parse_signal(_doc("stop-snapshot")) == Signal("stop-snapshot", None)
    verify = _doc("execute-snapshot", **{"data-collections": ["db.t"], "verify": "dry-run"})
    assert parse_signal(verify) == Signal("execute-snapshot", ("db.t",), "dry-run")


@pytest.mark.parametrize(
    ("value", "problem"),
    [
        (b"not json", "not JSON"),
        (None, "not JSON"),
        (b"[1]", 'no "type"'),
        (b'{"type": "log"}', "not supported"),
        (_doc("execute-snapshot"), "needs"),
        (_doc("execute-snapshot", **{"data-collections": "db.t"}), "must be a list"),
        (
            _doc("execute-snapshot", **{"data-collections": ["db.t"], "type": "BLOCKING"}),
            "BLOCKING",
        ),
        (_doc("execute-snapshot", **{"data-collections": ["db.t"], "verify": "yes"}), "verify"),
        (_doc("stop-snapshot", verify="repair"), "verify"),
    ],
)
def test_malformed_signals_name_the_problem(value: bytes | None, problem: str) -> None:
    with pytest.raises(SignalError, match=problem):
        parse_signal(value)
