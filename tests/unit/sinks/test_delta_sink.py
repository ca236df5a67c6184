"""The Delta sink's pure parts: which key ranges bound a MERGE, which hold rows."""

from __future__ import annotations

from airflow_dblog.config import DeltaSinkConfig
from airflow_dblog.core.events import TableId
from airflow_dblog.sinks.delta_sink import _WRITTEN_RANGES, DeltaSink, _overlap, usable_bounds
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


def test_a_written_range_overlaps_a_range_sharing_one_of_its_values() -> None:
    assert _overlap((1, 10), (10, 20), above=False)
    assert not _overlap((1, 10), (10, 20), above=True)  # the lower end left out
    assert not _overlap((11, 20), (1, 10), above=False)
    assert _overlap((None, None), (5, 6), above=False)
    assert _overlap((1, 10), (None, 1), above=False)
    assert _overlap((1, 10), (5, None), above=True)
    assert not _overlap(("b", "c"), ("d", None), above=False)


def test_a_sink_that_created_a_table_holds_what_it_wrote_there_and_nothing_else() -> None:
    schemas = {TABLE: _keyed_by("bigint")}
    sink = DeltaSink(None, DeltaSinkConfig(path="/lake"), schemas, "app")  # type: ignore[arg-type]
    sink._written[TABLE] = []
    assert not sink._holds_in(TABLE, None, None)
    sink._wrote(TABLE, (1, 10))
    assert sink._holds_in(TABLE, None, (10, 20))
    assert not sink._holds_in(TABLE, None, (10, 20), above=True)
    assert not sink._holds_in(TABLE, None, (11, 20))
    for low in range(100, 100 + _WRITTEN_RANGES):  # past the ranges kept: their hull
        sink._wrote(TABLE, (low, low))
    assert sink._written[TABLE] == [(1, 100 + _WRITTEN_RANGES - 1)]
    assert sink._holds_in(TABLE, None, (11, 20))  # more than it wrote, never less
    sink._wrote(TABLE, None)  # a write whose range was not known: anywhere
    assert sink._holds_in(TABLE, None, (10_000, None))
