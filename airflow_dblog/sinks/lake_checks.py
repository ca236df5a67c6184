"""What Delta's batch checks after its MERGE, before its chunks complete: keys the lake holds
that the source lacks, and verify chunks.

The lake is the sink that can be read back (:class:`~airflow_dblog.sinks.base.ReadBack`). Its
batch holds every change the log carried up to each of its closed chunks' windows, so a chunk's
rows can be held against it: a range chunk's range for keys the source lacked (a follow-up
key-list dump, :mod:`~airflow_dblog.engine.repairs`), a table whose key order only the source
knows as a whole once its last chunk is in (:mod:`~airflow_dblog.engine.dump_keys`), and a
verify chunk's rows for what is missing, extra or different (:mod:`~airflow_dblog.core.verify`).
Each check is safe to run again: a batch replayed after a crash asks for nothing twice and keeps
the first verdict.
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
        """``chunks``: the chunk files; ``keys``: where the sweep keeps chunks' keys."""
        self.lake, self.store, self.chunks, self.keys = lake, store, chunks, keys

    def after_batch(self, refs: Sequence[ChunkRef]) -> None:
        """Every check of the batch's closed chunks, once the batch is in the lake."""
        self.request_repairs(refs)
        swept = self.sweep(refs)
        self.verify_chunks(refs, {s.chunk_id: s.keys for s in swept})
        for done in swept:
            for folder in done.folders:
                self.keys.delete(folder)

    def request_repairs(self, refs: Sequence[ChunkRef]) -> list[int]:
        """After the MERGE, before the chunks complete: a key-list dump of the keys Delta holds
        that the batch's range chunks found the source lacking, one per table and dump.

        Delta does not delete them here: Kafka's forwarder is ahead of Delta, and a delete sent
        now could follow a later re-insert of the key there. The follow-up dump's chunks read
        each key again in a watermark window and delete, in log order in both sinks, those the
        source still lacks. A batch replayed after a crash finds its chunks named by an earlier
        request and asks for nothing twice (:meth:`MetadataStore.request_repair`).
        """
        checks = [ref for ref in refs if ref.checks_extras and not ref.verify]
        if not checks:
            return []
        found = self.lake.extra_keys(checks, self.chunks)
        dump_of = {ref.chunk_id: ref.dump_id for ref in checks}
        created: list[int] = []
        for table, by_chunk in sorted(found.items()):
            key_columns = list(self.lake.schemas[TableId.parse(table)].key)
            for dump_id in sorted({dump_of[c] for c in by_chunk}):
                mine = {c: keys for c, keys in by_chunk.items() if dump_of[c] == dump_id}
                new = self.store.request_repair(table, key_columns, dump_id, mine)
                if new:
                    log.info(
                        "%s: %d keys Delta holds were missing from chunks %s of dump %d;"
                        " dump %s reads them again and deletes those the source lacks",
                        table,
                        sum(len(k) for k in mine.values()),
                        sorted(mine),
                        dump_id,
                        ", ".join(map(str, new)),
                    )
                created.extend(new)
        return created

    def sweep(self, refs: Sequence[ChunkRef]) -> list[Swept]:
        """The keys Delta holds that a table's whole dump found the source lacking, for tables
        whose key order Spark does not share (:mod:`~airflow_dblog.engine.dump_keys`): each
        closed range chunk's keys are kept; once every chunk of the table is in, Delta's live
        keys last changed before the first chunk's window began that no chunk selected are
        asked for again (an ordinary dump) or handed to the verdict of the chunk that completed
        the table (a verify dump). A dump or chunk cancelled or failed sweeps nothing."""
        mine = [
            r
            for r in refs
            if r.covers is not None and r.low and not self.lake.orders_keys(TableId.parse(r.table))
        ]
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
                before = min(low for _, low in folders)
                uris = [keys.uri(folder) for folder, _ in folders]
                found = self.lake.unlisted_keys(TableId.parse(table), uris, before)
                last = max(
                    (r for r in mine if r.dump_id == dump_id and r.table == table),
                    key=lambda r: r.chunk_id,
                )
                swept.append(Swept(last.chunk_id, found, [f for f, _ in folders]))
                if found and not last.verify:
                    key_columns = list(self.lake.schemas[TableId.parse(table)].key)
                    new = self.store.request_repair(
                        table, key_columns, dump_id, {last.chunk_id: found}
                    )
                    if new:
                        log.info(
                            "%s: %d keys Delta holds were in no chunk of dump %d; dump %s reads"
                            " them again and deletes those the source lacks",
                            table, len(found), dump_id, ", ".join(map(str, new)),
                        )  # fmt: skip
        return swept

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
