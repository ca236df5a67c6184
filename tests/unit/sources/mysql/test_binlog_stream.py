"""The binlog stream's fast path reads the same records from a packet as the library does.

Each packet is built by hand (MySQL 8's v2 rows events with extra data cannot be produced by the
MariaDB these tests run beside) and read twice: once by the fast path, once by
pymysqlreplication's own event classes."""

from __future__ import annotations

import struct
from types import SimpleNamespace
from typing import Any

import pytest
from pymysql.protocol import MysqlPacket
from pymysqlreplication.constants import BINLOG
from pymysqlreplication.event import QueryEvent
from pymysqlreplication.exceptions import MalformedBinLogEvent
from pymysqlreplication.table import Table

from airflow_dblog.sources.mysql.binlog_stream import Begin, BinlogStream, Commit, RowsData

TABLE_ID = 70_000_001  # wider than four bytes


class _Connection:
    """A replica connection that has received ``packets``."""

    def __init__(self, packets: list[bytes]) -> None:
        self.packets = [MysqlPacket(p, "utf8") for p in packets]

    def _read_packet(self, packet_type: Any = MysqlPacket) -> MysqlPacket:
        return self.packets.pop(0)


def _packet(kind: int, body: bytes, end: int = 4000, server_id: int = 7) -> bytes:
    """An OK byte, the event header, ``body`` and a CRC32 checksum's four bytes."""
    size = 19 + len(body) + 4
    header = struct.pack("<IBIIIH", 1_700_000_000, kind, server_id, size, end, 0)
    return b"\x00" + header + body + b"\xde\xad\xbe\xef"


def _rows_body(kind: int, images: bytes, extra: bytes = b"", columns: int = 3) -> bytes:
    post = TABLE_ID.to_bytes(6, "little") + b"\x01\x00"
    if kind >= BINLOG.WRITE_ROWS_EVENT_V2:
        post += struct.pack("<H", 2 + len(extra)) + extra
    bitmaps = b"\x07\x07" if kind in (BINLOG.UPDATE_ROWS_EVENT_V1, 31) else b"\x07"
    return post + bytes([columns]) + bitmaps + images


def _stream(packets: list[bytes]) -> BinlogStream:
    stream = BinlogStream(connection_settings={}, server_id=9, freeze_schema=True)
    stream._BinLogStreamReader__connected_stream = True  # type: ignore[attr-defined]
    stream._BinLogStreamReader__connected_ctl = True  # type: ignore[attr-defined]
    stream._BinLogStreamReader__use_checksum = True  # type: ignore[attr-defined]
    stream._stream_connection = _Connection(packets)
    stream._ctl_connection = SimpleNamespace(charset="utf8", _get_dbms=lambda: "mysql")
    stream.table_map = {TABLE_ID: Table(TABLE_ID, "shop", "orders", [], primary_key="id")}
    return stream


def _both(packet: bytes) -> tuple[Any, Any]:
    """What the fast path reads from ``packet``, and what the library's classes read."""
    fast = _stream([packet]).fetchone()
    library_stream = _stream([])
    library = library_stream._through_library(MysqlPacket(packet, "utf8"))
    return fast, library


IMAGES = b"\x00" + b"\x01\x02\x03" * 4  # stands for the images: the records only delimit them


@pytest.mark.parametrize(
    ("kind", "extra"),
    [
        (BINLOG.WRITE_ROWS_EVENT_V1, b""),
        (BINLOG.UPDATE_ROWS_EVENT_V1, b""),
        (BINLOG.DELETE_ROWS_EVENT_V1, b""),
        (BINLOG.WRITE_ROWS_EVENT_V2, b""),
        (BINLOG.UPDATE_ROWS_EVENT_V2, b"\x01\x05\x00\x06\x00"),  # partition info
        (BINLOG.DELETE_ROWS_EVENT_V2, b"\x02abc"),
    ],
)
def test_a_rows_event_is_read_from_its_packet_as_the_library_delimits_it(
    kind: int, extra: bytes
) -> None:
    fast, library = _both(_packet(kind, _rows_body(kind, IMAGES, extra)))
    assert isinstance(fast, RowsData)
    assert fast == library
    assert fast.data[fast.start : fast.stop] == IMAGES
    assert (fast.op, fast.table_id, fast.timestamp, fast.end) == (
        {23: "c", 24: "u", 25: "d", 30: "c", 31: "u", 32: "d"}[kind],
        TABLE_ID,
        1_700_000_000,
        4000,
    )


def test_mariadbs_gtid_and_xid_events_are_read_from_their_packets_as_the_library_reads_them() -> (
    None
):
    for flags, implied in ((0, True), (1, False)):  # FL_STANDALONE: no BEGIN is implied
        body = struct.pack("<QIB", 500, 3, flags) + b"\x00" * 6
        fast, library = _both(_packet(BINLOG.MARIADB_GTID_EVENT, body, end=900))
        assert fast == library == Begin("3-7-500", implied, 900 - (19 + len(body) + 4), 900)
    fast, library = _both(_packet(BINLOG.XID_EVENT, struct.pack("<Q", 42), end=1234))
    assert fast == library == Commit(1234)


def test_a_known_table_map_is_skipped_and_other_events_go_through_the_library() -> None:
    table_map = _packet(BINLOG.TABLE_MAP_EVENT, TABLE_ID.to_bytes(6, "little") + b"\x00" * 12)
    status = b""
    query = struct.pack("<IIBHH", 1, 0, 4, 0, len(status)) + status + b"shop\x00BEGIN"
    stream = _stream([table_map, _packet(BINLOG.QUERY_EVENT, query, end=77)])
    event = stream.fetchone()
    assert isinstance(event, QueryEvent)
    assert (event.query, event.packet.log_pos) == ("BEGIN", 77)


def test_a_rows_event_of_a_table_the_library_did_not_map_is_not_returned() -> None:
    other = _rows_body(BINLOG.WRITE_ROWS_EVENT_V1, IMAGES).replace(
        TABLE_ID.to_bytes(6, "little"), (5).to_bytes(6, "little"), 1
    )
    xid = _packet(BINLOG.XID_EVENT, struct.pack("<Q", 1), end=300)
    stream = _stream([_packet(BINLOG.WRITE_ROWS_EVENT_V1, other), xid])
    assert stream.fetchone() == Commit(300)


def test_a_rows_event_whose_declared_post_header_is_too_short_is_refused_as_the_library_does() -> (
    None
):
    kind = BINLOG.WRITE_ROWS_EVENT_V1
    stream = _stream([_packet(kind, _rows_body(kind, IMAGES))])
    lengths = [8] * 40
    lengths[kind - 1] = 6
    stream._BinLogStreamReader__post_header_lengths = lengths  # type: ignore[attr-defined]
    with pytest.raises(MalformedBinLogEvent, match="shorter than the supported minimum"):
        stream.fetchone()
