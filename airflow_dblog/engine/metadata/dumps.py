"""Dumps and their chunks: the dump state machine (pause, resume, cancel, fail, done) and the
streaming job's chunk claims.

A chunk starts only under a lock on its dump's row, the lock a cancel or pause takes too, so no
chunk starts in a dump that was just cancelled or paused.
"""

from __future__ import annotations

import json
import math
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

from sqlalchemy import func, select, update
from sqlalchemy.orm import Session

from airflow_dblog.config import DumpSettings
from airflow_dblog.core.keys import MAX_KEYS_PER_CHUNK
from airflow_dblog.core.verify import ChunkVerdict, VerifyReport
from airflow_dblog.engine import repairs
from airflow_dblog.engine.metadata.database import MetadataDatabase, utcnow
from airflow_dblog.engine.metadata.models import (
    FINAL_DUMP_STATES,
    VERIFY_MODES,
    Chunk,
    Dump,
    DumpTable,
)
from airflow_dblog.errors import InputError, MetadataError

# action -> (states it applies to, state it leads to)
_TRANSITIONS: dict[str, tuple[tuple[str, ...], str]] = {
    "pause": (("pending", "running"), "paused"),
    "resume": (("paused",), "running"),
    "cancel": (("pending", "running", "paused"), "cancelled"),
}


@dataclass(frozen=True)
class TablePlan:
    """What a dump of one table needs to know up front, gathered from the source by the planner."""

    table: str
    key_columns: list[str]
    estimated_rows: int
    key_chunks: list[list[list[Any]]] | None = None  # specific-key dumps: keys cut into chunks


@dataclass(frozen=True)
class DumpProgress:
    """Where a dump stands: its state, chunks done of the total expected, rows; read by
    ``dblog status``, the sensor and the trigger."""

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
    verify: VerifyReport | None = None  # a verify dump's counts so far

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
            "verify": None if self.verify is None else self.verify.as_dict(),
            "created_at": _iso(self.created_at),
            "started_at": _iso(self.started_at),
            "finished_at": _iso(self.finished_at),
        }

    def rows_per_second(self, now: datetime | None = None) -> float:
        if self.started_at is None:
            return 0.0
        end = self.finished_at or (now or datetime.now(timezone.utc)).replace(tzinfo=None)
        seconds = (end - self.started_at).total_seconds()
        rows = self.rows_emitted if self.verify is None else self.rows_selected
        return rows / seconds if seconds > 0 else 0.0

    def line(self, now: datetime | None = None) -> str:
        """One line for a task log, the same for sensor and trigger: counts, rate and ETA."""
        rate = self.rows_per_second(now)
        eta = "unknown"
        if self.state == "done":
            eta = "0s"
        elif self.chunks_done and self.started_at is not None and rate > 0:
            per_chunk = self.rows_selected / self.chunks_done
            remaining_rows = per_chunk * max(self.chunks_total - self.chunks_done, 0)
            eta = f"{remaining_rows / rate:.0f}s"
        current = ", ".join(self.current_chunks) or "-"
        rows = (
            f"rows emitted {self.rows_emitted}"
            if self.verify is None
            else f"rows selected {self.rows_selected}"
        )
        line = (
            f"dump {self.dump_id} [{self.state}] chunks {self.chunks_done}/"
            f"{self.chunks_total} ({self.percent:.1f}%), {rows}, "
            f"dropped as conflicting {self.rows_dropped}, {rate:.0f} rows/s, ETA {eta}, "
            f"working on {current}"
        )
        return line if self.verify is None else f"{line}; {self.verify.line()}"


# A table's first range chunk is at most this long: its first rows reach the sinks after a
# short SELECT instead of a full chunk's, and the chunks after it run at the configured size
FIRST_CHUNK_ROWS = 1024


def chunk_rows(chunk_size: int, first: bool) -> int:
    """The keys a range chunk is cut at: ``chunk_size``, or less for a table's first chunk."""
    return min(chunk_size, FIRST_CHUNK_ROWS) if first else chunk_size


def _chunks_to_cut(table: DumpTable, rows_cut: int, chunk_size: int) -> int:
    """A table's chunks not cut yet, from its estimated rows less ``rows_cut`` (at least one)."""
    rows = max(table.estimated_rows - rows_cut, 1)
    head = chunk_rows(chunk_size, first=table.cursor is None)
    return 1 + math.ceil(max(rows - head, 0) / chunk_size)


