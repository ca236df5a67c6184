"""User-given key values (JSON) in the Python types PyMySQL returns for their columns.

A key typed on the command line or in a signal must compare equal to the key a SELECT or the
binlog gives for the same row, or a dump by keys would miss it: each value is converted to the
column's type, and refused in one line when it cannot be one.
"""

from __future__ import annotations

import datetime as dt
import decimal
import re
import uuid
from typing import Any

from airflow_dblog.sources.mysql.schema import BINARY_TYPES, ColumnInfo
from airflow_dblog.sources.sql import is_integral

INT_BITS = {"tinyint": 8, "smallint": 16, "mediumint": 24, "int": 32, "integer": 32, "bigint": 64}


def expects(col: ColumnInfo) -> str:
    kind = col.data_type
    if kind in INT_BITS:
        return f"an integer ({col.column_type})"
    if kind == "decimal":
        return f"a decimal number ({col.column_type})"
    if kind in ("float", "double", "real"):
        return "a number"
    if kind in BINARY_TYPES:
        return f"bytes, 0x-hex text or a UUID ({col.column_type})"
    if kind == "date":
        return "an ISO date like 2024-01-31"
    if kind in ("datetime", "timestamp"):
        return "an ISO date-time like 2024-01-31T12:00:00"
    if kind == "time":
        return "a time like 12:30:00 or seconds"
    if kind == "uuid":
        return "a UUID string"
    return f"a string ({col.column_type})"


def coerce_value(col: ColumnInfo, value: Any) -> Any:
    """One JSON value in the Python type PyMySQL returns for ``col``; ValueError if it can't."""
    kind = col.data_type
    if value is None:
        raise ValueError("primary key values cannot be null")
    if kind in INT_BITS or kind == "year":
        if isinstance(value, bool):
            raise ValueError
        number = _as_int(value)
        if kind in INT_BITS:
            bits = INT_BITS[kind]
            signed = (-(2 ** (bits - 1)), 2 ** (bits - 1) - 1)
            low, high = (0, 2**bits - 1) if col.unsigned else signed
            if not low <= number <= high:
                raise ValueError(f"out of range {low}..{high}")
        return number
    if kind == "decimal":
        if isinstance(value, bool) or not isinstance(value, (int, float, str, decimal.Decimal)):
            raise ValueError
        try:
            number = decimal.Decimal(str(value).strip())
        except decimal.InvalidOperation:
            raise ValueError from None
        if not number.is_finite():
            raise ValueError
        if col.scale is not None:
            quantum = decimal.Decimal(1).scaleb(-col.scale)
            rounded = number.quantize(quantum)
            if rounded != number:
                raise ValueError(f"has more than {col.scale} decimals")
            number = rounded
        return number
    if kind in ("float", "double", "real"):
        if isinstance(value, bool):
            raise ValueError
        return float(value)
    if kind in BINARY_TYPES:
        if isinstance(value, (bytes, bytearray, memoryview)):
            data = bytes(value)
        elif isinstance(value, uuid.UUID):
            data = value.bytes
        elif isinstance(value, str):
            if re.fullmatch(r"0[xX]([0-9a-fA-F]{2})*", value):
                data = bytes.fromhex(value[2:])
            elif col.char_length == 16 and _looks_like_uuid(value):
                data = uuid.UUID(value).bytes
            else:
                data = value.encode("utf-8")
        else:
            raise ValueError
        if col.char_length is not None and len(data) > col.char_length:
            raise ValueError(f"longer than {col.char_length} bytes")
        if kind == "binary" and col.char_length:
            data = data.ljust(col.char_length, b"\x00")
        return data
    if kind == "date":
        if isinstance(value, dt.datetime):
            raise ValueError
        if isinstance(value, dt.date):
            return value
        if isinstance(value, str):
            return dt.date.fromisoformat(value.strip())
        raise ValueError
    if kind in ("datetime", "timestamp"):
        if isinstance(value, dt.datetime):
            stamp = value
        elif isinstance(value, str):
            text = value.strip()
            if text.endswith(("Z", "z")):
                text = text[:-1] + "+00:00"
            stamp = dt.datetime.fromisoformat(text)
        else:
            raise ValueError
        if stamp.tzinfo is not None:
            stamp = stamp.astimezone(dt.timezone.utc).replace(tzinfo=None)
        return stamp
    if kind == "time":
        if isinstance(value, dt.timedelta):
            return value
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return dt.timedelta(seconds=value)
        if isinstance(value, str):
            match = re.fullmatch(r"\s*(-)?(\d+):(\d\d):(\d\d)(?:\.(\d{1,6}))?\s*", value)
            if match:
                sign, h, m, s, frac = match.groups()
                delta = dt.timedelta(
                    hours=int(h),
                    minutes=int(m),
                    seconds=int(s),
                    microseconds=int((frac or "0").ljust(6, "0")),
                )
                return -delta if sign else delta
        raise ValueError
    if kind == "uuid":
        if isinstance(value, uuid.UUID):
            return str(value)
        if isinstance(value, str) and _looks_like_uuid(value):
            return str(uuid.UUID(value))
        raise ValueError
    # strings: char, varchar, text, enum, set
    if isinstance(value, uuid.UUID):
        value = str(value)
    if not isinstance(value, str):
        raise ValueError
    if col.char_length is not None and len(value) > col.char_length:
        raise ValueError(f"longer than {col.char_length} characters")
    if kind == "char":
        value = value.rstrip(" ")  # CHAR drops trailing spaces on the way out
    return value


def _as_int(value: Any) -> int:
    if isinstance(value, int):
        return value
    if not is_integral(value):
        raise ValueError
    return int(value)


def _looks_like_uuid(text: str) -> bool:
    try:
        uuid.UUID(text)
    except (ValueError, AttributeError, TypeError):
        return False
    return True
