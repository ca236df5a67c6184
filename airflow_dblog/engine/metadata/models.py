"""SQLAlchemy models of the metadata tables. Alembic migrations in ``migrations/`` create them.

A dump names what to capture; ``dump_tables`` carries each table's keyset cursor (the last
primary key handed to a chunk) and its maximum key, read by the stream when it cuts the table's
first chunk (``bounded``): rows inserted later are left to the log, which the stream was already
reading, and the dump ends under constant inserts. Chunks are cut
from that cursor when claimed, so a chunk-size change applies to the next chunk.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import JSON, BigInteger, DateTime, ForeignKey, Integer, String, Text
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

FINAL_DUMP_STATES = ("done", "failed", "cancelled")
VERIFY_MODES = ("repair", "dry-run")

# SQLite only auto-increments INTEGER PRIMARY KEY; elsewhere ids are 64-bit.
Id = BigInteger().with_variant(Integer(), "sqlite")


class Base(DeclarativeBase):
    pass


class Dump(Base):
    __tablename__ = "dblog_dumps"

    id: Mapped[int] = mapped_column(Id, primary_key=True, autoincrement=True)
    stream: Mapped[str] = mapped_column(String(128), index=True)
    kind: Mapped[str] = mapped_column(String(16))  # all | tables | keys
    tables: Mapped[list[str]] = mapped_column(JSON)
    requested_by: Mapped[str] = mapped_column(String(256), default="")
    # pending | running | paused | done | failed | cancelled (the last three: FINAL_DUMP_STATES)
    state: Mapped[str] = mapped_column(String(16), default="pending", index=True)
    reason: Mapped[str | None] = mapped_column(Text, nullable=True)
    chunk_size: Mapped[int | None] = mapped_column(Integer, nullable=True)
    # a verify dump compares instead of writing: VERIFY_MODES (None: an ordinary dump)
    verify: Mapped[str | None] = mapped_column(String(16), nullable=True)
    created_at: Mapped[datetime] = mapped_column(DateTime)
    started_at: Mapped[datetime | None] = mapped_column(DateTime, nullable=True)
    finished_at: Mapped[datetime | None] = mapped_column(DateTime, nullable=True)
    updated_at: Mapped[datetime] = mapped_column(DateTime)


class DumpTable(Base):
    __tablename__ = "dblog_dump_tables"

    id: Mapped[int] = mapped_column(Id, primary_key=True, autoincrement=True)
    dump_id: Mapped[int] = mapped_column(
        ForeignKey("dblog_dumps.id", ondelete="CASCADE"), index=True
    )
    table_name: Mapped[str] = mapped_column(String(512))
    key_columns: Mapped[list[str]] = mapped_column(JSON)
    max_key: Mapped[list[Any] | None] = mapped_column(JSON, nullable=True)  # None: table was empty
    bounded: Mapped[bool] = mapped_column(default=True)  # max_key read (by the stream)
    # the log position the stream had read when it read max_key (None: before revision 0004)
    bound_position: Mapped[str | None] = mapped_column(String(128), nullable=True)
    cursor: Mapped[list[Any] | None] = mapped_column(JSON, nullable=True)  # last key handed out
    estimated_rows: Mapped[int] = mapped_column(BigInteger, default=0)
    exhausted: Mapped[bool] = mapped_column(default=False)


class Chunk(Base):
    __tablename__ = "dblog_chunks"

    id: Mapped[int] = mapped_column(Id, primary_key=True, autoincrement=True)
    dump_id: Mapped[int] = mapped_column(
        ForeignKey("dblog_dumps.id", ondelete="CASCADE"), index=True
    )
    table_name: Mapped[str] = mapped_column(String(512))
    seq: Mapped[int] = mapped_column(Integer)
    lower_key: Mapped[list[Any] | None] = mapped_column(JSON, nullable=True)  # exclusive
    upper_key: Mapped[list[Any] | None] = mapped_column(JSON, nullable=True)  # inclusive
    keys: Mapped[list[list[Any]] | None] = mapped_column(JSON, nullable=True)  # key-list chunks
    # pending | running | selected | done | failed | cancelled
    state: Mapped[str] = mapped_column(String(16), default="pending", index=True)
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    claimed_by: Mapped[str | None] = mapped_column(String(256), nullable=True)
    low_watermark: Mapped[str | None] = mapped_column(String(64), nullable=True)
    high_watermark: Mapped[str | None] = mapped_column(String(64), nullable=True)
    window: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)
    rows_selected: Mapped[int] = mapped_column(BigInteger, default=0)
    rows_dropped: Mapped[int] = mapped_column(BigInteger, default=0)
    rows_emitted: Mapped[int] = mapped_column(BigInteger, default=0)
    error: Mapped[str | None] = mapped_column(Text, nullable=True)
    # a verify dump's chunk: what the lake's comparison found (core.verify.ChunkVerdict)
    verified: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)
    started_at: Mapped[datetime | None] = mapped_column(DateTime, nullable=True)
    selected_at: Mapped[datetime | None] = mapped_column(DateTime, nullable=True)
    finished_at: Mapped[datetime | None] = mapped_column(DateTime, nullable=True)


class Control(Base):
    """Runtime settings of a stream, read by the running job every few seconds."""

    __tablename__ = "dblog_controls"

    stream: Mapped[str] = mapped_column(String(128), primary_key=True)
    chunk_size: Mapped[int | None] = mapped_column(Integer, nullable=True)
    delay_ms: Mapped[int | None] = mapped_column(Integer, nullable=True)
    parallelism: Mapped[int | None] = mapped_column(Integer, nullable=True)
    updated_at: Mapped[datetime] = mapped_column(DateTime)


class StreamState(Base):
    """Where a stream's log reading stands and who leads it."""

    __tablename__ = "dblog_stream_state"

    stream: Mapped[str] = mapped_column(String(128), primary_key=True)
    position: Mapped[str | None] = mapped_column(String(128), nullable=True)  # committed offset
    source_offset: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)
    fencing_token: Mapped[int] = mapped_column(BigInteger, default=0)
    leader: Mapped[str | None] = mapped_column(String(256), nullable=True)
    last_event_at: Mapped[datetime | None] = mapped_column(DateTime, nullable=True)
    heartbeat_at: Mapped[datetime | None] = mapped_column(DateTime, nullable=True)
    # the source time the committed position stands for (ms since the epoch): the commit time
    # of the last change committed, or when a heartbeat found the log read to its end
    source_ts_ms: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
