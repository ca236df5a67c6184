"""PostgreSQL's WAL as dblog ``LogItem``s: logical replication with the wal2json plugin.

The reader streams from a logical replication slot (psycopg2's ``LogicalReplicationConnection``)
with wal2json format 2, one JSON message per begin (B), row change (I/U/D) and commit (C). Only
the configured tables and ``dblog.dblog_watermarks`` are decoded (``add-tables``).

Positions
    ``Position.postgres(commit_lsn, n)``: ``commit_lsn`` is the LSN of the transaction's commit
    record (its start, wal2json's ``lsn`` in B and C) and ``n`` counts the items the transaction
    produced, from 1. Change index 0 is never used by an item: ``(L, 0)`` lies after every
    transaction whose commit record starts before ``L`` and before every transaction that
    commits at or after ``L`` (heartbeats and snapshot closes use it). The walsender decodes in
    commit order and the B message already carries the commit LSN, so items are emitted as they
    arrive (no transaction is buffered in memory, however large).

Heartbeats
    ``Heartbeat(Position.postgres(L, 0))`` means: every transaction whose commit record starts
    before ``L`` has been returned. ``L`` is the walsender's send pointer (the end of the last WAL
    record it decoded), taken from the end of the last commit message or from a keepalive
    received while no transaction is open: the walsender writes a transaction's output before it
    moves its send pointer past the commit record, on the same socket. When the reader is idle
    it asks for a keepalive (``send_feedback(reply=True)``) a few times a second, so a heartbeat
    passes any ``pg_current_wal_lsn()`` read before within about a second. A send pointer exactly
    at a WAL page boundary is moved past the page header (no record can start inside it).
    Heartbeats are returned only when a read found nothing, and never inside a transaction.

Offsets and acknowledgements
    ``offset()`` is ``{"version": 1, "slot": ..., "position": <last item's position or null>,
    "flush_lsn": "X/Y", "system": <system identifier>, "timeline": N}``. A reader refuses another
    cluster; on a promoted standby (another timeline, LSNs going on) it continues only if the
    slot there holds everything after ``flush_lsn`` (a slot created after the promotion does not).
    ``flush_lsn`` is the end of the last transaction returned completely
    (or the last heartbeat's LSN): a new reader starts streaming there and drops every item at or
    before ``position``, so it continues exactly after the last item returned, also in the middle
    of a transaction. ``acknowledge(offset)`` is the only thing that sends ``flush_lsn`` to the
    server, so the slot's ``confirmed_flush_lsn`` never passes what the caller committed (psycopg2
    itself moves it further only across WAL that produced no message for this reader, once
    everything received has been acknowledged: that frees WAL on a busy server whose captured
    tables are idle and loses nothing).

Row images
    Values are converted with psycopg2's own typecasters, looked up by the type OID wal2json
    reports (``include-type-oids``), so they equal what :class:`PostgresSource` SELECTs return
    (see the type table in :mod:`airflow_dblog.sources.postgres.source`). Inserts carry ``after``;
    deletes carry ``before`` = the replica identity: key columns only under REPLICA IDENTITY
    DEFAULT, the whole row under FULL. Updates carry ``before`` only under FULL. An update that
    changes the primary key is emitted as a delete of the old key followed by an insert of the
    new one (as Debezium does), with ``extra["pk_change"]`` set on both.

Unchanged TOASTed values
    wal2json leaves out of an update's new image the columns whose out-of-line (TOASTed) value
    did not change. Under REPLICA IDENTITY FULL they are taken from the old image. Otherwise
    they are set to :data:`UNAVAILABLE` (Debezium's ``__debezium_unavailable_value``) and their
    names listed in ``event.extra["unavailable_columns"]``: a sink must keep its stored value for
    those columns (the Delta MERGE) or pass the placeholder on (Kafka, as Debezium does).

TRUNCATE is not a row change: it is logged as a warning and counted in ``stats["truncates"]``;
run a dump of the table afterwards.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import logging
import re
import select
import time
from collections import deque
from collections.abc import Sequence
from typing import Any

import psycopg2
import psycopg2.extensions
import psycopg2.extras

from airflow_dblog.core.events import ChangeEvent, Heartbeat, LogItem, Row, TableId, WatermarkEvent
from airflow_dblog.core.position import Position, int_to_lsn, lsn_to_int
from airflow_dblog.errors import SourceError
from airflow_dblog.redact import redact
from airflow_dblog.sources.base import Offset, StreamReader, Wake
from airflow_dblog.sources.postgres.connection import (
    SESSION_OPTIONS,
    ConnectionSettings,
    connect_error,
    parse_postgres_url,
)
from airflow_dblog.sources.postgres.source import WATERMARK_TABLE_ID, PostgresSource
from airflow_dblog.sources.postgres.wal_values import Converter, identity, value_converter
from airflow_dblog.sources.registry import ReaderSettings

log = logging.getLogger(__name__)

PLUGIN = "wal2json"
OFFSET_VERSION = 1
UNAVAILABLE = "__debezium_unavailable_value"
"""Placeholder for an unchanged TOASTed column the WAL does not carry (REPLICA IDENTITY DEFAULT)."""

KEEPALIVE_REQUEST_S = 0.2  # while idle, ask the walsender for its position this often
RECONNECT_ATTEMPTS = 5
_SLOT_RE = re.compile(r"^[a-z0-9_]{1,63}$")
_TS_RE = re.compile(
    r"^(\d{4})-(\d\d)-(\d\d) (\d\d):(\d\d):(\d\d)(?:\.(\d+))?([+-]\d\d)(?::?(\d\d))?"
)
_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.timezone.utc)
_DECODER = json.JSONDecoder(parse_float=str)  # numbers keep their text: numeric stays exact
_SCAN = _DECODER.scan_once  # wal2json writes one compact object per message: no whitespace


def commit_ts_ms(text: str) -> int:
    """wal2json's commit timestamp (``2024-05-01 10:11:12.5+00``) in epoch milliseconds."""
    m = _TS_RE.match(text)
    if not m:
        return 0
    year, month, day, hh, mm, ss, frac, tzh, tzm = m.groups()
    stamp = dt.datetime(
        int(year),
        int(month),
        int(day),
        int(hh),
        int(mm),
        int(ss),
        int((frac or "0")[:6].ljust(6, "0")),
    )
    offset = dt.timedelta(hours=abs(int(tzh)), minutes=int(tzm or 0))
    stamp = stamp.replace(tzinfo=dt.timezone(-offset if tzh[0] == "-" else offset))
    delta = stamp - _EPOCH
    return (delta.days * 86_400 + delta.seconds) * 1000 + delta.microseconds // 1000


