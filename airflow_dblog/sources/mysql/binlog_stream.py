"""The replica connection of a binlog reader: pymysqlreplication's stream, the hot events read
straight from their packets.

A steady write load is a handful of small events per transaction (a GTID, a table map, a rows
event, an XID), and the library wraps each packet and builds an event object parsing fields the
reader never uses: most of the capture thread's time under single-row writes. Those events come
out of :meth:`BinlogStream.fetchone` as the small records below, read from the packet's bytes;
every other packet (rotations, statements, heartbeats, a table map not seen yet) goes through the
library as before, and the records the library would have given for rows, GTID and XID events
are built from its objects instead, so the reader sees one kind of each.

The stream never reconnects by itself: pymysqlreplication reconnects at its last event, or
connected by GTID at the first GTID again (events read since would come twice). Here a reconnect
is a lost connection: the reader reopens at its own resume point, checking the server first.
"""

from __future__ import annotations

import struct
from typing import Any, NamedTuple

import pymysql
from pymysqlreplication import BinLogStreamReader
from pymysqlreplication.constants import BINLOG
from pymysqlreplication.event import GtidEvent, MariadbGtidEvent, NotImplementedEvent, XidEvent
from pymysqlreplication.row_event import DeleteRowsEvent, UpdateRowsEvent, WriteRowsEvent

# the OK byte, then the event header: timestamp, type, server id, size, next position, flags
_HEADER = struct.Struct("<xIBIIIH")
_BODY = _HEADER.size  # where the post-header starts in a packet
_ROWS_OP = {
    BINLOG.WRITE_ROWS_EVENT_V1: "c",
    BINLOG.UPDATE_ROWS_EVENT_V1: "u",
    BINLOG.DELETE_ROWS_EVENT_V1: "d",
    BINLOG.WRITE_ROWS_EVENT_V2: "c",
    BINLOG.UPDATE_ROWS_EVENT_V2: "u",
    BINLOG.DELETE_ROWS_EVENT_V2: "d",
}
_ROWS_V2 = {BINLOG.WRITE_ROWS_EVENT_V2, BINLOG.UPDATE_ROWS_EVENT_V2, BINLOG.DELETE_ROWS_EVENT_V2}
_MARIADB_GTID = struct.Struct("<QIB")  # sequence number, domain, flags
_MARIADB_FL_STANDALONE = 1  # a GTID event without it stands for BEGIN (no query event)
_OP_OF = {WriteRowsEvent: "c", UpdateRowsEvent: "u", DeleteRowsEvent: "d"}


class RowsData(NamedTuple):
    """A rows event of a mapped table: its row images are ``data[start:stop]``, one
    columns-present bitmap per image of a row (an update's before and after)."""

    op: str  # "c", "u" or "d"
    table_id: int
    timestamp: int
    end: int  # the binlog offset after the event
    data: bytes
    start: int
    stop: int
    present: tuple[bytes, ...]


class Begin(NamedTuple):
    """A transaction's GTID event (``gtid`` None: MySQL's anonymous one with gtid_mode OFF)."""

    gtid: str | None
    implied_begin: bool  # MariaDB: no BEGIN statement follows, the event stands for it
    start: int
    end: int


class Commit(NamedTuple):
    """An XID event: the transaction committed."""

    end: int


Record = RowsData | Begin | Commit


