"""User-given key values (JSON) as the Python values psycopg2 returns for their columns.

A key typed on the command line or in a signal must compare equal to the key a SELECT or the
WAL gives for the same row, or a dump by keys would miss it: each value is converted to the
column's type, and refused in one line when it cannot be one.
"""

from __future__ import annotations

import datetime as dt
import decimal
import re
import uuid
from typing import Any

from airflow_dblog.sources.postgres.schema import ColumnInfo
from airflow_dblog.sources.sql import is_integral

_INT_RANGES = {"int2": 16, "int4": 32, "int8": 64}
_TEXT_TYPES = {"text", "varchar", "bpchar", "name", "citext"}
_FLOAT_TYPES = {"float4", "float8"}
_TIMESTAMP_RE = re.compile(
    r"^(\d{4})-(\d{2})-(\d{2})(?:[T ](\d{2}):(\d{2})(?::(\d{2})(?:\.(\d{1,6})\d*)?)?)?"
    r"\s*(Z|[+-]\d{2}(?::?\d{2})?)?$"
)


def expects(col: ColumnInfo) -> str:
    t = col.base_type
    if t in _INT_RANGES:
        return f"an integer ({col.type})"
    if t == "numeric":
        return "a number or a decimal string (numeric)"
    if t in _FLOAT_TYPES:
        return f"a number ({col.type})"
    if t in _TEXT_TYPES:
        return f"a string ({col.type})"
    if t == "uuid":
        return "a UUID string (uuid)"
    if t == "date":
        return "an ISO date string YYYY-MM-DD (date)"
    if t == "timestamp":
        return "an ISO timestamp string without time zone (timestamp)"
    if t == "timestamptz":
        return "an ISO timestamp string, UTC unless it has an offset (timestamptz)"
    if t == "bytea":
        return "a hex string (bytea)"
    if t == "bool":
        return "true or false (boolean)"
    return f"a value of type {col.type}"


def _parse_timestamp(text: str, aware: bool) -> dt.datetime:
    m = _TIMESTAMP_RE.match(text.strip())
    if not m:
        raise ValueError("not an ISO timestamp")
    year, month, day, hh, mm, ss, frac, tz = m.groups()
    micro = int((frac or "0").ljust(6, "0"))
    value = dt.datetime(
        int(year), int(month), int(day), int(hh or 0), int(mm or 0), int(ss or 0), micro
    )
    if tz is None:
        return value.replace(tzinfo=dt.timezone.utc) if aware else value
    if not aware:
        raise ValueError("timestamp (without time zone) takes no UTC offset")
    if tz == "Z":
        offset = dt.timedelta(0)
    else:
        sign = -1 if tz[0] == "-" else 1
        digits = tz[1:].replace(":", "")
        offset = sign * dt.timedelta(hours=int(digits[:2]), minutes=int(digits[2:] or 0))
    return value.replace(tzinfo=dt.timezone(offset)).astimezone(dt.timezone.utc)


def coerce_value(col: ColumnInfo, value: Any) -> Any:
    """A JSON value (or an already typed one) as the Python value SELECTs return for ``col``."""
    t = col.base_type
    if value is None:
        raise ValueError("a primary key value cannot be null")
    if t in _INT_RANGES:
        if isinstance(value, bool):
            raise TypeError("a boolean is not an integer")
        if is_integral(value):
            value = int(value)
        if not isinstance(value, int):
            raise TypeError("not an integer")
        bits = _INT_RANGES[t]
        if not -(2 ** (bits - 1)) <= value < 2 ** (bits - 1):
            raise ValueError(f"out of range for {col.type}")
        return value
    if t == "numeric":
        if isinstance(value, bool):
            raise TypeError("a boolean is not a number")
        if isinstance(value, float):
            value = repr(value)
        try:
            number = (
                decimal.Decimal(str(value).strip())
                if not isinstance(value, decimal.Decimal)
                else value
            )
        except decimal.InvalidOperation:
            raise ValueError("not a decimal number") from None
        if not number.is_finite():
            raise ValueError("not a finite number")
        if col.scale is not None:  # numeric(p, s) values come back with exactly s decimals
            rounded = number.quantize(decimal.Decimal(1).scaleb(-col.scale))
            if rounded != number:
                raise ValueError(f"has more than {col.scale} decimals")
            number = rounded
        return number
    if t in _FLOAT_TYPES:
        if isinstance(value, bool) or not isinstance(value, (int, float, decimal.Decimal)):
            raise TypeError("not a number")
        return float(value)
    if t == "bool":
        if not isinstance(value, bool):
            raise TypeError("not a boolean")
        return value
    if t == "uuid":
        if isinstance(value, uuid.UUID):
            return str(value)
        if not isinstance(value, str):
            raise TypeError("not a string")
        return str(uuid.UUID(value.strip()))
    if t == "date":
        if isinstance(value, dt.datetime):
            raise TypeError("a timestamp is not a date")
        if isinstance(value, dt.date):
            return value
        if not isinstance(value, str):
            raise TypeError("not a string")
        return dt.date.fromisoformat(value.strip())
    if t in ("timestamp", "timestamptz"):
        aware = t == "timestamptz"
        if isinstance(value, dt.datetime):
            if aware:
                tz = value if value.tzinfo else value.replace(tzinfo=dt.timezone.utc)
                return tz.astimezone(dt.timezone.utc)
            if value.tzinfo is not None:
                raise ValueError("timestamp (without time zone) takes no UTC offset")
            return value
        if not isinstance(value, str):
            raise TypeError("not a string")
        return _parse_timestamp(value, aware)
    if t == "bytea":
        if isinstance(value, (bytes, bytearray, memoryview)):
            return bytes(value)
        if not isinstance(value, str):
            raise TypeError("not a hex string")
        text = value.strip()
        if text.startswith(("\\x", "0x")):
            text = text[2:]
        return bytes.fromhex(text)
    if t in _TEXT_TYPES or col.category == "S":
        if not isinstance(value, str):
            raise TypeError("not a string")
        if col.max_length is not None and len(value) > col.max_length:
            raise ValueError(f"longer than {col.max_length} characters")
        if t == "bpchar" and col.max_length is not None:
            value = value.ljust(col.max_length)  # char(n) comes back blank-padded
        return value
    # enums and other types: the server casts the bound string (errors surface as InputError)
    if isinstance(value, (dict, list)):
        raise TypeError(f"a JSON {type(value).__name__} is not a {col.type}")
    return value
