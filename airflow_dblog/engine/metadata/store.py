"""Reads and writes of the metadata tables, each in one short transaction.

Airflow and the CLI create dumps and change controls; the streaming job claims and completes
chunks; sensors and ``dblog status`` read progress. Everything goes through this class so the
state machine of a dump lives in one place.
"""

from __future__ import annotations

import math
import sqlite3
import time
from collections.abc import Callable, Collection, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from alembic import command
from alembic.config import Config as AlembicConfig
from sqlalchemy import create_engine, event, func, select, update
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.exc import OperationalError
from sqlalchemy.orm import Session, sessionmaker

from airflow_dblog.config import DumpSettings
from airflow_dblog.engine.metadata.models import (
    FINAL_DUMP_STATES,
    Chunk,
    Control,
    Dump,
    DumpTable,
    StreamState,
)
from airflow_dblog.errors import FencedError, MetadataError
from airflow_dblog.redact import redact

MIGRATIONS = Path(__file__).parent / "migrations"
_SESSION_LOCKS = {  # dialect -> (take, release) of a lock held by the connection's session
    "postgresql": ("SELECT pg_advisory_lock(4313651395)", "SELECT pg_advisory_unlock(4313651395)"),
    "mysql": ("SELECT GET_LOCK('dblog_migrate', 600)", "SELECT RELEASE_LOCK('dblog_migrate')"),
}