def _iso(value: datetime | None) -> str | None:
    return None if value is None else value.isoformat() + "Z"


@dataclass(frozen=True)
class Claimable:
    """A dump that may hand out chunks now, and where they come from: chunks waiting with
    bounds or keys (``pending``: key lists, requeued or split chunks), else its tables' cursors."""

    dump: Dump
    pending: bool
    tables: list[DumpTable]


class DumpsAndChunks(MetadataDatabase):
    """Creating, reading and controlling dumps (Airflow, the CLI); claiming, cutting and
    completing their chunks (the streaming job)."""

    # -- dumps ------------------------------------------------------------------------------

    def create_dump(
        self,
        stream: str,
        kind: str,
        plans: Sequence[TablePlan],
        requested_by: str = "",
        chunk_size: int | None = None,
        verify: str | None = None,
    ) -> int:
        """Write a dump, its tables and (for specific keys) its chunks in one transaction.

        ``verify``: one of ``VERIFY_MODES`` for a dump that compares instead of writing."""
        if verify is not None and verify not in VERIFY_MODES:
            raise InputError(
                f"unknown verify mode {verify!r}", f"use one of: {', '.join(VERIFY_MODES)}"
            )
        with self.session() as s:
            return _add_dump(s, stream, kind, plans, requested_by, chunk_size, verify)

    def request_repair(
        self,
        table: str,
        key_columns: Sequence[str],
        dump_id: int,
        keys_by_chunk: Mapping[int, Sequence[list[Any]]],
        chunk_size: int = MAX_KEYS_PER_CHUNK,
        reason: str = repairs.EXTRA_KEYS,
    ) -> list[int]:
        """Dump the keys Delta holds that chunks of ``dump_id`` found the source lacking, once
        per chunk (:mod:`~airflow_dblog.engine.repairs`): chunks an earlier request already
        names are left out, so a replayed batch asks for nothing twice, and so are chunks of a
        cancelled dump. Returns the new dumps.

        The follow-up belongs to the stream of ``dump_id``; the check and the creation share
        one transaction, under the stream's fence.
        """
        created: list[int] = []
        per_chunk = max(1, min(chunk_size, MAX_KEYS_PER_CHUNK))
        with self.session() as s:
            repaired = s.get(Dump, dump_id)
            if repaired is None:
                raise MetadataError(f"no dump with id {dump_id}", "list dumps with: dblog status")
            stream = repaired.stream
            named: set[int] = set()
            query = select(Dump.requested_by).where(
                Dump.stream == stream, Dump.kind == "keys", Dump.requested_by.like("dblog repair%")
            )
            for text in s.scalars(query):
                named |= repairs.repaired_chunks(text, dump_id)
            # a cancelled dump's chunk that closed anyway is not completed: it deletes nothing
            named |= set(
                s.scalars(
                    select(Chunk.id).where(
                        Chunk.id.in_(list(keys_by_chunk)), Chunk.state == "cancelled"
                    )
                )
            )
            wanted = [c for c in keys_by_chunk if c not in named and keys_by_chunk[c]]
            for group in repairs.groups(dump_id, wanted, reason):
                unique: dict[str, list[Any]] = {}
                for chunk_id in group:
                    for key in keys_by_chunk[chunk_id]:
                        unique.setdefault(json.dumps(key, sort_keys=True), list(key))
                keys = list(unique.values())
                cut = [keys[i : i + per_chunk] for i in range(0, len(keys), per_chunk)]
                plan = TablePlan(table, list(key_columns), len(keys), cut)
                by = repairs.requested_by(dump_id, group, reason)
                created.append(_add_dump(s, stream, "keys", [plan], by, chunk_size))
        return created

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
            return _dumps(s, stream, states)

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

    def progress(self, dump_id: int) -> DumpProgress:
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
                remaining += _chunks_to_cut(t, dumped, chunk_size)
        open_chunks = [c for c in chunks if c.state in ("pending", "running", "selected")]
        return DumpProgress(
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
            verify=None if dump.verify is None else _report(dump.verify, chunks),
        )

    # -- chunks (the streaming job's side) --------------------------------------------------

    def claimable(self, stream: str) -> list[Claimable]:
        """Dumps that may hand out chunks now, oldest first (paused ones wait), with what to
        claim from each: one read per claim, however a chunk is then taken."""
        with self.session(writes=False) as s:
            dumps = _dumps(s, stream, ("pending", "running"))
            if not dumps:
                return []
            ids = [d.id for d in dumps]
            pending = set(
                s.scalars(
                    select(Chunk.dump_id)
                    .where(Chunk.dump_id.in_(ids), Chunk.state == "pending")
                    .distinct()
                )
            )
            tables: dict[int, list[DumpTable]] = {}
            for table in s.scalars(
                select(DumpTable).where(DumpTable.dump_id.in_(ids)).order_by(DumpTable.id)
            ):
                tables.setdefault(table.dump_id, []).append(table)
        return [Claimable(d, d.id in pending, tables.get(d.id, [])) for d in dumps]

    def chunks_to_select(self, stream: str) -> int:
        """Chunks of the stream's running dumps whose SELECT has not ended: claimed, waiting,
        or not cut yet (estimated from the tables' rows)."""
        with self.session(writes=False) as s:
            dumps = _dumps(s, stream, ("running",))
            if not dumps:
                return 0
            ids = [d.id for d in dumps]
            chunks = list(s.scalars(select(Chunk).where(Chunk.dump_id.in_(ids))))
            tables = list(s.scalars(select(DumpTable).where(DumpTable.dump_id.in_(ids))))
        sizes = {d.id: d.chunk_size or DumpSettings().chunk_size for d in dumps}
        left = 0
        cut: dict[tuple[int, str], int] = {}  # rows in each table's chunks cut so far
        for c in chunks:
            claimed = c.state in ("pending", "running")
            left += claimed
            # a claimed chunk's rows are not counted yet: about a chunk's worth
            rows = sizes[c.dump_id] if claimed else c.rows_selected
            cut[(c.dump_id, c.table_name)] = cut.get((c.dump_id, c.table_name), 0) + rows
        for t in tables:
            if not t.exhausted:
                left += _chunks_to_cut(t, cut.get((t.dump_id, t.table_name), 0), sizes[t.dump_id])
        return left

    def claim_pending_chunk(self, dump_id: int, worker: str) -> Chunk | None:
        """Take a chunk that already has bounds or keys (key lists, requeued chunks)."""
        with self.session() as s:
            dump = self._lock_active_dump(s, dump_id)
            if dump is None:
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
            self._start(chunk, dump, worker)
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
            dump = None if dump_id is None else self._lock_active_dump(s, dump_id)
            if dump is None:
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
            self._start(chunk, dump, worker)  # inserted running, in the commit's one flush
            s.add(chunk)
            return chunk

    def set_table_bound(
        self, dump_table_id: int, max_key: list[Any] | None, position: str | None = None
    ) -> DumpTable:
        """Record a table's upper key bound (``None``: it is empty, nothing to cut) and the log
        position the stream had read when it read the bound."""
        with self.session() as s:
            table = s.get(DumpTable, dump_table_id, with_for_update=True)
            if table is None:
                raise MetadataError(f"no dumped table with id {dump_table_id}")
            if not table.bounded:
                table.max_key, table.bounded, table.exhausted = max_key, True, max_key is None
                table.bound_position = position
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

    @staticmethod
    def _start(chunk: Chunk, dump: Dump, worker: str) -> None:
        now = utcnow()
        chunk.state, chunk.claimed_by, chunk.started_at = "running", worker, now
        chunk.attempts += 1
        if dump.state == "pending":
            dump.state, dump.started_at = "running", now
        dump.updated_at = now

    def mark_selected(
        self,
        chunk_id: int,
        rows_selected: int,
        window: dict[str, Any] | None = None,
        low: str | None = None,
        high: str | None = None,
    ) -> None:
        """The chunk's SELECT is done, and the window its watermark strategy records."""
        with self.session() as s:
            chunk = _get_chunk(s, chunk_id)
            if window is not None:
                chunk.window = window
                chunk.low_watermark = low or chunk.low_watermark
                chunk.high_watermark = high or chunk.high_watermark
            if chunk.state != "running":  # cancelled while its SELECT ran
                return
            chunk.state, chunk.rows_selected, chunk.selected_at = (
                "selected",
                rows_selected,
                utcnow(),
            )

    def table_chunks(self, dump_id: int, table: str) -> tuple[bool, list[int]]:
        """Whether a table's dump gave up (it, or one of the table's chunks, was cancelled or
        failed), and the table's chunks once every one is cut (empty before that)."""
        with self.session(writes=False) as s:
            dump = s.get(Dump, dump_id)
            dumped = s.scalars(
                select(DumpTable).where(DumpTable.dump_id == dump_id, DumpTable.table_name == table)
            ).first()
            if dump is None or dumped is None or dump.state in ("cancelled", "failed"):
                return True, []
            chunks = list(
                s.execute(
                    select(Chunk.id, Chunk.state).where(
                        Chunk.dump_id == dump_id, Chunk.table_name == table
                    )
                )
            )
        if any(state in ("cancelled", "failed") for _, state in chunks):
            return True, []
        return False, sorted(c for c, _ in chunks) if dumped.exhausted else []

    def verify_mode(self, dump_id: int) -> str | None:
        """The dump's verify mode (None: an ordinary dump, or no such dump)."""
        with self.session(writes=False) as s:
            return s.scalar(select(Dump.verify).where(Dump.id == dump_id))

    def record_verdict(self, chunk_id: int, verdict: ChunkVerdict) -> bool:
        """Keep what the lake's comparison of a verify chunk found; the first verdict stays (a
        batch replayed after a crash compares again). Returns whether this one was kept."""
        with self.session() as s:
            chunk = _get_chunk(s, chunk_id)
            if chunk.verified is not None or chunk.state == "cancelled":
                return False
            chunk.verified = verdict.as_record()
            return True

    def complete_chunk(self, chunk_id: int, selected: int, dropped: int, emitted: int) -> None:
        """Record a chunk every sink has committed; finish its dump if it was the last one."""
        with self.session() as s:
            self._complete(s, [(chunk_id, selected, dropped, emitted)])

    def _complete(self, s: Session, closed: Sequence[tuple[int, int, int, int]]) -> None:
        """Chunks done (id, rows selected, dropped, emitted), each dump finished if complete:
        the chunks read in one statement and their dumps checked once each."""
        if not closed:
            return
        ids = [c[0] for c in closed]
        chunks = {
            c.id: c
            for c in s.scalars(
                select(Chunk).where(Chunk.id.in_(ids)).order_by(Chunk.id).with_for_update()
            )
        }
        now = utcnow()
        dump_ids: set[int] = set()
        for chunk_id, selected, dropped, emitted in closed:
            chunk = chunks.get(chunk_id)
            if chunk is None:
                raise MetadataError(f"no chunk with id {chunk_id}")
            if chunk.state in ("done", "cancelled"):
                continue
            chunk.state, chunk.finished_at = "done", now
            chunk.rows_selected, chunk.rows_dropped, chunk.rows_emitted = selected, dropped, emitted
            dump_ids.add(chunk.dump_id)
        s.flush()
        for dump_id in sorted(dump_ids):
            self._finish_if_complete(s, dump_id, now)

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


