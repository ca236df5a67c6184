"""Claim the next chunk of a dump and run it: low watermark, keyset SELECT, high watermark.

The executor runs while the log reader is paused (same thread, between reads), so a chunk's
window is registered with the merge before the log items that could fall inside it are fed; the
changes fed before it are judged from the merge's memory. How the window is bounded is the
watermark strategy's business (:mod:`~airflow_dblog.engine.watermarks`, one class per mode and
source kind).

A table's upper key bound is read here, by the stream, when its first chunk is cut: only then is
the stream's log position durable, so any row beyond the bound is in the log. An error that
belongs to one chunk (a key the table no longer accepts, a dropped table, a key change) fails
that chunk's dump with its reason; the stream goes on.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from airflow_dblog.core.events import TableId
from airflow_dblog.core.keys import from_json, to_json
from airflow_dblog.core.merge import HistoryLost, WatermarkMerge
from airflow_dblog.engine.metadata import MetadataStore
from airflow_dblog.engine.metadata.models import Chunk, DumpTable
from airflow_dblog.engine.watermarks import Rows, Selection, WatermarkStrategy
from airflow_dblog.errors import DblogError, FencedError, MetadataError, SourceError
from airflow_dblog.sources.base import Key, Source, TableSchema

log = logging.getLogger(__name__)

RESELECT_ATTEMPTS = 3
HISTORY_RETRY_S = 1.0  # wait before a chunk whose window cannot be judged yet is tried again


class ChunkExecutor:
    def __init__(
        self,
        source: Source,
        store: MetadataStore,
        merge: WatermarkMerge,
        stream: str,
        strategy: WatermarkStrategy[Any],
        worker: str,
    ) -> None:
        self.source, self.store, self.merge = source, store, merge
        self.stream, self.strategy, self.worker = stream, strategy, worker
        self._schemas: dict[TableId, TableSchema] = {}  # as described after the last chunk
        self._retry_at = 0.0

    def refresh_horizon(self) -> None:
        """Forget remembered changes that no later window can need."""
        if self.strategy.history:
            horizon = self.strategy.horizon()
            if horizon is not None:
                self.merge.forget(horizon)

    def ready(self) -> bool:
        """Whether a chunk may start now: its window must be able to judge the past."""
        if time.monotonic() < self._retry_at:
            return False
        if self.strategy.history and not self.merge.remembers_all:
            self.refresh_horizon()
            if not self.merge.remembers_all:
                self._retry_at = time.monotonic() + HISTORY_RETRY_S
                return False
        return True

    def claim(self, chunk_size: int) -> Chunk | None:
        """The oldest runnable dump's next chunk: requeued or key-list chunks first."""
        dumps = self.store.runnable_dumps(self.stream)
        if not dumps:
            return None  # the common case between dumps: one query per step, no more
        for dump in dumps:
            try:
                chunk = self._claim_in(dump.id, chunk_size)
            except DblogError as err:
                self._fail_if_own(dump.id, "cutting its next chunk", err)
                continue
            if chunk is not None:
                return chunk
        self.store.finish_empty_dumps(self.stream)
        return None

    def _claim_in(self, dump_id: int, chunk_size: int) -> Chunk | None:
        chunk = self.store.claim_pending_chunk(dump_id, self.worker)
        if chunk is not None:
            return chunk
        for table in self.store.dump_tables(dump_id):
            if not table.bounded:
                table = self._read_bound(table)
            if table.exhausted:
                continue
            table_id = TableId.parse(table.table_name)
            after = self._typed(table_id, table.cursor)
            upto = self._typed(table_id, table.max_key)
            assert upto is not None
            bound = self.source.next_bound(table_id, after, upto, chunk_size)
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
        return self.store.set_table_bound(table.id, None if max_key is None else to_json(max_key))

    def run(self, chunk: Chunk, chunk_size: int) -> int:
        """Execute a claimed chunk and register it with the merge; returns the rows selected.

        Errors that belong to the chunk fail its dump (and return 0); a source that stopped
        answering, a metadata outage or a lost lease stop the stream as before.
        """
        try:
            return self._run(chunk, chunk_size)
        except HistoryLost as err:
            log.warning("chunk %s#%s: %s", chunk.table_name, chunk.seq, err)
            self.store.requeue_chunk(chunk.id)
            self._retry_at = time.monotonic() + HISTORY_RETRY_S
            return 0
        except DblogError as err:
            self._fail_if_own(chunk.dump_id, f"chunk {chunk.table_name}#{chunk.seq}", err)
            return 0

    def _fail_if_own(self, dump_id: int, what: str, err: DblogError) -> None:
        """Fail the dump for an error of its own; re-raise what concerns the whole stream."""
        if isinstance(err, (FencedError, MetadataError)):
            raise err
        if isinstance(err, SourceError):
            try:
                self.source.ping()
            except SourceError:
                raise err from None  # the source is down, not this dump's fault
        self.merge.cancel_dump(dump_id)
        reason = f"{what}: {err}"
        self.store.fail(dump_id, reason)
        log.error("dump %s failed: %s", dump_id, reason)

    def _run(self, chunk: Chunk, chunk_size: int) -> int:
        """The table is described again once the window is closed: if its schema changed since
        the last chunk, the ALTER may lie between the SELECT and the high watermark, where rows
        of the old shape would land after the change, so the chunk is selected again. A changed
        primary key fails the dump: its chunks and cursors are keyed on the old one.
        """
        table = TableId.parse(chunk.table_name)
        known = self._schemas.get(table) or self.source.describe(table)
        for attempt in range(1, RESELECT_ATTEMPTS + 1):
            rows = self._select_in_window(self._selection(table, chunk, chunk_size), chunk)
            schema = self.source.describe(table)
            self._schemas[table] = schema
            if schema.key != known.key:
                raise DblogError(
                    f"the primary key of {table} changed from ({', '.join(known.key)}) to"
                    f" ({', '.join(schema.key)}) during dump {chunk.dump_id}; dumps cannot follow"
                    " a key change: run a new dump of the table"
                )
            if schema == known:
                break
            log.info(
                "chunk %s#%s of dump %s: the table's schema changed while it was selected;"
                " selecting it again (attempt %d)",
                table, chunk.seq, chunk.dump_id, attempt + 1,
            )  # fmt: skip
            self.merge.cancel_chunk(chunk.id)
            known = schema
        else:
            raise DblogError(
                f"the schema of {table} changed during each of {RESELECT_ATTEMPTS} selects of"
                f" chunk #{chunk.seq}; retry once the ALTERs are done"
            )
        if (
            chunk.keys is None
            and len(rows) == chunk_size
            and to_json(rows[-1][0]) != chunk.upper_key
        ):
            # the page filled before the upper key (rows inserted since the cut, or a smaller
            # chunk size): the rest of the range becomes its own chunk
            self.store.split_chunk(chunk.id, to_json(rows[-1][0]))
        self.store.mark_selected(chunk.id, len(rows))
        log.info(
            "chunk %s#%s of dump %s: %d rows selected", table, chunk.seq, chunk.dump_id, len(rows)
        )
        return len(rows)

    def _select_in_window(self, selection: Selection, chunk: Chunk) -> Rows:
        """Select the rows inside the chunk's window and hand both to the merge."""
        rows, window, record = self.strategy.select(selection)
        self.merge.open_chunk(chunk.id, chunk.dump_id, selection.table, window)
        self.merge.set_rows(chunk.id, rows)
        self.store.record_window(chunk.id, *record)
        self.merge.forget(window.forgettable)
        return rows

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
