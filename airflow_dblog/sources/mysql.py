"""MySQL and MariaDB as a dblog ``Source``: schema, keyset chunk SELECTs, watermarks, binlog facts.

One PyMySQL connection per source object, in autocommit mode, opened lazily and reopened once
when the server drops it (:class:`~airflow_dblog.sources.sql.SqlSource`). Identifiers are always
quoted with backticks and values are always bound parameters: nothing a user types is spliced
into SQL. Key order is the server's business (column collations decide how strings sort); this
module never sorts keys in Python.

Values come back in the types PyMySQL produces (int, str, Decimal, date, datetime, bytes, ...),
and :mod:`airflow_dblog.sources.binlog_reader` converts binlog values to the same types, so a
dumped row and a logged change of the same key compare equal. The session time zone is UTC so
TIMESTAMP columns read the same from a SELECT and from the binlog.

Positions: ``SHOW MASTER STATUS`` and ``binlog_snapshot_position`` are *end* positions (the end of
the last event written). They are returned as ``Position.mysql(file, end, END_OF_EVENT)``: after
every row of the event that ends there, before anything the log writes later.
"""

from __future__ import annotations

import datetime as dt
import decimal
import logging
import re
import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

import pymysql
import pymysql.cursors

from airflow_dblog.core.events import Row, TableId
from airflow_dblog.core.gtid import GtidSet, parse_gtid_set
from airflow_dblog.core.keys import check_arity
from airflow_dblog.core.position import Position, binlog_file_index
from airflow_dblog.errors import InputError, SourceError
from airflow_dblog.redact import redact
from airflow_dblog.sources.base import Column, Key, TableSchema
from airflow_dblog.sources.sql import SqlSource, is_integral

log = logging.getLogger(__name__)

WATERMARK_DB = "dblog"
WATERMARK_TABLE = "dblog_watermarks"
WATERMARK_TABLE_ID = TableId(WATERMARK_DB, WATERMARK_TABLE)

END_OF_EVENT = 2**32 - 1
"""Row index of a position that lies after every row of the event ending at its offset."""

# Client-side codes PyMySQL raises when the connection is gone (worth one reconnect).
_CONNECTION_LOST = {0, 1927, 2006, 2013, 2014, 2045, 2055, 4031}
_UNREACHABLE = {2002, 2003, 2005}

_INT_BITS = {"tinyint": 8, "smallint": 16, "mediumint": 24, "int": 32, "integer": 32, "bigint": 64}
_BINARY_TYPES = {"binary", "varbinary", "tinyblob", "blob", "mediumblob", "longblob"}


# --------------------------------------------------------------------------------------------
# connection settings


@dataclass(frozen=True)
class ConnectionSettings:
    """Where and as whom to connect; ``repr`` and ``where`` never show the password."""

    host: str
    port: int
    user: str
    password: str
    database: str | None = None
    unix_socket: str | None = None
    connect_timeout: float = 10.0

    def __repr__(self) -> str:
        return f"ConnectionSettings(host={self.host!r}, port={self.port}, user={self.user!r})"

    @property
    def where(self) -> str:
        return f"{self.host}:{self.port}"

    def pymysql_kwargs(self) -> dict[str, Any]:
        kwargs: dict[str, Any] = {
            "host": self.host,
            "port": self.port,
            "user": self.user,
            "password": self.password,
            "charset": "utf8mb4",
            "connect_timeout": self.connect_timeout,
        }
        if self.unix_socket:
            kwargs["unix_socket"] = self.unix_socket
        return kwargs