def _add_dump(
    s: Session,
    stream: str,
    kind: str,
    plans: Sequence[TablePlan],
    requested_by: str,
    chunk_size: int | None,
    verify: str | None = None,
) -> int:
    """A new pending dump, its tables and (for specific keys) its chunks, in ``s``."""
    now = utcnow()
    dump = Dump(
        stream=stream,
        kind=kind,
        tables=[p.table for p in plans],
        requested_by=requested_by,
        state="pending",
        chunk_size=chunk_size,
        verify=verify,
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


def _report(mode: str, chunks: Sequence[Chunk]) -> VerifyReport:
    verdicts = [(c.table_name, ChunkVerdict.from_record(c.verified)) for c in chunks if c.verified]
    return VerifyReport.of(mode, verdicts)


def _dumps(s: Session, stream: str, states: Sequence[str] | None) -> list[Dump]:
    """The stream's dumps, oldest first (in ``states`` only, when given)."""
    query = select(Dump).where(Dump.stream == stream).order_by(Dump.id)
    if states:
        query = query.where(Dump.state.in_(states))
    return list(s.scalars(query))


def _get_chunk(s: Session, chunk_id: int) -> Chunk:
    chunk = s.get(Chunk, chunk_id, with_for_update=True)
    if chunk is None:
        raise MetadataError(f"no chunk with id {chunk_id}")
    return chunk
