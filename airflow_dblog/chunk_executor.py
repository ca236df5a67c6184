"""Claim the next chunk of a dump and run it: low watermark, keyset SELECT, high watermark.

The executor runs while the log reader is paused (same thread, between reads), so the merge
has the chunk's window registered before any log item that could fall inside it is fed. How
the window is bounded depends on the watermark strategy:

- ``table``: UUIDs written to ``dblog.dblog_watermarks`` before and after the SELECT; the
  window is what the log shows between the two writes.
- ``gtid``: executed GTID sets read before and after the SELECT (read-only; MySQL/MariaDB).
- ``snapshot``: the SELECT's own snapshot says which changes it saw (read-only and exact):
  PostgreSQL's ``pg_current_snapshot()``, MariaDB's binlog snapshot position.
"""

from __future__ import annotations

import logging
import uuid
from typing import Any

from airflow_dblog.errors import DblogError
from airflow_dblog.events import Row, TableId
from airflow_dblog.keys import from_json, to_json
from airflow_dblog.merge import WatermarkMerge
from airflow_dblog.metadata import MetadataStore
from airflow_dblog.metadata.models import Chunk
from airflow_dblog.position import Position
from airflow_dblog.sources.base import Key, Source, TableSchema
from airflow_dblog.window import GtidWindow, PositionWindow, SnapshotXidWindow, TableWindow

log = logging.getLogger(__name__)

RESELECT_ATTEMPTS = 3


class ChunkExecutor:
    def __init__(
        self,
        source: Source,
        store: MetadataStore,
        merge: WatermarkMerge,
        stream: str,
        watermark: str,
        worker: str,
    ) -> None:
        self.source, self.store, self.merge = source, store, merge
        self.stream, self.watermark, self.worker = stream, watermark, worker
        self._schemas: dict[TableId, TableSchema] = {}  # as described after the last chunk
        if watermark == "table":
            source.ensure_watermark_table()  # type: ignore[attr-defined]

    def claim(self, chunk_size: int) -> Chunk | None:
        """The oldest runnable dump's next chunk: requeued or key-list chunks first."""
        dumps = self.store.runnable_dumps(self.stream)
        if not dumps:
            return None  # the common case between dumps: one query per step, no more
        for dump in dumps:
            chunk = self.store.claim_pending_chunk(dump.id, self.worker)
            if chunk is not None:
                return chunk
            for table in self.store.dump_tables(dump.id):
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
        self.store.finish_empty_dumps(self.stream)
        return None

    def run(self, chunk: Chunk, chunk_size: int) -> int:
        """Execute a claimed chunk and register it with the merge; returns the rows selected.

        The table is described again once the window is closed: if its schema changed since the
        last chunk, the ALTER may lie between the SELECT and the high watermark, where rows of
        the old shape would land after the change, so the chunk is selected again. A changed
        primary key fails the dump: its chunks and cursors are keyed on the old one.
        """
        table = TableId.parse(chunk.table_name)
        known = self._schemas.get(table) or self.source.describe(table)
        for attempt in range(1, RESELECT_ATTEMPTS + 1):
            rows = self._select_in_window(table, chunk, chunk_size)
            schema = self.source.describe(table)
            self._schemas[table] = schema
            if schema.key != known.key:
                self.merge.cancel_dump(chunk.dump_id)
                reason = (
                    f"the primary key of {table} changed from ({', '.join(known.key)}) to"
                    f" ({', '.join(schema.key)}) during dump {chunk.dump_id}; dumps cannot follow"
                    " a key change: run a new dump of the table"
                )
                self.store.fail(chunk.dump_id, reason)
                log.error("%s", reason)
                return 0
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

    def _select_in_window(self, table: TableId, chunk: Chunk, limit: int) -> list[tuple[Key, Row]]:
        """Open the chunk's window in the merge, select its rows inside it, close the window."""
        select = self._selector(table, chunk, limit)
        if self.watermark == "table":
            low, high = str(uuid.uuid4()), str(uuid.uuid4())
            window: Any = TableWindow(low, high)
            self.merge.open_chunk(chunk.id, chunk.dump_id, table, window)
            self.source.write_watermark(self.stream, low)
            rows = select()
            self.merge.set_rows(chunk.id, rows)
            self.source.write_watermark(self.stream, high)
            self.store.record_window(chunk.id, {"type": "table"}, low, high)
        elif self.watermark == "gtid":
            src: Any = self.source
            low_set = src.gtid_executed()
            rows = select()
            high_set = src.gtid_executed()
            close_at: Position = src.binlog_position()
            window = GtidWindow.from_strings(low_set, high_set, close_at)
            self.merge.open_chunk(chunk.id, chunk.dump_id, table, window)
            self.merge.set_rows(chunk.id, rows)
            self.store.record_window(chunk.id, {"type": "gtid"}, low_set, high_set)
        else:
            rows, window = self._snapshot_select(table, chunk, limit)
            self.merge.open_chunk(chunk.id, chunk.dump_id, table, window)
            self.merge.set_rows(chunk.id, rows)
            self.store.record_window(chunk.id, {"type": "snapshot"})
        return rows

    def _selector(self, table: TableId, chunk: Chunk, limit: int) -> Any:
        if chunk.keys is not None:
            keys = [self._typed(table, k) for k in chunk.keys]
            return lambda: self.source.select_keys(table, keys)  # type: ignore[arg-type]
        lower = self._typed(table, chunk.lower_key)
        upper = self._typed(table, chunk.upper_key)
        assert upper is not None
        return lambda: self.source.select_range(table, lower, upper, limit)

    def _snapshot_select(self, table: TableId, chunk: Chunk, limit: int) -> tuple[Any, Any]:
        src: Any = self.source
        if chunk.keys is not None:
            keys = [self._typed(table, k) for k in chunk.keys]
            rows, snap = src.snapshot_select_keys(table, keys)
        else:
            lower = self._typed(table, chunk.lower_key)
            upper = self._typed(table, chunk.upper_key)
            rows, snap = src.snapshot_select_range(table, lower, upper, limit)
        if self.source.kind == "mysql":
            # the SELECT saw the binlog exactly up to ``snap`` (after every row of the event
            # ending there): rows belong right there, and an idle server's heartbeat reaches it
            return rows, PositionWindow(snap, snap)
        # every commit the snapshot saw starts below close_lsn; an idle heartbeat reaches it
        return rows, SnapshotXidWindow(
            snap.xmin, snap.xmax, frozenset(snap.xip), snap.close_position
        )

    def _typed(self, table: TableId, key: list[Any] | None) -> Key | None:
        if key is None:
            return None
        return tuple(self.source.coerce_key(table, from_json(key)))
