"""What Delta's batch checks after its MERGE, before its chunks complete: keys the lake holds
that the source lacks, and verify chunks.

The lake is the sink that can be read back (:class:`~airflow_dblog.sinks.base.ReadBack`). Its
batch holds every change the log carried up to each of its closed chunks' windows, so a chunk's
rows can be held against it: the ranges of a table's chunks, once its last chunk is in, for
keys the source lacked (a follow-up key-list dump, :mod:`~airflow_dblog.engine.repairs`;
:mod:`~airflow_dblog.engine.dump_keys` keeps the chunks' keys until then), and a verify chunk's
rows for what is missing, extra or different (:mod:`~airflow_dblog.core.verify`). Each check
is safe to run again: a batch replayed after a crash asks for nothing twice and keeps the first
verdict.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from airflow_dblog.core.events import TableId
from airflow_dblog.core.verify import FOUND, ChunkVerdict, verdict
from airflow_dblog.engine import dump_keys
from airflow_dblog.engine.chunk_file import ChunkFiles, ChunkRef
from airflow_dblog.engine.metadata import MetadataStore
from airflow_dblog.engine.repairs import DIFFERENCES
from airflow_dblog.sinks.base import ReadBack

log = logging.getLogger(__name__)


class LakeChecks:
    def __init__(
        self, lake: ReadBack, store: MetadataStore, chunks: ChunkFiles, keys: ChunkFiles
    ) -> None:
        """``chunks``: the chunk files; ``keys``: where chunks' keys wait for their table's
        sweep."""
        self.lake, self.store, self.chunks, self.keys = lake, store, chunks, keys

    def after_batch(self, refs: Sequence[ChunkRef]) -> None:
        """Every check of the batch's closed chunks, once the batch is in the lake."""
        swept = self.sweep(refs)
        self.verify_chunks(refs, {s.chunk_id: s.keys for s in swept})
        for done in swept:
            for folder in done.folders:
                self.keys.delete(folder)

    def sweep(self, refs: Sequence[ChunkRef]) -> list[Swept]:
        """The keys Delta holds that a table's dump found the source lacking, looked for once
        every chunk of the table is in (:mod:`~airflow_dblog.engine.dump_keys`): one pass over
        the table, not one per batch. Each closed range chunk's keys are kept until then.

        Found keys go to a key-list dump, once per chunk (:meth:`MetadataStore.request_repair`:
        a batch replayed after a crash asks for nothing twice), which reads each key again in
        a watermark window and deletes, in log order in both sinks, those the source still
        lacks. Delta does not delete them here: Kafka's forwarder is ahead of Delta, and a
        delete sent now could follow a later re-insert of the key there. A verify dump's chunks
        compare their own range (:meth:`verify_chunks`) where Spark orders the key as the
        source does; elsewhere the keys found go to the verdict of the chunk that completed
        the table. A dump or chunk cancelled or failed looks for nothing."""
        mine = [r for r in refs if r.checks_extras and not (r.verify and self._ordered(r))]
        if not mine:
            return []
        keys = self.keys
        for ref in mine:
            dump_keys.record(self.chunks, keys, ref)
        swept: list[Swept] = []
        for dump_id in sorted({r.dump_id for r in mine}):
            recorded = dump_keys.recorded(keys, dump_id)
            for table in sorted({r.table for r in mine if r.dump_id == dump_id}):
                ended, chunks = self.store.table_chunks(dump_id, table)
                if ended:
                    for folder, _ in recorded.values():
                        keys.delete(folder)
                    continue
                folders = dump_keys.complete(recorded, chunks)
                if folders is None:
                    continue
                last = max(
                    (r for r in mine if r.dump_id == dump_id and r.table == table),
                    key=lambda r: r.chunk_id,
                )
                names = [folder for folder, _ in folders]
                before = min(low for _, low in folders)
                found = self._extras(table, names, before, last.chunk_id)
                swept.append(Swept(last.chunk_id, found.get(last.chunk_id, []), names))
                if found and not last.verify:
                    self._request(table, dump_id, found)
        return swept

    def _ordered(self, ref: ChunkRef) -> bool:
        return self.lake.orders_keys(TableId.parse(ref.table))

    def _extras(
        self, table: str, folders: list[str], before: str, last: int
    ) -> dict[int, list[list[Any]]]:
        """The keys found, by chunk: each chunk's range with its own window where Spark orders
        the key as the source does; else the whole table with the first chunk's window
        (``before``), all on the ``last`` chunk."""
        table_id = TableId.parse(table)
        if self.lake.orders_keys(table_id):
            ranges = dump_keys.refs(self.keys, folders)
            return self.lake.extra_keys(ranges, self.keys).get(table, {})
        unlisted = self.lake.unlisted_keys(table_id, [self.keys.uri(f) for f in folders], before)
        return {last: unlisted} if unlisted else {}

    def _request(self, table: str, dump_id: int, found: dict[int, list[list[Any]]]) -> None:
        key_columns = list(self.lake.schemas[TableId.parse(table)].key)
        new = self.store.request_repair(table, key_columns, dump_id, found)
        if new:
            log.info(
                "%s: %d keys Delta holds were not in the source when chunks %s of dump %d read"
                " them; dump %s reads them again and deletes those the source lacks",
                table,
                sum(len(k) for k in found.values()),
                sorted(found),
                dump_id,
                ", ".join(map(str, new)),
            )

    def verify_chunks(
        self, refs: Sequence[ChunkRef], swept: Mapping[int, list[list[Any]]] | None = None
    ) -> dict[int, ChunkVerdict]:
        """After the MERGE, before the chunks complete: compare the batch's verify chunks with
        Delta and record what each found; a ``repair`` chunk's differences go to a key-list
        dump that reads them again and writes them (Delta only what differs, Kafka each one,
        deletes in log order), as :meth:`request_repairs` does for extra keys.

        The follow-up is requested before the verdict is recorded: a crash between the two
        replays the batch, whose request finds its chunks named, and whose verdict is then
        recorded. A verdict already recorded stays (returns the new ones)."""
        verifying = [ref for ref in refs if ref.verify]
        if not verifying:
            return {}
        found = self.lake.compare(verifying, self.chunks)
        results: dict[int, ChunkVerdict] = {}
        differing: dict[tuple[str, int], dict[int, list[list[Any]]]] = {}
        for ref in verifying:
            keys = dict(found.get(ref.chunk_id, {}))
            if swept and ref.chunk_id in swept:  # the table's extras, found at its last chunk
                keys["extra"] = swept[ref.chunk_id]
            repair = ref.verify == "repair"
            results[ref.chunk_id] = verdict(
                ref.compared, keys, keys.get("extra") is not None, repair
            )
            if repair and results[ref.chunk_id].differences:
                by_chunk = differing.setdefault((ref.table, ref.dump_id), {})
                by_chunk[ref.chunk_id] = [k for kind in FOUND for k in keys.get(kind) or ()]
        for (table, dump_id), by_chunk in sorted(differing.items()):
            key_columns = list(self.lake.schemas[TableId.parse(table)].key)
            self.store.request_repair(table, key_columns, dump_id, by_chunk, reason=DIFFERENCES)
        recorded: dict[int, ChunkVerdict] = {}
        for ref in verifying:
            if self.store.record_verdict(ref.chunk_id, results[ref.chunk_id]):
                recorded[ref.chunk_id] = results[ref.chunk_id]
                log.info(
                    "%s chunk %d: %s", ref.table, ref.chunk_id, _summary(recorded[ref.chunk_id])
                )
        return recorded


@dataclass(frozen=True)
class Swept:
    """A table's sweep: the chunk that completed it, the keys found, the folders read."""

    chunk_id: int
    keys: list[list[Any]]
    folders: list[str]


def _summary(result: ChunkVerdict) -> str:
    extra = "not checked" if result.extra is None else str(result.extra)
    return (
        f"{result.checked} rows checked, {result.missing} missing, {extra} extra,"
        f" {result.different} different, {result.repaired} to repair"
    )