def parse_mysql_url(url: str) -> ConnectionSettings:
    """``mysql://user:password@host:port/db`` (also ``mariadb://``, ``mysql+pymysql://``)."""
    try:
        parts = urlsplit(url)
        port = parts.port or 3306
    except ValueError as err:
        raise SourceError(
            f"source.url is not a valid MySQL URL ({redact(str(err))})",
            "write it as mysql://user:password@host:3306/db",
        ) from None
    scheme = parts.scheme.split("+", 1)[0]
    if scheme not in ("mysql", "mariadb"):
        raise SourceError(
            f"source.url scheme {parts.scheme!r} is not mysql",
            "write it as mysql://user:password@host:3306/db",
        )
    query = {k: v[-1] for k, v in parse_qs(parts.query).items()}
    timeout = float(query.get("connect_timeout", 10))
    return ConnectionSettings(
        host=parts.hostname or "127.0.0.1",
        port=port,
        user=unquote(parts.username or ""),
        password=unquote(parts.password or ""),
        database=unquote(parts.path.lstrip("/")) or None,
        unix_socket=query.get("unix_socket"),
        connect_timeout=timeout,
    )


def quote_ident(name: str) -> str:
    """A MySQL identifier in backticks, embedded backticks doubled."""
    if "\x00" in name:
        raise InputError(f"identifier {name!r} contains a NUL character", "fix the table name")
    return "`" + name.replace("`", "``") + "`"


def quote_table(table: TableId) -> str:
    return f"{quote_ident(table.db)}.{quote_ident(table.table)}"


def connect(settings: ConnectionSettings, **extra: Any) -> pymysql.connections.Connection:
    """A PyMySQL connection, or a SourceError naming host:port (never the password)."""
    kwargs = settings.pymysql_kwargs()
    kwargs.update(extra)
    try:
        return pymysql.connect(**kwargs)
    except pymysql.MySQLError as err:
        raise connect_error(settings, err) from None


# access denied for a statement / a table / a database: a grant is missing
_DENIED = (1227, 1142, 1044)


def connect_error(settings: ConnectionSettings, err: BaseException) -> SourceError:
    code = err.args[0] if err.args and isinstance(err.args[0], int) else None
    text = redact(str(err.args[1] if len(err.args) > 1 else err))
    if settings.password:
        text = text.replace(settings.password, "***")
    if code == 1045:
        return SourceError(
            f"MySQL at {settings.where} refused user {settings.user!r}: {text}",
            "check the user and password in source.url",
        )
    if code in _DENIED:
        return SourceError(
            f"MySQL at {settings.where} denied user {settings.user!r} a privilege: {text}",
            f"GRANT REPLICATION SLAVE, REPLICATION CLIENT ON *.* and SELECT on the captured"
            f" tables to {settings.user!r} (README: least privilege)",
        )
    return SourceError(
        f"cannot reach MySQL at {settings.where}: {text}",
        "check that the server is running and that source.url names the right host and port",
    )


# --------------------------------------------------------------------------------------------
# binlog settings


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


# --------------------------------------------------------------------------------------------
# table descriptions


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


@dataclass(frozen=True)
class ColumnInfo:
    """What the source knows of a column beyond ``base.Column``."""

    name: str
    data_type: str  # lower-case DATA_TYPE: int, varchar, decimal, ...
    column_type: str  # COLUMN_TYPE: int(11) unsigned, varchar(20), enum('a','b'), ...
    nullable: bool
    unsigned: bool
    charset: str | None  # None: binary or not a string
    char_length: int | None
    scale: int | None

    @property
    def is_binary(self) -> bool:
        return self.data_type in _BINARY_TYPES


@dataclass(frozen=True)
class TableInfo:
    schema: TableSchema
    columns: tuple[ColumnInfo, ...]

    def column(self, name: str) -> ColumnInfo:
        for col in self.columns:
            if col.name == name:
                return col
        raise KeyError(name)


# --------------------------------------------------------------------------------------------
# key coercion


