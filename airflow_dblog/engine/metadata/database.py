"""The metadata database: its engine, transactions, migrations and the leader's fencing.

Every read and write of the metadata tables is one short transaction from :meth:`session`. On
SQLite, writing transactions begin ``IMMEDIATE`` and read-only ones deferred, in WAL mode (see
:func:`_serialise_sqlite`); on PostgreSQL and MySQL the row locks the callers take do that work.
:class:`~airflow_dblog.engine.metadata.store.MetadataStore` adds the dumps, chunks, controls and
stream state on top.
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from alembic import command
from alembic.config import Config as AlembicConfig
from sqlalchemy import create_engine, event, select
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.exc import OperationalError
from sqlalchemy.orm import Session, sessionmaker

from airflow_dblog.engine.metadata.models import StreamState
from airflow_dblog.errors import FencedError, MetadataError
from airflow_dblog.redact import redact

MIGRATIONS = Path(__file__).parent / "migrations"
_SESSION_LOCKS = {  # dialect -> (take, release) of a lock held by the connection's session
    "postgresql": ("SELECT pg_advisory_lock(4313651395)", "SELECT pg_advisory_unlock(4313651395)"),
    "mysql": ("SELECT GET_LOCK('dblog_migrate', 600)", "SELECT RELEASE_LOCK('dblog_migrate')"),
}


_DRIVERS = {
    "postgres": "postgresql+psycopg2",
    "postgresql": "postgresql+psycopg2",
    "mysql": "mysql+pymysql",
    "mariadb": "mysql+pymysql",
}


def sqlalchemy_url(url: str) -> str:
    """Pick the drivers this package installs for the plain schemes people write."""
    scheme, sep, rest = url.partition("://")
    return f"{_DRIVERS.get(scheme, scheme)}{sep}{rest}"


# How long a SQLite transaction waits for another process's to end before it fails.
SQLITE_BUSY_S = 60


# Execution option of the engine that read-only sessions use.
_READS_ONLY = "dblog_reads_only"


def _serialise_sqlite(engine: Engine) -> None:
    """Make every writing SQLite transaction take the database's write lock when it begins.

    SQLite has no row locks (``FOR UPDATE`` is dropped) and Python's driver starts a
    transaction only at the first write, so a read that decides a write ran outside it: a
    chunk cut after its dump was read as running could be added after a cancel committed in
    between, and stay "running" in a cancelled dump. ``BEGIN IMMEDIATE`` serialises the
    writing transactions instead, which is what the row locks give on PostgreSQL and MySQL.
    Read-only ones begin deferred and, in WAL mode, neither wait for a writer nor hold one
    up: a process frozen (SIGSTOP, a long pause) mid-read must not stall the others, and a
    status read must not queue behind the stream's writes.
    """

    @event.listens_for(engine, "connect")
    def _wal_and_no_implicit_transactions(dbapi_connection: Any, _record: Any) -> None:
        dbapi_connection.isolation_level = None
        _use_wal(dbapi_connection)

    @event.listens_for(engine, "begin")
    def _begin(connection: Connection) -> None:
        reads_only = connection.get_execution_options().get(_READS_ONLY, False)
        connection.exec_driver_sql("BEGIN" if reads_only else "BEGIN IMMEDIATE")


def _use_wal(dbapi_connection: Any) -> None:
    """Switch the file to WAL (it stays so). The switch fails at once, without waiting, when
    another process starting on the same new file holds a lock: try again for a while."""
    deadline = time.monotonic() + SQLITE_BUSY_S
    while True:
        try:
            dbapi_connection.execute("PRAGMA journal_mode=WAL")
            return
        except sqlite3.OperationalError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


def utcnow() -> datetime:
    return datetime.now(timezone.utc).replace(tzinfo=None)


@dataclass(frozen=True)
class Fence:
    """The leader's lease token; ``alive`` raises once the lease itself is known to be lost."""

    stream: str
    token: int
    alive: Callable[[], None] = lambda: None


@contextmanager
def _migration_lock(connection: Connection) -> Iterator[None]:
    """One migrating process at a time, held until its migrations are committed.

    The stream and an Airflow task often open a new database together; unserialised, both ran
    0001 and one failed with "table dblog_dumps already exists" (or hung on the other's locks).
    """
    if connection.dialect.name not in _SESSION_LOCKS:  # SQLite: BEGIN IMMEDIATE serialises
        yield
        return
    lock, unlock = _SESSION_LOCKS[connection.dialect.name]
    connection.exec_driver_sql(lock)
    connection.commit()
    try:
        yield
    finally:
        connection.exec_driver_sql(unlock)
        connection.commit()


