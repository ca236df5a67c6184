"""The keys a dump's range chunks selected, kept until the table's last chunk is in: the keys
the lake holds beyond the source are looked for once per table, not once per batch.

A key Delta holds live in a chunk's range, last changed before the chunk's window began, that
the chunk did not select (rows its window dropped included) was not in the source when the
chunk read it. Where Spark orders the table's key as the source does, each chunk's range is
looked at with its own window (:meth:`~airflow_dblog.sinks.delta_sink.DeltaSink.extra_keys`).
Where it does not (text under a collation, floats, times) a chunk's range means other keys in
Delta, so the whole table is looked at with the first chunk's window: a key no chunk selected,
wherever the source sorts it. Each closed chunk's keys are copied here (a chunk's own file goes
with its spool segment); the check reads them all once and the folders are deleted after it.

A folder per chunk, ``<dump>-<chunk>-<low>`` under ``<checkpoint>/dump-keys``: one Parquet file
of the chunk's ``chunk_id`` and ``key`` columns, its :class:`ChunkRef` in the file's metadata,
and in the name where its window began. A chunk closed again after a crash writes the same
folder again.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Collection, Sequence

from airflow_dblog.engine.chunk_file import ChunkFiles, ChunkRef

SPARK_DDL = "chunk_id BIGINT, key STRING"  # also a chunk file's columns of these names
_REF = b"dblog.chunk_ref"


def folder_of(ref: ChunkRef) -> str:
    return f"{ref.dump_id:012d}-{ref.chunk_id:012d}-{ref.low}"


def record(chunks: ChunkFiles, keys: ChunkFiles, ref: ChunkRef) -> None:
    """Copy the keys of a closed range chunk's rows (those its window dropped included)."""
    import pyarrow as pa

    batches = list(chunks.batches(ref.folder, ("key",))) if ref.folder else []
    # a file written by Spark and one written here differ in the column's nullability
    key = pa.chunked_array([b.column(0).cast(pa.string()) for b in batches], pa.string())
    chunk_id = pa.array([ref.chunk_id] * len(key), pa.int64())
    table = pa.table({"chunk_id": chunk_id, "key": key})
    keys.write(folder_of(ref), table.replace_schema_metadata({_REF: ref.record()}))


def refs(keys: ChunkFiles, folders: Sequence[str]) -> list[ChunkRef]:
    """The chunks recorded in these folders, each naming its folder here (not its chunk file,
    which may be gone)."""
    import pyarrow.parquet as pq

    found: list[ChunkRef] = []
    for folder in folders:
        for path in keys.files(folder):
            with keys.fs.open_input_file(path) as source:
                metadata = pq.read_schema(source).metadata or {}
            if _REF in metadata:
                ref = ChunkRef.from_record(json.loads(metadata[_REF]))
                found.append(dataclasses.replace(ref, folder=folder))
    return found


def recorded(keys: ChunkFiles, dump_id: int) -> dict[int, tuple[str, str]]:
    """The chunks of ``dump_id`` whose keys are here: chunk id -> (folder, window start)."""
    found: dict[int, tuple[str, str]] = {}
    prefix = f"{dump_id:012d}-"
    for folder in keys.folders():
        if folder.startswith(prefix):
            _, chunk, low = folder.split("-", 2)
            found[int(chunk)] = (folder, low)
    return found


def complete(
    recorded_chunks: dict[int, tuple[str, str]], table_chunks: Collection[int]
) -> list[tuple[str, str]] | None:
    """The folders of a table's chunks if every one is recorded, else None."""
    if not table_chunks or any(c not in recorded_chunks for c in table_chunks):
        return None
    return [recorded_chunks[c] for c in sorted(table_chunks)]
