"""Claim the next chunk of a dump, send its SELECT to a runner, register it with the merge.

A chunk runs in three parts (:mod:`~airflow_dblog.sources.watermark`): the strategy opens it on
the driver (MySQL's ``table`` mode registers its window and writes the low watermark), the
runner selects it where it runs (a Spark executor) into its chunk file, and once the runner
is done the driver registers the window if it was not yet, tells the merge the rows are ready
and writes the high watermark. The capture thread reads the log all the while: a window
registered after the log went past its SELECT judges those changes from the merge's memory,
which is kept back to a horizon read before the oldest SELECT in flight was sent.

A table's upper key bound is read here, by the stream, when its first chunk is cut: only then is
the stream's log position durable, so any row beyond the bound is in the log. An error that
belongs to one chunk (a key the table no longer accepts, a dropped table, a key change) fails
that chunk's dump with its reason; the stream goes on.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

from airflow_dblog.core.events import TableId
from airflow_dblog.core.keys import from_json, to_json
from airflow_dblog.core.merge import HistoryLost, Seen, WatermarkMerge
from airflow_dblog.engine.chunk_file import ChunkFiles, ChunkRows, ChunkSelected, Covered
from airflow_dblog.engine.chunk_runner import ChunkRunner
from airflow_dblog.engine.chunk_task import ChunkTask, error_of
from airflow_dblog.engine.metadata import MetadataStore
from airflow_dblog.engine.metadata.dumps import Claimable, chunk_rows
from airflow_dblog.engine.metadata.models import Chunk, DumpTable
from airflow_dblog.engine.typed_values import stored_columns
from airflow_dblog.errors import DblogError, FencedError, MetadataError, SourceError
from airflow_dblog.sources.base import Key, Source, TableSchema, Wake
from airflow_dblog.sources.watermark import Opened, Selection, WatermarkStrategy

log = logging.getLogger(__name__)

RESELECT_ATTEMPTS = 3
# A range chunk's page may hold this share of its size more than the cut counted: rows inserted
# into its range between the cut and the SELECT then stay in the chunk, instead of filling the
# page before its upper key and leaving the last few keys to a chunk (a SELECT, a window, a
# Spark job) of their own
PAGE_SLACK = 0.25
HISTORY_RETRY_S = 1.0  # wait before a chunk whose window cannot be judged yet is tried again


def page_limit(chunk_size: int) -> int:
    """The LIMIT of a range chunk cut ``chunk_size`` keys long (:data:`PAGE_SLACK`)."""
    return chunk_size + max(1, int(chunk_size * PAGE_SLACK))


@dataclass
class _InFlight:
    """A chunk whose SELECT was sent and is not done yet."""

    chunk: Chunk
    task: ChunkTask
    opened: Opened
    future: Future[ChunkSelected]
    horizon: Callable[[Seen], bool] | None  # read before it was sent
    known: TableSchema  # the table's schema before the SELECT
    attempt: int
    discarded: bool = False  # its dump was cancelled or failed meanwhile


class ChunkExecutor:
    def __init__(
        self,
        source: Source,
        store: MetadataStore,
        merge: WatermarkMerge,
        stream: str,
        strategy: WatermarkStrategy[Any],
        worker: str,
        runner: ChunkRunner,
        files: ChunkFiles,
        url: str,
        wake: Wake | None = None,
        typed: bool = False,
    ) -> None:
        """``wake`` is set when a SELECT ends: the capture's log read stops waiting for the
        log, and the chunk's watermark follows at once. ``typed``: chunk files hold the
        columns typed too (:mod:`~airflow_dblog.engine.typed_values`; the stream writes to
        Delta)."""
        self.typed = typed
        self.source, self.store, self.merge = source, store, merge
        self.stream, self.strategy, self.worker = stream, strategy, worker
        self.runner, self.files, self.url, self.wake = runner, files, url, wake
        self._schemas: dict[TableId, TableSchema] = {}  # as described after the last chunk
        # (dump id, table) -> its bound and where the log stood when it was read
        self._bounds: dict[tuple[int, str], tuple[list[Any] | None, str | None]] = {}
        self._in_flight: dict[int, _InFlight] = {}  # in the order they were sent
        self._ahead: Chunk | None = None  # claimed while SELECTs ran, not started yet
        self._retry_at = 0.0

    def refresh_horizon(self) -> None:
        """Forget remembered changes that no window, registered now or later, can need.

        A SELECT in flight will register its window later; its snapshot may be older than a
        horizon read now, so while one runs the horizon read before the oldest was sent holds.
        """
        if not self.strategy.history:
            return
        oldest = next(iter(self._in_flight.values()), None)
        horizon = self.strategy.horizon() if oldest is None else oldest.horizon
        if horizon is not None:
            self.merge.forget(horizon)

    def ready(self) -> bool:
        """Whether a chunk may start now: its window must be able to judge the past."""
        if not self.runner.ready or time.monotonic() < self._retry_at:
            return False
        if self.strategy.history and not self.merge.remembers_all:
            self.refresh_horizon()
            if not self.merge.remembers_all:
                self._retry_at = time.monotonic() + HISTORY_RETRY_S
                return False
        return True

    def busy(self) -> int:
        """Chunks started and not closed: SELECTs in flight and windows open."""
        return len(self._started())

    def _started(self) -> set[int]:
        return set(self._in_flight) | self.merge.open_ids()

    def has_room(self, parallelism: int) -> bool:
        """Whether another chunk may start: fewer than ``parallelism`` SELECTs run, and at
        most ``parallelism`` chunks whose SELECT ended wait for their window to close. So the
        next chunk's SELECT runs while the last one's high watermark is written and read
        back, and a capture that falls behind the log holds the dump back."""
        selecting = {i for i, f in self._in_flight.items() if not f.future.done()}
        waiting = self._started() - selecting
        return len(selecting) < parallelism and len(waiting) <= parallelism

    def selects_ended(self) -> bool:
        """Whether a SELECT ended that :meth:`poll` has not taken yet."""
        return any(f.future.done() for f in self._in_flight.values())

    @property
    def in_flight(self) -> int:
        return len(self._in_flight)

    def claim(self, chunk_size: int) -> Chunk | None:
        """The oldest runnable dump's next chunk: requeued or key-list chunks first."""
        ahead, self._ahead = self._ahead, None
        if ahead is not None:
            if self.store.dump(ahead.dump_id).state in ("pending", "running"):
                return ahead
            self.store.requeue_chunk(ahead.id)  # paused meanwhile (a cancel cancelled it)
        dumps = self.store.claimable(self.stream)
        if not dumps:
            return None  # the common case between dumps: one query per step, no more
        for claimable in dumps:
            try:
                chunk = self._claim_in(claimable, chunk_size)
            except DblogError as err:
                self._fail_if_own(claimable.dump.id, "cutting its next chunk", err)
                continue
            if chunk is not None:
                return chunk
        self.store.finish_empty_dumps(self.stream)
        return None

    def claim_ahead(self, chunk_size: int) -> bool:
        """Claim the next chunk while SELECTs run, to start it when a slot frees: a chunk's
        metadata work (cut, claim) then overlaps the SELECT before it instead of following
        it. Whether there is one."""
        if self._ahead is None:
            self._ahead = self.claim(chunk_size)
        return self._ahead is not None

    def _claim_in(self, claimable: Claimable, chunk_size: int) -> Chunk | None:
        if claimable.pending:
            chunk = self.store.claim_pending_chunk(claimable.dump.id, self.worker)
            if chunk is not None:
                return chunk
        for table in claimable.tables:
            if not table.bounded:
                table = self._read_bound(table)
            if table.exhausted:
                continue
            table_id = TableId.parse(table.table_name)
            after = self._typed(table_id, table.cursor)
            upto = self._typed(table_id, table.max_key)
            assert upto is not None
            size = chunk_rows(chunk_size, first=table.cursor is None)
            bound = self.source.next_bound(table_id, after, upto, size)
            chunk = self.store.cut_range_chunk(
                table.id, table.cursor, None if bound is None else to_json(bound), self.worker
            )
            if chunk is not None:
                return chunk
        return None

    def _read_bound(self, table: DumpTable) -> DumpTable:
        """The table's largest key now, after the stream's start is durable (or: it is empty)."""
        table_id = TableId.parse(table.table_name)
        schema = self.source.describe(table_id)
        if list(schema.key) != list(table.key_columns):
            raise DblogError(
                f"the primary key of {table_id} is ({', '.join(schema.key)}), not"
                f" ({', '.join(table.key_columns)}) as when the dump was requested",
                "request a new dump of the table",
            )
        max_key = self.source.max_key(table_id)
        log.info("dump %s: %s bounded at key %s", table.dump_id, table_id, max_key)
        read = self.merge.last_position  # the log read so far: later inserts come after it
        return self.store.set_table_bound(
            table.id,
            None if max_key is None else to_json(max_key),
            None if read is None else str(read),
        )

    # -------------------------------------------------------------------------- running

    def start(self, chunk: Chunk, chunk_size: int) -> None:
        """Send a claimed chunk's SELECT; it runs while the log is read. A chunk's own error
        fails its dump; a source that stopped answering, a metadata outage or a lost lease stop
        the stream."""
        try:
            table = TableId.parse(chunk.table_name)
            known = self._schemas.get(table) or self.source.describe(table)
            self._send(chunk, self._selection(table, chunk, page_limit(chunk_size)), known, 1)
        except DblogError as err:
            err = self._key_change(chunk) or err
            self._fail_if_own(chunk.dump_id, f"chunk {chunk.table_name}#{chunk.seq}", err)

    def _send(self, chunk: Chunk, selection: Selection, known: TableSchema, attempt: int) -> None:
        horizon = self.strategy.horizon() if self.strategy.history else None
        task = ChunkTask(
            chunk.id,
            ChunkFiles.new_folder(chunk.id),
            selection.table,
            type(self.strategy),
            self.source.kind,
            self.url,
            self.source.lineage_epoch,
            selection.lower,
            selection.upper,
            selection.limit,
            selection.keys,
            stored_columns(known.columns) if self.typed else (),
        )
        opened = self.strategy.open(
            lambda window: self.merge.open_chunk(chunk.id, chunk.dump_id, selection.table, window)
        )
        future = self.runner.submit(task)
        wake = self.wake
        if wake is not None:
            future.add_done_callback(lambda _: wake.set())
        self._in_flight[chunk.id] = _InFlight(chunk, task, opened, future, horizon, known, attempt)

    def poll(self) -> int:
        """Register the chunks whose SELECT is done (before the log is fed further)."""
        done = [f for f in self._in_flight.values() if f.future.done()]
        for flight in done:
            del self._in_flight[flight.chunk.id]
            chunk = flight.chunk
            try:
                self._finish(flight)
            except HistoryLost as err:
                log.warning("chunk %s#%s: %s", chunk.table_name, chunk.seq, err)
                self._drop(flight)
                self.store.requeue_chunk(chunk.id)
                self._retry_at = time.monotonic() + HISTORY_RETRY_S
            except DblogError as err:
                self._drop(flight)
                self._fail_if_own(chunk.dump_id, f"chunk {chunk.table_name}#{chunk.seq}", err)
        return len(done)

    def _drop(self, flight: _InFlight) -> None:
        self.merge.cancel_chunk(flight.chunk.id)
        self.files.delete(flight.task.folder)

    def _finish(self, flight: _InFlight) -> None:
        """The rows are in the chunk file: window, rows, high watermark; then the table is
        described again. If its schema changed since the SELECT was sent, the ALTER may lie
        inside the window, where rows of the old shape would land after the change, so the
        chunk is selected again (its window is still open: this thread feeds the merge). A
        changed primary key fails the dump: its chunks and cursors are keyed on the old one.
        """
        chunk, task = flight.chunk, flight.task
        selected = flight.future.result()  # a failed Spark job stops the stream
        if flight.discarded:
            self._drop(flight)
            return
        error = error_of(selected)
        if error is not None:
            raise self._key_change(chunk) or error
        window = self.strategy.window(flight.opened, selected.info)
        if window is not None:
            self.merge.open_chunk(chunk.id, chunk.dump_id, task.table, window)
        split = (
            chunk.keys is None
            and selected.count == task.limit
            and selected.last_key != chunk.upper_key
        )
        covers = self._covered(chunk, selected, split)
        rows = ChunkRows(task.folder, selected.key_span, covers, selected.typed)
        self.merge.rows_ready(chunk.id, selected.count, rows, absent=selected.absent)
        self.strategy.finish(flight.opened)
        schema = self.source.describe(task.table)
        self._schemas[task.table] = schema
        if schema.key != flight.known.key:
            raise self._key_changed(task.table, chunk.dump_id, flight.known.key, schema.key)
        if schema != flight.known:
            if flight.attempt >= RESELECT_ATTEMPTS:
                raise DblogError(
                    f"the schema of {task.table} changed during each of {RESELECT_ATTEMPTS}"
                    f" selects of chunk #{chunk.seq}; retry once the ALTERs are done"
                )
            log.info(
                "chunk %s#%s of dump %s: the table's schema changed while it was selected;"
                " selecting it again (attempt %d)",
                task.table, chunk.seq, chunk.dump_id, flight.attempt + 1,
            )  # fmt: skip
            self._drop(flight)
            self._send(chunk, task.selection(), schema, flight.attempt + 1)
            return
        if split:
            # the page filled before the upper key (rows inserted since the cut, or a smaller
            # chunk size): the rest of the range becomes its own chunk
            assert selected.last_key is not None
            self.store.split_chunk(chunk.id, selected.last_key)
        self.store.mark_selected(chunk.id, selected.count, *self.strategy.record(flight.opened))
        log.info(
            "chunk %s#%s of dump %s: %d rows selected (by pid %d)",
            task.table, chunk.seq, chunk.dump_id, selected.count, selected.pid,
        )  # fmt: skip

    def _covered(self, chunk: Chunk, selected: ChunkSelected, split: bool) -> Covered | None:
        """The keys a range chunk read all of (None for a key list): up to its last row when
        the page filled early, else up to its bound; the table's last chunk (its bound is the
        table's) covers what lies above too."""
        if chunk.keys is None and chunk.upper_key is not None:
            if split:
                assert selected.last_key is not None
                return Covered(chunk.lower_key, selected.last_key)
            bound = self._bounds.get((chunk.dump_id, chunk.table_name))
            if bound is None:
                for table in self.store.dump_tables(chunk.dump_id):
                    if table.bounded:
                        key = (chunk.dump_id, table.table_name)
                        self._bounds[key] = (table.max_key, table.bound_position)
                bound = self._bounds.get((chunk.dump_id, chunk.table_name), (None, None))
            max_key, position = bound
            last = max_key is not None and chunk.upper_key == max_key
            return Covered(chunk.lower_key, chunk.upper_key, last, position if last else None)
        return None

    def _key_change(self, chunk: Chunk) -> DblogError | None:
        """The primary key changed since the dump was requested: that, not a key that no longer
        fits the table, is the reason to give."""
        table = TableId.parse(chunk.table_name)
        try:
            key = self.source.describe(table).key
        except DblogError:
            return None
        for dumped in self.store.dump_tables(chunk.dump_id):
            if dumped.table_name == chunk.table_name and list(dumped.key_columns) != list(key):
                return self._key_changed(table, chunk.dump_id, dumped.key_columns, key)
        return None

    @staticmethod
    def _key_changed(
        table: TableId, dump_id: int, was: Sequence[str], now: Sequence[str]
    ) -> DblogError:
        return DblogError(
            f"the primary key of {table} changed from ({', '.join(was)}) to ({', '.join(now)})"
            f" during dump {dump_id}; dumps cannot follow a key change: run a new dump of the"
            " table"
        )

    def key_columns(self, table: TableId) -> tuple[str, ...]:
        """The table's primary key columns, as described after its last chunk."""
        return (self._schemas.get(table) or self.source.describe(table)).key

    def cancel_dump(self, dump_id: int) -> None:
        """Forget a dump's open windows; its SELECTs in flight are dropped when they end."""
        self.merge.cancel_dump(dump_id)
        if self._ahead is not None and self._ahead.dump_id == dump_id:
            self._ahead = None
        for flight in self._in_flight.values():
            if flight.chunk.dump_id == dump_id:
                flight.discarded = True

    def _fail_if_own(self, dump_id: int, what: str, err: DblogError) -> None:
        """Fail the dump for an error of its own; re-raise what concerns the whole stream."""
        if isinstance(err, (FencedError, MetadataError)):
            raise err
        if isinstance(err, SourceError):
            try:
                self.source.ping()
            except SourceError:
                raise err from None  # the source is down, not this dump's fault
        self.cancel_dump(dump_id)
        reason = f"{what}: {err}"
        self.store.fail(dump_id, reason)
        log.error("dump %s failed: %s", dump_id, reason)

    def _selection(self, table: TableId, chunk: Chunk, limit: int) -> Selection:
        if chunk.keys is not None:
            keys = [self._typed(table, k) for k in chunk.keys]
            return Selection(table, keys=keys)  # type: ignore[arg-type]
        upper = self._typed(table, chunk.upper_key)
        assert upper is not None
        return Selection(table, self._typed(table, chunk.lower_key), upper, limit)

    def _typed(self, table: TableId, key: list[Any] | None) -> Key | None:
        if key is None:
            return None
        return tuple(self.source.coerce_key(table, from_json(key)))

    def close(self) -> None:
        for flight in self._in_flight.values():
            flight.discarded = True
        self._in_flight.clear()
