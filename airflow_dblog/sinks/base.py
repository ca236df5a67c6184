"""The contract between the merge and every sink.

A batch is the ordered output of one step of the stream (a Spark micro-batch, or one loop of
the plain capture loop). ``write`` must be atomic and idempotent per ``batch_id``: writing a
batch again after a crash changes nothing, so the stream may replay the batch it was in the
middle of. Within a batch, and across batches, a key's position never decreases; sinks also
refuse an event older than what they hold, so a late replay cannot move a key back.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from airflow_dblog.core.events import ChangeEvent


class Sink(Protocol):
    name: str

    def write(self, batch_id: int, events: Sequence[ChangeEvent]) -> None: ...

    def close(self) -> None: ...
