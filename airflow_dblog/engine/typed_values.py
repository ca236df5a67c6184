"""Dumped rows as typed columns: each source column as the type Delta stores it in.

A chunk file holds each row's JSON text, which Kafka sends as it is. Delta would parse that
text back into typed columns, on every batch, for every dumped row: most of what a batch's
dumped rows cost it besides the write. So, when the stream writes to Delta, the chunk's worker
also writes each column as an Arrow array of its stored type, which Delta reads as they are.

A column becomes typed only where the values are of the Python types its stored type takes
exactly (ints into ``bigint``, decimals into ``decimal``, datetimes into ``timestamp``, ...),
and a text column only where every value's plain JSON form is a string: what Delta gets is then
the value the JSON text would have been cast to. One value outside that (a zero date a lax
MySQL returns as text, a decimal with more digits than its scale, a YEAR column's ints in a
text column) leaves the whole chunk JSON only, and Delta parses it as before.
"""

from __future__ import annotations

import datetime as dt
import decimal
import re
import uuid
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from airflow_dblog.engine.event_text import plain_value
from airflow_dblog.sources.base import Column

if TYPE_CHECKING:
    import pyarrow as pa

    from airflow_dblog.core.events import Row

_INTEGER = re.compile(r"^(tiny|small|medium|big)?int(eger)?\b|^int[248]\b|^(small|big)?serial")
_DECIMAL = re.compile(r"^(decimal|numeric)\s*\((\d+)(?:\s*,\s*(\d+))?\)")

# stored type: the Python types whose values it takes as they are (exact classes: a bool is
# not an int here, a datetime not a date)
_EXACT: dict[str, frozenset[type]] = {
    "bigint": frozenset({int}),
    "double": frozenset({float}),
    "boolean": frozenset({bool}),
    "date": frozenset({dt.date}),
    "timestamp": frozenset({dt.datetime}),
    "binary": frozenset({bytes, bytearray}),
    "decimal": frozenset({decimal.Decimal, int}),
}
# values whose plain JSON form is a string (event_text.plain_value): a text column takes them
_TEXTUAL = frozenset(
    {str, decimal.Decimal, uuid.UUID, dt.datetime, dt.date, dt.time, bytes, bytearray, dict, list}
)
_NONE = type(None)


def stored_type(column: Column) -> str:
    """The type a source column is stored as in Delta, in Spark's DDL spelling (text when
    nothing fits exactly)."""
    name = column.type.lower().strip()
    if _INTEGER.match(name):
        return "decimal(20,0)" if name.startswith("bigint") and "unsigned" in name else "bigint"
    if m := _DECIMAL.match(name):
        precision, scale = int(m.group(2)), int(m.group(3) or 0)
        return f"decimal({precision},{scale})" if precision <= 38 else "string"
    if name.startswith(("float", "double", "real")):
        return "double"
    if name in ("bool", "boolean"):
        return "boolean"
    if name == "date":
        return "date"
    if name.startswith(("datetime", "timestamp")):
        return "timestamp"
    if name == "bytea" or name.endswith("blob") or name.startswith(("binary", "varbinary")):
        return "binary"
    return "string"


def stored_columns(columns: Sequence[Column]) -> tuple[tuple[str, str], ...]:
    """Each column's name and stored type: what a chunk's typed columns are written as."""
    return tuple((c.name, stored_type(c)) for c in columns)


def decimal_digits(stored: str) -> tuple[int, int] | None:
    """A stored ``decimal(p,s)`` type's precision and scale (None for any other type)."""
    if not stored.startswith("decimal("):
        return None
    precision, scale = stored[len("decimal(") : -1].split(",")
    return int(precision), int(scale)


def arrow_type(stored: str) -> pa.DataType:
    import pyarrow as pa

    if digits := decimal_digits(stored):
        return pa.decimal128(*digits)
    return {
        "bigint": pa.int64(),
        "double": pa.float64(),
        "boolean": pa.bool_(),
        "date": pa.date32(),
        # a naive datetime is taken as UTC, as the JSON text is cast in the stream's session
        # time zone, UTC
        "timestamp": pa.timestamp("us", tz="UTC"),
        "binary": pa.binary(),
        "string": pa.string(),
    }[stored]


def typed_arrays(rows: Sequence[Row], columns: Sequence[tuple[str, str]]) -> list[pa.Array] | None:
    """The rows' values of ``columns`` (name, stored type) as arrays of those types, or None
    when a value has no exact typed form (the chunk then stays JSON only)."""
    arrays = []
    for name, stored in columns:
        array = _array([row.get(name) for row in rows], stored)
        if array is None:
            return None
        arrays.append(array)
    return arrays


def _array(values: list[Any], stored: str) -> pa.Array | None:
    import pyarrow as pa

    kinds = set(map(type, values)) - {_NONE}
    if stored == "string":
        if not kinds <= _TEXTUAL:
            return None
        if kinds - {str}:
            values = [v if v is None or type(v) is str else plain_value(v) for v in values]
    elif not kinds <= _EXACT[stored.partition("(")[0]]:
        return None
    try:
        return pa.array(values, arrow_type(stored))
    except (pa.ArrowException, OverflowError, ValueError, TypeError):
        return None  # out of the type's range, more digits than its scale, ...
