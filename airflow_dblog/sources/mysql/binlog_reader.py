"""The MySQL/MariaDB binlog as a dblog ``ChangelogReader`` (on pymysqlreplication).

The reader connects as a replica (file/position protocol, also on MariaDB) and turns row events
of the configured tables into :class:`ChangeEvent`, row events of the watermark table into
:class:`WatermarkEvent`, and idleness into :class:`Heartbeat`.

Positions
    ``Position.mysql(file index, end offset of the event, item index in the event)``. Binlog
    offsets are end offsets, like ``SHOW MASTER STATUS`` and ``binlog_snapshot_position``, so "an
    event's position is greater than a snapshot's position" means the snapshot did not see it.
    An UPDATE that changes the primary key becomes a delete of the old key followed by a create
    of the new key (two items, consecutive item indexes).

Offsets (``offset()``), JSON-able::

    {"file": "mysql-bin.000003", "pos": 1234, "after": "<Position string>" | null,
     "server": "<server_id>[/<server_uuid>]", "gtid": "0-1-500" | null, "epoch": 0}

``file``/``pos`` is where a new reader starts reading: the start of the transaction holding the
last returned item (or, between transactions, the end of the last one). ``after`` is the
position of the last returned item; a resumed reader drops everything at or before it. Together
they resume exactly after the last returned item, even in the middle of a multi-row event or a
multi-statement transaction.

Lineage
    ``server`` names the server the offset belongs to and ``gtid`` the GTIDs committed before
    ``file``/``pos`` there: MariaDB's GTID position (last GTID per domain), MySQL's executed GTID
    set (null with gtid_mode OFF). A reader started on another server (the config points at a
    promoted replica) or on a binlog that was reset (RESET MASTER: the offset's file is gone
    and only lower numbers exist, the file name was reused for other transactions, or the
    server's GTIDs went back) cannot use ``file``/``pos``: it resumes by GTID on the new server
    (auto-positioning, both flavours), or from the start of the reset binlog (a warning names the
    dump that recovers what the reset discarded), on the next lineage ``epoch``: every position
    of the new history sorts after the old ones (``position.py``).

Idleness
    ``read`` returns what it has as soon as the server has sent nothing more; the server sends
    replication heartbeats every ``heartbeat_s`` when it has nothing to send, so ``read`` returns
    within about ``timeout_s + heartbeat_s``. When ``read`` found nothing for
    ``timeout_s`` it reads ``SHOW MASTER STATUS``, reads on until the stream has reached that
    position and returns one ``Heartbeat(Position.mysql(file, end, END_OF_EVENT))``: never before
    a ``SHOW MASTER STATUS`` position read earlier (those are ``END_OF_EVENT`` positions too).

Schemas
    Column names come from the table map events when ``binlog_row_metadata=FULL`` (exact across
    ALTER TABLE). Otherwise they come from information_schema, refreshed when a DDL statement in
    the log names the table; a table map whose column types do not fit the current columns (the
    reader is behind an ALTER it has not seen) is refused with a SourceError rather than decoded
    under wrong names.

pymysqlreplication speaks the protocol and parses the table maps; ``binlog_stream`` reads the
frequent events from their packets and ``binlog_codecs`` decodes the row images, into the Python
types a SELECT through PyMySQL returns (bytes for binary columns and BIT, Decimal, date, datetime,
text for SET/JSON/UUID, ...), so the merge can compare logged keys with dumped keys. TRUNCATE
TABLE is a statement in the binlog and produces no events (a warning is logged).

Replica identity: ``server_id`` must be unique among the server's replicas (a second connection
with the same id disconnects the first); :func:`server_id_for` derives a stable one from the
stream name, ``None`` picks a random one. ``watermark_stream`` limits watermark events to one
stream's row of the shared watermark table.
"""

from __future__ import annotations

import contextlib
import logging
import random
import select
import ssl
import time
import zlib
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import pymysql
from pymysqlreplication.event import (
    GtidEvent,
    HeartbeatLogEvent,
    MariadbGtidEvent,
    NotImplementedEvent,
    QueryEvent,
    RotateEvent,
    XidEvent,
)
from pymysqlreplication.row_event import (
    DeleteRowsEvent,
    TableMapEvent,
    UpdateRowsEvent,
    WriteRowsEvent,
)