class MetadataDatabase:
    """One metadata database. ``upgrade=True`` applies pending migrations on first use.

    A database with a :class:`Fence` (the leading stream process's) checks the token at the
    start of every transaction, under a share lock on the stream's row: a new leader's
    :meth:`take_lead` waits for those transactions, and every later one of the old leader fails.
    """

    def __init__(self, url: str, *, upgrade: bool = True) -> None:
        self.url = url
        self.fence: Fence | None = None
        if url.startswith("sqlite:///") and url != "sqlite:///:memory:":
            Path(url[len("sqlite:///") :]).parent.mkdir(parents=True, exist_ok=True)
        sqlite = url.startswith("sqlite:")
        self.engine: Engine = create_engine(
            sqlalchemy_url(url),
            pool_pre_ping=True,
            connect_args={"timeout": SQLITE_BUSY_S} if sqlite else {},
        )
        if sqlite:
            _serialise_sqlite(self.engine)
        self._sessions = sessionmaker(self.engine, expire_on_commit=False)
        self._reads = sessionmaker(
            self.engine.execution_options(**{_READS_ONLY: True}), expire_on_commit=False
        )
        if upgrade:
            self.upgrade()

    def upgrade(self) -> None:
        cfg = AlembicConfig()
        cfg.set_main_option("script_location", str(MIGRATIONS))
        try:
            with (
                self.engine.connect() as connection,
                _migration_lock(connection),
                connection.begin(),
            ):
                cfg.attributes["connection"] = connection
                command.upgrade(cfg, "head")
        except OperationalError as err:
            raise MetadataError(
                f"cannot reach the metadata database {redact(self.url)}: "
                f"{str(err.orig).splitlines()[0]}",
                "check metadata.url and that the database is running",
            ) from None

    def revision(self) -> str | None:
        with self.engine.connect() as connection:
            return connection.exec_driver_sql(
                "SELECT version_num FROM dblog_alembic_version"
            ).scalar()

    @contextmanager
    def session(self, *, writes: bool = True) -> Iterator[Session]:
        """One transaction; a database that went away is one line, not a driver traceback.

        ``writes=False`` for transactions that only read: on SQLite they take no write lock.
        """
        try:
            with (self._sessions if writes else self._reads).begin() as session:
                if self.fence is not None:
                    self._check_fence(session, self.fence)
                yield session
        except OperationalError as err:
            raise MetadataError(
                f"the metadata database {redact(self.url)} failed: "
                f"{str(err.orig).strip().splitlines()[0]}",
                "check that it is running; a stopped stream continues from its last commit"
                " when started again",
            ) from None

    @staticmethod
    def _check_fence(s: Session, fence: Fence) -> None:
        fence.alive()
        current = s.scalar(
            select(StreamState.fencing_token)
            .where(StreamState.stream == fence.stream)
            .with_for_update(read=True)
        )
        if current != fence.token:
            raise FencedError(
                f"stream {fence.stream}: this process (lease token {fence.token}) was replaced"
                f" by a newer leader (token {current}) and stops without writing",
                "nothing to do: the new leader carries on",
            )

    def check_fence(self) -> None:
        """Raise :class:`FencedError` unless this store's lease is still the current one."""
        if self.fence is None:
            return
        with self.session(writes=False):
            pass

    def take_lead(self, fence: Fence, leader: str, wait_s: float = 300) -> None:
        """Record ``fence`` as the stream's current token; later writes of older tokens fail.

        A deposed leader frozen inside a transaction holds the stream's row: wait for it.
        """
        deadline = time.monotonic() + wait_s
        while True:
            try:
                with self._sessions.begin() as s:
                    row = locked_stream_row(s, fence.stream)
                    if row.fencing_token > fence.token:
                        raise FencedError(
                            f"stream {fence.stream}: lease token {fence.token} is older than"
                            f" the recorded {row.fencing_token}",
                            "check that every stream process of this name uses the same"
                            " ha.zookeeper",
                        )
                    row.fencing_token, row.leader = fence.token, leader
                break
            except OperationalError as err:
                if time.monotonic() > deadline:
                    raise MetadataError(
                        f"cannot record the leader of stream {fence.stream}: "
                        f"{str(err.orig).splitlines()[0]}",
                        "a deposed leader may still hold the row: stop it",
                    ) from None
                time.sleep(1)
        self.fence = fence


def locked_stream_row(s: Session, stream: str) -> StreamState:
    """The stream's state row, locked; created (token 0) on first use."""
    row = s.get(StreamState, stream, with_for_update=True)
    if row is None:
        row = StreamState(stream=stream, fencing_token=0)
        s.add(row)
    return row
