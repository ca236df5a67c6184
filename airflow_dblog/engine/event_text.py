"""A change event as JSON text, field by field: what the spool stores and Kafka sends.

Values are written as plain JSON a consumer can use without this package: decimals, UUIDs and
times as text, bytes as base64, JSON columns as their text.
"""

from __future__ import annotations

import base64
import datetime as dt
import decimal
import json
import math
import uuid
from collections.abc import Sequence
from typing import Any, NamedTuple

import orjson

from airflow_dblog.core.events import ChangeEvent, Row


def plain_value(value: Any) -> Any:
    """A column value as plain JSON (what Delta and Kafka consumers receive)."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, (decimal.Decimal, uuid.UUID)):
        return str(value)
    if isinstance(value, (dt.datetime, dt.date, dt.time)):
        return value.isoformat()
    if isinstance(value, dt.timedelta):
        return value.total_seconds()
    if isinstance(value, (bytes, bytearray, memoryview)):
        return base64.b64encode(bytes(value)).decode("ascii")
    if isinstance(value, (dict, list, tuple)):
        return json.dumps(value, default=plain_value, separators=(",", ":"))
    return str(value)


_PLAIN_TYPES = frozenset({str, int, float, bool, type(None)})
encode_json = json.JSONEncoder(separators=(",", ":")).encode  # one encoder, not one per call


def plain_row(row: Row | None) -> dict[str, Any] | None:
    if row is None:
        return None
    return {k: v if type(v) in _PLAIN_TYPES else plain_value(v) for k, v in row.items()}


# Values whose JSON the encoder writes itself, or as plain_value gives it when asked through
# ``default`` (a string or a number): a row of these alone is encoded without building the
# plain copy first. Lists, dicts and tuples are not: plain_value writes them as JSON text.
_SCALAR_TYPES = _PLAIN_TYPES | {
    decimal.Decimal,
    uuid.UUID,
    dt.datetime,
    dt.date,
    dt.time,
    dt.timedelta,
    bytes,
    bytearray,
}
_encode_scalars = json.JSONEncoder(
    separators=(",", ":"), default=plain_value, check_circular=False
).encode


# What orjson writes as plain_value would, once the row passes ``_orjson_exact``: not times of
# day, some of whose microseconds it writes a digit short.
_ORJSON_TYPES = _SCALAR_TYPES - {dt.time}


def row_text(row: Row) -> str:
    """``plain_row(row)`` as a JSON object.

    orjson writes the row in C, datetimes and UUIDs included, calling ``plain_value`` for the
    rest (decimals, bytes, intervals). Its text is the same JSON value as the standard encoder's,
    not always the same bytes: non-ASCII as UTF-8, not escaped, and exponents without a sign or a
    leading zero (``1e-7``). Rows it would write otherwise go the standard way."""
    types = set(map(type, row.values()))
    if not _SCALAR_TYPES.issuperset(types):
        return encode_json(plain_row(row))
    if _ORJSON_TYPES.issuperset(types) and _orjson_exact(row, types):
        try:
            return orjson.dumps(row, default=plain_value).decode()
        except orjson.JSONEncodeError:  # an integer beyond 64 bits, a lone surrogate
            pass
    return _encode_scalars(row)


def _orjson_exact(row: Row, types: set[type]) -> bool:
    """Whether orjson writes this row's floats and datetimes as the standard encoder does: it
    writes a float that is not finite as null, and drops the seconds of a UTC offset."""
    if float in types and not all(math.isfinite(v) for v in row.values() if type(v) is float):
        return False
    if dt.datetime in types:
        for v in row.values():
            if type(v) is dt.datetime and v.tzinfo is not None:
                offset = v.utcoffset()
                if offset is not None and (offset.seconds % 60 or offset.microseconds):
                    return False
    return True


def key_text(key: Sequence[Any]) -> str:
    """The key values as a JSON array (an integer key's text written directly)."""
    if all(type(v) is int for v in key):
        return "[" + ",".join(map(str, key)) + "]"
    return encode_json([plain_value(v) for v in key])


def _int_text(value: int | None) -> str:
    return "null" if value is None else str(int(value))


class EventText(NamedTuple):
    """One event with each field already JSON text: the spool line and the Kafka message are
    both concatenated from it, so a row image is encoded once for both."""

    table: str
    op: str
    key: str  # the key values as a JSON array
    position: str
    before: str  # a JSON object, or null
    after: str
    ts_ms: str
    dump_id: str
    chunk_id: str
    unavailable: str
    source: str  # the reader's own fields (gtid, xid, pk_change) as a JSON object

    @classmethod
    def of(cls, event: ChangeEvent) -> EventText:
        extra = event.extra
        if event.gtid is None and event.xid is None and not extra:
            source = "{}"  # dumped rows, and most log events of a reader without extras
        else:
            fields: dict[str, Any] = {}
            if event.gtid is not None:
                fields["gtid"] = event.gtid
            if event.xid is not None:
                fields["xid"] = event.xid
            fields.update({k: v for k, v in extra.items() if k != "unavailable_columns"})
            source = encode_json(fields)
        unavailable = extra.get("unavailable_columns") if extra else None
        return cls(
            str(event.table),
            event.op,
            key_text(event.key),
            str(event.position),
            "null" if event.before is None else row_text(event.before),
            "null" if event.after is None else row_text(event.after),
            _int_text(event.ts_ms),
            _int_text(event.dump_id),
            _int_text(event.chunk_id),
            encode_json(unavailable) if unavailable else "[]",
            source,
        )

    @classmethod
    def parse(cls, line: str) -> EventText:
        """From a spool line (a restart: the segment is no longer in memory)."""
        record = json.loads(line)
        return cls(
            record["table"],
            record["op"],
            record["key"],
            record["position"],
            *(
                encode_json(record[field])
                for field in ("before", "after", "ts_ms", "dump_id", "chunk_id", "unavailable")
            ),
            encode_json(record["source"]),
        )

    def line(self) -> str:
        """The spool's line: a flat JSON object, the key array as a string."""
        return "".join(
            (
                '{"table":',
                encode_json(self.table),
                ',"op":"',
                self.op,
                '","key":',
                encode_json(self.key),
                ',"position":',
                encode_json(self.position),
                ',"before":',
                self.before,
                ',"after":',
                self.after,
                ',"ts_ms":',
                self.ts_ms,
                ',"dump_id":',
                self.dump_id,
                ',"chunk_id":',
                self.chunk_id,
                ',"unavailable":',
                self.unavailable,
                ',"source":',
                self.source,
                "}",
            )
        )
