"""What the MySQL/MariaDB and PostgreSQL sources share, whatever their driver.

:class:`SqlSource` holds one connection per source object, in autocommit mode, opened lazily and
reopened once when the server drops it (:meth:`SqlSource._run`); it coerces user-typed keys to
the column types, reads key lists in batches and runs chunk SELECTs in one snapshot transaction.
The keyset SQL (chunk pages, chunk bounds, the largest key, key lists) is built here once, by
:mod:`~airflow_dblog.sources.keyset` in the source's :class:`~airflow_dblog.sources.keyset.Dialect`.
A source supplies its driver's connection and errors, its dialect, how it reads rows and what its
snapshot saw.
"""

from __future__ import annotations

import contextlib
import decimal
import logging
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any, ClassVar, Generic, TypeVar

from airflow_dblog.core.events import Row, TableId
from airflow_dblog.core.keys import MAX_KEYS_PER_CHUNK, key_in_order
from airflow_dblog.errors import InputError
from airflow_dblog.sources import keyset
from airflow_dblog.sources.base import Closeable, Key, TableSchema
from airflow_dblog.sources.keyset import Dialect, Statement

log = logging.getLogger(__name__)

SELECT_KEYS_BATCH = 500
"""Keys per key-list SELECT: one statement of thousands of keys is slow to plan (MariaDB) or
exceeds the server's stack depth (PostgreSQL, composite keys); a snapshot spans the batches."""

Snap = TypeVar("Snap")  # what a snapshot chunk's snapshot saw: a binlog Position, a SnapshotInfo


def is_integral(value: Any) -> bool:
    """A float, a string or a Decimal that holds a whole number (ints are not asked about)."""
    return (
        (isinstance(value, float) and value.is_integer())
        or (isinstance(value, str) and re.fullmatch(r"\s*[+-]?\d+\s*", value) is not None)
        or (isinstance(value, decimal.Decimal) and value == value.to_integral_value())
    )