def _expects(col: ColumnInfo) -> str:
    kind = col.data_type
    if kind in _INT_BITS:
        return f"an integer ({col.column_type})"
    if kind == "decimal":
        return f"a decimal number ({col.column_type})"
    if kind in ("float", "double", "real"):
        return "a number"
    if kind in _BINARY_TYPES:
        return f"bytes, 0x-hex text or a UUID ({col.column_type})"
    if kind == "date":
        return "an ISO date like 2024-01-31"
    if kind in ("datetime", "timestamp"):
        return "an ISO date-time like 2024-01-31T12:00:00"
    if kind == "time":
        return "a time like 12:30:00 or seconds"
    if kind == "uuid":
        return "a UUID string"
    return f"a string ({col.column_type})"


def coerce_value(col: ColumnInfo, value: Any) -> Any:
    """One JSON value in the Python type PyMySQL returns for ``col``; ValueError if it can't."""
    kind = col.data_type
    if value is None:
        raise ValueError("primary key values cannot be null")
    if kind in _INT_BITS or kind == "year":
        if isinstance(value, bool):
            raise ValueError
        number = _as_int(value)
        if kind in _INT_BITS:
            bits = _INT_BITS[kind]
            signed = (-(2 ** (bits - 1)), 2 ** (bits - 1) - 1)
            low, high = (0, 2**bits - 1) if col.unsigned else signed
            if not low <= number <= high:
                raise ValueError(f"out of range {low}..{high}")
        return number
    if kind == "decimal":
        if isinstance(value, bool) or not isinstance(value, (int, float, str, decimal.Decimal)):
            raise ValueError
        try:
            number = decimal.Decimal(str(value).strip())
        except decimal.InvalidOperation:
            raise ValueError from None
        if not number.is_finite():
            raise ValueError
        if col.scale is not None:
            quantum = decimal.Decimal(1).scaleb(-col.scale)
            rounded = number.quantize(quantum)
            if rounded != number:
                raise ValueError(f"has more than {col.scale} decimals")
            number = rounded
        return number
    if kind in ("float", "double", "real"):
        if isinstance(value, bool):
            raise ValueError
        return float(value)
    if kind in _BINARY_TYPES:
        if isinstance(value, (bytes, bytearray, memoryview)):
            data = bytes(value)
        elif isinstance(value, uuid.UUID):
            data = value.bytes
        elif isinstance(value, str):
            if re.fullmatch(r"0[xX]([0-9a-fA-F]{2})*", value):
                data = bytes.fromhex(value[2:])
            elif col.char_length == 16 and _looks_like_uuid(value):
                data = uuid.UUID(value).bytes
            else:
                data = value.encode("utf-8")
        else:
            raise ValueError
        if col.char_length is not None and len(data) > col.char_length:
            raise ValueError(f"longer than {col.char_length} bytes")
        if kind == "binary" and col.char_length:
            data = data.ljust(col.char_length, b"\x00")
        return data
    if kind == "date":
        if isinstance(value, dt.datetime):
            raise ValueError
        if isinstance(value, dt.date):
            return value
        if isinstance(value, str):
            return dt.date.fromisoformat(value.strip())
        raise ValueError
    if kind in ("datetime", "timestamp"):
        if isinstance(value, dt.datetime):
            stamp = value
        elif isinstance(value, str):
            text = value.strip()
            if text.endswith(("Z", "z")):
                text = text[:-1] + "+00:00"
            stamp = dt.datetime.fromisoformat(text)
        else:
            raise ValueError
        if stamp.tzinfo is not None:
            stamp = stamp.astimezone(dt.timezone.utc).replace(tzinfo=None)
        return stamp
    if kind == "time":
        if isinstance(value, dt.timedelta):
            return value
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return dt.timedelta(seconds=value)
        if isinstance(value, str):
            match = re.fullmatch(r"\s*(-)?(\d+):(\d\d):(\d\d)(?:\.(\d{1,6}))?\s*", value)
            if match:
                sign, h, m, s, frac = match.groups()
                delta = dt.timedelta(
                    hours=int(h),
                    minutes=int(m),
                    seconds=int(s),
                    microseconds=int((frac or "0").ljust(6, "0")),
                )
                return -delta if sign else delta
        raise ValueError
    if kind == "uuid":
        if isinstance(value, uuid.UUID):
            return str(value)
        if isinstance(value, str) and _looks_like_uuid(value):
            return str(uuid.UUID(value))
        raise ValueError
    # strings: char, varchar, text, enum, set
    if isinstance(value, uuid.UUID):
        value = str(value)
    if not isinstance(value, str):
        raise ValueError
    if col.char_length is not None and len(value) > col.char_length:
        raise ValueError(f"longer than {col.char_length} characters")
    if kind == "char":
        value = value.rstrip(" ")  # CHAR drops trailing spaces on the way out
    return value


