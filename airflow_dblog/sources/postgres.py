"""PostgreSQL as a dblog ``Source``: schema, keyset chunk SELECTs, watermarks, snapshot facts.

One psycopg2 connection per source object, in autocommit mode, opened lazily and reopened once when
the server drops it (:class:`~airflow_dblog.sources.sql.SqlSource`). Tables are ``schema.table``
(``TableId.db`` is the schema; the database is the one in the URL). Identifiers are quoted with
:class:`psycopg2.sql.Identifier` and values are bound parameters: nothing a user types is spliced
into SQL. Keys are compared and ordered by the server only (row comparisons ``(a, b) > (%s, %s)``
on the primary key index, in the columns' collations); this module never sorts keys in Python.

Value types (the contract shared with :mod:`airflow_dblog.sources.wal2json_reader`): a row read
here and the same row decoded from the WAL hold the same Python values, because both go through
psycopg2's own typecasters (the reader looks them up by the type OID wal2json reports). Sessions
run with ``TimeZone=UTC``, ``DateStyle=ISO``, ``IntervalStyle=postgres``, ``bytea_output=hex``
and ``extra_float_digits=1`` on both sides.

==========================  ==================================================================
column type                 Python value (SELECT and WAL)
==========================  ==================================================================
smallint, integer, bigint   ``int``
numeric                     ``decimal.Decimal`` (scale kept: ``1.50`` stays ``Decimal('1.50')``)
real, double precision      ``float``
boolean                     ``bool``
text, varchar, char, name   ``str``
uuid                        ``str`` (the server's lower-case canonical form)
date                        ``datetime.date``  (``infinity`` -> ``date.max``, like psycopg2)
timestamp                   naive ``datetime.datetime``
timestamptz                 aware ``datetime.datetime`` in UTC
time / timetz / interval    ``datetime.time`` / ``datetime.time`` (aware) / ``timedelta``
bytea                       ``bytes`` (psycopg2's ``memoryview`` is converted)
json, jsonb                 parsed JSON (``dict``, ``list``, ``str``, ``int``, ``float``, ...)
arrays                      ``list`` of the element type
enums, domains, others      what psycopg2 returns: the base type's value, else ``str``
==========================  ==================================================================

Known WAL-side loss (wal2json, not ours): NaN and ±Infinity in numeric/real/double columns are
written as JSON ``null``.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import decimal
import logging
import re
import time
import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import psycopg2
import psycopg2.errors
import psycopg2.extensions
from psycopg2 import sql

from airflow_dblog.core.events import Row, TableId
from airflow_dblog.core.keys import check_arity
from airflow_dblog.core.position import Position, lsn_to_int
from airflow_dblog.core.window import XidSnapshot
from airflow_dblog.errors import InputError, SourceError
from airflow_dblog.redact import redact
from airflow_dblog.sources.base import Column, Key, TableSchema
from airflow_dblog.sources.sql import SqlSource, is_integral

log = logging.getLogger(__name__)

WATERMARK_SCHEMA = "dblog"
WATERMARK_TABLE = "dblog_watermarks"
WATERMARK_TABLE_ID = TableId(WATERMARK_SCHEMA, WATERMARK_TABLE)

SCHEMA_TTL_S = 30.0

SESSION_OPTIONS = (
    "-c TimeZone=UTC -c DateStyle=ISO -c IntervalStyle=postgres"
    " -c bytea_output=hex -c extra_float_digits=1"
)
"""GUCs of every connection (SELECTs and the walsender), so both sides print values alike."""

_BYTEA_OIDS = (17, 1001)  # bytea, bytea[]: psycopg2 returns memoryviews

_INT_RANGES = {"int2": 16, "int4": 32, "int8": 64}
_TEXT_TYPES = {"text", "varchar", "bpchar", "name", "citext"}
_FLOAT_TYPES = {"float4", "float8"}
_TIMESTAMP_RE = re.compile(
    r"^(\d{4})-(\d{2})-(\d{2})(?:[T ](\d{2}):(\d{2})(?::(\d{2})(?:\.(\d{1,6})\d*)?)?)?"
    r"\s*(Z|[+-]\d{2}(?::?\d{2})?)?$"
)


# --------------------------------------------------------------------------------------------
# connection settings


@dataclass(frozen=True)
class ConnectionSettings:
    """A libpq connection string plus where it points; ``repr`` never shows the password."""

    dsn: str
    host: str
    port: int
    user: str
    database: str

    def __repr__(self) -> str:
        return (
            f"ConnectionSettings(host={self.host!r}, port={self.port}, user={self.user!r},"
            f" database={self.database!r})"
        )

    @property
    def where(self) -> str:
        return f"{self.host}:{self.port}"


def parse_postgres_url(url: str) -> ConnectionSettings:
    """``postgres://user:password@host:port/db`` (also ``postgresql://``, ``postgres+x://``)."""
    text = url.strip()
    scheme, sep, rest = text.partition("://")
    if sep:
        base = scheme.split("+", 1)[0].lower()
        if base not in ("postgres", "postgresql"):
            raise SourceError(
                f"source.url scheme {scheme!r} is not postgres",
                "write it as postgres://user:password@host:5432/db",
            )
        text = f"postgresql://{rest}"
    try:
        params = psycopg2.extensions.parse_dsn(text)
    except psycopg2.ProgrammingError as err:
        raise SourceError(
            f"source.url is not a valid PostgreSQL URL ({redact(str(err)).strip()})",
            "write it as postgres://user:password@host:5432/db",
        ) from None
    host = params.get("host") or "localhost"
    try:
        port = int(str(params.get("port") or 5432).split(",")[0])
    except ValueError:
        raise SourceError(
            f"source.url has an invalid port {params.get('port')!r}",
            "write it as postgres://user:password@host:5432/db",
        ) from None
    user = params.get("user") or ""
    database = params.get("dbname") or user
    return ConnectionSettings(text, host, port, user, database)


