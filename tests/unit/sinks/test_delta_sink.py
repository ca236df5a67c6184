"""The Delta sink's pure parts: which key ranges a MERGE may be bounded by."""

from __future__ import annotations

from airflow_dblog.core.events import TableId
from airflow_dblog.sinks.delta_sink import usable_bounds
from airflow_dblog.sources.base import Column, TableSchema

TABLE = TableId("db", "t")


def _keyed_by(column_type: str) -> TableSchema:
    return TableSchema(TABLE, (Column("k", column_type, False), Column("v", "int", True)), ("k",))


def test_a_key_range_bounds_a_merge_where_spark_compares_it_as_python_did() -> None:
    assert usable_bounds(_keyed_by("bigint"), (9, 10)) == (9, 10)
    assert usable_bounds(_keyed_by("bigint unsigned"), (9, 10)) == (9, 10)  # a decimal
    assert usable_bounds(_keyed_by("varchar(20)"), ("a", "b")) == ("a", "b")
    assert usable_bounds(_keyed_by("int"), None) is None


def test_a_key_range_spark_would_compare_otherwise_bounds_nothing() -> None:
    assert usable_bounds(_keyed_by("year"), (9, 10)) is None  # text in Delta: "10" < "9"
    assert usable_bounds(_keyed_by("int"), ("9", "10")) is None
    assert usable_bounds(_keyed_by("varchar(20)"), (9, 10)) is None
    assert usable_bounds(_keyed_by("int"), (True, 10)) is None