class SqlSource(Closeable, Generic[Snap]):
    """The connection handling and the Source methods MySQL and PostgreSQL spell alike."""

    product: ClassVar[str]  # "MySQL", "PostgreSQL": log lines
    # the drivers' base errors: what _run looks at
    driver_error: ClassVar[type[Exception] | tuple[type[Exception], ...]]
    begin_snapshot: ClassVar[tuple[str, ...]]  # statements that open a snapshot transaction
    dialect: ClassVar[Dialect]  # how its keyset SQL is spelled

    settings: Any  # the source's ConnectionSettings: ``where`` names host:port
    _conn: Any

    # -- the source supplies ---------------------------------------------------------------

    def _connection(self) -> Any:
        """The open connection (opened now if there is none)."""
        raise NotImplementedError

    def query(self, statement: Any, params: Any = None) -> list[tuple[Any, ...]]:
        """Rows of one statement."""
        raise NotImplementedError

    def _lost(self, err: Exception, conn: Any) -> bool:
        """Whether ``err`` means the connection is gone (worth one reconnect)."""
        raise NotImplementedError

    def _failure(self, err: Exception, conn: Any, doing: str, lost: bool) -> Exception:
        """The error to raise for a driver error while trying to ``doing``."""
        raise NotImplementedError

    def table_info(self, table: TableId, refresh: bool = False) -> Any:
        """The table's description: ``schema`` (a TableSchema) and ``column(name)``."""
        raise NotImplementedError

    @staticmethod
    def _coerce_value(col: Any, value: Any) -> Any:
        """One key value in the Python type a SELECT returns for ``col``; ValueError/TypeError."""
        raise NotImplementedError

    @staticmethod
    def _expects(col: Any) -> str:
        """What a key value of ``col`` should look like, for the error message."""
        raise NotImplementedError

    def _chunk_connection(self) -> Any:
        """The open connection chunk SELECTs run on: the source's own unless it has a faster
        one for plain SELECTs."""
        return self._connection()

    def _fetch_rows(self, cur: Any, key: Sequence[str]) -> list[tuple[Key, Row]]:
        """The executed SELECT's rows as ``(key, row)``; ``key``: the key column names."""
        raise NotImplementedError

    def _fetch_keys(self, cur: Any) -> list[Key]:
        """The executed SELECT's rows, each a key."""
        return [tuple(r) for r in cur.fetchall()]

    def _check_snapshot(self) -> None:
        """SourceError if this server cannot run snapshot chunks."""

    def _read_snapshot(self, cur: Any) -> Snap:
        """In the snapshot transaction, before the SELECTs: what the snapshot saw."""
        raise NotImplementedError

    # -- connection ------------------------------------------------------------------------

    @property
    def where(self) -> str:
        return str(self.settings.where)

    def _drop_connection(self) -> None:
        if self._conn is not None:
            with contextlib.suppress(Exception):
                self._conn.close()
            self._conn = None

    def _run(
        self, doing: str, work: Callable[[Any], Any], connection: Callable[[], Any] | None = None
    ) -> Any:
        """Run ``work`` on a cursor; reconnect and retry once if the connection was lost.

        ``work`` must be safe to repeat (reads, idempotent upserts, whole transactions).
        ``connection``: opens the connection to run on (the source's own by default).
        """
        for attempt in (0, 1):
            conn = (connection or self._connection)()
            try:
                with conn.cursor() as cur:
                    return work(cur)
            except self.driver_error as err:
                lost = self._lost(err, conn)
                if lost:
                    self._drop_connection()
                    if attempt == 0:
                        log.warning(
                            "connection to %s at %s lost; reconnecting", self.product, self.where
                        )
                        continue
                raise self._failure(err, conn, doing, lost) from None
        raise AssertionError("unreachable")

    def ping(self) -> None:
        """SourceError unless the server answers (reconnecting once if the connection broke)."""
        self.query("SELECT 1")

    def close(self) -> None:
        self._drop_connection()

    # -- tables and keys -------------------------------------------------------------------

    def describe(self, table: TableId) -> TableSchema:
        schema: TableSchema = self.table_info(table, refresh=True).schema
        return schema

    def _key(self, table: TableId) -> tuple[str, ...]:
        key: tuple[str, ...] = self.table_info(table).schema.key
        return key

    def coerce_key(self, table: TableId, key: Sequence[Any] | Mapping[str, Any]) -> Key:
        info = self.table_info(table)
        names = info.schema.key
        values = key_in_order(key, names, table)
        typed = []
        for name, value in zip(names, values, strict=True):
            col = info.column(name)
            try:
                typed.append(self._coerce_value(col, value))
            except (ValueError, TypeError, OverflowError) as err:
                detail = f" ({err})" if str(err) else ""
                raise InputError(
                    f"key column {name} of {table} expects {self._expects(col)},"
                    f" got {value!r}{detail}",
                    "pass the key as JSON values in primary key order",
                ) from None
        return tuple(typed)

    # -- keyset SQL ------------------------------------------------------------------------

    def range_sql(
        self,
        table: TableId,
        columns: Sequence[str] | None,
        lower: Key | None,
        upper: Key | None,
        *,
        limit: int,
        offset: int = 0,
        descending: bool = False,
    ) -> Statement:
        """``SELECT cols FROM t WHERE key > lower AND key <= upper ORDER BY key LIMIT n``
        (``columns`` None: ``*``; see :func:`airflow_dblog.sources.keyset.range_sql`)."""
        key = self._key(table)
        return keyset.range_sql(
            self.dialect,
            table,
            key,
            columns,
            lower,
            upper,
            limit=limit,
            offset=offset,
            descending=descending,
        )

    def chunk_sql(
        self, table: TableId, lower: Key | None, upper: Key | None, limit: int
    ) -> Statement:
        """The chunk SELECT: every column (``*``: it must not name a column an ALTER just
        dropped) of rows with ``lower < key <= upper`` in key order."""
        return self.range_sql(table, None, lower, upper, limit=limit)

    def keys_sql(self, table: TableId, keys: Sequence[Key]) -> Statement:
        """The SELECT of every column of the rows with the given keys, in key order."""
        return keyset.keys_sql(self.dialect, table, self._key(table), keys)

    def _first_key(self, doing: str, statement: Statement) -> Key | None:
        sql, params = statement

        def work(cur: Any) -> Key | None:
            cur.execute(sql, params)
            keys = self._fetch_keys(cur)
            return keys[0] if keys else None

        key: Key | None = self._run(doing, work)
        return key

    def max_key(self, table: TableId) -> Key | None:
        """The largest key: the first in descending key order, read from the key index."""
        statement = self.range_sql(table, self._key(table), None, None, limit=1, descending=True)
        return self._first_key(f"read the largest key of {table}", statement)

    def next_bound(self, table: TableId, after: Key | None, upto: Key, n: int) -> Key | None:
        """The n-th key after ``after`` (at most ``upto``), read from the key index only."""
        if n < 1:
            raise InputError(f"chunk size must be >= 1, got {n}", "set dump.chunk_size >= 1")
        statement = self.range_sql(table, self._key(table), after, upto, limit=1, offset=n - 1)
        return self._first_key(f"find the next chunk bound of {table}", statement)

    # -- chunk SELECTs ---------------------------------------------------------------------

    def _select(self, doing: str, key: Sequence[str], statement: Statement) -> Any:
        sql, params = statement

        def work(cur: Any) -> list[tuple[Key, Row]]:
            cur.execute(sql, params)
            return self._fetch_rows(cur, key)

        return self._run(doing, work, self._chunk_connection)

    def select_range(
        self, table: TableId, lower: Key | None, upper: Key, limit: int
    ) -> list[tuple[Key, Row]]:
        key = self._key(table)
        return self._select(
            f"select a chunk of {table}", key, self.chunk_sql(table, lower, upper, limit)
        )

    def _key_batches(self, table: TableId, keys: Sequence[Key]) -> list[Statement]:
        return [
            self.keys_sql(table, keys[i : i + SELECT_KEYS_BATCH])
            for i in range(0, len(keys), SELECT_KEYS_BATCH)
        ]

    def select_keys(self, table: TableId, keys: Sequence[Key]) -> list[tuple[Key, Row]]:
        """Rows of the given keys (missing keys are left out), in key order per batch."""
        out: list[tuple[Key, Row]] = []
        for statement in self._key_batches(table, keys):
            out.extend(self._select(f"select keys of {table}", self._key(table), statement))
        return out

    # -- snapshot chunks -------------------------------------------------------------------

    def _snapshot(
        self, table: TableId, build: Callable[[], list[Statement]]
    ) -> tuple[list[tuple[Key, Row]], Snap]:
        """The statements ``build`` returns, all in one snapshot transaction."""
        self._check_snapshot()
        key = self._key(table)
        statements = build()

        def work(cur: Any) -> tuple[list[tuple[Key, Row]], Snap]:
            for statement in self.begin_snapshot:
                cur.execute(statement)
            try:
                seen = self._read_snapshot(cur)
                rows = []
                for sql, params in statements:
                    cur.execute(sql, params)
                    rows.extend(self._fetch_rows(cur, key))
                cur.execute("COMMIT")
            except BaseException:
                try:
                    cur.execute("ROLLBACK")
                except Exception:
                    self._drop_connection()
                raise
            return rows, seen

        result: tuple[list[tuple[Key, Row]], Snap] = self._run(
            f"select a snapshot chunk of {table}", work
        )
        return result

    def snapshot_select_range(
        self, table: TableId, lower: Key | None, upper: Key, limit: int
    ) -> tuple[list[tuple[Key, Row]], Snap]:
        """Keyset page in one snapshot, plus what the snapshot saw (:meth:`_read_snapshot`)."""
        return self._snapshot(table, lambda: [self.chunk_sql(table, lower, upper, limit)])

    def snapshot_select_keys(
        self, table: TableId, keys: Sequence[Key]
    ) -> tuple[list[tuple[Key, Row]], Snap]:
        """``select_keys`` in one snapshot, plus what the snapshot saw."""
        if len(keys) > MAX_KEYS_PER_CHUNK:
            raise InputError(
                f"{len(keys)} keys in one snapshot chunk",
                f"key-list chunks hold at most {MAX_KEYS_PER_CHUNK} keys",
            )
        return self._snapshot(table, lambda: self._key_batches(table, keys))
