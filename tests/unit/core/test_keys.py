"""User-typed keys: shapes accepted, one-line errors, and the JSON form kept in metadata."""

from __future__ import annotations

import datetime as dt
import decimal
import re
import uuid

import pytest

from airflow_dblog.core.keys import from_json, key_in_order, parse_keys, to_json
from airflow_dblog.errors import InputError


@pytest.mark.parametrize(
    ("value", "columns", "expected"),
    [
        (42, ["id"], [42]),
        ([1, "x"], ["a", "b"], [1, "x"]),
        ({"b": "x", "a": 1}, ["a", "b"], [1, "x"]),
    ],
)
def test_key_shapes(value: object, columns: list[str], expected: list[object]) -> None:
    assert key_in_order(value, columns, "app.t") == expected


@pytest.mark.parametrize(
    ("value", "columns", "message"),
    [
        ([1], ["a", "b"], "has 1 value(s)"),
        ({"a": 1}, ["a", "b"], "names columns ['a']"),
        (7, ["a", "b"], "is a single value"),
    ],
)
def test_key_shape_errors(value: object, columns: list[str], message: str) -> None:
    with pytest.raises(InputError, match=re.escape(message)):
        key_in_order(value, columns, "app.t")


def test_json_round_trip_keeps_bytes_and_text_forms() -> None:
    key = (
        1,
        "x",
        b"\x00\xff",
        dt.date(2024, 2, 29),
        dt.datetime(2024, 1, 1, 12, 30),
        decimal.Decimal("1.50"),
        uuid.UUID(int=5),
    )
    encoded = to_json(key)
    assert encoded[2] == {"$bytes": "00ff"}
    assert encoded[3:] == [
        "2024-02-29",
        "2024-01-01T12:30:00",
        "1.50",
        "00000000-0000-0000-0000-000000000005",
    ]
    assert from_json(encoded)[:3] == [1, "x", b"\x00\xff"]
    with pytest.raises(TypeError):
        to_json([object()])


def test_parse_keys_one_per_line_as_the_form_and_the_cli_take_them() -> None:
    text = '42\nabc\n\n[1, "eu"]\n{"id": 2, "region": "us"}\n  7.5 \n"quoted"'
    assert parse_keys(text) == [42, "abc", [1, "eu"], {"id": 2, "region": "us"}, 7.5, "quoted"]
    with pytest.raises(InputError, match="line 2 of the keys is not valid JSON"):
        parse_keys('1\n[1, "x"')