from airflow_dblog.core.events import ChangeEvent, Heartbeat, LogItem, Row, TableId, WatermarkEvent
from airflow_dblog.core.gtid import GtidSet, MysqlGtidSet
from airflow_dblog.core.position import Position, binlog_file_index
from airflow_dblog.errors import InputError, SourceError
from airflow_dblog.sources.base import Offset, StreamReader, Wake
from airflow_dblog.sources.mysql.binlog_codecs import row_decoder, shape_matches
from airflow_dblog.sources.mysql.binlog_stream import Begin, BinlogStream, Commit, RowsData
from airflow_dblog.sources.mysql.connection import (
    ConnectionSettings,
    connect_error,
    parse_mysql_url,
)
from airflow_dblog.sources.mysql.schema import TableInfo
from airflow_dblog.sources.mysql.source import END_OF_EVENT, WATERMARK_TABLE_ID, MysqlSource
from airflow_dblog.sources.registry import ReaderSettings

log = logging.getLogger(__name__)

_PURGED_CODES = {1236}
LINGER_S = 0.002  # a read that has events waits this long for more before returning them
_TRX_NEUTRAL = ("SAVEPOINT", "ROLLBACK TO", "RELEASE SAVEPOINT", "XA START", "XA END")
_TRX_END = ("COMMIT", "ROLLBACK", "XA COMMIT", "XA ROLLBACK")


def server_id_for(name: str) -> int:
    """A stable replica server id derived from a stream name (1 .. 2**31)."""
    return 1 + zlib.crc32(name.encode()) % (2**31 - 1)


def open_binlog_reader(url: str, settings: ReaderSettings, offset: Offset | None) -> BinlogReader:
    """The stream's reader: its server id derived from the stream name unless configured (two
    replicas with one server id on a server disconnect each other), the watermark table read
    only by the ``table`` strategy (a read-only strategy's user may not see it)."""
    return BinlogReader(
        url,
        settings.tables,
        offset=offset,
        server_id=settings.server_id or server_id_for(settings.stream),
        watermark_table=WATERMARK_TABLE_ID if settings.watermark == "table" else None,
        watermark_stream=settings.stream,
    )


@dataclass(frozen=True)
class _Mark:
    """Where a reader resumes to re-read an item: ``file``/``pos`` (its transaction's start,
    or between transactions the last one's end), the GTID position there, and the GTID of the
    transaction holding the item (MariaDB)."""

    file: str
    pos: int
    gtid_pos: str | None
    trx_gtid: str | None


@dataclass(frozen=True)
class _Resume:
    """Where a reader starts: ``file``/``pos``, or (``file`` None) after GTID position ``gtid``."""

    file: str | None
    pos: int
    after: Position | None
    gtid: str | None
    epoch: int
    trx_items: int = 0  # items of the transaction at file/pos (or, by GTID, the first one)
    trx_gtid: str | None = None  # the GTID of that transaction


def _gtid_domains(text: str | None) -> dict[str, str]:
    """MariaDB GTID position ``0-1-500,1-2-7`` by domain."""
    return {g.split("-", 1)[0]: g for g in (text or "").split(",") if g.count("-") == 2}


def _reset_since(read: Iterable[str | None], head: str) -> bool:
    """A GTID the stream read is not among the server's executed ones: MariaDB's sequence
    numbers only grow within a domain and MySQL's executed set only grows, unless the binlog
    was reset (RESET MASTER) since."""
    texts = [text for text in read if text]
    if any(":" in text for text in texts):  # MySQL: uuid:N sets
        executed = MysqlGtidSet.parse(head)
        return not all(MysqlGtidSet.parse(text) <= executed for text in texts)
    last = {d: int(g.rsplit("-", 1)[1]) for d, g in _gtid_domains(head).items()}
    return any(
        last.get(domain, 0) < int(gtid.rsplit("-", 1)[1])
        for text in read
        for domain, gtid in _gtid_domains(text).items()
    )


def _gtid_text(domains: dict[str, str]) -> str:
    return ",".join(domains[d] for d in sorted(domains, key=int))


def _same_history(ours: str, theirs: str) -> bool:
    """Whether a binlog offset the server places at GTID position ``theirs`` is the one the
    stream recorded at ``ours`` (each domain the stream saw at the same GTID)."""
    at = _gtid_domains(theirs)
    return all(at.get(domain) == gtid for domain, gtid in _gtid_domains(ours).items())