def _escape(part: str) -> str:
    return re.sub(r"([\\.,*\s'\"])", r"\\\1", part)


def escape_table_name(table: TableId) -> str:
    """``schema.table`` for wal2json's ``add-tables`` (backslash-escaped specials)."""
    return f"{_escape(table.db)}.{_escape(table.table)}"


def add_tables(tables: Sequence[TableId]) -> str:
    """wal2json's ``add-tables`` value.

    Its parser walks bytes and escapes one byte at a time, so a non-ASCII name cannot be written
    in it: such a table's whole schema (or every schema) is decoded and the reader filters.
    """
    entries = []
    for t in tables:
        if t.db.isascii() and t.table.isascii():
            entries.append(escape_table_name(t))
        else:
            entries.append(f"{_escape(t.db)}.*" if t.db.isascii() else "*.*")
    return ",".join(dict.fromkeys(entries))


def parse_offset(offset: Offset) -> tuple[Position | None, int]:
    """``(last position, flush LSN)`` of an offset made by :meth:`Wal2jsonReader.offset`."""
    try:
        if int(offset.get("version", 0)) != OFFSET_VERSION:
            raise ValueError("version")
        raw = offset.get("position")
        position = Position.parse(raw) if raw else None
        if position is not None and len(position.coords) != 3:
            raise ValueError("position")
        return position, lsn_to_int(str(offset["flush_lsn"]))
    except (KeyError, ValueError, TypeError, AttributeError):
        raise SourceError(
            f"the saved reader offset {offset!r} is not a wal2json reader offset",
            "the checkpoint belongs to another source type or version: start a new stream",
        ) from None


def open_wal2json_reader(
    url: str, settings: ReaderSettings, offset: Offset | None
) -> Wal2jsonReader:
    """The stream's reader on its slot: ``source.slot``, else one named after the stream."""
    slot = settings.slot or f"dblog_{settings.stream.replace('-', '_').lower()}"
    return Wal2jsonReader(url, settings.tables, slot=slot, offset=offset)


