"""Binlog row values in the Python types a SELECT through PyMySQL returns.

pymysqlreplication decodes a row event by the table map's column types; what it returns differs
from a SELECT for some types (BINARY padding, BIT, SET, JSON, FLOAT, MariaDB's UUID, unsigned
integers without ``binlog_row_metadata=FULL``). :func:`column_converters` completes the library's
column descriptions from information_schema and returns, per column, the conversion that makes a
logged value equal to the dumped one, so the merge can compare logged keys with dumped keys.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable
from typing import Any

from pymysqlreplication.constants import FIELD_TYPE

from airflow_dblog.sources.mysql.schema import TableInfo

_RAW_BYTES = "dblog-raw-bytes"  # a charset name Python has no codec for: the library keeps bytes

Converter = Callable[[Any], Any]


def _binary(length: int | None) -> Callable[[Any], Any]:
    """Binary columns: bytes (Python decodes b"" to "" without asking the codec), BINARY(n)
    padded with the zero bytes the binlog strips and a SELECT returns."""

    def raw(value: Any) -> Any:
        if isinstance(value, str) and not value:
            value = b""
        if length and isinstance(value, (bytes, bytearray)) and len(value) < length:
            return bytes(value).ljust(length, b"\x00")
        return value

    return raw


def _bits(nbytes: int) -> Callable[[Any], Any]:
    def bits(value: Any) -> Any:
        if isinstance(value, str):
            return int(value, 2).to_bytes(nbytes, "big") if value else b"\x00" * nbytes
        return value

    return bits


def _set_text(order: list[str] | None) -> Callable[[Any], Any]:
    rank = {v: i for i, v in enumerate(order or [])}

    def text(value: Any) -> Any:
        if isinstance(value, (set, frozenset)):
            return ",".join(sorted(value, key=lambda v: rank.get(v, len(rank))))
        return value

    return text


def _json_plain(value: Any) -> Any:
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    if isinstance(value, dict):
        return {_json_plain(k): _json_plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_json_plain(v) for v in value]
    return value


def _json_text(value: Any) -> Any:
    if value is None or isinstance(value, str):
        return value
    return json.dumps(_json_plain(value), ensure_ascii=False)


def _uuid_text(value: Any) -> Any:
    """MariaDB's UUID type is logged as its 16 bytes; a SELECT returns the text form."""
    if isinstance(value, (bytes, bytearray)) and len(value) == 16:
        return str(uuid.UUID(bytes=bytes(value)))
    return value


def _float_text(value: Any) -> Any:
    """FLOAT is logged as a 4-byte float; a SELECT returns the server's 6-digit text form."""
    if isinstance(value, float):
        return float(f"{value:.6g}")
    return value


_UNSIGNED_BITS = {
    FIELD_TYPE.TINY: 8,
    FIELD_TYPE.SHORT: 16,
    FIELD_TYPE.INT24: 24,
    FIELD_TYPE.LONG: 32,
    FIELD_TYPE.LONGLONG: 64,
}


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


def column_converters(columns: list[Any], info: TableInfo) -> list[tuple[str, Converter]]:
    """Complete a table map's column descriptions (``columns``, named already) from
    information_schema, and return the conversion of each column whose logged value is not
    what a SELECT returns."""
    by_name = {c.name: c for c in info.columns}
    convert: list[tuple[str, Converter]] = []
    for col in columns:
        ci = by_name.get(col.name)
        if col.type == FIELD_TYPE.BIT:
            convert.append((col.name, _bits(int(getattr(col, "bytes", 1)))))
        elif col.type == FIELD_TYPE.JSON:
            convert.append((col.name, _json_text))
        elif col.type == FIELD_TYPE.FLOAT:
            convert.append((col.name, _float_text))
        if ci is None:
            continue
        if ci.is_binary or ci.data_type == "uuid":
            col.character_set_name = _RAW_BYTES
        elif ci.charset and not col.character_set_name:
            col.character_set_name = ci.charset
        if ci.is_binary:
            length = ci.char_length if ci.data_type == "binary" else None
            convert.append((col.name, _binary(length)))
        if ci.unsigned and col.type in _UNSIGNED_BITS and not col.unsigned:
            col.unsigned = True
        if ci.data_type == "enum" and not getattr(col, "enum_values", None):
            col.enum_values = ["", *_enum_values(ci.column_type)]
        if ci.data_type == "uuid":
            convert.append((col.name, _uuid_text))
        if ci.data_type == "set":
            if not getattr(col, "set_values", None):
                col.set_values = _enum_values(ci.column_type)
            convert.append((col.name, _set_text(col.set_values)))
    return convert
