"""Wal2jsonReader without a server: commit times, table filters, offsets, heartbeat LSNs, xids
(tests/integration/sources/postgres/test_wal2json_reader.py reads the real PostgreSQL)."""

from __future__ import annotations

import datetime as dt

import pytest

from airflow_dblog.core.events import TableId
from airflow_dblog.core.position import Position
from airflow_dblog.errors import SourceError
from airflow_dblog.sources.postgres.wal2json_reader import (
    Wal2jsonReader,
    add_tables,
    commit_ts_ms,
    escape_table_name,
    parse_offset,
)


def test_commit_timestamp_parsing() -> None:
    assert commit_ts_ms("1970-01-01 00:00:01.5+00") == 1500
    assert commit_ts_ms("2024-05-01 12:00:00+02") == int(
        dt.datetime(2024, 5, 1, 10, tzinfo=dt.timezone.utc).timestamp() * 1000
    )
    assert commit_ts_ms("2024-05-01 12:00:00.123456-05:30") == int(
        dt.datetime(2024, 5, 1, 17, 30, 0, 123000, tzinfo=dt.timezone.utc).timestamp() * 1000
    )


def test_add_tables_escaping() -> None:
    assert escape_table_name(TableId("public", "items")) == "public.items"
    assert escape_table_name(TableId("my schema", "a.b,c*")) == "my\\ schema.a\\.b\\,c\\*"
    # wal2json escapes bytes, not characters: non-ASCII names widen to a wildcard, filtered here
    tables = [TableId("s", "ördërs"), TableId("s", "x"), TableId("ß", "y"), TableId("s", "ü")]
    assert add_tables(tables) == "s.*,s.x,*.*"


def test_offset_parsing_rejects_foreign_offsets() -> None:
    pos = Position.postgres(123, 4)
    assert parse_offset({"version": 1, "position": str(pos), "flush_lsn": "0/7B"}) == (pos, 123)
    assert parse_offset({"version": 1, "position": None, "flush_lsn": "0/0"}) == (None, 0)
    with pytest.raises(SourceError, match="not a wal2json reader offset"):
        parse_offset({"file": "mysql-bin.000001", "pos": 4})
    with pytest.raises(SourceError):
        parse_offset({"version": 1, "position": str(Position.mysql(1, 2)), "flush_lsn": "0/1"})


def _bare_reader() -> Wal2jsonReader:
    reader = object.__new__(Wal2jsonReader)
    reader._block, reader._segment, reader._hb_lsn = 8192, 16 * 1024 * 1024, 0
    return reader


def test_send_pointer_at_a_page_boundary_skips_the_page_header() -> None:
    reader = _bare_reader()
    reader._note_send_pointer(0x1_0000_2010)
    assert reader._hb_lsn == 0x1_0000_2010
    reader._note_send_pointer(0x1_0000_4000)  # page start: the next record is after 24 bytes
    assert reader._hb_lsn == 0x1_0000_4000 + 24
    reader._note_send_pointer(0x1_0100_0000)  # segment start: long page header
    assert reader._hb_lsn == 0x1_0100_0000 + 40
    reader._note_send_pointer(0x1_0000_0008)  # never backwards
    assert reader._hb_lsn == 0x1_0100_0000 + 40


def test_xids_are_extended_to_64_bits_across_wraparound() -> None:
    reader = _bare_reader()
    reader._xid_ref = (3 << 32) + 0xFFFFFF00  # epoch 3, near the end of the 32-bit range
    assert reader._xid64(0xFFFFFE00) == (3 << 32) + 0xFFFFFE00
    assert reader._xid64(5) == (4 << 32) + 5  # wrapped: the next epoch
    assert reader._xid64(0xFFFFFFF0) == (3 << 32) + 0xFFFFFFF0  # an older one is still epoch 3
