"""Row and key texts: the shortcuts write what the plain copy encoded writes, value for value."""

from __future__ import annotations

import collections
import datetime as dt
import decimal
import json
import uuid
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from airflow_dblog.engine.event_text import encode_json, key_text, plain_row, plain_value, row_text

Pair = collections.namedtuple("Pair", "a b")

SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.floats(),
    st.text(),
    st.decimals(allow_nan=False),
    st.uuids(),
    st.datetimes(),
    st.datetimes(timezones=st.just(dt.timezone.utc)),
    st.datetimes(  # offsets of seconds too, as a historic zone's local mean time has
        timezones=st.timedeltas(dt.timedelta(hours=-23), dt.timedelta(hours=23)).map(dt.timezone)
    ),
    st.dates(),
    st.times(),
    st.timedeltas(),
    st.binary(),
    st.binary().map(bytearray),
)
# what a driver may also give: arrays, JSON documents, a tuple-like row type
NESTED = st.one_of(
    st.lists(st.integers(), max_size=3),
    st.dictionaries(st.text(max_size=3), st.integers(), max_size=2),
    st.tuples(st.integers(), st.text()).map(lambda t: Pair(*t)),
)


@given(st.dictionaries(st.text(max_size=5), st.one_of(SCALARS, NESTED), max_size=6))
def test_a_rows_text_is_its_plain_copy_encoded(row: dict[str, Any]) -> None:
    assert same_json(row_text(row), encode_json(plain_row(row)))


def same_json(a: str, b: str) -> bool:
    """The same JSON value (NaN included, which is not equal to itself once parsed)."""
    return encode_json(json.loads(a)) == encode_json(json.loads(b))


@given(st.lists(st.one_of(st.integers(), st.booleans(), st.text(), st.decimals()), min_size=1))
def test_a_keys_text_is_its_plain_values_encoded(key: list[Any]) -> None:
    assert key_text(key) == encode_json([plain_value(v) for v in key])


def test_values_outside_json_are_written_as_text_in_a_row() -> None:
    row = {"d": decimal.Decimal("1.50"), "u": uuid.UUID(int=1), "t": dt.time(1, 2), "b": b"\x00"}
    assert row_text(row) == (
        '{"d":"1.50","u":"00000000-0000-0000-0000-000000000001","t":"01:02:00","b":"AA=="}'
    )
    assert row_text({"j": [1, 2]}) == '{"j":"[1,2]"}'  # a JSON column as its text


def test_values_orjson_would_write_otherwise_keep_their_standard_text() -> None:
    assert row_text({"t": dt.time(0, 0, 0, 10000)}) == '{"t":"00:00:00.010000"}'
    lmt = dt.timezone(dt.timedelta(minutes=19, seconds=32))
    assert row_text({"at": dt.datetime(1900, 1, 1, tzinfo=lmt)}) == (
        '{"at":"1900-01-01T00:00:00+00:19:32"}'
    )
    assert row_text({"f": float("nan"), "g": -float("inf")}) == '{"f":NaN,"g":-Infinity}'
    assert row_text({"i": 2**64}) == '{"i":18446744073709551616}'
