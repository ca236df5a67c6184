"""Row image decoding on hand-built bytes: the encodings MariaDB does not write here (MySQL's
binary JSON, the pre-5.6 temporal types), partial images, and bytes that do not fit the map.
Every type MariaDB writes is checked against a SELECT in the integration tier."""

from __future__ import annotations

import datetime as dt
from types import SimpleNamespace
from typing import Any

import pytest
from pymysqlreplication.constants import FIELD_TYPE

from airflow_dblog.core.events import TableId
from airflow_dblog.errors import SourceError
from airflow_dblog.sources.base import TableSchema
from airflow_dblog.sources.mysql.binlog_codecs import row_decoder
from airflow_dblog.sources.mysql.schema import ColumnInfo, TableInfo

NO_INFO = TableSchema(TableId("db", "t"), (), ("id",))


def column(name: str, kind: int, **meta: Any) -> SimpleNamespace:
    """A table map's column as pymysqlreplication describes it."""
    return SimpleNamespace(name=name, type=kind, unsigned=False, character_set_name=None, **meta)


def decode(columns: list[SimpleNamespace], data: bytes, present: bytes = b"\xff") -> list[Any]:
    return row_decoder(columns, TableInfo(NO_INFO, ())).images(data, 0, len(data), (present,))


def test_mysql_binary_json_reads_as_the_documents_text() -> None:
    # {"a": 1}: a small object of one key, its value an inlined int16
    document = bytes([0, 1, 0, 12, 0, 11, 0, 1, 0, 5, 1, 0]) + b"a"
    doc = column("doc", FIELD_TYPE.JSON, length_size=4)
    data = b"\x00" + len(document).to_bytes(4, "little") + document
    data += b"\x00" + (0).to_bytes(4, "little")  # a second row, of length 0
    assert decode([doc], data) == [{"doc": '{"a": 1}'}, {"doc": None}]


def test_the_pre_56_temporal_types_read_as_a_select_returns_them() -> None:
    columns = [
        column("at", FIELD_TYPE.DATETIME),
        column("tm", FIELD_TYPE.TIME),
        column("ts", FIELD_TYPE.TIMESTAMP),
    ]
    data = b"\x00" + (20240229235958).to_bytes(8, "little")
    data += (123456).to_bytes(3, "little") + (1_700_000_000).to_bytes(4, "little")
    assert decode(columns, data) == [
        {
            "at": dt.datetime(2024, 2, 29, 23, 59, 58),
            "tm": dt.timedelta(hours=12, minutes=34, seconds=56),
            "ts": dt.datetime(2023, 11, 14, 22, 13, 20),
        }
    ]


def test_columns_missing_from_a_minimal_image_read_as_none_and_the_rest_still_decode() -> None:
    columns = [column(n, FIELD_TYPE.LONG) for n in ("id", "a", "b")]
    # only id and b present; b is NULL in the second row
    data = b"\x00" + (7).to_bytes(4, "little") + (9).to_bytes(4, "little")
    data += b"\x02" + (8).to_bytes(4, "little")
    assert decode(columns, data, present=b"\x05") == [
        {"id": 7, "a": None, "b": 9},
        {"id": 8, "a": None, "b": None},
    ]


def test_a_mariadb_uuid_whose_last_bytes_are_zero_reads_as_its_full_text() -> None:
    info = ColumnInfo("u", "uuid", "uuid", True, False, None, 16, None)
    schema = TableSchema(TableId("db", "t"), (), ("u",))
    u = column("u", FIELD_TYPE.STRING, max_length=16)
    stripped = bytes.fromhex("d4a20e44c91740a9b1a2b3d87b79")  # the binlog drops the trailing 00 00
    data = b"\x00" + bytes([len(stripped)]) + stripped + b"\x00\x00"
    images = row_decoder([u], TableInfo(schema, (info,))).images(data, 0, len(data), (b"\x01",))
    assert images == [
        {"u": "d4a20e44-c917-40a9-b1a2-b3d87b790000"},
        {"u": "00000000-0000-0000-0000-000000000000"},
    ]


def test_bytes_that_end_inside_a_value_are_refused() -> None:
    columns = [column("id", FIELD_TYPE.LONG), column("s", FIELD_TYPE.VARCHAR, max_length=10)]
    data = b"\x00" + (7).to_bytes(4, "little") + b"\x05abc"  # says 5 bytes, holds 3
    with pytest.raises(SourceError, match="ended 2 bytes past its length"):
        decode(columns, data)


def test_a_column_type_without_a_reader_is_refused_when_its_table_map_arrives() -> None:
    with pytest.raises(SourceError, match="column old has type 0, which dblog cannot decode"):
        decode([column("old", FIELD_TYPE.DECIMAL)], b"")
