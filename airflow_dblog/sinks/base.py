"""The contract of every sink: it holds the spool's segments.

The capture writes merged batches into numbered spool segments; each sink follows the spool on
its own (Delta in a Spark query, Kafka in a driver thread) and writes batches of consecutive
segments. ``write`` is atomic and idempotent by the batch's last segment number: a sink that
holds it writes nothing, so a crash may replay the batch it was in the middle of, cut the same
way or not. A key's position never decreases within or across batches, and a sink refuses an
event older than what it holds, so a late replay cannot move a key back.

Each sink takes the batch in the form its runner has (``Batch``): Delta a Spark DataFrame of the
segments' events, Kafka the messages built from them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol, TypeVar

from airflow_dblog.core.events import TableId
from airflow_dblog.engine.chunk_file import ChunkFiles, ChunkRef
from airflow_dblog.sources.base import TableSchema

Batch = TypeVar("Batch", contravariant=True)
ExtraKeys = dict[str, dict[int, list[list[Any]]]]  # table -> chunk id -> keys (JSON values)
# chunk id -> missing | different | extra -> keys (JSON values); extra None: not looked for
Comparison = dict[int, dict[str, list[list[Any]] | None]]


class Sink(Protocol[Batch]):
    name: str

    def write(self, segment: int, batch: Batch) -> object:
        """Write ``batch``, the spool's segments up to ``segment``, unless already held."""
        ...

    def close(self) -> None: ...


class ReadBack(Protocol):
    """A sink whose tables can be read back: once a table's chunks are in, it names the keys it
    holds that they found the source lacking (only a sink that can be queried can; Kafka
    cannot)."""

    schemas: Mapping[TableId, TableSchema]

    def extra_keys(self, refs: Sequence[ChunkRef], files: ChunkFiles) -> ExtraKeys: ...

    def compare(self, refs: Sequence[ChunkRef], files: ChunkFiles) -> Comparison:
        """What verify chunks found the sink holding differently from the source."""
        ...

    def orders_keys(self, table: TableId) -> bool:
        """Whether the sink orders the table's key as the source does."""
        ...

    def unlisted_keys(self, table: TableId, listed: Sequence[str], before: str) -> list[list[Any]]:
        """The keys held live, last changed before ``before``, that no listed folder holds."""
        ...