def connect(
    settings: ConnectionSettings, *, connect_timeout: float = 10.0, **extra: Any
) -> psycopg2.extensions.connection:
    """A new connection with dblog's session settings; SourceError naming host:port if it fails."""
    try:
        return psycopg2.connect(
            settings.dsn,
            connect_timeout=max(1, int(connect_timeout)),
            application_name="airflow-dblog",
            options=SESSION_OPTIONS,
            **extra,
        )
    except psycopg2.Error as err:
        raise connect_error(settings, err) from None


def connect_error(settings: ConnectionSettings, err: BaseException) -> SourceError:
    message = " ".join(redact(str(err)).split()) or type(err).__name__
    if "password authentication failed" in message or "authentication" in message:
        fix = "check the user and password in source.url"
    elif "does not exist" in message and "database" in message:
        fix = "create the database or fix its name in source.url"
    elif "replication" in message and "pg_hba" in message:
        fix = "allow replication connections for this user in pg_hba.conf"
    else:
        fix = "check that PostgreSQL is running and that source.url's host and port are right"
    # libpq's text names the host and port but never the password; keep only its first clause
    return SourceError(
        f"cannot connect to PostgreSQL at {settings.where} as {settings.user or '?'}:"
        f" {message[:300]}",
        fix,
    )


def is_connection_lost(err: BaseException, conn: Any) -> bool:
    """True when ``err`` means the connection is gone (worth one reconnect)."""
    if isinstance(err, psycopg2.InterfaceError):
        return True
    if conn is not None and getattr(conn, "closed", 0):
        return True
    return isinstance(err, psycopg2.OperationalError) and getattr(err, "pgcode", None) in (
        None,
        "57P01",  # admin_shutdown / terminated by administrator
        "57P02",
        "57P03",
    )


# --------------------------------------------------------------------------------------------
# snapshot facts


@dataclass(frozen=True)
class SnapshotInfo:
    """What a chunk SELECT's snapshot saw, in the terms of the WAL reader.

    ``xmin``, ``xmax`` and ``xip`` are 64-bit ``xid8`` values (``pg_current_snapshot()``), the
    same epoch-extended transaction ids the reader puts on every :class:`ChangeEvent`. A
    committed transaction is visible to the SELECT iff ``xid < xmax and xid not in xip``.

    ``close_lsn`` is ``pg_current_wal_insert_lsn()`` read in the same statement, right after the
    snapshot was taken. Reader positions are ``(commit LSN, change index)`` where the commit LSN
    is the *start* of the commit record, so:

    - every change visible to the snapshot has a commit LSN ``< close_lsn`` (its commit record was
      inserted before the snapshot, hence before the read), i.e. position ``< close_position``;
    - every change with position ``>= close_position`` committed after the snapshot: invisible.

    Changes invisible to the snapshot can still sit before ``close_position`` (they committed
    between the snapshot and the LSN read, or were in progress); the xids tell them apart.
    """

    xmin: int
    xmax: int
    xip: frozenset[int]
    close_lsn: int

    @property
    def close_position(self) -> Position:
        """The first position that is certainly after the snapshot (see the class doc)."""
        return Position.postgres(self.close_lsn, 0)

    @classmethod
    def parse(cls, snapshot: str, close_lsn: int) -> SnapshotInfo:
        """From ``pg_current_snapshot()``'s text form ``xmin:xmax:xip,xip``."""
        snap = XidSnapshot.parse(snapshot)
        return cls(snap.xmin, snap.xmax, snap.xip, close_lsn)


