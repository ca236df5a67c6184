"""The keys a dump's range chunks selected, kept until the table's last chunk is in, for tables
whose key has no order Spark and the source share (text under a collation, floats, times).

For those a chunk's key range means different keys in Delta than at the source, so the keys the
lake holds beyond the source cannot be looked for chunk by chunk (:mod:`~airflow_dblog.engine.
repairs`). They can for the whole table: once every chunk of a table's dump has closed, a key
Delta holds live, last changed before the first chunk's window began, that no chunk selected
(rows their windows dropped included) was not in the source when its chunk read it, wherever
the source sorts it. Each closed chunk's keys are copied here (a chunk's own file goes with its
spool segment); the sweep reads them all once and the folders are deleted after it.

A folder per chunk, ``<dump>-<chunk>-<low>`` under ``<checkpoint>/dump-keys``: one Parquet file
of the chunk's ``key`` column, and in the name where its window began. A chunk closed again after
a crash writes the same folder again.
"""

from __future__ import annotations

from collections.abc import Collection

from airflow_dblog.engine.chunk_file import ChunkFiles, ChunkRef

SPARK_DDL = "key STRING"


def folder_of(ref: ChunkRef) -> str:
    return f"{ref.dump_id:012d}-{ref.chunk_id:012d}-{ref.low}"


def record(chunks: ChunkFiles, keys: ChunkFiles, ref: ChunkRef) -> None:
    """Copy the keys of a closed range chunk's rows (those its window dropped included)."""
    import pyarrow as pa

    batches = list(chunks.batches(ref.folder, ("key",))) if ref.folder else []
    # a file written by Spark and one written here differ in the column's nullability
    columns = [b.column(0).cast(pa.string()) for b in batches]
    keys.write(folder_of(ref), pa.table({"key": pa.chunked_array(columns, pa.string())}))


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
