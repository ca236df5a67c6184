"""Handles on a per-test database of the shared servers, and helpers of the source and reader
tests."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import psycopg2
import pymysql

from airflow_dblog.core.events import ChangeEvent, TableId
from airflow_dblog.core.position import lsn_to_int
from airflow_dblog.core.window import XidSnapshot
from airflow_dblog.errors import SourceError
from airflow_dblog.sources.base import ChangelogReader
from airflow_dblog.sources.mysql.connection import parse_mysql_url
from airflow_dblog.sources.postgres.connection import parse_postgres_url
from airflow_dblog.sources.postgres.source import PostgresSource, SnapshotInfo
from airflow_dblog.sources.sql import SqlSource


class _Db:
    """A lazily opened autocommit connection plus ``execute`` returning all rows."""

    def __init__(self) -> None:
        self._conn: Any = None

    def connect(self) -> Any:
        raise NotImplementedError

    def execute(self, sql: str, params: Any = None) -> list[tuple[Any, ...]]:
        if self._conn is None:
            self._conn = self.connect()
        with self._conn.cursor() as cur:
            if isinstance(params, list):
                cur.executemany(sql, params)
            else:
                cur.execute(sql, params)
            return list(cur.fetchall()) if cur.description else []

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()


class MysqlDb(_Db):
    """One fresh MariaDB/MySQL database, sessions in UTC like the source's."""

    def __init__(self, url: str, name: str) -> None:
        super().__init__()
        self.url, self.name = url, name
        self.settings = parse_mysql_url(url)

    def connect(self) -> Any:
        return pymysql.connect(
            **self.settings.pymysql_kwargs(), autocommit=True, init_command="SET time_zone='+00:00'"
        )

    def table(self, name: str) -> TableId:
        return TableId(self.name, name)

    def q(self, name: str) -> str:
        return f"`{self.name}`.`{name}`"


class PostgresDb(_Db):
    """One fresh PostgreSQL database, sessions in UTC like the source's."""

    def __init__(self, url: str) -> None:
        super().__init__()
        self.url = url

    def connect(self, autocommit: bool = True) -> Any:
        conn = psycopg2.connect(parse_postgres_url(self.url).dsn, options="-c TimeZone=UTC")
        conn.autocommit = autocommit
        return conn

    def txn(self, *statements: str | tuple[str, Any]) -> int:
        """Run statements in one transaction; returns its xid8."""
        conn = self.connect(autocommit=False)
        try:
            with conn.cursor() as cur:
                for s in statements:
                    sql, params = (s, None) if isinstance(s, str) else s
                    cur.execute(sql, params)
                cur.execute("SELECT pg_current_xact_id()::text::bigint")
                xid = cur.fetchone()[0]
            conn.commit()
            return int(xid)
        finally:
            conn.close()


def read_changes(reader: ChangelogReader, want: int, budget_s: float = 30.0) -> list[ChangeEvent]:
    """Exactly ``want`` change events (watermarks and heartbeats dropped); fails after budget_s."""
    got: list[ChangeEvent] = []
    deadline = time.monotonic() + budget_s
    while len(got) < want:
        assert time.monotonic() < deadline, f"{len(got)} of {want} changes: {got}"
        got += [i for i in reader.read(want - len(got), 1.0) if isinstance(i, ChangeEvent)]
    return got


@contextmanager
def after_snapshot(source: SqlSource[Any], hook: Callable[[Any], None]) -> Iterator[None]:
    """In the block, ``hook(seen)`` runs in each snapshot chunk of ``source`` right after the
    snapshot is taken, before the SELECTs (``seen``: what the snapshot saw, as returned)."""
    read = source._read_snapshot

    def read_then_hook(cur: Any) -> Any:
        seen = read(cur)
        hook(seen)
        return seen

    source._read_snapshot = read_then_hook  # type: ignore[method-assign]
    try:
        yield
    finally:
        del source._read_snapshot


def current_lsn(source: PostgresSource) -> int:
    """``pg_current_wal_lsn()``: the end of the WAL written so far (every commit before)."""
    return lsn_to_int(str(source.query("SELECT pg_current_wal_lsn()::text")[0][0]))


def current_insert_lsn(source: PostgresSource) -> int:
    """``pg_current_wal_insert_lsn()``: includes records not yet written out."""
    return lsn_to_int(str(source.query("SELECT pg_current_wal_insert_lsn()::text")[0][0]))


def visible(info: SnapshotInfo, xid: int) -> bool:
    """Whether a chunk's snapshot saw the committed transaction ``xid``, judged as its window
    judges it (:class:`XidSnapshot`)."""
    return XidSnapshot(info.xmin, info.xmax, info.xip).visible(xid)


def drop_replication_slot(source: PostgresSource, slot: str, tries: int = 100) -> None:
    """Drop a slot if it exists, waiting (0.1 s a try) while a closing reader still holds it."""
    for attempt in range(tries):
        try:
            source.query(
                "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots"
                " WHERE slot_name = %s",
                (slot,),
            )
            return
        except SourceError as err:
            if "is active" not in str(err) or attempt == tries - 1:
                raise
            time.sleep(0.1)