@dataclass
class _TableCodec:
    """How to turn one table map's rows events into dblog items; ``images`` decodes an event's
    row images (an update's before and after in turn)."""

    table: TableId
    key: tuple[str, ...]
    images: Callable[[RowsData], list[Row]]
    watermark: bool


class BinlogReader(StreamReader):
    """``ChangelogReader`` for MySQL 8 and MariaDB 10.5+."""

    def __init__(
        self,
        url: str | ConnectionSettings,
        tables: Iterable[TableId],
        *,
        offset: Offset | None = None,
        server_id: int | None = None,
        heartbeat_s: float = 0.1,
        watermark_table: TableId | None = WATERMARK_TABLE_ID,
        watermark_stream: str | None = None,
        read_timeout_s: float = 30.0,
    ) -> None:
        self.settings = url if isinstance(url, ConnectionSettings) else parse_mysql_url(url)
        self.tables = frozenset(tables)
        self.watermark_table = watermark_table
        self.watermark_stream = watermark_stream  # None: watermark events of every stream
        # Replica server ids must be unique on the server (a second connection with the same id
        # disconnects the first): derive one from the stream name via ``server_id_for``.
        self.server_id = server_id or random.randint(1 << 20, (1 << 31) - 1)
        self.heartbeat_s = heartbeat_s
        self.read_timeout_s = max(read_timeout_s, 4 * heartbeat_s)
        self.source = MysqlSource(self.settings)
        try:
            self.source.check_binlog()
            for table in sorted(self.tables, key=str):
                self.source.table_info(table, refresh=True)
            self.identity = self.source.identity()
            start = self._start(offset)
        except BaseException:
            self.source.close()
            raise
        start_file, start_pos, after = start.file, start.pos, start.after
        self.lineage_epoch = self.source.lineage_epoch = start.epoch
        self._mariadb = self.source.flavor == "mariadb"
        # the GTIDs committed before _last_end, as text (the offset's "gtid"), and kept as
        # MariaDB's last GTID per domain or MySQL's executed set (None: gtid_mode OFF)
        self._gtid_pos = start.gtid
        self._gtids = _gtid_domains(start.gtid) if self._mariadb else {}
        self._gtid_set: GtidSet | None = (
            None if self._mariadb or not start.gtid else MysqlGtidSet.parse(start.gtid)
        )
        # resume point of the last returned item (what offset() reports)
        self._ret = _Mark(start_file, start_pos, start.gtid, start.trx_gtid)  # type: ignore[arg-type]
        self._ret_after, self._ret_trx_items = after, start.trx_items
        self._trx_items = 0
        self._skip_items = start.trx_items if start.file is None else 0  # resumed by GTID
        # skip items at or before this position (resume inside a transaction)
        self._skip: Position | None = after
        self._produced: Position | None = after  # last item put into _pending
        # stream bookkeeping
        self._file = start_file
        self._file_index = self._lineage_index(start_file) if start_file else 0
        self._in_trx = False
        self._trx_start = (start_file, start_pos)
        self._last_end = (start_file, start_pos)
        self._gtid: str | None = None  # of the transaction being read
        self._saw_begin = False
        self._implied_begin = False
        # (item, where a resumed reader starts, items of that transaction up to this one)
        self._pending: deque[tuple[LogItem, _Mark, int]] = deque()
        self._codecs: dict[int, _TableCodec | None] = {}
        self._stream: BinlogStream | None = None
        self._stream_start = (start_file, start_pos)
        self._opened = False  # a reopened connection checks that the server is still the same
        self._server_idle = False

    # -- start ------------------------------------------------------------------------------

    def _start(self, offset: Offset | None) -> _Resume:
        source = self.source
        if not offset:
            # MariaDB: not SHOW MASTER STATUS: a transaction before it may not be visible yet,
            # and a dump bound read later would then miss a row the log never shows either
            file, pos, gtid = source.start_point()
            return _Resume(file, pos, None, gtid, 0)
        try:
            file = None if offset.get("file") is None else str(offset["file"])
            pos = int(offset.get("pos") or 0)
            if file is not None:
                binlog_file_index(file)
            after = Position.parse(offset["after"]) if offset.get("after") else None
            gtid = offset.get("gtid") or None
            epoch = int(offset.get("epoch") or 0)
            server = offset.get("server")
            returned = int(offset.get("trx_items") or 0)
            if file is None and not gtid:
                raise ValueError
        except (KeyError, TypeError, ValueError):
            raise SourceError(
                f"stream offset {offset!r} is not a binlog offset",
                "reset the stream offset and run a new full dump (dblog dump --all)",
            ) from None
        if server is not None and server != self.identity:
            return self._moved(server, gtid, epoch, returned)
        if file is None:  # resumed by GTID here, nothing committed since
            return _Resume(None, 0, after, gtid, epoch, returned)
        logs = source.binary_logs()
        trx_gtid = offset.get("trx_gtid")
        mariadb = source.flavor == "mariadb"
        here = source.gtid_at(file, pos) if mariadb and file in logs else None
        if not gtid:  # gtid_mode OFF, or an offset of an older version
            if file in logs:
                return _Resume(file, pos, after, here, epoch, returned, trx_gtid)
        elif not mariadb:  # MySQL: the set only grows, unless the binlog was reset
            # (a reset followed by more transactions than the stream had read passes this
            # check: MySQL has no BINLOG_GTID_POS, and a SHOW BINLOG EVENTS scan of the file
            # on every start would cost seconds per GB)
            head = source.gtid_executed()
            if _reset_since([gtid, trx_gtid], head):
                why = f"the server's GTIDs are back at {head or 'none'}"
                return self._reset(file, pos, logs, epoch, why)
            if file in logs:
                return _Resume(file, pos, after, gtid, epoch, returned, trx_gtid)
        elif here is not None and _same_history(gtid, here):
            head = source.gtid_executed()
            if not _reset_since([gtid, trx_gtid], head):
                return _Resume(file, pos, after, gtid, epoch, returned, trx_gtid)
            return self._reset(file, pos, logs, epoch, f"the server's GTIDs are back at {head}")
        elif file in logs:
            return self._reset(file, pos, logs, epoch, f"{file}:{pos} is at GTID {here}")
        if logs and max(binlog_file_index(f) for f in logs) < binlog_file_index(file):
            return self._reset(file, pos, logs, epoch, f"its files now end at {logs[-1]}")
        raise self._purged(file)

    def _moved(self, server: str, gtid: str | None, epoch: int, returned: int) -> _Resume:
        """The config now points at another server (a promoted replica): resume by GTID."""
        where = self.settings.where
        if not gtid:
            raise SourceError(
                f"{where} is another server (server {server} -> {self.identity}) and the stream"
                " offset has no GTIDs to resume from there (MySQL's gtid_mode was OFF, or the"
                " offset is from an older version)",
                "point source.url back at the server the stream followed, or start a new"
                " stream (new name) and run a full dump (dblog dump --all)",
            )
        log.warning(
            "%s is another server (server %s -> %s): resuming after GTID %s, lineage epoch %d",
            where,
            server,
            self.identity,
            gtid,
            epoch + 1,
        )
        return _Resume(None, 0, None, gtid, epoch + 1, returned)

    def _reset(self, file: str, pos: int, logs: list[str], epoch: int, why: str) -> _Resume:
        """The binlog was reset (RESET MASTER): continue from the start of the new one."""
        log.warning(
            "the binlog of %s was reset since the stream read %s:%s (%s): continuing from"
            " %s:4, lineage epoch %d; changes committed before the reset and not yet captured"
            " are not in the binlog: run a full dump (dblog dump --all) to recover them",
            self.settings.where,
            file,
            pos,
            why,
            logs[0],
            epoch + 1,
        )
        return _Resume(logs[0], 4, None, self.source.gtid_at(logs[0], 4), epoch + 1)

    @staticmethod
    def _purged(file: str) -> SourceError:
        return SourceError(
            f"binlog {file} needed to resume was purged",
            "run a new full dump (dblog dump --all) after resetting the stream offset",
        )

    def _open(self) -> BinlogStream:
        file, pos = self._stream_start
        if self._opened and (now := self.source.identity()) != self.identity:
            # a failover behind the same address: these offsets mean other bytes there
            raise SourceError(
                f"{self.settings.where} is now another server (server {self.identity} ->"
                f" {now}); the stream resumes there by GTID when started again",
                "start the stream again (a supervisor does)",
            )
        self._opened = True
        settings = self.settings.pymysql_kwargs()
        settings["read_timeout"] = self.read_timeout_s
        settings["write_timeout"] = self.read_timeout_s
        watched = {*self.tables, *self._watermark_tables()}
        schemas, names = {t.db for t in watched}, {t.table for t in watched}
        self._codecs.clear()
        by_gtid = file is None  # GTID auto-positioning; else file/position on both flavours
        return BinlogStream(
            connection_settings=settings,
            server_id=self.server_id,
            resume_stream=True,
            blocking=True,
            log_file=file,
            log_pos=pos if file is not None else None,
            auto_position=self._gtid_pos if by_gtid else None,
            only_events=[
                RotateEvent,
                QueryEvent,
                XidEvent,
                GtidEvent,
                MariadbGtidEvent,
                NotImplementedEvent,
                HeartbeatLogEvent,
                TableMapEvent,
                WriteRowsEvent,
                UpdateRowsEvent,
                DeleteRowsEvent,
            ],
            filter_non_implemented_events=False,
            only_schemas=sorted(schemas),
            only_tables=sorted(names),
            slave_heartbeat=self.heartbeat_s,
            is_mariadb=by_gtid and self._mariadb,
            enable_logging=False,
            # a table id's map is decoded once per binlog file (see _step), not per transaction:
            # re-decoding it was a large share of the capture thread under single-row writes
            freeze_schema=True,
        )

    # -- reading ----------------------------------------------------------------------------

    def _fetch(self) -> Any:
        """The next event; a lost connection is reopened once at the current transaction."""
        for attempt in (0, 1):
            if self._stream is None:
                self._stream = self._open()
            try:
                return self._stream.fetchone()
            except pymysql.MySQLError as err:
                code = err.args[0] if err.args and isinstance(err.args[0], int) else None
                start = self._stream_start
                self._reset_stream()
                if code in _PURGED_CODES and start[0] is None:
                    raise SourceError(
                        f"{self.settings.where} cannot resume the stream after GTID"
                        f" {self._gtid_pos}: {err.args[-1]}",
                        "check that this server replicated from the one the stream followed;"
                        " otherwise start a new stream (new name) with a full dump",
                    ) from None
                if code in _PURGED_CODES:
                    raise self._purged(start[0]) from None
                if attempt == 1 or code in (1045, 2002, 2003, 2005):
                    raise connect_error(self.settings, err) from None
                log.warning(
                    "binlog connection to %s lost (%s); resuming at %s:%s",
                    self.settings.where,
                    code,
                    *self._stream_start,
                )
        raise AssertionError("unreachable")

    def _arrived(self, wait_s: float, wake: Wake | None = None) -> bool:
        """Whether the server has sent more (or does within ``wait_s``): a fetch will not wait.

        Without this a read waited for the server's next heartbeat (``heartbeat_s``) after the
        last event it had: a tenth of a second on every read, on every chunk's watermarks. A
        read lingers ``LINGER_S`` for more, so a busy log still comes in batches, not one event
        per read.
        """
        connection = getattr(self._stream, "_stream_connection", None)
        sock = getattr(connection, "_sock", None)
        rfile = getattr(connection, "_rfile", None)
        if sock is None or rfile is None:
            return True  # not connected yet (the fetch connects), or a library we do not know
        timeout = sock.gettimeout()
        sock.setblocking(False)  # a peek at the buffer, or at what the socket holds now
        try:
            if rfile.peek(1):
                return True
        except (BlockingIOError, InterruptedError, ssl.SSLWantReadError):
            pass
        finally:
            sock.settimeout(timeout)
        if isinstance(sock, ssl.SSLSocket) and sock.pending():
            return True
        if wait_s <= 0:
            return False
        return sock in select.select([sock] if wake is None else [sock, wake], [], [], wait_s)[0]

    def _reset_stream(self) -> None:
        """Drop the connection; the next read reopens at the current transaction's start
        (or, resumed by GTID with no transaction begun since, at the same GTID position)."""
        self._close_stream()
        self._stream_start = self._trx_start if self._in_trx else self._last_end
        self._skip = self._produced
        self._in_trx = False
        self._last_end = self._stream_start
        self._file = self._stream_start[0]
        self._file_index = self._lineage_index(self._file) if self._file else 0

    def _lineage_index(self, file: str) -> int:
        """The first Position coordinate of ``file``: its index on this lineage epoch."""
        return Position.mysql(binlog_file_index(file), 0, epoch=self.lineage_epoch).coords[0]

    def _stamp(self) -> tuple[str, int]:
        stream = self._stream
        assert stream is not None
        return str(stream.log_file or self._file), int(stream.log_pos or 0)

    def read(self, max_items: int, timeout_s: float, wake: Wake | None = None) -> list[LogItem]:
        if max_items <= 0:
            return []
        deadline = time.monotonic() + max(0.0, timeout_s)
        out: list[LogItem] = []
        self._take(out, max_items)
        while len(out) < max_items:
            if out and (self._server_idle or not self._arrived(LINGER_S)):
                break  # the server has nothing more right now: hand over what we have
            remaining = deadline - time.monotonic()
            if remaining <= 0 or not (out or self._arrived(remaining, wake)):
                break
            self._step()
            self._take(out, max_items)
        if out or (wake is not None and wake.is_set()):
            return out
        heartbeat = self._heartbeat(max(timeout_s, 1.0), max_items)
        if isinstance(heartbeat, list):
            return heartbeat
        return [] if heartbeat is None else [heartbeat]

    def _take(self, out: list[LogItem], max_items: int) -> None:
        while self._pending and len(out) < max_items:
            item, mark, n = self._pending.popleft()
            out.append(item)
            self._ret, self._ret_after, self._ret_trx_items = mark, item.position, n

    def _heartbeat(self, budget_s: float, max_items: int) -> Heartbeat | list[LogItem] | None:
        """Idle: catch up with SHOW MASTER STATUS and report that position."""
        target_file, target_pos = self.source.master_status()
        target = (self._lineage_index(target_file), target_pos)
        deadline = time.monotonic() + budget_s
        while True:
            # resumed by GTID: no position to report before the first transaction begins
            if self._stream is not None and self._last_end[0] is not None:
                file, pos = self._stamp()
                here = (self._lineage_index(file), pos)
                if here >= target and not self._pending:
                    break
            if self._pending:
                out: list[LogItem] = []
                self._take(out, max_items)
                return out
            if time.monotonic() >= deadline:
                return None
            self._step()
        if self._in_trx:
            position = Position.mysql(target[0], target[1], END_OF_EVENT)
        else:
            position = Position.mysql(here[0], here[1], END_OF_EVENT)
            self._last_end = (file, pos)
        if self._ret_after is not None and position < self._ret_after:
            position = self._ret_after
        file, pos = self._trx_start if self._in_trx else self._last_end
        trx_gtid = self._gtid if self._in_trx else None
        self._ret = _Mark(file, pos, self._gtid_pos, trx_gtid)
        self._ret_after = position
        self._ret_trx_items = self._trx_items if self._in_trx else 0
        return Heartbeat(position)

    def _step(self) -> None:
        """Fetch one event and turn it into pending items."""
        event = self._fetch()
        if event is None:  # EOF (the server ended the dump): reopen on the next fetch
            self._reset_stream()
            return
        self._server_idle = isinstance(event, HeartbeatLogEvent)
        by_gtid = self._last_end[0] is None  # resumed by GTID, no transaction begun yet
        if isinstance(event, RotateEvent):
            # Table ids name a table definition until the server restarts, which starts a new
            # file; the library forgets its maps only at a rotation the old file recorded, and a
            # crashed server's file records none. Forgotten, the next map of each id is decoded.
            if self._stream is not None:
                self._stream.table_map.clear()
            self._file = event.next_binlog
            self._file_index = self._lineage_index(event.next_binlog)
            if not self._in_trx and not by_gtid:  # by GTID: the position of a skipped event
                self._last_end = (event.next_binlog, int(event.position))
            return
        kind = type(event)
        if kind is RowsData:
            end = event.end
            self._rows(event)
        elif kind is Commit:
            end = event.end
            self._commit(end)
        elif kind is Begin:
            end = event.end
            self._begin(event.start)
            self._gtid = event.gtid
            self._implied_begin = event.implied_begin
        else:
            end = int(event.packet.log_pos)
            if isinstance(event, TableMapEvent):
                self._table_map(event)
            elif isinstance(event, QueryEvent):
                self._query(event, end)
        heartbeat = isinstance(event, HeartbeatLogEvent)
        if not self._in_trx and end > 0 and not by_gtid and not heartbeat:
            self._last_end = (self._file, end)

    def _begin(self, start: int) -> None:
        self._in_trx = True
        self._trx_items = 0
        self._saw_begin = False
        self._implied_begin = False
        self._trx_start = (self._file, start)

    def _commit(self, end: int) -> None:
        gtid, self._gtid = self._gtid, None
        self._in_trx = False
        self._last_end = (self._file, end)
        self._skip_items = 0  # only the first transaction after a resume by GTID
        if gtid is None:
            return
        if self._mariadb:
            self._gtids[gtid.split("-", 1)[0]] = gtid
            self._gtid_pos = _gtid_text(self._gtids)
        elif self._gtid_set is not None:
            self._gtid_set = self._gtid_set.add(gtid)
            self._gtid_pos = str(self._gtid_set)

    def _query(self, event: QueryEvent, end: int) -> None:
        text = " ".join(event.query.split()[:3]).upper()
        if text == "BEGIN" or text.startswith("XA START"):
            self._saw_begin = True
            if not self._in_trx:  # MySQL without GTID events: BEGIN opens the transaction
                self._begin(end - int(event.packet.event_size))
                self._saw_begin = True
            return
        if text.startswith(_TRX_NEUTRAL):
            return
        if text.startswith(_TRX_END):
            self._commit(end)
            return
        # DDL (or another statement logged as a query): forget cached table shapes. It ends
        # the transaction unless it sits inside an explicit (or MariaDB's implied) BEGIN.
        self._schema_changed(event)
        if not self._in_trx or not (self._saw_begin or self._implied_begin):
            self._commit(end)

    def _schema_changed(self, event: QueryEvent) -> None:
        """Forget what we know of every captured table the statement names (ALTER, RENAME, ...).

        Any DDL names the tables it changes (DROP DATABASE removes them; they come back only
        through a CREATE that names them), so a name match is enough; false positives only cost
        an information_schema read.
        """
        query = event.query.lower()
        touched = {
            t
            for t in (*self.tables, *self._watermark_tables())
            if t.table.lower() in query or t.table.lower().replace("`", "``") in query
        }
        if not touched:
            return
        for table in touched:
            self.source.forget(table)
        for table_id, codec in list(self._codecs.items()):
            if codec is not None and codec.table in touched:
                del self._codecs[table_id]
                if self._stream is not None:  # its next map is decoded and builds the codec
                    self._stream.table_map.pop(table_id, None)
        if query.lstrip().startswith("truncate"):
            log.warning(
                "binlog has %r: TRUNCATE is logged as a statement, its deleted rows produce no "
                "change events; run a dump of the table to resynchronise",
                event.query[:200],
            )

    # -- tables -----------------------------------------------------------------------------

    def _watermark_tables(self) -> tuple[TableId, ...]:
        """None for read-only strategies: their user may not even see the watermark table."""
        return () if self.watermark_table is None else (self.watermark_table,)

    def _info(self, table: TableId, refresh: bool = False) -> TableInfo:
        try:
            info = self.source.table_info(table, refresh=refresh)
        except InputError as err:
            raise SourceError(
                f"binlog has changes of {table} but the table cannot be described: {err}",
                "restore the table or remove it from source.tables",
            ) from None
        return info

    def _table_map(self, event: TableMapEvent) -> None:
        """Complete the library's column descriptions from information_schema, build a codec."""
        table = TableId(event.schema, event.table)
        watermark = table == self.watermark_table
        if not watermark and table not in self.tables:
            self._codecs[event.table_id] = None
            return
        columns = event.columns
        named = all(c.name for c in columns)
        info = self._info(table)
        if not named and not shape_matches(columns, info):
            info = self._info(table, refresh=True)
            if not shape_matches(columns, info):
                raise SourceError(
                    f"binlog rows of {table} do not match its columns in information_schema"
                    " (the table was altered after they were written) and the binlog does not"
                    " name columns (binlog_row_metadata is not FULL)",
                    "SET GLOBAL binlog_row_metadata=FULL (MariaDB 10.5+, MySQL 8.0.14+), then"
                    " reset the stream offset and run a new full dump (dblog dump --all)",
                )
        if not named:
            for col, ci in zip(columns, info.columns, strict=True):
                col.name = ci.name
        decoder = row_decoder(columns, info)

        def images(rows: RowsData) -> list[Row]:
            return decoder.images(rows.data, rows.start, rows.stop, rows.present)

        self._codecs[event.table_id] = _TableCodec(table, info.schema.key, images, watermark)

    # -- rows -------------------------------------------------------------------------------

    def _rows(self, event: RowsData) -> None:
        codec = self._codecs.get(event.table_id)
        if codec is None:
            return
        file, pos = self._trx_start if self._in_trx else self._last_end
        mark = _Mark(file, pos, self._gtid_pos, self._gtid)
        fi, end, kind = self._file_index, event.end, event.op
        skip = self._skip
        if skip is not None and (fi, end) > skip.coords[:2]:
            skip = self._skip = None  # resumed past the saved item: stop comparing
        pending = self._pending
        # items of this transaction so far, read or not: a resume by GTID (which starts at the
        # transaction) skips the ones already returned
        n, returned = self._trx_items, self._skip_items
        images = codec.images(event)
        if codec.watermark:
            rows_after = images[1::2] if kind == "u" else images  # a row's newest image
            for index, image in enumerate(rows_after):
                position = Position.mysql(fi, end, index)
                n += 1
                if kind == "d" or (skip is not None and position <= skip) or n <= returned:
                    continue
                stream = str(image["stream"])
                if self.watermark_stream is not None and stream != self.watermark_stream:
                    continue
                item = WatermarkEvent(stream, str(image["value"]), position)
                pending.append((item, mark, n))
                self._produced = position
            self._trx_items = n
            return
        key_cols = codec.key
        table = codec.table
        gtid = self._gtid
        ts_ms = event.timestamp * 1000
        index = 0
        rows: Iterable[tuple[Row | None, Row | None]]
        if kind == "u":
            rows = zip(images[0::2], images[1::2], strict=True)
        elif kind == "c":
            rows = ((None, image) for image in images)
        else:
            rows = ((image, None) for image in images)
        for before, after in rows:
            try:
                old_key = None if before is None else tuple([before[c] for c in key_cols])
                new_key = None if after is None else tuple([after[c] for c in key_cols])
            except KeyError as err:
                raise SourceError(
                    f"binlog rows of {table} lack primary key column {err}",
                    "SET GLOBAL binlog_row_metadata=FULL and binlog_row_image=FULL",
                ) from None
            if kind == "u" and old_key != new_key:
                # the key changed: the old key is gone, the new one appears
                parts: tuple[tuple[str, Any, Row | None, Row | None], ...] = (
                    ("d", old_key, before, None),
                    ("c", new_key, None, after),
                )
            else:
                parts = ((kind, new_key if after is not None else old_key, before, after),)
            for op, key, b, a in parts:
                position = Position.mysql(fi, end, index)
                index += 1
                n += 1
                if (skip is not None and position <= skip) or n <= returned:
                    continue
                item = ChangeEvent(
                    table=table,
                    op=op,  # type: ignore[arg-type]
                    key=key,  # type: ignore[arg-type]
                    position=position,
                    before=b,
                    after=a,
                    ts_ms=ts_ms,
                    gtid=gtid,
                )
                pending.append((item, mark, n))
                self._produced = position
        self._trx_items = n

    # -- offsets ----------------------------------------------------------------------------

    def offset(self) -> Offset:
        ret = self._ret
        return {
            "file": ret.file,
            "pos": ret.pos,
            "after": None if self._ret_after is None else str(self._ret_after),
            "server": self.identity,
            "gtid": ret.gtid_pos,
            "trx_gtid": ret.trx_gtid,
            "trx_items": self._ret_trx_items,
            "epoch": self.lineage_epoch,
        }

    def acknowledge(self, offset: Offset) -> None:
        """Nothing to free: the server purges binlogs by its own retention settings."""

    def _close_stream(self) -> None:
        if self._stream is not None:
            with contextlib.suppress(Exception):  # already broken
                self._stream.close()
            self._stream = None