# --------------------------------------------------------------------------------------------
# table metadata and key coercion


@dataclass(frozen=True)
class ColumnInfo:
    name: str
    type: str  # format_type(), e.g. "character varying(20)"
    nullable: bool
    type_oid: int  # the base type's OID (domains resolved): what psycopg2 and the reader see
    base_type: str  # the base type's pg_type.typname, e.g. "int4", "varchar", "timestamptz"
    category: str  # pg_type.typcategory of the base type
    max_length: int | None  # varchar(n)/char(n)
    scale: int | None = None  # numeric(p, s)


@dataclass(frozen=True)
class TableInfo:
    oid: int
    schema: TableSchema
    columns: dict[str, ColumnInfo]
    replica_identity: str  # d(efault), f(ull), i(ndex), n(othing)
    loaded_at: float

    def column(self, name: str) -> ColumnInfo:
        return self.columns[name]


def _expects(col: ColumnInfo) -> str:
    t = col.base_type
    if t in _INT_RANGES:
        return f"an integer ({col.type})"
    if t == "numeric":
        return "a number or a decimal string (numeric)"
    if t in _FLOAT_TYPES:
        return f"a number ({col.type})"
    if t in _TEXT_TYPES:
        return f"a string ({col.type})"
    if t == "uuid":
        return "a UUID string (uuid)"
    if t == "date":
        return "an ISO date string YYYY-MM-DD (date)"
    if t == "timestamp":
        return "an ISO timestamp string without time zone (timestamp)"
    if t == "timestamptz":
        return "an ISO timestamp string, UTC unless it has an offset (timestamptz)"
    if t == "bytea":
        return "a hex string (bytea)"
    if t == "bool":
        return "true or false (boolean)"
    return f"a value of type {col.type}"


def _parse_timestamp(text: str, aware: bool) -> dt.datetime:
    m = _TIMESTAMP_RE.match(text.strip())
    if not m:
        raise ValueError("not an ISO timestamp")
    year, month, day, hh, mm, ss, frac, tz = m.groups()
    micro = int((frac or "0").ljust(6, "0"))
    value = dt.datetime(
        int(year), int(month), int(day), int(hh or 0), int(mm or 0), int(ss or 0), micro
    )
    if tz is None:
        return value.replace(tzinfo=dt.timezone.utc) if aware else value
    if not aware:
        raise ValueError("timestamp (without time zone) takes no UTC offset")
    if tz == "Z":
        offset = dt.timedelta(0)
    else:
        sign = -1 if tz[0] == "-" else 1
        digits = tz[1:].replace(":", "")
        offset = sign * dt.timedelta(hours=int(digits[:2]), minutes=int(digits[2:] or 0))
    return value.replace(tzinfo=dt.timezone(offset)).astimezone(dt.timezone.utc)


def coerce_value(col: ColumnInfo, value: Any) -> Any:
    """A JSON value (or an already typed one) as the Python value SELECTs return for ``col``."""
    t = col.base_type
    if value is None:
        raise ValueError("a primary key value cannot be null")
    if t in _INT_RANGES:
        if isinstance(value, bool):
            raise TypeError("a boolean is not an integer")
        if is_integral(value):
            value = int(value)
        if not isinstance(value, int):
            raise TypeError("not an integer")
        bits = _INT_RANGES[t]
        if not -(2 ** (bits - 1)) <= value < 2 ** (bits - 1):
            raise ValueError(f"out of range for {col.type}")
        return value
    if t == "numeric":
        if isinstance(value, bool):
            raise TypeError("a boolean is not a number")
        if isinstance(value, float):
            value = repr(value)
        try:
            number = (
                decimal.Decimal(str(value).strip())
                if not isinstance(value, decimal.Decimal)
                else value
            )
        except decimal.InvalidOperation:
            raise ValueError("not a decimal number") from None
        if not number.is_finite():
            raise ValueError("not a finite number")
        if col.scale is not None:  # numeric(p, s) values come back with exactly s decimals
            rounded = number.quantize(decimal.Decimal(1).scaleb(-col.scale))
            if rounded != number:
                raise ValueError(f"has more than {col.scale} decimals")
            number = rounded
        return number
    if t in _FLOAT_TYPES:
        if isinstance(value, bool) or not isinstance(value, (int, float, decimal.Decimal)):
            raise TypeError("not a number")
        return float(value)
    if t == "bool":
        if not isinstance(value, bool):
            raise TypeError("not a boolean")
        return value
    if t == "uuid":
        if isinstance(value, uuid.UUID):
            return str(value)
        if not isinstance(value, str):
            raise TypeError("not a string")
        return str(uuid.UUID(value.strip()))
    if t == "date":
        if isinstance(value, dt.datetime):
            raise TypeError("a timestamp is not a date")
        if isinstance(value, dt.date):
            return value
        if not isinstance(value, str):
            raise TypeError("not a string")
        return dt.date.fromisoformat(value.strip())
    if t in ("timestamp", "timestamptz"):
        aware = t == "timestamptz"
        if isinstance(value, dt.datetime):
            if aware:
                tz = value if value.tzinfo else value.replace(tzinfo=dt.timezone.utc)
                return tz.astimezone(dt.timezone.utc)
            if value.tzinfo is not None:
                raise ValueError("timestamp (without time zone) takes no UTC offset")
            return value
        if not isinstance(value, str):
            raise TypeError("not a string")
        return _parse_timestamp(value, aware)
    if t == "bytea":
        if isinstance(value, (bytes, bytearray, memoryview)):
            return bytes(value)
        if not isinstance(value, str):
            raise TypeError("not a hex string")
        text = value.strip()
        if text.startswith(("\\x", "0x")):
            text = text[2:]
        return bytes.fromhex(text)
    if t in _TEXT_TYPES or col.category == "S":
        if not isinstance(value, str):
            raise TypeError("not a string")
        if col.max_length is not None and len(value) > col.max_length:
            raise ValueError(f"longer than {col.max_length} characters")
        if t == "bpchar" and col.max_length is not None:
            value = value.ljust(col.max_length)  # char(n) comes back blank-padded
        return value
    # enums and other types: the server casts the bound string (errors surface as InputError)
    if isinstance(value, (dict, list)):
        raise TypeError(f"a JSON {type(value).__name__} is not a {col.type}")
    return value


