"""The Kafka sink's messages: image modes, keys and the envelope as exact JSON
(tests/integration/sinks/test_kafka_sink.py sends them to a real broker)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from airflow_dblog.config import KafkaSinkConfig
from airflow_dblog.core.events import ChangeEvent, TableId
from airflow_dblog.core.position import Position
from airflow_dblog.engine.event_text import EventText
from airflow_dblog.sinks.kafka_sink import MessageBuilder
from airflow_dblog.sources.base import Column, TableSchema

TABLE = TableId("shop", "items")
SCHEMA = TableSchema(
    TABLE,
    (Column("a", "int", False), Column("b", "varchar(5)", False), Column("qty", "int", True)),
    ("a", "b"),
)


def _event(
    op: str, a: int, qty: int, offset: int, b: str = "x", key: tuple[str, ...] = ("a", "b")
) -> ChangeEvent:
    image = {"a": a, "b": b, "qty": qty}
    return ChangeEvent(
        TABLE,
        op,  # type: ignore[arg-type]
        tuple(image[c] for c in key),
        Position.mysql(1, offset),
        before=image if op in ("u", "d") else None,
        after=None if op == "d" else image,
        ts_ms=1000 + offset,
        dump_id=1 if op == "r" else None,
        chunk_id=2 if op == "r" else None,
        gtid="0-1-5",
    )


def _row(op: str, a: int, qty: int, offset: int, b: str = "x", key: Any = ("a", "b")) -> str:
    """An event as its spool line."""
    return EventText.of(_event(op, a, qty, offset, b, key)).line()


def _messages(
    rows: list[str],
    mode: str = "NEW_AND_OLD_IMAGES",
    kind: str = "mysql",
    prefix: str = "p",
    schema: TableSchema = SCHEMA,
) -> list[tuple[Any, ...]]:
    """The sink's messages for these spool lines (topics under ``prefix``)."""
    config = KafkaSinkConfig("unused:9092", prefix, mode)
    build = MessageBuilder({TABLE: schema}, "s", kind, config)
    return [build(EventText.parse(row)) for row in rows]


@pytest.mark.parametrize(
    ("mode", "before", "after"),
    [
        ("NEW_AND_OLD_IMAGES", {"a": 1, "b": "x", "qty": 6}, {"a": 1, "b": "x", "qty": 6}),
        ("NEW_IMAGE", None, {"a": 1, "b": "x", "qty": 6}),
        ("OLD_IMAGE", {"a": 1, "b": "x", "qty": 6}, None),
        ("KEYS_ONLY", {"a": 1, "b": "x"}, {"a": 1, "b": "x"}),
    ],
)
def test_image_modes(mode: str, before: Any, after: Any) -> None:
    [(topic, key, value, tombstone)] = _messages([_row("u", 1, 6, 11)], mode)
    assert (topic, json.loads(key), tombstone) == ("p.shop.items", {"a": 1, "b": "x"}, False)
    decoded = json.loads(value)
    assert (decoded["before"], decoded["after"]) == (before, after)


@pytest.mark.parametrize("key_columns", [("a", "b"), ("b",)])
@pytest.mark.parametrize(
    "b", ['x,"y"]', "back\\slash", "ünï \u2603", "", "[1,2]", " null ", '{"k": ["v"]}']
)
def test_keys_and_envelope_are_exact_json_whatever_the_key_text(
    b: str, key_columns: tuple[str, ...]
) -> None:
    record = json.loads(EventText.of(_event("d", -7, 3, 20, b=b, key=key_columns)).line())
    record["source"] = {"xid": 42, "pk_change": "deleted"}
    schema = TableSchema(TABLE, SCHEMA.columns, key_columns)
    [(_, key, value, tombstone)] = _messages([json.dumps(record)], kind="postgres", schema=schema)
    assert json.loads(key) == {c: {"a": -7, "b": b}[c] for c in key_columns} and tombstone
    assert json.loads(value) == {
        "before": {"a": -7, "b": b, "qty": 3},
        "after": None,
        "op": "d",
        "ts_ms": 1020,
        "source": {
            "connector": "postgresql",
            "name": "s",
            "db": "shop",
            "schema": "shop",
            "table": "items",
            "position": str(Position.mysql(1, 20)),
            "ts_ms": 1020,
            "snapshot": "false",
            "dump_id": None,
            "chunk_id": None,
            "xid": 42,
            "pk_change": "deleted",
        },
    }