class Wal2jsonReader(StreamReader):
    """``ChangelogReader`` over a wal2json logical replication slot (see the module doc)."""

    lineage_epoch = 0  # LSNs go on across a promotion (a new timeline): see _check_lineage

    def __init__(
        self,
        url: str | ConnectionSettings,
        tables: Sequence[TableId],
        *,
        slot: str,
        offset: Offset | None = None,
        create_slot: bool = True,
        before_images: str = "warn",
        status_interval_s: float = 10.0,
        connect_timeout: float = 10.0,
        plugin: str = PLUGIN,
    ) -> None:
        self.settings = url if isinstance(url, ConnectionSettings) else parse_postgres_url(url)
        if not _SLOT_RE.match(slot):
            raise SourceError(
                f"replication slot name {slot!r} is not valid",
                "use 1-63 lower-case letters, digits or _ (source.slot)",
            )
        self.slot = slot
        self.tables = tuple(tables)
        self._captured = frozenset(self.tables)
        self.plugin = plugin
        self.stats = {"messages": 0, "changes": 0, "truncates": 0, "reconnects": 0}
        self._status_interval = status_interval_s
        self._connect_timeout = connect_timeout
        self._conn: Any = None
        self._cur: Any = None
        self.source = PostgresSource(self.settings, connect_timeout=connect_timeout)
        try:
            self._setup(offset, create_slot, before_images)
        except BaseException:
            self.close()
            raise

    # -- setup ------------------------------------------------------------------------------

    def _setup(self, offset: Offset | None, create_slot: bool, before_images: str) -> None:
        src = self.source
        src.check_logical_decoding()
        for table in self.tables:
            src.table_info(table)  # InputError: unknown table, no primary key
        src.check_replica_identity(self.tables, before_images)
        self._block = int(src.setting("wal_block_size"))
        self._segment = int(src.setting("wal_segment_size"))

        self._last: Position | None = None  # position of the last item returned
        self._safe = 0  # every transaction committing before this LSN was returned completely
        # the cluster (system identifier) and timeline the offset's LSNs belong to
        self._lineage: tuple[str | None, int | None] = (None, None)
        if offset is not None:
            self._last, self._safe = parse_offset(offset)
            timeline = offset.get("timeline")
            self._lineage = (offset.get("system"), None if timeline is None else int(timeline))
            if offset.get("slot") not in (None, self.slot):
                raise SourceError(
                    f"the saved reader offset is for replication slot {offset.get('slot')},"
                    f" not {self.slot}",
                    "set source.slot back, or start a new stream",
                )

        info = src.replication_slot(self.slot)
        if info is None:
            if offset is not None:
                raise SourceError(
                    f"replication slot {self.slot} does not exist on PostgreSQL at {src.where};"
                    f" resuming from {int_to_lsn(self._safe)} needs it (the WAL since is gone)",
                    "start a new stream without the checkpoint (a new slot is created) and dump"
                    " all tables again",
                )
            if not create_slot:
                raise SourceError(
                    f"replication slot {self.slot} does not exist on PostgreSQL at {src.where}",
                    f"create it: SELECT pg_create_logical_replication_slot('{self.slot}',"
                    f" '{self.plugin}')",
                )
            src.create_replication_slot(self.slot, self.plugin)
            log.info("created replication slot %s (%s) on %s", self.slot, self.plugin, src.where)
            info = src.replication_slot(self.slot)
            assert info is not None
        self._check_slot(info)
        self._acked = info["confirmed_flush_lsn"] or 0
        if offset is not None and self._safe < self._acked:
            log.info(
                "slot %s is confirmed up to %s, past the offset's %s: WAL in between produced no"
                " change for this reader",
                self.slot,
                int_to_lsn(self._acked),
                int_to_lsn(self._safe),
            )
        self._skip_upto = self._last  # items at or before this were returned by an earlier reader
        self._xid_ref = src.next_xid()
        self._conv: dict[int, Converter] = {}
        self._tids: dict[tuple[str, str], TableId] = {
            (WATERMARK_TABLE_ID.db, WATERMARK_TABLE_ID.table): WATERMARK_TABLE_ID
        }
        self._widths: dict[TableId, int] = {}  # columns per table, to spot unchanged TOAST
        self._queue: deque[LogItem | int] = deque()  # items, and ints = LSN of a finished txn
        self._reset_txn()
        self._hb_lsn = 0
        self._open_stream()

    def _check_slot(self, info: dict[str, Any]) -> None:
        where = self.source.where
        if info["slot_type"] != "logical":
            raise SourceError(
                f"replication slot {self.slot} on {where} is a physical slot",
                "set source.slot to the name of a logical slot, or to a new name",
            )
        if info["plugin"] != self.plugin:
            raise SourceError(
                f"replication slot {self.slot} on {where} uses plugin {info['plugin']},"
                f" not {self.plugin}",
                f"drop it (SELECT pg_drop_replication_slot('{self.slot}')) or set source.slot"
                " to another name",
            )
        if info["database"] != self.settings.database:
            raise SourceError(
                f"replication slot {self.slot} on {where} belongs to database {info['database']},"
                f" not {self.settings.database}",
                "set source.slot to another name",
            )

    def _reset_txn(self) -> None:
        self._in_txn = False
        self._txn_lsn = 0
        self._txn_end = 0
        self._txn_xid = 0
        self._txn_ts = 0
        self._index = 0

    def _options(self) -> dict[str, str]:
        tables = [*self.tables, WATERMARK_TABLE_ID]
        return {
            "format-version": "2",
            "include-transaction": "1",
            "include-xids": "1",
            "include-timestamp": "1",
            "include-lsn": "1",
            "include-pk": "1",
            "include-types": "0",
            "include-type-oids": "1",
            "actions": "insert,update,delete,truncate",
            "add-tables": add_tables(tables),
        }

    def _open_stream(self) -> None:
        self._close_stream()
        try:
            conn = psycopg2.connect(
                self.settings.dsn,
                connection_factory=psycopg2.extras.LogicalReplicationConnection,
                connect_timeout=max(1, int(self._connect_timeout)),
                application_name=f"airflow-dblog:{self.slot}",
                options=SESSION_OPTIONS,
            )
        except psycopg2.Error as err:
            raise connect_error(self.settings, err) from None
        self._conn = conn
        cur = conn.cursor()
        try:
            self._check_lineage(cur)
        except BaseException:
            self._close_stream()
            raise
        try:
            cur.start_replication(
                slot_name=self.slot,
                decode=True,
                start_lsn=self._safe,
                status_interval=self._status_interval,
                options=self._options(),
            )
        except psycopg2.Error as err:
            self._close_stream()
            raise self._stream_error(err) from None
        self._cur = cur
        self._last_request = 0.0

    def _check_lineage(self, cur: Any) -> None:
        """Refuse another cluster; across a promotion (a new timeline: LSNs go on) continue
        only if the slot still holds everything after the offset."""
        cur.execute("IDENTIFY_SYSTEM")
        row = cur.fetchone()
        system, timeline = str(row[0]), int(row[1])
        saved_system, saved_timeline = self._lineage
        where = self.source.where
        if saved_system is not None and system != saved_system:
            raise SourceError(
                f"PostgreSQL at {where} is another cluster (system identifier {saved_system} ->"
                f" {system}): the stream's LSNs mean nothing there",
                "point source.url back at the cluster the stream followed, or start a new"
                " stream (new name) and run a full dump (dblog dump --all)",
            )
        if saved_timeline is not None and timeline != saved_timeline:
            if self._acked > self._safe:
                raise SourceError(
                    f"PostgreSQL at {where} was promoted (timeline {saved_timeline} ->"
                    f" {timeline}) and replication slot {self.slot} there starts at"
                    f" {int_to_lsn(self._acked)}, after the stream's {int_to_lsn(self._safe)}:"
                    " changes committed in between are not in the slot",
                    "start a new stream (new name) and run a full dump (dblog dump --all)",
                )
            log.warning(
                "PostgreSQL at %s was promoted (timeline %d -> %d): continuing from %s on slot %s",
                where,
                saved_timeline,
                timeline,
                int_to_lsn(self._safe),
                self.slot,
            )
        self._lineage = (system, timeline)

    def _stream_error(self, err: psycopg2.Error) -> SourceError:
        text = " ".join(redact(str(getattr(err, "pgerror", None) or err)).split())
        text = text.removeprefix("ERROR: ").strip()
        where = self.source.where
        if "is active for PID" in text:
            return SourceError(
                f"replication slot {self.slot} on {where} is in use ({text})",
                "stop the other reader of this slot, or set source.slot to another name",
            )
        if "does not exist" in text and "slot" in text:
            return SourceError(
                f"replication slot {self.slot} does not exist on PostgreSQL at {where}",
                "start a new stream without the checkpoint and dump all tables again",
            )
        if "could not access file" in text:
            return SourceError(
                f"output plugin {self.plugin} is not installed on PostgreSQL at {where}",
                f"install {self.source.wal2json_package()} on the database server",
            )
        return SourceError(f"logical replication from {where} failed: {text[:400]}")

    def _close_stream(self) -> None:
        if self._conn is not None:
            with contextlib.suppress(Exception):
                self._conn.close()
        self._conn = self._cur = None

    def _reconnect(self, err: BaseException | None) -> None:
        """Reopen the stream, continuing right after the last item handed out."""
        if err is not None:
            log.warning(
                "replication connection of slot %s lost (%s); reconnecting",
                self.slot,
                " ".join(redact(str(err)).split())[:200],
            )
        self.stats["reconnects"] += 1
        self._queue.clear()  # decoded again from the slot
        self._reset_txn()
        self._skip_upto = self._last
        delay = 0.2
        for attempt in range(RECONNECT_ATTEMPTS):
            try:
                self._open_stream()
                return
            except SourceError:
                if attempt == RECONNECT_ATTEMPTS - 1:
                    raise
                time.sleep(delay)
                delay = min(delay * 2, 2.0)

    # -- ChangelogReader --------------------------------------------------------------------

    def read(self, max_items: int, timeout_s: float, wake: Wake | None = None) -> list[LogItem]:
        """Up to ``max_items`` items in commit order; ``[Heartbeat]`` when nothing came."""
        max_items = max(1, int(max_items))
        deadline = time.monotonic() + max(0.0, timeout_s)
        out: list[LogItem] = []
        saved = (self._last, self._safe)
        try:
            if self._cur is None:
                self._reconnect(None)  # an earlier read failed
            self._drain(out, max_items)
            failures = 0
            while True:
                try:
                    self._read_into(out, max_items, deadline, wake)
                    break
                except (psycopg2.OperationalError, psycopg2.InterfaceError, OSError) as err:
                    failures += 1
                    if failures > RECONNECT_ATTEMPTS:
                        raise connect_error(self.settings, err) from None
                    self._reconnect(err)
                    if out:
                        break
        except BaseException as err:
            # nothing of this call reaches the caller: forget it, reopen on the next read
            self._last, self._safe = saved
            self._close_stream()
            self._queue.clear()
            self._reset_txn()
            if isinstance(err, psycopg2.Error):
                raise self._stream_error(err) from None
            raise
        if not out:
            hb = self._heartbeat()
            if hb is not None:
                out.append(hb)
                self._last = hb.position
                self._safe = max(self._safe, hb.position.coords[0])
        return out

    def _read_into(
        self, out: list[LogItem], max_items: int, deadline: float, wake: Wake | None
    ) -> None:
        cur = self._cur
        while len(out) < max_items:
            msg = cur.read_message()
            if msg is not None:
                self._handle(msg)
                if self._queue:
                    self._drain(out, max_items)
                continue
            if not self._in_txn:
                self._note_send_pointer(cur.wal_end)
            if out:
                return
            now = time.monotonic()
            if now >= deadline:
                return
            if not self._in_txn and now - self._last_request >= KEEPALIVE_REQUEST_S:
                cur.send_feedback(reply=True)  # the walsender answers with a keepalive
                self._last_request = now
            wait = min(deadline - now, KEEPALIVE_REQUEST_S)
            with contextlib.suppress(InterruptedError):
                if wake in select.select([cur] if wake is None else [cur, wake], [], [], wait)[0]:
                    return
        if not self._queue and self._in_txn:
            # look one message ahead: when it is the commit of the transaction just handed
            # out, the offset can already say that transaction is complete
            msg = cur.read_message()
            if msg is not None:
                self._handle(msg)
                self._drain(out, max_items)

    def _drain(self, out: list[LogItem], max_items: int) -> None:
        """Move decoded items to ``out``; a finished transaction's end LSN becomes safe."""
        queue = self._queue
        while queue:
            entry = queue[0]
            if isinstance(entry, int):
                queue.popleft()
                if entry > self._safe:
                    self._safe = entry  # that transaction has been handed out completely
                continue
            if len(out) >= max_items:
                return
            out.append(queue.popleft())
            self._last = entry.position

    def _note_send_pointer(self, lsn: int) -> None:
        if lsn and lsn % self._block == 0:
            # no record starts inside a page header
            lsn += 40 if lsn % self._segment == 0 else 24
        if lsn > self._hb_lsn:
            self._hb_lsn = lsn

    def _heartbeat(self) -> Heartbeat | None:
        if self._in_txn or self._queue or not self._hb_lsn:
            return None
        position = Position.postgres(self._hb_lsn, 0)
        if self._last is not None and position < self._last:
            return None
        return Heartbeat(position)

    def offset(self) -> Offset:
        return {
            "version": OFFSET_VERSION,
            "slot": self.slot,
            "position": None if self._last is None else str(self._last),
            "flush_lsn": int_to_lsn(self._safe),
            "system": self._lineage[0],
            "timeline": self._lineage[1],
        }

    def acknowledge(self, offset: Offset) -> None:
        """Confirm ``offset``'s flush LSN to the server (the slot may free WAL before it)."""
        _, flush = parse_offset(offset)
        if flush > self._safe:
            raise ValueError(
                f"cannot acknowledge {int_to_lsn(flush)}: this reader has returned only up to"
                f" {int_to_lsn(self._safe)}"
            )
        if flush <= self._acked:
            return
        for attempt in (0, 1):
            try:
                if self._cur is None:
                    raise psycopg2.InterfaceError("replication stream is closed")
                self._cur.send_feedback(write_lsn=flush, flush_lsn=flush, force=True)
                break
            except psycopg2.Error as err:
                if attempt:
                    raise connect_error(self.settings, err) from None
                self._reconnect(err)
        self._acked = flush

    # -- decoding ---------------------------------------------------------------------------

    def _xid64(self, xid: int) -> int:
        """wal2json's 32-bit xid extended with the epoch (the xid8 ``pg_current_snapshot`` uses)."""
        ref = self._xid_ref
        full = (ref & ~0xFFFFFFFF) | xid
        if full > ref + 0x80000000:
            full -= 0x100000000
        elif full < ref - 0x80000000:
            full += 0x100000000
        if full > ref:
            self._xid_ref = full
        return full

    def _handle(self, msg: Any) -> None:
        self.stats["messages"] += 1
        m = _SCAN(msg.payload, 0)[0]
        action = m["action"]
        if action in ("I", "U", "D"):
            if self._in_txn:
                self._change(action, m)
            return
        if action == "B":
            self._in_txn = True
            self._txn_lsn = lsn_to_int(m["lsn"])
            self._txn_end = lsn_to_int(m["nextlsn"]) if "nextlsn" in m else 0
            self._txn_xid = self._xid64(int(m["xid"]))
            self._txn_ts = commit_ts_ms(m.get("timestamp", ""))
            self._index = 0
            return
        if action == "C":
            end = self._txn_end or msg.data_start
            self._reset_txn()
            self._queue.append(end)
            self._note_send_pointer(end)
            return
        if action == "T":
            self.stats["truncates"] += 1
            log.warning(
                "TRUNCATE of %s.%s at %s is not captured as row deletes; dump the table again",
                m.get("schema"),
                m.get("table"),
                m.get("lsn"),
            )
            return
        # "M" (logical decoding messages) and anything newer: not ours

    def _table_id(self, schema: str, table: str) -> TableId:
        """One TableId object per table (so the watermark table is recognised by identity)."""
        tid = self._tids.get((schema, table))
        if tid is None:
            tid = self._tids[(schema, table)] = TableId(schema, table)
        return tid

    def _converter(self, oid: int) -> Converter:
        conv = self._conv.get(oid)
        if conv is None:
            conv = self._conv[oid] = self._make_converter(oid)
        return conv

    def _make_converter(self, oid: int) -> Converter:
        base = oid
        if oid >= 10000 or oid not in psycopg2.extensions.string_types:
            # user types: domains convert as their base type
            rows = self.source.query(
                "SELECT CASE WHEN typtype = 'd' THEN typbasetype ELSE oid END"
                " FROM pg_type WHERE oid = %s",
                (oid,),
            )
            base = int(rows[0][0]) if rows else oid
        return value_converter(oid, base, self._cur)

    def _row(self, columns: list[dict[str, Any]]) -> Row:
        row: Row = {}
        conv = self._conv
        for c in columns:
            value = c["value"]
            if value is not None:
                oid = c["typeoid"]
                f = conv[oid] if oid in conv else self._converter(oid)
                if f is not identity:
                    value = f(value)
            row[c["name"]] = value
        return row

    def _position(self) -> Position:
        self._index += 1
        return Position((self._txn_lsn, self._index, 0))

    def _emit(self, item: LogItem) -> None:
        skip = self._skip_upto
        if skip is not None:
            if item.position <= skip:
                return
            self._skip_upto = None  # positions only grow from here
        self._queue.append(item)

    def _change(self, action: str, m: dict[str, Any]) -> None:
        tid = self._tids.get((m["schema"], m["table"])) or self._table_id(m["schema"], m["table"])
        columns = m.get("columns")
        identity = m.get("identity")
        after = self._row(columns) if columns is not None else None
        old = self._row(identity) if identity is not None else None
        if tid is WATERMARK_TABLE_ID:
            if after is not None and "stream" in after and "value" in after:
                self._emit(
                    WatermarkEvent(str(after["stream"]), str(after["value"]), self._position())
                )
            return
        if tid not in self._captured:  # decoded only because add-tables had to use a wildcard
            return
        self.stats["changes"] += 1
        pk = [p["name"] for p in m["pk"]] if "pk" in m else []
        ts, xid = self._txn_ts, self._txn_xid
        if action == "I":
            assert after is not None
            key = tuple([after.get(k) for k in pk])
            self._emit(ChangeEvent(tid, "c", key, self._position(), None, after, ts, xid))
            return
        if action == "D":
            before = old or {}
            key = tuple([before.get(k) for k in pk])
            self._emit(ChangeEvent(tid, "d", key, self._position(), before, None, ts, xid))
            return
        assert after is not None
        full_old = old is not None and len(old) > len(pk)  # more than the key: a whole row
        extra: dict[str, Any] = {}
        if columns is not None and (len(after) < len(old or ()) or self._may_miss(tid, after)):
            missing = self._missing_columns(tid, after, old if full_old else None)
            if missing:
                extra["unavailable_columns"] = missing
        key = tuple([after.get(k) for k in pk])
        old_key = tuple([old.get(k) for k in pk]) if old is not None else key
        if old_key != key:
            deleted = {"pk_change": "deleted"}
            self._emit(
                ChangeEvent(tid, "d", old_key, self._position(), old, None, ts, xid, extra=deleted)
            )
            extra["pk_change"] = "inserted"
            self._emit(
                ChangeEvent(tid, "c", key, self._position(), None, after, ts, xid, extra=extra)
            )
            return
        before = old if full_old else None
        self._emit(
            ChangeEvent(tid, "u", key, self._position(), before, after, ts, xid, extra=extra)
        )

    def _may_miss(self, tid: TableId, after: Row) -> bool:
        """Whether an update's new image lacks columns the table has (unchanged TOAST)."""
        width = self._widths.get(tid)
        if width is None or len(after) < width:
            try:
                width = self._widths[tid] = len(self.source.table_info(tid).columns)
            except Exception:  # the table may be gone by now: nothing to compare with
                return False
        return len(after) < width

    def _missing_columns(self, tid: TableId, after: Row, old: Row | None) -> tuple[str, ...]:
        """Fill unchanged TOASTed columns of an update's new image; the ones left unavailable."""
        if old is not None:
            for name, value in old.items():
                if name not in after:
                    after[name] = value
            return ()
        try:
            info = self.source.table_info(tid)
            if any(c not in after for c in info.columns):
                info = self.source.table_info(tid, refresh=True)
        except Exception as err:  # the table may be gone by now: nothing to fill
            log.debug("cannot read columns of %s: %s", tid, err)
            return ()
        missing = tuple(c for c in info.columns if c not in after)
        for name in missing:
            after[name] = UNAVAILABLE
        return missing