class BinlogStream(BinLogStreamReader):
    """The library's stream with a fast path for rows, table map, GTID and XID events."""

    _connected = False

    def _BinLogStreamReader__connect_to_stream(self) -> None:  # the library's private hook
        if self._connected:
            raise pymysql.err.OperationalError(2013, "Lost connection to server during query")
        self._connected = True
        super()._BinLogStreamReader__connect_to_stream()  # type: ignore[misc]

    def fetchone(self) -> Any:
        """The next event: a :data:`Record`, a library event of another kind, or None at the
        end of the server's dump."""
        if not self._BinLogStreamReader__connected_stream:  # type: ignore[attr-defined]
            return _record(super().fetchone())  # the library connects, or refuses to again
        connection = self._stream_connection
        lengths = self._BinLogStreamReader__post_header_lengths  # type: ignore[attr-defined]
        checksum = 4 if self._BinLogStreamReader__use_checksum else 0  # type: ignore[attr-defined]
        while True:
            packet = connection._read_packet()
            data = packet._data
            if len(data) < _BODY or data[0]:
                return self._through_library(packet)  # the end of the dump
            timestamp, kind, server_id, size, end, _flags = _HEADER.unpack_from(data)
            op = _ROWS_OP.get(kind)
            if op is not None:
                table_id = _table_id(data)
                known = 10 if kind in _ROWS_V2 else 8
                post = _post_header(lengths, kind, known)
                if table_id not in self.table_map or post < known:
                    return self._through_library(packet)  # it filters, or refuses, the event
                self.log_pos = end
                pos = _BODY + post
                if kind in _ROWS_V2:  # extra data, its length counting its own two bytes
                    pos += int.from_bytes(data[_BODY + 8 : _BODY + 10], "little") - 2
                columns, pos = _length_coded(data, pos)
                width = (columns + 7) // 8
                present = (data[pos : pos + width],)
                pos += width
                if op == "u":
                    present += (data[pos : pos + width],)
                    pos += width
                stop = 1 + size - checksum
                return RowsData(op, table_id, timestamp, end, data, pos, stop, present)
            if kind == BINLOG.TABLE_MAP_EVENT:
                if _table_id(data) in self.table_map:
                    self.log_pos = end  # frozen schema: the library skips it too
                    continue
            elif kind == BINLOG.XID_EVENT:
                self.log_pos = end
                return Commit(end)
            elif kind == BINLOG.MARIADB_GTID_EVENT:
                self.log_pos = end
                seq, domain, flags = _MARIADB_GTID.unpack_from(data, _BODY)
                standalone = flags & _MARIADB_FL_STANDALONE
                return Begin(f"{domain}-{server_id}-{seq}", not standalone, end - size, end)
            return self._through_library(packet)

    def _through_library(self, packet: Any) -> Any:
        """The library's next event, starting with ``packet`` (read already)."""
        connection = self._stream_connection

        def once(*args: Any, **kwargs: Any) -> Any:
            del connection._read_packet  # the library reads on from the connection itself
            return packet

        connection._read_packet = once
        try:
            return _record(super().fetchone())
        finally:
            connection.__dict__.pop("_read_packet", None)


def _post_header(lengths: Any, kind: int, known: int) -> int:
    """An event type's post-header length as the format description declares it (``known``
    when it declares none; shorter than ``known`` is malformed, and the library says so)."""
    if lengths and 0 <= kind - 1 < len(lengths):
        return int(lengths[kind - 1])
    return known


def _table_id(data: bytes) -> int:
    """The six-byte table id that starts a rows or table map event's post-header."""
    return int.from_bytes(data[_BODY : _BODY + 6], "little")


def _length_coded(data: bytes, pos: int) -> tuple[int, int]:
    first = data[pos]
    if first < 251:
        return first, pos + 1
    width = {252: 2, 253: 3, 254: 8}[first]
    return int.from_bytes(data[pos + 1 : pos + 1 + width], "little"), pos + 1 + width


def _record(event: Any) -> Any:
    """The record standing for a library event of a kind the fast path reads, else the event."""
    if isinstance(event, (WriteRowsEvent, UpdateRowsEvent, DeleteRowsEvent)):
        wrapper = event.packet  # the library's reader over the pymysql packet
        packet = wrapper.packet
        present = (event.columns_present_bitmap,)
        if isinstance(event, UpdateRowsEvent):
            present += (event.columns_present_bitmap2,)
        start = packet._position  # the header parsed, the images left unread
        stop = start + event.event_size - wrapper.read_bytes
        op = _OP_OF[type(event)]
        end = int(wrapper.log_pos)
        return RowsData(
            op, event.table_id, int(event.timestamp), end, packet._data, start, stop, present
        )
    if isinstance(event, XidEvent):
        return Commit(int(event.packet.log_pos))
    if isinstance(event, (GtidEvent, MariadbGtidEvent)):
        end = int(event.packet.log_pos)
        implied = isinstance(event, MariadbGtidEvent) and not (event.flags & _MARIADB_FL_STANDALONE)
        return Begin(event.gtid, implied, end - int(event.packet.event_size), end)
    if (
        isinstance(event, NotImplementedEvent)
        and event.event_type == BINLOG.ANONYMOUS_GTID_LOG_EVENT
    ):
        end = int(event.packet.log_pos)
        return Begin(None, False, end - int(event.packet.event_size), end)
    return event
