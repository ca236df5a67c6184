"""Binlog row images decoded into the Python types a SELECT through PyMySQL returns.

pymysqlreplication parses the replication protocol and each table map, but its row decoding walks
every column of every image through several method calls per value, and what it returns differs
from a SELECT for some types (BINARY padding, BIT, SET, JSON, FLOAT, MariaDB's UUID, unsigned
integers without ``binlog_row_metadata=FULL``). Decoding the images was most of the capture
thread's time under a steady update load, so the reader decodes them itself: :func:`row_decoder`
builds, once per table map (taking from information_schema what the map's metadata lacks), a
reader per column of its binlog encoding that returns what a SELECT returns; a rows event is then
read straight from its bytes. Logged values must equal dumped ones: the merge compares logged keys
with dumped keys, and verify compares whole rows.
"""

from __future__ import annotations

import codecs
import datetime as dt
import decimal
import json
import struct
import uuid
from collections.abc import Callable
from typing import Any

from pymysql.charset import charset_by_name
from pymysqlreplication.constants import FIELD_TYPE
from pymysqlreplication.json_binary import parse_json

from airflow_dblog.core.events import Row
from airflow_dblog.errors import SourceError
from airflow_dblog.sources.mysql.schema import ColumnInfo, TableInfo

Reader = Callable[[bytes, int], tuple[Any, int]]
"""Reads one non-NULL value at a position of a rows event's bytes: the value, the next position."""

_EPOCH = dt.datetime(1970, 1, 1)
_DIGITS_BYTES = (0, 1, 1, 2, 2, 3, 3, 4, 4, 4)  # bytes holding 0-8 leftover decimal digits


