"""Typed columns of dumped rows: each value as Delta stores it, or the chunk stays JSON."""

from __future__ import annotations

import datetime as dt
import decimal
import uuid
from typing import Any

import pyarrow as pa
import pytest

from airflow_dblog.core.events import TableId
from airflow_dblog.engine.chunk_file import encode_rows, typed_name
from airflow_dblog.engine.typed_values import stored_columns, stored_type, typed_arrays
from airflow_dblog.sources.base import Column, TableSchema


@pytest.mark.parametrize(
    ("declared", "stored"),
    [
        ("int(11)", "bigint"),
        ("tinyint(1)", "bigint"),
        ("bigserial", "bigint"),
        ("bigint unsigned", "decimal(20,0)"),
        ("decimal(10,2)", "decimal(10,2)"),
        ("numeric(65,30)", "string"),
        ("numeric", "string"),
        ("double precision", "double"),
        ("boolean", "boolean"),
        ("date", "date"),
        ("datetime(6)", "timestamp"),
        ("timestamp with time zone", "timestamp"),
        ("bytea", "binary"),
        ("mediumblob", "binary"),
        ("varchar(20)", "string"),
        ("time", "string"),
        ("year", "string"),
    ],
)
def test_a_source_type_is_stored_as_the_spark_type_that_holds_it_exactly(
    declared: str, stored: str
) -> None:
    assert stored_type(Column("c", declared, True)) == stored


def _one(value: Any, stored: str) -> pa.Array | None:
    arrays = typed_arrays([{"c": value}, {"c": None}], [("c", stored)])
    return None if arrays is None else arrays[0]


@pytest.mark.parametrize(
    ("value", "stored", "expected"),
    [
        (7, "bigint", 7),
        (2**64 - 1, "decimal(20,0)", decimal.Decimal(2**64 - 1)),
        (decimal.Decimal("1.5"), "decimal(10,2)", decimal.Decimal("1.50")),
        (0.1, "double", 0.1),
        (True, "boolean", True),
        (dt.date(2024, 2, 29), "date", dt.date(2024, 2, 29)),
        (b"\x00", "binary", b"\x00"),
        ("é", "string", "é"),
        # a text column holds a value's plain JSON text
        (decimal.Decimal("1.50"), "string", "1.50"),
        (uuid.UUID(int=1), "string", "00000000-0000-0000-0000-000000000001"),
        (dt.time(1, 2, 3), "string", "01:02:03"),
        ({"a": [1]}, "string", '{"a":[1]}'),
        (b"\xff", "string", "/w=="),
    ],
)
def test_a_value_of_the_type_its_column_is_stored_as_is_written_as_it_is(
    value: Any, stored: str, expected: Any
) -> None:
    array = _one(value, stored)
    assert array is not None and array.to_pylist() == [expected, None]


def test_a_naive_datetime_is_a_utc_instant_and_an_aware_one_keeps_its_instant() -> None:
    naive = dt.datetime(2024, 1, 1, 12, 0, 0, 5)
    aware = dt.datetime(2024, 1, 1, 12, tzinfo=dt.timezone(dt.timedelta(hours=2)))
    array = typed_arrays([{"t": naive}, {"t": aware}], [("t", "timestamp")])
    assert array is not None
    assert array[0].to_pylist() == [naive.replace(tzinfo=dt.UTC), aware.astimezone(dt.UTC)]


@pytest.mark.parametrize(
    ("value", "stored"),
    [
        ("0000-00-00", "date"),  # a zero date a lax MySQL returns as text
        (dt.datetime(2024, 1, 1), "date"),
        (True, "bigint"),
        (2**63, "bigint"),
        (1, "double"),
        (decimal.Decimal("1.555"), "decimal(10,2)"),  # more digits than the scale
        (decimal.Decimal("NaN"), "decimal(10,2)"),
        (decimal.Decimal("1e20"), "decimal(10,2)"),  # beyond the precision
        (2024, "string"),  # a YEAR: its JSON is a number
        (dt.timedelta(hours=1), "string"),  # a MySQL TIME: its JSON is a number of seconds
        (1.5, "string"),
    ],
)
def test_a_value_without_an_exact_typed_form_leaves_the_chunk_json_only(
    value: Any, stored: str
) -> None:
    assert _one(value, stored) is None


SCHEMA = TableSchema(
    TableId("db", "t"),
    (Column("id", "int", False), Column("at", "date", True), Column("n", "varchar(9)", True)),
    ("id",),
)


def test_a_chunk_file_holds_the_typed_columns_in_order_after_the_json() -> None:
    typed = stored_columns(SCHEMA.columns)
    rows = [((1,), {"id": 1, "at": dt.date(2024, 1, 1), "n": "a"}), ((2,), {"id": 2})]
    table, selected = encode_rows(5, rows, typed=typed)
    assert selected.typed == typed
    assert table.column_names[:5] == ["chunk_id", "idx", "key", "mkey", "after"]
    assert [table.column(typed_name(i)).to_pylist() for i in range(3)] == [
        [1, 2],
        [dt.date(2024, 1, 1), None],
        ["a", None],
    ]


def test_a_chunk_with_a_value_of_no_typed_form_holds_the_json_alone() -> None:
    rows = [((1,), {"id": 1, "at": "0000-00-00", "n": "a"})]
    table, selected = encode_rows(5, rows, typed=stored_columns(SCHEMA.columns))
    assert selected.typed == ()
    assert table.column_names == ["chunk_id", "idx", "key", "mkey", "after"]


def test_a_stream_without_delta_writes_no_typed_column() -> None:
    table, selected = encode_rows(5, [((1,), {"id": 1})])
    assert (selected.typed, table.num_columns) == ((), 5)