def _as_int(value: Any) -> int:
    if isinstance(value, int):
        return value
    if not is_integral(value):
        raise ValueError
    return int(value)


def _looks_like_uuid(text: str) -> bool:
    try:
        uuid.UUID(text)
    except (ValueError, AttributeError, TypeError):
        return False
    return True


# --------------------------------------------------------------------------------------------
# keyset SQL


def _keyset_after(cols: Sequence[str], values: Sequence[Any]) -> tuple[str, list[Any]]:
    """``(cols) > (values)`` spelled so the range optimizer uses the key index.

    ``c0 >= v0 AND (c0 > v0 OR (c0 = v0 AND c1 > v1) OR ...)``: MariaDB does not turn a row
    constructor comparison into an index range, but it does turn this.
    """
    return _keyset(cols, values, ">")


def _keyset_upto(cols: Sequence[str], values: Sequence[Any]) -> tuple[str, list[Any]]:
    """``(cols) <= (values)``."""
    return _keyset(cols, values, "<=")


def _keyset(cols: Sequence[str], values: Sequence[Any], op: str) -> tuple[str, list[Any]]:
    q = [quote_ident(c) for c in cols]
    if len(q) == 1:
        return f"{q[0]} {op} %s", [values[0]]
    strict = op[0]  # ">" or "<"
    last = op
    disjuncts: list[str] = []
    params: list[Any] = []
    for i in range(len(q)):
        terms = [f"{q[j]} = %s" for j in range(i)]
        params.extend(values[:i])
        terms.append(f"{q[i]} {last if i == len(q) - 1 else strict} %s")
        params.append(values[i])
        disjuncts.append(" AND ".join(terms))
    bound = f"{q[0]} {strict}= %s"
    sql = f"({bound} AND ({' OR '.join(f'({d})' for d in disjuncts)}))"
    return sql, [values[0], *params]


# --------------------------------------------------------------------------------------------
# the source


