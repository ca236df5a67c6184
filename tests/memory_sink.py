"""A sink that keeps the current state per key in memory, with the same guards as Delta.

Used by tests and benchmarks to replay the output and compare it with the source table.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from airflow_dblog.core.events import ChangeEvent, Row, TableId
from airflow_dblog.core.position import Position


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