# action -> (states it applies to, state it leads to)
_TRANSITIONS: dict[str, tuple[tuple[str, ...], str]] = {
    "pause": (("pending", "running"), "paused"),
    "resume": (("paused",), "running"),
    "cancel": (("pending", "running", "paused"), "cancelled"),
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
class TablePlan:
    """What a dump of one table needs to know up front, gathered from the source by the planner."""

    table: str
    key_columns: list[str]
    estimated_rows: int
    key_chunks: list[list[list[Any]]] | None = None  # specific-key dumps: keys cut into chunks


@dataclass(frozen=True)
class Progress:
    dump_id: int
    stream: str
    state: str
    reason: str | None
    tables: list[str]
    chunks_total: int
    chunks_done: int
    rows_selected: int
    rows_dropped: int
    rows_emitted: int
    created_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
    current_chunks: list[str] = field(default_factory=list)

    @property
    def percent(self) -> float:
        if self.state == "done":
            return 100.0
        return 100.0 * self.chunks_done / self.chunks_total if self.chunks_total else 0.0

    def as_dict(self) -> dict[str, Any]:
        return {
            "dump_id": self.dump_id,
            "stream": self.stream,
            "state": self.state,
            "reason": self.reason,
            "tables": self.tables,
            "chunks_total": self.chunks_total,
            "chunks_done": self.chunks_done,
            "percent": round(self.percent, 1),
            "rows_selected": self.rows_selected,
            "rows_dropped": self.rows_dropped,
            "rows_emitted": self.rows_emitted,
            "current_chunks": self.current_chunks,
            "created_at": _iso(self.created_at),
            "started_at": _iso(self.started_at),
            "finished_at": _iso(self.finished_at),
        }


def _iso(value: datetime | None) -> str | None:
    return None if value is None else value.isoformat() + "Z"


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


class MetadataStore:
    """One metadata database. ``upgrade=True`` applies pending migrations on first use.

    A store with a :class:`Fence` (the leading stream process's) checks the token at the start
    of every transaction, under a share lock on the stream's row: a new leader's
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
                    row = _stream_row(s, fence.stream)
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

    # -- dumps ------------------------------------------------------------------------------

    def create_dump(
        self,
        stream: str,
        kind: str,
        plans: Sequence[TablePlan],
        requested_by: str = "",
        chunk_size: int | None = None,
    ) -> int:
        """Write a dump, its tables and (for specific keys) its chunks in one transaction."""
        now = utcnow()
        with self.session() as s:
            dump = Dump(
                stream=stream,
                kind=kind,
                tables=[p.table for p in plans],
                requested_by=requested_by,
                state="pending",
                chunk_size=chunk_size,
                created_at=now,
                updated_at=now,
            )
            s.add(dump)
            s.flush()
            for plan in plans:
                s.add(
                    DumpTable(
                        dump_id=dump.id,
                        table_name=plan.table,
                        key_columns=plan.key_columns,
                        max_key=None,
                        cursor=None,
                        estimated_rows=plan.estimated_rows,
                        # a range's bound is read by the stream once its log start is durable;
                        # key lists have no range to cut
                        bounded=plan.key_chunks is not None,
                        exhausted=plan.key_chunks is not None,
                    )
                )
                for seq, keys in enumerate(plan.key_chunks or []):
                    s.add(_new_chunk(dump.id, plan.table, seq, keys=keys))
            return dump.id

    def dump(self, dump_id: int) -> Dump:
        with self.session(writes=False) as s:
            dump = s.get(Dump, dump_id)
            if dump is None:
                raise MetadataError(
                    f"no dump with id {dump_id}", "list dumps with: dblog status -c FILE"
                )
            return dump

    def dumps(self, stream: str, states: Sequence[str] | None = None) -> list[Dump]:
        with self.session(writes=False) as s:
            query = select(Dump).where(Dump.stream == stream).order_by(Dump.id)
            if states:
                query = query.where(Dump.state.in_(states))
            return list(s.scalars(query))

    def dump_tables(self, dump_id: int) -> list[DumpTable]:
        with self.session(writes=False) as s:
            return list(
                s.scalars(
                    select(DumpTable).where(DumpTable.dump_id == dump_id).order_by(DumpTable.id)
                )
            )

    def apply(self, dump_id: int, action: str, reason: str | None = None) -> Dump:
        """pause / resume / cancel, refusing transitions that make no sense."""
        allowed, target = _TRANSITIONS[action]
        with self.session() as s:
            dump = s.get(Dump, dump_id, with_for_update=True)
            if dump is None:
                raise MetadataError(f"no dump with id {dump_id}", "check the id with dblog status")
            if dump.state not in allowed:
                raise MetadataError(
                    f"cannot {action} dump {dump_id}: it is {dump.state}",
                    f"{action} applies to {' or '.join(allowed)} dumps",
                )
            if action == "resume" and dump.started_at is None:
                target = "pending"
            now = utcnow()
            dump.state, dump.updated_at = target, now
            if action == "cancel":
                dump.finished_at, dump.reason = now, reason or "cancelled by request"
                s.execute(
                    update(Chunk)
                    .where(
                        Chunk.dump_id == dump_id,
                        Chunk.state.in_(("pending", "running", "selected")),
                    )
                    .values(state="cancelled", finished_at=now)
                )
            return dump

    def fail(self, dump_id: int, reason: str) -> None:
        with self.session() as s:
            dump = s.get(Dump, dump_id, with_for_update=True)
            if dump is not None and dump.state not in FINAL_DUMP_STATES:
                now = utcnow()
                dump.state, dump.reason, dump.finished_at, dump.updated_at = (
                    "failed",
                    reason,
                    now,
                    now,
                )

    def progress(self, dump_id: int) -> Progress:
        with self.session(writes=False) as s:
            dump = s.get(Dump, dump_id)
            if dump is None:
                raise MetadataError(f"no dump with id {dump_id}", "check the id with dblog status")
            chunks = list(s.scalars(select(Chunk).where(Chunk.dump_id == dump_id)))
            tables = list(s.scalars(select(DumpTable).where(DumpTable.dump_id == dump_id)))
        done = [c for c in chunks if c.state == "done"]
        chunk_size = dump.chunk_size or DumpSettings().chunk_size
        remaining = 0
        for t in tables:
            if not t.exhausted:
                dumped = sum(c.rows_selected for c in done if c.table_name == t.table_name)
                remaining += math.ceil(max(t.estimated_rows - dumped, 1) / chunk_size)
        open_chunks = [c for c in chunks if c.state in ("pending", "running", "selected")]
        return Progress(
            dump_id=dump.id,
            stream=dump.stream,
            state=dump.state,
            reason=dump.reason,
            tables=list(dump.tables),
            chunks_total=len([c for c in chunks if c.state != "cancelled"]) + remaining,
            chunks_done=len(done),
            rows_selected=sum(c.rows_selected for c in done),
            rows_dropped=sum(c.rows_dropped for c in done),
            rows_emitted=sum(c.rows_emitted for c in done),
            created_at=dump.created_at,
            started_at=dump.started_at,
            finished_at=dump.finished_at,
            current_chunks=[
                f"{c.table_name}#{c.seq} ({c.state})" for c in open_chunks if c.state != "pending"
            ],
        )

    # -- chunks (the streaming job's side) --------------------------------------------------

    def runnable_dumps(self, stream: str) -> list[Dump]:
        """Dumps that may hand out chunks now, oldest first; paused ones wait."""
        return self.dumps(stream, ("pending", "running"))

    def claim_pending_chunk(self, dump_id: int, worker: str) -> Chunk | None:
        """Take a chunk that already has bounds or keys (key lists, requeued chunks)."""
        with self.session() as s:
            if self._lock_active_dump(s, dump_id) is None:
                return None
            chunk = s.scalars(
                select(Chunk)
                .where(Chunk.dump_id == dump_id, Chunk.state == "pending")
                .order_by(Chunk.id)
                .limit(1)
                .with_for_update(skip_locked=True)
            ).first()
            if chunk is None:
                return None
            self._start(s, chunk, worker)
            return chunk

    def cut_range_chunk(
        self,
        dump_table_id: int,
        expected_cursor: list[Any] | None,
        upper_key: list[Any] | None,
        worker: str,
    ) -> Chunk | None:
        """Hand out ``(cursor, upper_key]`` as a new chunk, if nobody moved the cursor first.

        ``upper_key`` ``None`` means "to the table's captured maximum": the last chunk.
        The compare-and-set on the cursor lets several workers cut chunks without a lock.
        """
        with self.session() as s:
            dump_id = s.scalar(select(DumpTable.dump_id).where(DumpTable.id == dump_table_id))
            if dump_id is None or self._lock_active_dump(s, dump_id) is None:
                return None
            table = s.get(DumpTable, dump_table_id, with_for_update=True)
            if table is None or table.exhausted or table.cursor != expected_cursor:
                return None
            last = upper_key is None or upper_key == table.max_key
            upper = table.max_key if last else upper_key
            seq = s.scalar(
                select(func.count())
                .select_from(Chunk)
                .where(Chunk.dump_id == table.dump_id, Chunk.table_name == table.table_name)
            )
            chunk = _new_chunk(
                table.dump_id, table.table_name, seq or 0, lower=table.cursor, upper=upper
            )
            table.cursor, table.exhausted = upper, last
            s.add(chunk)
            s.flush()
            self._start(s, chunk, worker)
            return chunk

    def set_table_bound(self, dump_table_id: int, max_key: list[Any] | None) -> DumpTable:
        """Record a table's upper key bound (``None``: it is empty, nothing to cut)."""
        with self.session() as s:
            table = s.get(DumpTable, dump_table_id, with_for_update=True)
            if table is None:
                raise MetadataError(f"no dumped table with id {dump_table_id}")
            if not table.bounded:
                table.max_key, table.bounded, table.exhausted = max_key, True, max_key is None
            return table

    def requeue_chunk(self, chunk_id: int) -> None:
        """Put a claimed chunk back to be selected again later."""
        with self.session() as s:
            chunk = _get_chunk(s, chunk_id)
            if chunk.state in ("running", "selected"):
                chunk.state, chunk.window = "pending", None
                chunk.low_watermark = chunk.high_watermark = None

    def split_chunk(self, chunk_id: int, at_key: list[Any]) -> None:
        """Shrink a range chunk to ``(lower, at_key]``; the rest becomes a new pending chunk.

        Rows inserted into a range after it was cut can fill a page before its upper key; the
        keys past the page must not be skipped.
        """
        with self.session() as s:
            chunk = _get_chunk(s, chunk_id)
            seq = s.scalar(
                select(func.count())
                .select_from(Chunk)
                .where(Chunk.dump_id == chunk.dump_id, Chunk.table_name == chunk.table_name)
            )
            rest = _new_chunk(
                chunk.dump_id, chunk.table_name, seq or 0, lower=at_key, upper=chunk.upper_key
            )
            chunk.upper_key = at_key
            s.add(rest)

    @staticmethod
    def _lock_active_dump(s: Session, dump_id: int) -> Dump | None:
        """Lock the dump row first, as cancel does, so no chunk starts after a cancel or pause."""
        dump = s.get(Dump, dump_id, with_for_update=True)
        return dump if dump is not None and dump.state in ("pending", "running") else None

    def _start(self, s: Session, chunk: Chunk, worker: str) -> None:
        now = utcnow()
        chunk.state, chunk.claimed_by, chunk.started_at = "running", worker, now
        chunk.attempts += 1
        dump = s.get(Dump, chunk.dump_id)
        assert dump is not None
        if dump.state == "pending":
            dump.state, dump.started_at = "running", now
        dump.updated_at = now

    def record_window(
        self, chunk_id: int, window: dict[str, Any], low: str | None = None, high: str | None = None
    ) -> None:
        with self.session() as s:
            chunk = _get_chunk(s, chunk_id)
            chunk.window = window
            chunk.low_watermark = low or chunk.low_watermark
            chunk.high_watermark = high or chunk.high_watermark

    def mark_selected(self, chunk_id: int, rows_selected: int) -> None:
        with self.session() as s:
            chunk = _get_chunk(s, chunk_id)
            if chunk.state != "running":  # cancelled while its SELECT ran
                return
            chunk.state, chunk.rows_selected, chunk.selected_at = (
                "selected",
                rows_selected,
                utcnow(),
            )

    def complete_chunk(self, chunk_id: int, selected: int, dropped: int, emitted: int) -> None:
        """Record a chunk every sink has committed; finish its dump if it was the last one."""
        with self.session() as s:
            chunk = _get_chunk(s, chunk_id)
            if chunk.state in ("done", "cancelled"):
                return
            now = utcnow()
            chunk.state, chunk.finished_at = "done", now
            chunk.rows_selected, chunk.rows_dropped, chunk.rows_emitted = selected, dropped, emitted
            s.flush()
            self._finish_if_complete(s, chunk.dump_id, now)

    def _finish_if_complete(self, s: Session, dump_id: int, now: datetime) -> None:
        dump = s.get(Dump, dump_id, with_for_update=True)
        assert dump is not None
        if dump.state in FINAL_DUMP_STATES:
            return
        open_tables = s.scalar(
            select(func.count())
            .select_from(DumpTable)
            .where(DumpTable.dump_id == dump_id, DumpTable.exhausted.is_(False))
        )
        open_chunks = s.scalar(
            select(func.count())
            .select_from(Chunk)
            .where(Chunk.dump_id == dump_id, Chunk.state.in_(("pending", "running", "selected")))
        )
        if not open_tables and not open_chunks:
            dump.state, dump.finished_at, dump.updated_at = "done", now, now

    def finish_empty_dumps(self, stream: str) -> None:
        """A dump of empty tables has no chunk to complete it: close it here."""
        now = utcnow()
        with self.session() as s:
            for dump in s.scalars(
                select(Dump).where(Dump.stream == stream, Dump.state.in_(("pending", "running")))
            ):
                self._finish_if_complete(s, dump.id, now)

    def requeue_inflight(self, stream: str, keep: Collection[int] = ()) -> int:
        """After a restart: chunks claimed but not completed are selected again.

        ``keep``: chunks whose output is already durable downstream (the stream's spool) and
        only waits to be committed; they are left as they are.
        """
        with self.session() as s:
            ids = select(Dump.id).where(Dump.stream == stream)
            result = s.execute(
                update(Chunk)
                .where(Chunk.dump_id.in_(ids), Chunk.state.in_(("running", "selected")))
                .where(Chunk.id.not_in(list(keep)))
                .values(state="pending", window=None, low_watermark=None, high_watermark=None)
            )
            return result.rowcount or 0

    def chunks(self, dump_id: int) -> list[Chunk]:
        with self.session(writes=False) as s:
            return list(s.scalars(select(Chunk).where(Chunk.dump_id == dump_id).order_by(Chunk.id)))

    def chunk(self, chunk_id: int) -> Chunk:
        with self.session() as s:
            return _get_chunk(s, chunk_id)

    # -- controls and stream state -----------------------------------------------------------

    def controls(self, stream: str, defaults: DumpSettings) -> DumpSettings:
        """The stream's settings now: values set at runtime override the config file's."""
        with self.session(writes=False) as s:
            row = s.get(Control, stream)
        if row is None:
            return defaults
        return DumpSettings(
            chunk_size=row.chunk_size or defaults.chunk_size,
            delay_ms=defaults.delay_ms if row.delay_ms is None else row.delay_ms,
            parallelism=row.parallelism or defaults.parallelism,
        )

    def set_controls(
        self,
        stream: str,
        chunk_size: int | None = None,
        delay_ms: int | None = None,
        parallelism: int | None = None,
    ) -> None:
        for name, value, low in (
            ("chunk size", chunk_size, 1),
            ("delay", delay_ms, 0),
            ("parallelism", parallelism, 1),
        ):
            if value is not None and value < low:
                raise MetadataError(f"{name} must be >= {low}, got {value}")
        with self.session() as s:
            row = s.get(Control, stream, with_for_update=True)
            if row is None:
                row = Control(stream=stream, updated_at=utcnow())
                s.add(row)
            if chunk_size is not None:
                row.chunk_size = chunk_size
            if delay_ms is not None:
                row.delay_ms = delay_ms
            if parallelism is not None:
                row.parallelism = parallelism
            row.updated_at = utcnow()

    def stream_state(self, stream: str) -> StreamState | None:
        with self.session(writes=False) as s:
            return s.get(StreamState, stream)

    def save_stream_state(self, stream: str, **values: Any) -> None:
        with self.session() as s:
            row = _stream_row(s, stream)
            for key, value in values.items():
                setattr(row, key, value)


def _stream_row(s: Session, stream: str) -> StreamState:
    """The stream's state row, locked; created (token 0) on first use."""
    row = s.get(StreamState, stream, with_for_update=True)
    if row is None:
        row = StreamState(stream=stream, fencing_token=0)
        s.add(row)
    return row


def _new_chunk(
    dump_id: int,
    table: str,
    seq: int,
    *,
    lower: list[Any] | None = None,
    upper: list[Any] | None = None,
    keys: list[list[Any]] | None = None,
) -> Chunk:
    return Chunk(
        dump_id=dump_id,
        table_name=table,
        seq=seq,
        lower_key=lower,
        upper_key=upper,
        keys=keys,
        state="pending",
        attempts=0,
        rows_selected=0,
        rows_dropped=0,
        rows_emitted=0,
    )


def _get_chunk(s: Session, chunk_id: int) -> Chunk:
    chunk = s.get(Chunk, chunk_id, with_for_update=True)
    if chunk is None:
        raise MetadataError(f"no chunk with id {chunk_id}")
    return chunk
