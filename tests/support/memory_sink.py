"""A sink that keeps the current state per key in memory, with the same guards as Delta, and
the capture loop that writes it directly: each step written, then committed at once.

Tests use them to replay the output and compare it with the source table without Spark.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from typing import Any

from airflow_dblog.config import Config
from airflow_dblog.core.events import ChangeEvent, LogItem, Row, TableId
from airflow_dblog.core.position import Position
from airflow_dblog.engine.capture import Capture, Published
from airflow_dblog.engine.chunk_file import ChunkRef
from airflow_dblog.engine.metadata import MetadataStore
from airflow_dblog.sources.base import ChangelogReader, Source


class MemorySink:
    name = "memory"

    def __init__(self) -> None:
        self.state: dict[TableId, dict[tuple[Any, ...], tuple[Position, Row | None]]] = {}
        self.received: list[ChangeEvent] = []  # every event of every new batch, in order
        self.applied: list[ChangeEvent] = []  # those that changed the state
        self.batches: set[int] = set()

    def write(self, batch_id: int, events: Sequence[ChangeEvent]) -> None:
        if batch_id in self.batches:
            return
        self.received.extend(events)
        for event in events:
            table = self.state.setdefault(event.table, {})
            current = table.get(event.key)
            if current is not None and current[0] >= event.position:
                continue  # monotonic guard: never move a key back
            table[event.key] = (event.position, event.row)
            self.applied.append(event)
        self.batches.add(batch_id)

    def rows(self, table: TableId) -> dict[tuple[Any, ...], Row]:
        """Live rows (tombstones left out) by key."""
        return {k: row for k, (_, row) in self.state.get(table, {}).items() if row is not None}

    def close(self) -> None:
        pass


class MemoryCapture(Capture):
    """The capture loop writing every step to in-memory sinks and committing it right away
    (offset saved, chunks completed, log acknowledged), as the job does once every sink holds
    a spool segment."""

    def __init__(
        self,
        config: Config,
        store: MetadataStore,
        source: Source,
        reader: ChangelogReader,
        sinks: Sequence[MemorySink],
        batch_id: int = 0,
    ) -> None:
        super().__init__(config, store, source, reader, batch_id=batch_id)
        self.sinks = list(sinks)
        self.placed: list[ChunkRef] = []  # every closed chunk's reference

    def _publish(self, output: list[Published], items: list[LogItem]) -> None:
        refs = [o for o in output if isinstance(o, ChunkRef)]
        self.placed.extend(refs)
        events = list(self._events(output))
        for sink in self.sinks:
            sink.write(self.batch_id, events)
        offset = self.reader.offset()
        self._record_commit(
            {"reader": offset, "batch_id": self.batch_id},
            str(items[-1].position) if items else None,
            bool(events),
            [ref.closed_record() for ref in refs],
            self.source_ts_ms,
        )
        self.reader.acknowledge(offset)
        for ref in refs:
            if ref.folder:
                self.files.delete(ref.folder)

    def _events(self, output: list[Published]) -> Iterator[ChangeEvent]:
        """Log events as they are; a chunk's rows read back from its file (plain JSON values,
        as every sink receives them)."""
        for item in output:
            if not isinstance(item, ChunkRef):
                yield item
                continue
            if not item.emitted:
                continue
            for text in item.texts(self.files):
                yield ChangeEvent(
                    table=TableId.parse(text.table),
                    op="r",
                    key=tuple(json.loads(text.key)),
                    position=Position.parse(text.position),
                    after=json.loads(text.after),
                    ts_ms=int(text.ts_ms),
                    dump_id=item.dump_id,
                    chunk_id=item.chunk_id,
                )
