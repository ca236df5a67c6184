"""PostgreSQL as a dblog ``Source``: schema, keyset chunk SELECTs, watermarks, snapshot facts.

One psycopg2 connection per source object, in autocommit mode, opened lazily and reopened once when
the server drops it (:class:`~airflow_dblog.sources.sql.SqlSource`). Tables are ``schema.table``
(``TableId.db`` is the schema; the database is the one in the URL). Identifiers are quoted
(keyset SQL by :mod:`~airflow_dblog.sources.postgres.dialect`, other statements with
:class:`psycopg2.sql.Identifier`) and values are bound parameters: nothing a user types is spliced
into SQL. Keys are compared and ordered by the server only (row comparisons ``(a, b) > (%s, %s)``
on the primary key index, in the columns' collations); this module never sorts keys in Python.

Value types (the contract shared with the WAL reader,
:mod:`~airflow_dblog.sources.postgres.wal2json_reader`): a row read here and the same row decoded
from the WAL hold the same Python values, because both go through
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
import logging
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import psycopg2
import psycopg2.errors
import psycopg2.extensions
from psycopg2 import sql

from airflow_dblog.core.events import Row, TableId
from airflow_dblog.core.position import Position, lsn_to_int
from airflow_dblog.core.window import XidSnapshot
from airflow_dblog.errors import InputError, SourceError
from airflow_dblog.redact import redact
from airflow_dblog.sources.base import Column, Key, Offset, TableSchema
from airflow_dblog.sources.postgres import lag
from airflow_dblog.sources.postgres.connection import (
    ConnectionSettings,
    connect,
    connect_error,
    is_connection_lost,
    parse_postgres_url,
)
from airflow_dblog.sources.postgres.dialect import DIALECT
from airflow_dblog.sources.postgres.key_values import coerce_value, expects
from airflow_dblog.sources.postgres.schema import ColumnInfo, TableInfo
from airflow_dblog.sources.postgres.wal_values import bytes_deep
from airflow_dblog.sources.sql import SqlSource

log = logging.getLogger(__name__)

WATERMARK_SCHEMA = "dblog"
WATERMARK_TABLE = "dblog_watermarks"
WATERMARK_TABLE_ID = TableId(WATERMARK_SCHEMA, WATERMARK_TABLE)

SCHEMA_TTL_S = 30.0

_BYTEA_OIDS = (17, 1001)  # bytea, bytea[]: psycopg2 returns memoryviews


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


class PostgresSource(SqlSource[SnapshotInfo]):
    """``Source`` for PostgreSQL 13+ through psycopg2 (``snapshot`` watermarks need 13+).

    Snapshot chunks report what their REPEATABLE READ snapshot saw (:class:`SnapshotInfo`).
    """

    kind = "postgres"
    lineage_epoch = 0  # LSNs go on across a promotion: no epoch
    product = "PostgreSQL"
    driver_error = psycopg2.Error
    begin_snapshot = ("BEGIN ISOLATION LEVEL REPEATABLE READ, READ ONLY",)
    dialect = DIALECT
    _coerce_value = staticmethod(coerce_value)
    _expects = staticmethod(expects)

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

    def log_lag(
        self, position: str | None, offset: Offset | None
    ) -> tuple[str, int | None, str | None]:
        """(head LSN, bytes behind, why unknown) of a stream that committed ``position`` and
        reader ``offset``: WAL bytes from its flush LSN to the server's current LSN."""
        return lag.wal_lag(self, position, offset)

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

    # -- rows -------------------------------------------------------------------------

    @staticmethod
    def _ident(table: TableId) -> sql.Composed:
        return sql.SQL("{}.{}").format(sql.Identifier(table.db), sql.Identifier(table.table))

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
