"""Primary keys as people type them and as the metadata store keeps them.

People write a key as a scalar (one-column keys), a list in key order, or an object by column
name. The metadata store keeps keys as JSON; bytes are tagged so they survive the round trip.
Turning the JSON values into column types is the source's job (``Source.coerce_key``).
"""

from __future__ import annotations

import datetime as dt
import decimal
import json
import uuid
from collections.abc import Mapping, Sequence
from typing import Any

from airflow_dblog.errors import InputError

_BYTES = "$bytes"

MAX_KEYS_PER_CHUNK = 10_000
"""A key-list chunk reads its keys in one snapshot transaction: the planner cuts lists to this."""


def check_arity(table: object, key_columns: Sequence[str], values: Sequence[Any]) -> Sequence[Any]:
    """``values`` unchanged if there is one per key column; InputError otherwise."""
    if len(values) != len(key_columns):
        raise InputError(
            f"key {list(values)!r} has {len(values)} value(s) but {table} has the"
            f" {len(key_columns)}-column primary key ({', '.join(key_columns)})",
            "give one value per primary key column, in key order",
        )
    return values


def key_in_order(value: Any, key_columns: Sequence[str], table: object) -> list[Any]:
    """A user-given key as a list in key-column order; InputError when its shape is wrong."""
    columns = list(key_columns)
    if isinstance(value, Mapping):
        names = set(map(str, value))
        if names != set(columns):
            raise InputError(
                f"key {dict(value)!r} for {table} names columns {sorted(names)}",
                f"give exactly the primary key columns ({', '.join(columns)})",
            )
        return [value[c] for c in columns]
    if isinstance(value, Sequence) and not isinstance(value, (str, bytes)):
        return list(check_arity(table, columns, value))
    if len(columns) != 1:
        raise InputError(
            f"key {value!r} for {table} is a single value",
            f'write composite keys as a list in order {columns} or as {{"{columns[0]}": ...}}',
        )
    return [value]


def to_json(key: Sequence[Any]) -> list[Any]:
    """A key tuple as JSON-able values (dates as ISO text, decimals and UUIDs as text)."""
    return [_jsonable(v) for v in key]


def from_json(values: Sequence[Any]) -> list[Any]:
    """Undo the tagging of :func:`to_json`; other values stay JSON for ``coerce_key``."""
    return [
        bytes.fromhex(v[_BYTES]) if isinstance(v, dict) and set(v) == {_BYTES} else v
        for v in values
    ]


def _jsonable(value: Any) -> Any:
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, (bytes, bytearray, memoryview)):
        return {_BYTES: bytes(value).hex()}
    if isinstance(value, (dt.datetime, dt.date, dt.time)):
        return value.isoformat()
    if isinstance(value, (decimal.Decimal, uuid.UUID)):
        return str(value)
    if isinstance(value, dt.timedelta):
        return value.total_seconds()
    raise TypeError(f"cannot store a key value of type {type(value).__name__}")


def parse_keys(text: str) -> list[Any]:
    """One key per line, as the Airflow form and ``dblog dump --pk`` take them: JSON where the
    line is a number, ``true``/``false``/``null``, a quoted string, a list or an object;
    otherwise the line itself is a string key."""
    keys: list[Any] = []
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line:
            continue
        if line[0] in '[{"' or line in ("true", "false", "null") or _is_number(line):
            try:
                keys.append(json.loads(line))
            except json.JSONDecodeError:
                raise InputError(
                    f"line {number} of the keys is not valid JSON: {line[:60]!r}",
                    'write composite keys as [1, "x"] or {"col": 1}',
                ) from None
        else:
            keys.append(line)
    return keys


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def match_key(key: Sequence[Any]) -> str:
    """A key as text that is equal for two keys of the same column types exactly when they
    compare equal in Python (the sources give the log's keys and the SELECT's the same types).

    A chunk's rows are matched against the keys the log changed inside its window where the
    rows are (a Spark task, the Kafka forwarder), not in the merge, so the comparison goes by
    this text: decimals normalised (``1.50`` is ``1.5``), aware times in UTC, bytes as hex.
    """
    return _match_text([_matchable(v) for v in key])


_match_text = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False).encode


def _matchable(value: Any) -> Any:
    if value is None or isinstance(value, (bool, str)):
        return value
    if isinstance(value, int):
        return value
    if isinstance(value, float):
        return int(value) if value.is_integer() else repr(value)
    if isinstance(value, decimal.Decimal):
        if value.is_finite() and value == value.to_integral_value():
            return int(value)
        return str(value.normalize())
    if isinstance(value, dt.datetime) and value.utcoffset() is not None:
        return value.astimezone(dt.timezone.utc).replace(tzinfo=None).isoformat()
    if isinstance(value, (bytes, bytearray, memoryview)):
        return {_BYTES: bytes(value).hex()}
    return _jsonable(value)