def bytes_deep(value: Any) -> Any:
    """psycopg2's ``memoryview`` for bytea as ``bytes``, also inside arrays (SELECT and WAL)."""
    if isinstance(value, memoryview):
        return value.tobytes()
    if isinstance(value, list):
        return [bytes_deep(v) for v in value]
    return value


# --------------------------------------------------------------------------------------------
# the source


class PostgresSource(SqlSource[SnapshotInfo]):
    """``Source`` for PostgreSQL 13+ through psycopg2 (``snapshot`` watermarks need 13+).

    Snapshot chunks report what their REPEATABLE READ snapshot saw (:class:`SnapshotInfo`).
    """

    kind = "postgres"
    lineage_epoch = 0  # LSNs go on across a promotion: no epoch
    product = "PostgreSQL"
    driver_error = psycopg2.Error
    begin_snapshot = ("BEGIN ISOLATION LEVEL REPEATABLE READ, READ ONLY",)
    _coerce_value = staticmethod(coerce_value)
    _expects = staticmethod(_expects)

    def __init__(self, url: str | ConnectionSettings, *, connect_timeout: float = 10.0) -> None:
        self.settings = url if isinstance(url, ConnectionSettings) else parse_postgres_url(url)
        self._connect_timeout = connect_timeout
        self._conn: psycopg2.extensions.connection | None = None
        self._tables: dict[TableId, TableInfo] = {}
        self._settings_cache: dict[str, str] = {}

    # -- connection -------------------------------------------------------------------------

    def _connection(self) -> psycopg2.extensions.connection:
        if self._conn is None or self._conn.closed:
            conn = connect(self.settings, connect_timeout=self._connect_timeout)
            conn.autocommit = True
            self._conn = conn
        return self._conn

    def _error(self, err: Exception, doing: str) -> SourceError:
        text = " ".join(redact(str(getattr(err, "pgerror", None) or err)).split())
        text = text.removeprefix("ERROR: ").strip()
        return SourceError(f"PostgreSQL at {self.where} failed to {doing}: {text[:400]}")

    def _lost(self, err: Exception, conn: Any) -> bool:
        return is_connection_lost(err, conn)

    def _failure(self, err: Exception, conn: Any, doing: str, lost: bool) -> Exception:
        if lost:
            return connect_error(self.settings, err)
        if not conn.closed and conn.status != psycopg2.extensions.STATUS_READY:
            with contextlib.suppress(psycopg2.Error):
                conn.rollback()
        if isinstance(err, psycopg2.DataError):
            return InputError(
                f"PostgreSQL at {self.where} rejected a value while trying to {doing}:"
                f" {' '.join(str(err).split())[:300]}",
                "check the key values against the column types",
            )
        return self._error(err, doing)

    def query(
        self, statement: str | sql.Composable, params: Sequence[Any] | Mapping[str, Any] = ()
    ) -> list[tuple[Any, ...]]:
        """Rows of one statement (also used by the WAL reader for catalog questions)."""

        def work(cur: psycopg2.extensions.cursor) -> list[tuple[Any, ...]]:
            cur.execute(statement, params or None)
            return list(cur.fetchall()) if cur.description is not None else []

        return self._run("run a query", work)

    # -- server facts and checks ------------------------------------------------------------

    def setting(self, name: str) -> str:
        """A server setting as ``pg_settings`` shows it (in base units), cached."""
        if name not in self._settings_cache:
            self._settings_cache[name] = str(
                self.query("SELECT setting FROM pg_settings WHERE name = %s", (name,))[0][0]
            )
        return self._settings_cache[name]

    @property
    def server_version_num(self) -> int:
        return int(self.setting("server_version_num"))

    def wal2json_package(self) -> str:
        return f"postgresql-{self.server_version_num // 10000}-wal2json"

    def check_logical_decoding(self) -> None:
        """SourceError unless the server can decode its WAL for dblog (wal_level, slots)."""
        level = self.setting("wal_level")
        if level != "logical":
            raise SourceError(
                f"wal_level is {level} on PostgreSQL at {self.where}; dblog needs logical",
                "ALTER SYSTEM SET wal_level=logical and restart PostgreSQL",
            )
        if int(self.setting("max_replication_slots")) < 1:
            raise SourceError(
                f"max_replication_slots is 0 on PostgreSQL at {self.where}",
                "ALTER SYSTEM SET max_replication_slots=10 and restart PostgreSQL",
            )
        if self.server_version_num < 130000:
            raise SourceError(
                f"PostgreSQL at {self.where} is version {self.setting('server_version')}",
                "use PostgreSQL 13 or newer (pg_current_snapshot, xid8)",
            )
        rows = self.query(
            "SELECT rolreplication OR rolsuper FROM pg_roles WHERE rolname = current_user"
        )
        if not rows or not rows[0][0]:
            raise SourceError(
                f"user {self.settings.user} has no REPLICATION attribute on {self.where}",
                f"ALTER ROLE {self.settings.user} REPLICATION",
            )

    def current_wal_lsn(self) -> int:
        """Where the server's WAL ends now: ``pg_current_wal_lsn()`` (on a standby, the last
        WAL replayed)."""
        value = self.query(
            "SELECT CASE WHEN pg_is_in_recovery() THEN pg_last_wal_replay_lsn()"
            " ELSE pg_current_wal_lsn() END::text"
        )[0][0]
        return lsn_to_int(str(value))

    def current_snapshot(self) -> XidSnapshot:
        """``pg_current_snapshot()`` now: its xmin is the horizon every later snapshot is above."""
        return XidSnapshot.parse(str(self.query("SELECT pg_current_snapshot()::text")[0][0]))

    def next_xid(self) -> int:
        """The next 64-bit transaction id (``xmax`` of a fresh snapshot); assigns no xid."""
        return int(self.query("SELECT pg_snapshot_xmax(pg_current_snapshot())::text::bigint")[0][0])

    # -- replication slots ------------------------------------------------------------------

    def replication_slot(self, name: str) -> dict[str, Any] | None:
        """The slot's row of ``pg_replication_slots`` (LSNs as ints), or None."""
        rows = self.query(
            "SELECT slot_name, plugin, slot_type, database, active, active_pid,"
            " restart_lsn::text, confirmed_flush_lsn::text"
            " FROM pg_replication_slots WHERE slot_name = %s",
            (name,),
        )
        if not rows:
            return None
        slot, plugin, kind, database, active, pid, restart, confirmed = rows[0]
        return {
            "slot_name": slot,
            "plugin": plugin,
            "slot_type": kind,
            "database": database,
            "active": active,
            "active_pid": pid,
            "restart_lsn": lsn_to_int(restart) if restart else None,
            "confirmed_flush_lsn": lsn_to_int(confirmed) if confirmed else None,
        }

    def create_replication_slot(self, name: str, plugin: str = "wal2json") -> int:
        """Create a logical slot; returns its consistent point (the LSN it starts from)."""
        try:
            rows = self._run(
                f"create replication slot {name}",
                lambda cur: (
                    cur.execute(
                        "SELECT lsn::text FROM pg_create_logical_replication_slot(%s, %s)",
                        (name, plugin),
                    ),
                    cur.fetchall(),
                )[1],
            )
        except SourceError as err:
            text = str(err)
            if "could not access file" in text or "could not load library" in text:
                raise SourceError(
                    f"output plugin {plugin} is not installed on PostgreSQL at {self.where}"
                    f' (creating slot {name} failed: could not access file "{plugin}")',
                    f"install {self.wal2json_package()} on the database server",
                ) from None
            if "wal_level" in text:
                self._settings_cache.pop("wal_level", None)
                self.check_logical_decoding()
            if "all replication slots are in use" in text:
                raise SourceError(
                    f"all replication slots are in use on PostgreSQL at {self.where}",
                    "drop unused slots or raise max_replication_slots",
                ) from None
            raise
        return lsn_to_int(rows[0][0])

    # -- tables -----------------------------------------------------------------------------

    def table_info(self, table: TableId, refresh: bool = False) -> TableInfo:
        cached = self._tables.get(table)
        if (
            cached is not None
            and not refresh
            and time.monotonic() - cached.loaded_at < SCHEMA_TTL_S
        ):
            return cached

        def work(cur: psycopg2.extensions.cursor) -> TableInfo:
            cur.execute(
                "SELECT c.oid, c.relreplident FROM pg_class c"
                " JOIN pg_namespace n ON n.oid = c.relnamespace"
                " WHERE n.nspname = %s AND c.relname = %s AND c.relkind IN ('r', 'p')",
                (table.db, table.table),
            )
            found = cur.fetchone()
            if found is None:
                raise InputError(
                    f"table {table} does not exist in database {self.settings.database}"
                    f" at {self.where}",
                    "check source.tables and the table name (PostgreSQL tables are schema.table)",
                )
            oid, replident = found
            cur.execute(
                "SELECT a.attname, format_type(a.atttypid, a.atttypmod), NOT a.attnotnull,"
                "  COALESCE(NULLIF(t.typbasetype, 0), a.atttypid) AS base,"
                "  bt.typname, bt.typcategory,"
                "  CASE WHEN bt.typname IN ('varchar', 'bpchar')"
                "   AND COALESCE(NULLIF(t.typtypmod, -1), a.atttypmod) > 4"
                "   THEN COALESCE(NULLIF(t.typtypmod, -1), a.atttypmod) - 4 END,"
                "  CASE WHEN bt.typname = 'numeric'"
                "   AND COALESCE(NULLIF(t.typtypmod, -1), a.atttypmod) >= 4"
                "   THEN (COALESCE(NULLIF(t.typtypmod, -1), a.atttypmod) - 4) & 65535 END"
                " FROM pg_attribute a JOIN pg_type t ON t.oid = a.atttypid"
                " JOIN pg_type bt ON bt.oid = COALESCE(NULLIF(t.typbasetype, 0), a.atttypid)"
                " WHERE a.attrelid = %s AND a.attnum > 0 AND NOT a.attisdropped"
                " ORDER BY a.attnum",
                (oid,),
            )
            columns = {r[0]: ColumnInfo(*r) for r in cur.fetchall()}
            cur.execute(
                "SELECT a.attname FROM pg_index i"
                " CROSS JOIN LATERAL unnest(i.indkey) WITH ORDINALITY AS k(attnum, ord)"
                " JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k.attnum"
                " WHERE i.indrelid = %s AND i.indisprimary ORDER BY k.ord",
                (oid,),
            )
            key = tuple(r[0] for r in cur.fetchall())
            if not key:
                raise InputError(
                    f"table {table} has no primary key",
                    "add a primary key (dblog pages, merges and outputs rows by it)",
                )
            schema = TableSchema(
                table,
                tuple(Column(c.name, c.type, c.nullable) for c in columns.values()),
                key,
            )
            return TableInfo(oid, schema, columns, replident, time.monotonic())

        info: TableInfo = self._run(f"describe {table}", work)
        self._tables[table] = info
        return info

    def replica_identity(self, table: TableId) -> str:
        """``default``, ``full``, ``index`` or ``nothing`` (read fresh from pg_class)."""
        info = self.table_info(table, refresh=True)
        return {"d": "default", "f": "full", "i": "index", "n": "nothing"}[info.replica_identity]

    def check_replica_identity(
        self, tables: Iterable[TableId], before_images: str = "warn"
    ) -> dict[TableId, str]:
        """Check that deletes of ``tables`` carry their key, and (optionally) full before images.

        REPLICA IDENTITY ``nothing`` or ``index`` (on another index than the primary key) loses
        the key of deleted rows: SourceError. Full before images of updates and deletes, and
        unchanged TOASTed values, need REPLICA IDENTITY FULL; ``before_images`` says what to do
        when a table has only DEFAULT: ``"ignore"``, ``"warn"`` (log) or ``"require"``
        (SourceError). dblog never changes a table's replica identity itself: that rewrites
        nothing but makes every UPDATE/DELETE log the whole old row: the fix in the error and the
        warning is an ``ALTER TABLE`` for the table's owner to run deliberately.
        """
        if before_images not in ("ignore", "warn", "require"):
            raise ValueError("before_images must be ignore, warn or require")
        found: dict[TableId, str] = {}
        for table in tables:
            identity = self.replica_identity(table)
            found[table] = identity
            if identity in ("nothing", "index"):
                raise SourceError(
                    f"table {table} has REPLICA IDENTITY {identity.upper()}: deletes would not"
                    " carry the primary key",
                    f"ALTER TABLE {table} REPLICA IDENTITY DEFAULT (or FULL for before images)",
                )
            if identity != "full" and before_images != "ignore":
                problem = (
                    f"table {table} has REPLICA IDENTITY {identity.upper()}: before images hold"
                    " only the key and unchanged TOASTed values are unavailable"
                )
                fix = f"ALTER TABLE {table} REPLICA IDENTITY FULL"
                if before_images == "require":
                    raise SourceError(problem, fix)
                log.warning("%s; %s", problem, fix)
        return found

    # -- keyset SQL -------------------------------------------------------------------------

    @staticmethod
    def _ident(table: TableId) -> sql.Composed:
        return sql.SQL("{}.{}").format(sql.Identifier(table.db), sql.Identifier(table.table))

    @staticmethod
    def _row(columns: Sequence[str]) -> sql.Composable:
        return sql.SQL("({})").format(sql.SQL(", ").join(map(sql.Identifier, columns)))

    @staticmethod
    def _params(n: int) -> sql.Composable:
        return sql.SQL("({})").format(sql.SQL(", ").join(sql.Placeholder() * n))

    def range_sql(
        self,
        table: TableId,
        columns: Sequence[str] | None,
        lower: Key | None,
        upper: Key | None,
        *,
        limit: int | None = None,
        offset: int | None = None,
        descending: bool = False,
    ) -> tuple[sql.Composed, list[Any]]:
        """``SELECT cols FROM t WHERE (key) > (lower) AND (key) <= (upper) ORDER BY key ...``."""
        info = self.table_info(table)
        key = info.schema.key
        where: list[sql.Composable] = []
        params: list[Any] = []
        if lower is not None:
            where.append(sql.SQL("{} > {}").format(self._row(key), self._params(len(key))))
            params.extend(check_arity(table, key, lower))
        if upper is not None:
            where.append(sql.SQL("{} <= {}").format(self._row(key), self._params(len(key))))
            params.extend(check_arity(table, key, upper))
        direction = sql.SQL(" DESC" if descending else "")
        query = sql.SQL("SELECT {cols} FROM {table}{where} ORDER BY {order}").format(
            # ``*``: a chunk SELECT must not name a column an ALTER just dropped
            cols=sql.SQL("*")
            if columns is None
            else sql.SQL(", ").join(map(sql.Identifier, columns)),
            table=self._ident(table),
            where=sql.SQL(" WHERE ") + sql.SQL(" AND ").join(where) if where else sql.SQL(""),
            order=sql.SQL(", ").join(sql.Identifier(k) + direction for k in key),
        )
        if offset:
            query += sql.SQL(" OFFSET %s")
            params.append(int(offset))
        if limit is not None:
            query += sql.SQL(" LIMIT %s")
            params.append(int(limit))
        return query, params

    def chunk_sql(
        self, table: TableId, lower: Key | None, upper: Key | None, limit: int
    ) -> tuple[sql.Composed, list[Any]]:
        """The chunk SELECT (``*``: it must not name a column an ALTER just dropped)."""
        return self.range_sql(table, None, lower, upper, limit=limit)

    def keys_sql(self, table: TableId, keys: Sequence[Key]) -> tuple[sql.Composed, list[Any]]:
        """``SELECT * FROM t WHERE (key) IN ((%s, %s), ...) ORDER BY key``."""
        info = self.table_info(table)
        key = info.schema.key
        params: list[Any] = []
        for k in keys:
            params.extend(check_arity(table, key, k))
        query = sql.SQL("SELECT * FROM {table} WHERE {row} IN ({values}) ORDER BY {order}").format(
            table=self._ident(table),
            row=self._row(key),
            values=sql.SQL(", ").join([self._params(len(key))] * len(keys)),
            order=sql.SQL(", ").join(map(sql.Identifier, key)),
        )
        return query, params

    def _fetch_rows(
        self, cur: psycopg2.extensions.cursor, key: Sequence[str]
    ) -> list[tuple[Key, Row]]:
        names = [d.name for d in cur.description]
        bytea = [i for i, d in enumerate(cur.description) if d.type_code in _BYTEA_OIDS]
        index = [names.index(k) for k in key]
        out: list[tuple[Key, Row]] = []
        for record in cur.fetchall():
            if bytea:
                record = list(record)
                for i in bytea:
                    record[i] = bytes_deep(record[i])
            out.append((tuple(record[i] for i in index), dict(zip(names, record, strict=True))))
        return out

    def _fetch_keys(self, cur: psycopg2.extensions.cursor) -> list[Key]:
        bytea = [i for i, d in enumerate(cur.description) if d.type_code in _BYTEA_OIDS]
        rows = cur.fetchall()
        if not bytea:
            return [tuple(r) for r in rows]
        return [tuple(bytes_deep(v) if i in bytea else v for i, v in enumerate(r)) for r in rows]

    # -- Source protocol --------------------------------------------------------------------

    def max_key(self, table: TableId) -> Key | None:
        key = self._key(table)
        query, params = self.range_sql(table, key, None, None, limit=1, descending=True)

        def work(cur: psycopg2.extensions.cursor) -> Key | None:
            cur.execute(query, params)
            keys = self._fetch_keys(cur)
            return keys[0] if keys else None

        return self._run(f"read the largest key of {table}", work)

    def estimate_rows(self, table: TableId) -> int:
        """The planner's estimate (``pg_class.reltuples``); never a ``count(*)``."""
        oid = self.table_info(table).oid
        rows = self.query(
            "SELECT c.reltuples::bigint, s.n_live_tup FROM pg_class c"
            " LEFT JOIN pg_stat_all_tables s ON s.relid = c.oid WHERE c.oid = %s",
            (oid,),
        )
        if not rows:
            return 0
        reltuples, live = rows[0]
        if reltuples is not None and reltuples >= 0:
            return int(reltuples)
        return int(live or 0)  # never analyzed/vacuumed (reltuples = -1): the stats counter

    def next_bound(self, table: TableId, after: Key | None, upto: Key, n: int) -> Key | None:
        if n < 1:
            raise ValueError("n must be >= 1")
        key = self._key(table)
        query, params = self.range_sql(table, key, after, upto, offset=n - 1, limit=1)

        def work(cur: psycopg2.extensions.cursor) -> Key | None:
            cur.execute(query, params)
            keys = self._fetch_keys(cur)
            return keys[0] if keys else None

        return self._run(f"find the next chunk bound of {table}", work)

    # -- watermarks -------------------------------------------------------------------------

    def ensure_watermark_table(self) -> None:
        """``table`` strategy: create schema ``dblog`` and ``dblog.dblog_watermarks`` if missing.

        An existing table needs no CREATE grant: least privilege is USAGE on the schema and
        INSERT, UPDATE on the table.
        """
        if self.query(
            "SELECT 1 FROM pg_catalog.pg_tables WHERE schemaname = %s AND tablename = %s",
            (WATERMARK_SCHEMA, WATERMARK_TABLE),
        ):
            return
        statements = [
            sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(sql.Identifier(WATERMARK_SCHEMA)),
            sql.SQL(
                "CREATE TABLE IF NOT EXISTS {} (stream text PRIMARY KEY, value text NOT NULL,"
                " updated_at timestamptz NOT NULL DEFAULT now())"
            ).format(self._ident(WATERMARK_TABLE_ID)),
        ]
        for statement in statements:
            for attempt in range(3):
                try:
                    self.query(statement)
                    break
                except SourceError as err:
                    # concurrent CREATE ... IF NOT EXISTS can still collide in the catalogs
                    if "already exists" in str(err) or "duplicate key" in str(err):
                        if attempt < 2:
                            time.sleep(0.1)
                            continue
                        break
                    raise SourceError(
                        f"cannot create the watermark table {WATERMARK_TABLE_ID}: {err}",
                        f"grant CREATE on the database (or create schema {WATERMARK_SCHEMA}) to"
                        f" {self.settings.user}, or use source.watermark snapshot",
                    ) from None

    def write_watermark(self, stream: str, value: str) -> None:
        """Upsert the stream's row of the watermark table (autocommit: committed on return)."""
        statement = sql.SQL(
            "INSERT INTO {} (stream, value) VALUES (%s, %s)"
            " ON CONFLICT (stream) DO UPDATE SET value = EXCLUDED.value, updated_at = now()"
        ).format(self._ident(WATERMARK_TABLE_ID))
        try:
            self.query(statement, (stream, value))
        except SourceError as err:
            if "does not exist" not in str(err):
                raise
            self.ensure_watermark_table()
            self.query(statement, (stream, value))

    # -- snapshot watermark -----------------------------------------------------------------

    def _read_snapshot(self, cur: psycopg2.extensions.cursor) -> SnapshotInfo:
        # The first statement fixes the transaction snapshot; the LSN function runs after that,
        # inside the same statement, so every commit visible to the snapshot was inserted into
        # the WAL before close_lsn.
        cur.execute("SELECT pg_current_snapshot()::text, pg_current_wal_insert_lsn()::text")
        snapshot, lsn = cur.fetchone()
        return SnapshotInfo.parse(snapshot, lsn_to_int(lsn))