class RowDecoder:
    """One table map's row images, read from a rows event's bytes."""

    def __init__(self, columns: list[tuple[str, Reader]]) -> None:
        self._columns = columns
        # by columns-present bitmap: the null bitmap's size, and per column its name, its bit
        # in the null bitmap (-1: not in the image) and its reader
        self._plans: dict[bytes, tuple[int, tuple[tuple[str, int, Reader], ...]]] = {}

    def images(self, data: bytes, pos: int, end: int, present: tuple[bytes, ...]) -> list[Row]:
        """Every row image in ``data[pos:end]``, each row's images in turn (an update's before
        and after, with a columns-present bitmap each)."""
        plans = [self._plan(bitmap) for bitmap in present]
        out: list[Row] = []
        while pos < end:
            for nulls_size, steps in plans:
                nulls = int.from_bytes(data[pos : pos + nulls_size], "little")
                pos += nulls_size
                row: Row = {}
                for name, bit, read in steps:
                    if bit < 0 or nulls >> bit & 1:
                        row[name] = None
                    else:
                        row[name], pos = read(data, pos)
                out.append(row)
        if pos != end:
            raise SourceError(
                f"a binlog rows event ended {pos - end} bytes past its length while decoding",
                "report the table's definition; exclude the table from source.tables meanwhile",
            )
        return out

    def _plan(self, bitmap: bytes) -> tuple[int, tuple[tuple[str, int, Reader], ...]]:
        plan = self._plans.get(bitmap)
        if plan is None:
            present = int.from_bytes(bitmap, "little")
            steps, bit = [], 0
            for i, (name, read) in enumerate(self._columns):
                if present >> i & 1:
                    steps.append((name, bit, read))
                    bit += 1
                else:  # binlog_row_image MINIMAL or NOBLOB: not in this image
                    steps.append((name, -1, read))
            plan = self._plans[bitmap] = ((bit + 7) // 8, tuple(steps))
        return plan


def row_decoder(columns: list[Any], info: TableInfo) -> RowDecoder:
    """The decoder of one table map's rows; ``columns`` are the library's descriptions of the
    map's columns, named already. A column the map's metadata leaves incomplete (no FULL row
    metadata) takes its charset, signedness and ENUM/SET values from information_schema."""
    by_name = {c.name: c for c in info.columns}
    return RowDecoder([(col.name, _reader(col, by_name.get(col.name))) for col in columns])


def _reader(col: Any, ci: ColumnInfo | None) -> Reader:
    kind = col.type
    unsigned = bool(col.unsigned) or bool(ci and ci.unsigned)
    if kind in _INTEGERS:
        signed, unsigned_format = _INTEGERS[kind]
        return _fixed(unsigned_format if unsigned else signed)
    if kind == FIELD_TYPE.INT24:
        return _int24(signed=not unsigned)
    if kind == FIELD_TYPE.FLOAT:  # a SELECT returns the server's 6-digit text form
        return _fixed("<f", lambda v: float(f"{v:.6g}"))
    if kind == FIELD_TYPE.DOUBLE:
        return _fixed("<d")
    if kind == FIELD_TYPE.NEWDECIMAL:
        return _decimal(int(col.precision), int(col.decimals))
    if kind == FIELD_TYPE.YEAR:
        return _year
    if kind in (FIELD_TYPE.DATE, FIELD_TYPE.NEWDATE):
        return _date
    if kind == FIELD_TYPE.DATETIME2:
        return _datetime2(int(col.fsp))
    if kind == FIELD_TYPE.TIMESTAMP2:
        return _timestamp2(int(col.fsp))
    if kind == FIELD_TYPE.TIME2:
        return _time2(int(col.fsp))
    if kind == FIELD_TYPE.DATETIME:
        return _datetime_v1
    if kind == FIELD_TYPE.TIMESTAMP:
        return _fixed("<I", lambda s: _EPOCH + dt.timedelta(seconds=s))
    if kind == FIELD_TYPE.TIME:
        return _time_v1
    if kind in (FIELD_TYPE.VARCHAR, FIELD_TYPE.VAR_STRING, FIELD_TYPE.STRING):
        return _prefixed(2 if col.max_length > 255 else 1, _text(col, ci))
    if kind in (FIELD_TYPE.BLOB, FIELD_TYPE.GEOMETRY):
        finish = _text(col, ci) if kind == FIELD_TYPE.BLOB else bytes
        return _prefixed(int(col.length_size), finish)
    if kind == FIELD_TYPE.JSON:
        return _prefixed(int(col.length_size), _json_text)
    if kind == FIELD_TYPE.ENUM:
        values = getattr(col, "enum_values", None) or (
            ["", *_enum_values(ci.column_type)] if ci else []
        )
        return _little(int(col.size), values.__getitem__)
    if kind == FIELD_TYPE.SET:
        members = getattr(col, "set_values", None) or (_enum_values(ci.column_type) if ci else [])
        return _little(int(col.size), _set_text(members))
    if kind == FIELD_TYPE.BIT:  # the bytes a SELECT returns, big-endian
        return _bytes(int(col.bytes))
    raise SourceError(
        f"binlog column {col.name} has type {kind}, which dblog cannot decode",
        "remove the table from source.tables, or change the column's type",
    )


_INTEGERS = {  # binlog type: signed and unsigned struct formats (INT24 has none)
    FIELD_TYPE.TINY: ("<b", "<B"),
    FIELD_TYPE.SHORT: ("<h", "<H"),
    FIELD_TYPE.LONG: ("<i", "<I"),
    FIELD_TYPE.LONGLONG: ("<q", "<Q"),
}


def _fixed(fmt: str, finish: Callable[[Any], Any] | None = None) -> Reader:
    unpack = struct.Struct(fmt).unpack_from
    size = struct.calcsize(fmt)
    if finish is None:

        def read(data: bytes, pos: int) -> tuple[Any, int]:
            return unpack(data, pos)[0], pos + size

        return read

    def read_and_finish(data: bytes, pos: int) -> tuple[Any, int]:
        return finish(unpack(data, pos)[0]), pos + size

    return read_and_finish


def _little(size: int, finish: Callable[[int], Any]) -> Reader:
    def read(data: bytes, pos: int) -> tuple[Any, int]:
        return finish(int.from_bytes(data[pos : pos + size], "little")), pos + size

    return read


def _int24(signed: bool) -> Reader:
    def read(data: bytes, pos: int) -> tuple[Any, int]:
        return int.from_bytes(data[pos : pos + 3], "little", signed=signed), pos + 3

    return read


def _bytes(size: int) -> Reader:
    def read(data: bytes, pos: int) -> tuple[Any, int]:
        return data[pos : pos + size], pos + size

    return read


def _prefixed(size: int, finish: Callable[[bytes], Any]) -> Reader:
    """A value after its length in ``size`` little-endian bytes."""
    if size == 1:

        def read_short(data: bytes, pos: int) -> tuple[Any, int]:
            end = pos + 1 + data[pos]
            return finish(data[pos + 1 : end]), end

        return read_short

    def read(data: bytes, pos: int) -> tuple[Any, int]:
        start = pos + size
        end = start + int.from_bytes(data[pos:start], "little")
        return finish(data[start:end]), end

    return read


def _text(col: Any, ci: ColumnInfo | None) -> Callable[[bytes], Any]:
    """Strings in their column's charset; binary columns as the bytes a SELECT returns (BINARY(n)
    padded with the zero bytes the binlog strips; MariaDB's UUID, stripped the same way, as its
    text form)."""
    if ci is not None and ci.data_type == "uuid":
        return lambda raw: str(uuid.UUID(bytes=raw.ljust(16, b"\x00"))) if len(raw) <= 16 else raw
    if ci is not None and ci.is_binary:
        length = ci.char_length if ci.data_type == "binary" else None
        if length:
            return lambda raw: raw.ljust(length, b"\x00")
        return bytes
    name = getattr(col, "character_set_name", None) or (ci.charset if ci else None)
    charset = charset_by_name(name) if name else None
    encoding = charset.encoding if charset else (name or "utf-8")
    try:
        codecs.lookup(encoding)
    except LookupError:  # "binary", or a charset Python has no codec for: the bytes
        return bytes
    return lambda raw: raw.decode(encoding)


def _json_text(raw: bytes) -> Any:
    """MySQL's binary JSON as the document's text (MariaDB logs JSON as text already)."""
    if not raw:
        return None
    return json.dumps(_json_plain(parse_json(raw[0], raw[1:])), ensure_ascii=False)


def _json_plain(value: Any) -> Any:
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    if isinstance(value, dict):
        return {_json_plain(k): _json_plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_json_plain(v) for v in value]
    return value


def _set_text(members: list[str]) -> Callable[[int], str]:
    """A SET's bit mask as a SELECT returns it: its members in definition order, comma-joined."""

    def text(mask: int) -> str:
        return ",".join(m for i, m in enumerate(members) if mask >> i & 1)

    return text


def _decimal(precision: int, scale: int) -> Reader:
    """DECIMAL(precision, scale): groups of nine digits in four big-endian bytes each (fewer
    bytes for the leftover digits at either end), the sign in the first bit (set: not
    negative), every byte inverted when negative."""
    whole = precision - scale
    head, groups = _DIGITS_BYTES[whole % 9], whole // 9
    frac_groups, tail_digits = scale // 9, scale % 9
    tail = _DIGITS_BYTES[tail_digits]
    size = head + 4 * (groups + frac_groups) + tail

    def read(data: bytes, pos: int) -> tuple[Any, int]:
        raw = bytearray(data[pos : pos + size])
        negative = not raw[0] & 0x80
        raw[0] ^= 0x80
        if negative:
            raw = bytearray(b ^ 0xFF for b in raw)
        text = ["-" if negative else ""]
        at = head
        if head:
            text.append(str(int.from_bytes(raw[:head], "big")))
        for _ in range(groups):
            text.append(f"{int.from_bytes(raw[at : at + 4], 'big'):09d}")
            at += 4
        text.append(".")
        for _ in range(frac_groups):
            text.append(f"{int.from_bytes(raw[at : at + 4], 'big'):09d}")
            at += 4
        if tail:
            text.append(f"{int.from_bytes(raw[at : at + tail], 'big'):0{tail_digits}d}")
        return decimal.Decimal("".join(text)), pos + size

    return read


def _fraction(fsp: int) -> tuple[int, Callable[[bytes, int], int]]:
    """The bytes of a temporal value's fraction of a second and its reader (microseconds)."""
    size = (fsp + 1) // 2
    scale = 10 ** (6 - fsp)

    def micros(data: bytes, pos: int) -> int:
        value = int.from_bytes(data[pos : pos + size], "big")
        return (value // 10 if fsp % 2 else value) * scale

    return size, micros


def _datetime2(fsp: int) -> Reader:
    """Five big-endian bytes: a sign bit, year * 13 + month (17 bits), day, hour, minute,
    second; then the fraction. A zero date reads as None."""
    extra, micros = _fraction(fsp)

    def read(data: bytes, pos: int) -> tuple[Any, int]:
        v = int.from_bytes(data[pos : pos + 5], "big")
        year_month = v >> 22 & 0x1FFFF
        try:
            value = dt.datetime(
                year_month // 13,
                year_month % 13,
                v >> 17 & 31,
                v >> 12 & 31,
                v >> 6 & 63,
                v & 63,
                micros(data, pos + 5) if extra else 0,
            )
        except ValueError:
            value = None
        return value, pos + 5 + extra

    return read


def _timestamp2(fsp: int) -> Reader:
    """Seconds since the epoch in four big-endian bytes, then the fraction; in UTC."""
    extra, micros = _fraction(fsp)

    def read(data: bytes, pos: int) -> tuple[Any, int]:
        seconds = int.from_bytes(data[pos : pos + 4], "big")
        us = micros(data, pos + 4) if extra else 0
        return _EPOCH + dt.timedelta(seconds=seconds, microseconds=us), pos + 4 + extra

    return read


def _time2(fsp: int) -> Reader:
    """Three big-endian bytes: a sign bit (set: not negative), a spare bit, hours (10 bits),
    minutes, seconds, negative values as the two's complement; then the fraction."""
    extra, micros = _fraction(fsp)

    def read(data: bytes, pos: int) -> tuple[Any, int]:
        v = int.from_bytes(data[pos : pos + 3], "big")
        negative = not v >> 23
        if negative:
            v = -v & 0xFFFFFF
        value = dt.timedelta(
            hours=v >> 12 & 0x3FF,
            minutes=v >> 6 & 63,
            seconds=v & 63,
            microseconds=micros(data, pos + 3) if extra else 0,
        )
        return (-value if negative else value), pos + 3 + extra

    return read


def _year(data: bytes, pos: int) -> tuple[Any, int]:
    value = data[pos]
    return (value + 1900 if value else 0), pos + 1


def _date(data: bytes, pos: int) -> tuple[Any, int]:
    """Three little-endian bytes: year (15 bits), month (4), day (5); a zero date reads as None."""
    v = int.from_bytes(data[pos : pos + 3], "little")
    year, month, day = v >> 9, v >> 5 & 15, v & 31
    if not (year and month and day):
        return None, pos + 3
    try:
        return dt.date(year, month, day), pos + 3
    except ValueError:  # an invalid date a lax sql_mode stored: a SELECT returns its text
        return f"{year:04d}-{month:02d}-{day:02d}", pos + 3


def _datetime_v1(data: bytes, pos: int) -> tuple[Any, int]:
    """The pre-5.6 DATETIME: YYYYMMDDhhmmss as a little-endian integer of eight bytes."""
    v = int.from_bytes(data[pos : pos + 8], "little")
    day, time = divmod(v, 1_000_000)
    year, month, mday = day // 10_000, day // 100 % 100, day % 100
    if not (year and month and mday):
        return None, pos + 8
    value = dt.datetime(year, month, mday, time // 10_000, time // 100 % 100, time % 100)
    return value, pos + 8


def _time_v1(data: bytes, pos: int) -> tuple[Any, int]:
    """The pre-5.6 TIME: hhmmss as a little-endian integer of three bytes."""
    v = int.from_bytes(data[pos : pos + 3], "little")
    return dt.timedelta(hours=v // 10_000, minutes=v // 100 % 100, seconds=v % 100), pos + 3


def _enum_values(column_type: str) -> list[str]:
    """``enum('a','b''c')`` -> ['a', "b'c"]."""
    body = column_type[column_type.index("(") + 1 : column_type.rindex(")")]
    values, current, quoted, i = [], "", False, 0
    while i < len(body):
        ch = body[i]
        if quoted:
            if ch == "'" and i + 1 < len(body) and body[i + 1] == "'":
                current += "'"
                i += 1
            elif ch == "'":
                quoted = False
                values.append(current)
                current = ""
            elif ch == "\\" and i + 1 < len(body):
                current += body[i + 1]
                i += 1
            else:
                current += ch
        elif ch == "'":
            quoted = True
        i += 1
    return values


_BINLOG_TYPES: dict[str, set[int]] = {
    "tinyint": {FIELD_TYPE.TINY},
    "smallint": {FIELD_TYPE.SHORT},
    "mediumint": {FIELD_TYPE.INT24},
    "int": {FIELD_TYPE.LONG},
    "integer": {FIELD_TYPE.LONG},
    "bigint": {FIELD_TYPE.LONGLONG},
    "float": {FIELD_TYPE.FLOAT},
    "double": {FIELD_TYPE.DOUBLE},
    "decimal": {FIELD_TYPE.NEWDECIMAL, FIELD_TYPE.DECIMAL},
    "date": {FIELD_TYPE.DATE, FIELD_TYPE.NEWDATE},
    "datetime": {FIELD_TYPE.DATETIME, FIELD_TYPE.DATETIME2},
    "timestamp": {FIELD_TYPE.TIMESTAMP, FIELD_TYPE.TIMESTAMP2},
    "time": {FIELD_TYPE.TIME, FIELD_TYPE.TIME2},
    "year": {FIELD_TYPE.YEAR},
    "varchar": {FIELD_TYPE.VARCHAR, FIELD_TYPE.VAR_STRING},
    "varbinary": {FIELD_TYPE.VARCHAR, FIELD_TYPE.VAR_STRING},
    "char": {FIELD_TYPE.STRING},
    "binary": {FIELD_TYPE.STRING},
    "enum": {FIELD_TYPE.ENUM, FIELD_TYPE.STRING},
    "set": {FIELD_TYPE.SET, FIELD_TYPE.STRING},
    "bit": {FIELD_TYPE.BIT},
    "tinytext": {FIELD_TYPE.BLOB},
    "text": {FIELD_TYPE.BLOB},
    "mediumtext": {FIELD_TYPE.BLOB},
    "longtext": {FIELD_TYPE.BLOB},
    "tinyblob": {FIELD_TYPE.BLOB},
    "blob": {FIELD_TYPE.BLOB},
    "mediumblob": {FIELD_TYPE.BLOB},
    "longblob": {FIELD_TYPE.BLOB},
    "json": {FIELD_TYPE.JSON, FIELD_TYPE.BLOB},
}


def shape_matches(columns: list[Any], info: TableInfo) -> bool:
    """Whether a table map's column types fit the table's current columns, one by one.

    Without ``binlog_row_metadata=FULL`` the binlog carries no column names; the names are
    taken from information_schema, which is right only while the shapes agree.
    """
    if len(columns) != len(info.columns):
        return False
    for col, ci in zip(columns, info.columns, strict=True):
        expected = _BINLOG_TYPES.get(ci.data_type)
        if expected is not None and col.type not in expected:
            return False
    return True