class MysqlSource(SqlSource[Position]):
    """``Source`` for MySQL 8 and MariaDB 10.5+ through PyMySQL.

    Snapshot chunks (MariaDB only) report the binlog position their snapshot saw.
    """

    kind = "mysql"
    product = "MySQL"
    driver_error = pymysql.MySQLError
    begin_snapshot = (
        "SET TRANSACTION ISOLATION LEVEL REPEATABLE READ",
        "START TRANSACTION WITH CONSISTENT SNAPSHOT, READ ONLY",
    )
    _coerce_value = staticmethod(coerce_value)
    _expects = staticmethod(_expects)

    def __init__(
        self,
        url: str | ConnectionSettings,
        *,
        read_timeout: float | None = 3600.0,
    ) -> None:
        self.settings = url if isinstance(url, ConnectionSettings) else parse_mysql_url(url)
        self._read_timeout = read_timeout
        self._conn: pymysql.connections.Connection | None = None
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
                init_command="SET time_zone = '+00:00'",
                cursorclass=pymysql.cursors.Cursor,
            )
        return self._conn

    def _error(self, err: pymysql.MySQLError, doing: str) -> SourceError:
        code = err.args[0] if err.args and isinstance(err.args[0], int) else None
        if code in _UNREACHABLE or code in _CONNECTION_LOST or code in _DENIED:
            return connect_error(self.settings, err)
        text = redact(str(err.args[1] if len(err.args) > 1 else err))
        return SourceError(f"MySQL at {self.where} failed to {doing}: ({code}) {text}")

    def _lost(self, err: Exception, conn: Any) -> bool:
        if isinstance(err, pymysql.err.InterfaceError):
            return True
        if not isinstance(err, pymysql.err.OperationalError):
            return False
        code = err.args[0] if err.args and isinstance(err.args[0], int) else 0
        return code in _CONNECTION_LOST

    def _failure(self, err: Exception, conn: Any, doing: str, lost: bool) -> Exception:
        assert isinstance(err, pymysql.MySQLError)
        return self._error(err, doing)

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

    def max_key(self, table: TableId) -> Key | None:
        key = self._key(table)
        cols = ", ".join(quote_ident(c) for c in key)
        order = ", ".join(f"{quote_ident(c)} DESC" for c in key)
        rows = self.query(
            f"SELECT {cols} FROM {quote_table(table)} FORCE INDEX (PRIMARY)"
            f" ORDER BY {order} LIMIT 1"
        )
        return tuple(rows[0]) if rows else None

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

    def _range_sql(
        self,
        table: TableId,
        select: str,
        lower: Key | None,
        upper: Key | None,
        limit: int,
        offset: int = 0,
    ) -> tuple[str, list[Any]]:
        key = self._key(table)
        where: list[str] = []
        params: list[Any] = []
        if lower is not None:
            sql, values = _keyset_after(key, check_arity(table, key, lower))
            where.append(sql)
            params.extend(values)
        if upper is not None:
            sql, values = _keyset_upto(key, check_arity(table, key, upper))
            where.append(sql)
            params.extend(values)
        order = ", ".join(quote_ident(c) for c in key)
        text = f"SELECT {select} FROM {quote_table(table)} FORCE INDEX (PRIMARY)"
        if where:
            text += " WHERE " + " AND ".join(where)
        text += f" ORDER BY {order} LIMIT %s"
        params.append(int(limit))
        if offset:
            text += " OFFSET %s"
            params.append(int(offset))
        return text, params

    def chunk_sql(
        self, table: TableId, lower: Key | None, upper: Key | None, limit: int
    ) -> tuple[str, list[Any]]:
        """The chunk SELECT and its parameters."""
        return self._range_sql(table, "*", lower, upper, limit)

    def next_bound(self, table: TableId, after: Key | None, upto: Key, n: int) -> Key | None:
        if n < 1:
            raise InputError(f"chunk size must be >= 1, got {n}", "set dump.chunk_size >= 1")
        cols = ", ".join(quote_ident(c) for c in self._key(table))
        sql, params = self._range_sql(table, cols, after, upto, 1, n - 1)
        rows = self.query(sql, params)
        return tuple(rows[0]) if rows else None

    @staticmethod
    def _fetch_rows(cur: pymysql.cursors.Cursor, key: Sequence[str]) -> list[tuple[Key, Row]]:
        names = [d[0] for d in cur.description]
        index = [names.index(c) for c in key]
        out: list[tuple[Key, Row]] = []
        for values in cur.fetchall():
            out.append((tuple(values[i] for i in index), dict(zip(names, values, strict=True))))
        return out

    def keys_sql(self, table: TableId, keys: Sequence[Key]) -> tuple[str, list[Any]]:
        """The key-list SELECT of one batch and its parameters."""
        key = self._key(table)
        q = [quote_ident(c) for c in key]
        params: list[Any] = []
        for k in keys:
            params.extend(check_arity(table, key, k))
        if len(q) == 1:
            where = f"{q[0]} IN ({', '.join(['%s'] * len(keys))})"
        else:
            one = "(" + " AND ".join(f"{c} = %s" for c in q) + ")"
            where = " OR ".join([one] * len(keys))
        sql = (
            f"SELECT * FROM {quote_table(table)} FORCE INDEX (PRIMARY) WHERE {where}"
            f" ORDER BY {', '.join(q)}"
        )
        return sql, params

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
