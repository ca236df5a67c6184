"""MySQL and MariaDB as a dblog ``Source``: schema, keyset chunk SELECTs, watermarks, binlog facts.

One PyMySQL connection per source object, in autocommit mode, opened lazily and reopened once
when the server drops it (:class:`~airflow_dblog.sources.sql.SqlSource`). Identifiers are always
quoted with backticks and values are always bound parameters: nothing a user types is spliced
into SQL. Key order is the server's business (column collations decide how strings sort); this
module never sorts keys in Python.

Values come back in the types PyMySQL produces (int, str, Decimal, date, datetime, bytes, ...),
and :mod:`~airflow_dblog.sources.mysql.binlog_codecs` decodes binlog row images into the same
types, so a dumped row and a logged change of the same key compare equal. The session time zone
is UTC so TIMESTAMP columns read the same from a SELECT and from the binlog.

Positions: ``SHOW MASTER STATUS`` and ``binlog_snapshot_position`` are *end* positions (the end of
the last event written). They are returned as ``Position.mysql(file, end, END_OF_EVENT)``: after
every row of the event that ends there, before anything the log writes later.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import pymysql
import pymysql.cursors

from airflow_dblog.core.events import Row, TableId
from airflow_dblog.core.gtid import GtidSet, parse_gtid_set
from airflow_dblog.core.position import Position, binlog_file_index
from airflow_dblog.errors import InputError, SourceError
from airflow_dblog.redact import redact
from airflow_dblog.sources.base import Column, Key, Offset, TableSchema
from airflow_dblog.sources.mysql import c_rows, lag
from airflow_dblog.sources.mysql.c_rows import AVAILABLE as MYSQLCLIENT
from airflow_dblog.sources.mysql.connection import (
    CONNECTION_LOST,
    DENIED,
    UNREACHABLE,
    ConnectionSettings,
    connect,
    connect_error,
    parse_mysql_url,
)
from airflow_dblog.sources.mysql.dialect import DIALECT, quote_ident, quote_table
from airflow_dblog.sources.mysql.key_values import coerce_value, expects
from airflow_dblog.sources.mysql.schema import ColumnInfo, TableInfo
from airflow_dblog.sources.mysql.text_values import CONVERSIONS
from airflow_dblog.sources.sql import SqlSource

log = logging.getLogger(__name__)

WATERMARK_DB = "dblog"
WATERMARK_TABLE = "dblog_watermarks"
WATERMARK_TABLE_ID = TableId(WATERMARK_DB, WATERMARK_TABLE)

SESSION_INIT = "SET time_zone = '+00:00'"  # TIMESTAMP reads as the binlog holds it: UTC

END_OF_EVENT = 2**32 - 1
"""Row index of a position that lies after every row of the event ending at its offset."""


def validate_binlog_variables(variables: Mapping[str, Any]) -> None:
    """Refuse a server whose binlog dblog cannot read; ``variables`` maps names to values."""
    values = {str(k).lower(): str(v) for k, v in variables.items()}
    log_bin = values.get("log_bin", "OFF").upper()
    if log_bin not in ("ON", "1"):
        raise SourceError(
            f"log_bin is {log_bin}; dblog reads the binary log:"
            " start the server with log_bin (e.g. --log-bin=mysql-bin) and binlog_format=ROW"
        )
    fmt = values.get("binlog_format", "").upper()
    if fmt != "ROW":
        raise SourceError(
            f"binlog_format is {fmt or 'unset'}; dblog needs ROW:"
            " SET GLOBAL binlog_format=ROW and restart writers"
        )
    image = values.get("binlog_row_image", "").upper()
    if image != "FULL":
        raise SourceError(
            f"binlog_row_image is {image or 'unset'}; dblog needs FULL:"
            " SET GLOBAL binlog_row_image=FULL and restart writers"
        )
    # compressed binlog events are not decoded by pymysqlreplication: they would be lost
    for name, fix in (
        ("binlog_transaction_compression", "SET GLOBAL binlog_transaction_compression=OFF"),
        ("log_bin_compress", "SET GLOBAL log_bin_compress=OFF"),
    ):
        if values.get(name, "OFF").upper() in ("ON", "1"):
            raise SourceError(f"{name} is ON; dblog cannot decode compressed binlog events: {fix}")


def mysql_gtids_before(events: Sequence[Sequence[Any]], offset: int) -> str | None:
    """The MySQL GTID set committed before ``offset`` (a transaction boundary) of one binlog
    file, from its ``SHOW BINLOG EVENTS`` rows (Log_name, Pos, Event_type, Server_id,
    End_log_pos, Info): the file's ``Previous_gtids`` plus every ``Gtid`` event that starts
    before the offset. None when the file has no ``Previous_gtids`` (not a MySQL binlog)."""
    executed: GtidSet | None = None
    for _, pos, kind, _, _, info in events:
        if kind == "Previous_gtids":  # second in the file: the GTIDs of the files before
            executed = parse_gtid_set("".join(str(info or "").split()), "mysql")
        elif executed is None:
            continue  # the file's format description
        elif int(pos) >= offset:
            break
        elif kind in ("Gtid", "Gtid_tagged"):
            executed = executed.add(str(info).split("'")[1])  # SET @@SESSION.GTID_NEXT= '...'
    return None if executed is None else str(executed)


class MysqlSource(SqlSource[Position]):
    """``Source`` for MySQL 8 and MariaDB 10.5+ through PyMySQL.

    Snapshot chunks (MariaDB only) report the binlog position their snapshot saw.
    """

    kind = "mysql"
    product = "MySQL"
    driver_error = (pymysql.MySQLError, *c_rows.ERRORS)
    begin_snapshot = (
        "SET TRANSACTION ISOLATION LEVEL REPEATABLE READ",
        "START TRANSACTION WITH CONSISTENT SNAPSHOT, READ ONLY",
    )
    dialect = DIALECT
    _coerce_value = staticmethod(coerce_value)
    _expects = staticmethod(expects)

    def __init__(
        self,
        url: str | ConnectionSettings,
        *,
        read_timeout: float | None = 3600.0,
        mysqlclient: bool = MYSQLCLIENT,
    ) -> None:
        self.settings = url if isinstance(url, ConnectionSettings) else parse_mysql_url(url)
        self._read_timeout = read_timeout
        self._conn: pymysql.connections.Connection | None = None
        # chunk SELECTs on mysqlclient when installed (c_rows.py); everything else on PyMySQL
        self._c_rows = (
            c_rows.CRows(self.settings, read_timeout, SESSION_INIT) if mysqlclient else None
        )
        self._tables: dict[TableId, TableInfo] = {}
        self._version: str | None = None
        self._status_sql: str | None = None
        # the binlog history the stream follows (see position.py); set from the reader's offset
        self.lineage_epoch = 0

    # -- connection -------------------------------------------------------------------------

    def _connection(self) -> pymysql.connections.Connection:
        if self._conn is None or not self._conn.open:
            self._conn = connect(
                self.settings,
                autocommit=True,
                read_timeout=self._read_timeout,
                write_timeout=self._read_timeout,
                init_command=SESSION_INIT,
                cursorclass=pymysql.cursors.Cursor,
                conv=CONVERSIONS,
            )
        return self._conn

    def _chunk_connection(self) -> Any:
        return self._connection() if self._c_rows is None else self._c_rows.connection()

    def _drop_connection(self) -> None:
        super()._drop_connection()
        if self._c_rows is not None:
            self._c_rows.close()

    def _error(self, err: pymysql.MySQLError, doing: str) -> SourceError:
        code = err.args[0] if err.args and isinstance(err.args[0], int) else None
        if code in UNREACHABLE or code in CONNECTION_LOST or code in DENIED:
            return connect_error(self.settings, err)
        text = redact(str(err.args[1] if len(err.args) > 1 else err))
        return SourceError(f"MySQL at {self.where} failed to {doing}: ({code}) {text}")

    def _lost(self, err: Exception, conn: Any) -> bool:
        err = c_rows.as_pymysql(err)
        if isinstance(err, pymysql.err.InterfaceError):
            return True
        if not isinstance(err, pymysql.err.OperationalError):
            return False
        code = err.args[0] if err.args and isinstance(err.args[0], int) else 0
        return code in CONNECTION_LOST

    def _failure(self, err: Exception, conn: Any, doing: str, lost: bool) -> Exception:
        return self._error(c_rows.as_pymysql(err), doing)

    def query(self, sql: str, params: Sequence[Any] | None = None) -> list[tuple[Any, ...]]:
        """Rows of one statement (internal helper, also used by the binlog reader)."""

        def work(cur: pymysql.cursors.Cursor) -> list[tuple[Any, ...]]:
            cur.execute(sql, params)
            return list(cur.fetchall())

        return self._run("run a query", work)

    # -- server facts -----------------------------------------------------------------------

    @property
    def version(self) -> str:
        if self._version is None:
            self._version = str(self.query("SELECT VERSION()")[0][0])
        return self._version

    @property
    def flavor(self) -> str:
        """``mariadb`` or ``mysql``, from ``VERSION()``."""
        return "mariadb" if "mariadb" in self.version.lower() else "mysql"

    def variables(self, names: Iterable[str]) -> dict[str, str]:
        """Global server variables by lower-case name (missing ones are absent)."""
        wanted = [n.lower() for n in names]
        marks = ", ".join(["%s"] * len(wanted))
        rows = self.query(f"SHOW GLOBAL VARIABLES WHERE LOWER(Variable_name) IN ({marks})", wanted)
        return {str(name).lower(): "" if value is None else str(value) for name, value in rows}

    def check_binlog(self) -> dict[str, str]:
        """SourceError unless log_bin is ON, binlog_format ROW, binlog_row_image FULL and the
        binlog is not compressed; returns the variables read."""
        names = (
            "log_bin",
            "binlog_format",
            "binlog_row_image",
            "binlog_row_metadata",
            "binlog_transaction_compression",
            "log_bin_compress",
        )
        found = self.variables(names)
        validate_binlog_variables(found)
        if found.get("binlog_row_metadata", "FULL").upper() != "FULL":
            log.info(
                "binlog_row_metadata is %s: column names are read from information_schema; "
                "SET GLOBAL binlog_row_metadata=FULL makes ALTER TABLE during lag exact",
                found.get("binlog_row_metadata"),
            )
        return found

    def master_status(self) -> tuple[str, int]:
        """(binlog file, end offset) of the last event written: ``SHOW MASTER STATUS``."""
        row = self._status_row()
        return str(row[0]), int(row[1])

    def start_point(self) -> tuple[str, int, str | None]:
        """Where a new stream starts, and the GTIDs committed before it.

        MariaDB: the consistent-snapshot position (:meth:`visible_status`) and its GTID
        position. MySQL: one ``SHOW MASTER STATUS`` row, whose ``Executed_Gtid_Set`` belongs to
        exactly that position (None with ``gtid_mode=OFF``).
        """
        if self.flavor == "mariadb":
            file, pos = self.visible_status()
            return file, pos, self.gtid_at(file, pos)
        row = self._status_row()
        executed = "".join(str(row[4] or "").split()) if len(row) > 4 else ""
        return str(row[0]), int(row[1]), executed or None

    def _status_row(self) -> tuple[Any, ...]:
        def work(cur: pymysql.cursors.Cursor) -> Any:
            if self._status_sql is None:  # MySQL 8.4 renamed it; older servers know only this
                try:
                    cur.execute("SHOW BINARY LOG STATUS")
                    self._status_sql = "SHOW BINARY LOG STATUS"
                    return cur.fetchone()
                except pymysql.err.ProgrammingError:
                    self._status_sql = "SHOW MASTER STATUS"
            cur.execute(self._status_sql)
            return cur.fetchone()

        row = self._run("read the binlog position", work)
        if not row:
            raise SourceError(
                f"binary logging is off on MySQL at {self.where} (SHOW MASTER STATUS is empty)",
                "start the server with log_bin and binlog_format=ROW",
            )
        return tuple(row)

    def binlog_position(self) -> Position:
        """The end of the binlog now, as a Position after every row logged so far."""
        return self.position(*self.master_status())

    def position(self, file: str, offset: int) -> Position:
        """The Position of a binlog end offset (after every row logged before it)."""
        epoch = self.lineage_epoch
        return Position.mysql(binlog_file_index(file), offset, END_OF_EVENT, epoch=epoch)

    def identity(self) -> str:
        """Which server this is: a replica promoted in its place has another server_id (and
        on MySQL another server_uuid), so the same binlog file names mean other bytes."""
        found = self.variables(["server_id", "server_uuid"])
        return "/".join(v for v in (found.get("server_id"), found.get("server_uuid")) if v)

    def gtid_at(self, file: str, offset: int) -> str | None:
        """The GTIDs committed before a transaction boundary of the binlog, None when the
        server does not know the offset. MariaDB: its GTID position (``BINLOG_GTID_POS``).
        MySQL: the file's ``Previous_gtids`` plus the transactions before the offset, read with
        ``SHOW BINLOG EVENTS`` (a scan of the file up to the offset: used on a reset binlog's
        first file, at its start)."""
        if self.flavor == "mariadb":
            value = self.query("SELECT BINLOG_GTID_POS(%s, %s)", (file, offset))[0][0]
            return None if value is None else "".join(str(value).split())
        events: list[tuple[Any, ...]] = []
        while True:
            page = self.query(f"SHOW BINLOG EVENTS IN %s LIMIT {len(events)}, 1000", (file,))
            events.extend(page)
            if len(page) < 1000 or int(page[-1][1]) >= max(offset, 200):
                return mysql_gtids_before(events, offset)

    def binary_logs(self) -> list[str]:
        """Binlog files the server still has (``SHOW BINARY LOGS``)."""
        return [name for name, _ in self.binary_log_sizes()]

    def binary_log_sizes(self) -> list[tuple[str, int]]:
        """(file, size in bytes) of every binlog file the server still has, oldest first."""
        return [(str(row[0]), int(row[1])) for row in self.query("SHOW BINARY LOGS")]

    def log_lag(
        self, position: str | None, offset: Offset | None
    ) -> tuple[str, int | None, str | None]:
        """(head, bytes behind, why unknown) of a stream that committed ``position`` and
        reader ``offset``: binlog bytes from there to the end of the binlog."""
        return lag.binlog_lag(self, position, offset)

    def gtid_executed(self) -> str:
        """The executed GTID set: MariaDB ``@@gtid_binlog_pos``, MySQL ``@@gtid_executed``."""
        if self.flavor == "mariadb":
            value = self.query("SELECT @@GLOBAL.gtid_binlog_pos")[0][0]
        else:
            value = self.query("SELECT @@GLOBAL.gtid_executed")[0][0]
        return "".join(str(value or "").split())

    # -- tables -----------------------------------------------------------------------------

    def table_info(self, table: TableId, refresh: bool = False) -> TableInfo:
        """Columns and key from information_schema (cached until ``refresh``)."""
        if not refresh and table in self._tables:
            return self._tables[table]
        kinds = self.query(
            "SELECT TABLE_TYPE FROM information_schema.TABLES"
            " WHERE TABLE_SCHEMA = %s AND TABLE_NAME = %s",
            (table.db, table.table),
        )
        if not kinds:
            raise InputError(
                f"table {table} does not exist",
                f"check source.tables (written db.table) against MySQL at {self.where}",
            )
        if str(kinds[0][0]).upper() not in ("BASE TABLE", "SYSTEM VERSIONED"):
            raise InputError(
                f"table {table} is a {str(kinds[0][0]).lower()}, not a base table",
                "capture the underlying table instead",
            )
        rows = self.query(
            "SELECT COLUMN_NAME, DATA_TYPE, COLUMN_TYPE, IS_NULLABLE, CHARACTER_SET_NAME,"
            " CHARACTER_MAXIMUM_LENGTH, NUMERIC_SCALE FROM information_schema.COLUMNS"
            " WHERE TABLE_SCHEMA = %s AND TABLE_NAME = %s ORDER BY ORDINAL_POSITION",
            (table.db, table.table),
        )
        columns = tuple(
            ColumnInfo(
                name=str(name),
                data_type=str(data_type).lower(),
                column_type=str(column_type),
                nullable=str(nullable).upper() == "YES",
                unsigned="unsigned" in str(column_type).lower(),
                charset=None if charset is None else str(charset),
                char_length=None if length is None else int(length),
                scale=None if scale is None else int(scale),
            )
            for name, data_type, column_type, nullable, charset, length, scale in rows
        )
        key_rows = self.query(
            "SELECT COLUMN_NAME FROM information_schema.STATISTICS"
            " WHERE TABLE_SCHEMA = %s AND TABLE_NAME = %s AND INDEX_NAME = 'PRIMARY'"
            " ORDER BY SEQ_IN_INDEX",
            (table.db, table.table),
        )
        if not key_rows:
            raise InputError(
                f"table {table} has no primary key; dblog needs one to cut chunks",
                "add one (ALTER TABLE ... ADD PRIMARY KEY) or drop the table from source.tables",
            )
        schema = TableSchema(
            table=table,
            columns=tuple(Column(c.name, c.column_type, c.nullable) for c in columns),
            key=tuple(str(r[0]) for r in key_rows),
        )
        info = TableInfo(schema, columns)
        self._tables[table] = info
        return info

    def forget(self, table: TableId) -> None:
        """Drop the cached description of ``table`` (after DDL)."""
        self._tables.pop(table, None)

    def estimate_rows(self, table: TableId) -> int:
        """The optimizer's row estimate (``EXPLAIN``), not a COUNT(*)."""
        self.table_info(table)

        def work(cur: pymysql.cursors.Cursor) -> int | None:
            cur.execute(f"EXPLAIN SELECT * FROM {quote_table(table)}")
            names = [d[0].lower() for d in cur.description]
            row = cur.fetchone()
            if row is None or "rows" not in names:
                return None
            value = row[names.index("rows")]
            return None if value is None else int(value)

        estimate = self._run("estimate rows", work)
        if estimate is None:
            rows = self.query(
                "SELECT TABLE_ROWS FROM information_schema.TABLES"
                " WHERE TABLE_SCHEMA = %s AND TABLE_NAME = %s",
                (table.db, table.table),
            )
            estimate = int(rows[0][0] or 0) if rows else 0
        return max(0, estimate)

    @staticmethod
    def _fetch_rows(cur: Any, key: Sequence[str]) -> list[tuple[Key, Row]]:
        """On either driver's cursor (DB-API: the same description and rows)."""
        names = [d[0] for d in cur.description]
        index = [names.index(c) for c in key]
        return [
            (tuple(values[i] for i in index), dict(zip(names, values, strict=True)))
            for values in cur.fetchall()
        ]

    # -- watermarks -------------------------------------------------------------------------

    def ensure_watermark_table(self) -> None:
        """``table`` strategy: create ``dblog.dblog_watermarks`` if it is missing.

        An existing table needs no CREATE grant: least privilege is INSERT, UPDATE on it.
        """
        if self.query(
            "SELECT 1 FROM information_schema.tables WHERE table_schema = %s AND table_name = %s",
            (WATERMARK_DB, WATERMARK_TABLE),
        ):
            return
        try:
            self.query(f"CREATE DATABASE IF NOT EXISTS {quote_ident(WATERMARK_DB)}")
            self.query(
                f"CREATE TABLE IF NOT EXISTS {quote_table(WATERMARK_TABLE_ID)} ("
                " `stream` varchar(128) NOT NULL PRIMARY KEY,"
                " `value` char(36) NOT NULL"
                ") ENGINE=InnoDB DEFAULT CHARSET=utf8mb4"
            )
        except SourceError as err:
            raise SourceError(
                f"cannot create the watermark table {WATERMARK_TABLE_ID}: {err}",
                f"grant CREATE, INSERT, UPDATE on {WATERMARK_DB}.* to the capture user,"
                " or use source.watermark gtid",
            ) from None

    def write_watermark(self, stream: str, value: str) -> None:
        """Upsert the stream's row of the watermark table (autocommit: committed on return)."""
        self.query(
            f"INSERT INTO {quote_table(WATERMARK_TABLE_ID)} (`stream`, `value`) VALUES (%s, %s)"
            " ON DUPLICATE KEY UPDATE `value` = VALUES(`value`)",
            (stream, value),
        )

    # -- snapshot watermark (MariaDB) -------------------------------------------------------

    def _snapshot_status(self, cur: pymysql.cursors.Cursor) -> tuple[str, int]:
        """Inside a consistent-snapshot transaction: the binlog file/offset it corresponds to.

        MariaDB takes it under the lock that orders engine commits, so it is the end of the last
        transaction the engine had committed: everything before it is visible to the snapshot,
        nothing after it is, even a transaction already in the binlog that waits for a
        semi-sync ACK before its engine commit.
        """
        cur.execute("SHOW STATUS LIKE 'binlog_snapshot_%'")
        status = {str(k).lower(): str(v) for k, v in cur.fetchall()}
        file = status.get("binlog_snapshot_file", "")
        if not file:
            raise SourceError(
                f"MariaDB at {self.where} reports no binlog snapshot position",
                "enable log_bin on the server or use source.watermark table",
            )
        return file, int(status["binlog_snapshot_position"])

    def visible_status(self) -> tuple[str, int]:
        """(binlog file, end offset) before which every transaction is visible to any later read.

        MariaDB: the consistent-snapshot position (see :meth:`_snapshot_status`); a stream that
        starts there misses nothing a later SELECT cannot see. MySQL has no such position:
        ``SHOW MASTER STATUS``, exact with ``binlog_order_commits`` and no semi-sync wait.
        """
        if self.flavor != "mariadb":
            return self.master_status()

        def work(cur: pymysql.cursors.Cursor) -> tuple[str, int]:
            cur.execute("START TRANSACTION WITH CONSISTENT SNAPSHOT, READ ONLY")
            try:
                return self._snapshot_status(cur)
            finally:
                cur.execute("COMMIT")

        return self._run("read the binlog snapshot position", work)

    def visible_position(self) -> Position:
        return self.position(*self.visible_status())

    def check_commit_order(self) -> None:
        """``table`` watermarks: a SELECT after the low watermark's commit must see everything
        logged before it, which needs engine commits in binlog order (MariaDB always does)."""
        value = self.variables(["binlog_order_commits"]).get("binlog_order_commits")
        if value is not None and str(value).upper() in ("OFF", "0"):
            raise SourceError(
                f"binlog_order_commits is OFF on {self.where}: commits may become visible out of"
                " binlog order, so table watermarks could place a stale row",
                "SET GLOBAL binlog_order_commits = ON, or use source.watermark gtid",
            )

    def refuse_gtid_watermarks(self) -> None:
        """MariaDB advances ``@@gtid_binlog_pos`` when a transaction is written to the binlog,
        before it is visible (group commit, semi-sync ``AFTER_SYNC``): a GTID window could count
        a change as seen by the SELECT when it was not."""
        if self.flavor == "mariadb":
            raise SourceError(
                f"source.watermark gtid is not exact on MariaDB ({self.where}):"
                " @@gtid_binlog_pos counts a transaction before it is visible",
                "set source.watermark: snapshot (read-only and exact on MariaDB) or table",
            )

    def _check_snapshot(self) -> None:
        if self.flavor != "mariadb":
            raise SourceError(
                f"watermark snapshot needs MariaDB; MySQL at {self.where} ({self.version})"
                " has no binlog snapshot position",
                "set source.watermark: gtid (read-only) or table",
            )

    def _read_snapshot(self, cur: pymysql.cursors.Cursor) -> Position:
        """The binlog position of the consistent snapshot: a change whose event position is
        greater is not in the rows."""
        return self.position(*self._snapshot_status(cur))
