"""Delta's batch hands the keys its range chunks found extra to a follow-up dump, once."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

from airflow_dblog.core.events import TableId
from airflow_dblog.engine.chunk_file import ChunkRef
from airflow_dblog.engine.metadata import MetadataStore
from airflow_dblog.engine.repairs import repaired_chunks
from airflow_dblog.sources.base import Column, TableSchema
from airflow_dblog.spark.stream_job import BatchCommitter

T = TableId("app", "t")


class _Lake:
    """Delta as the committer sees it: the keys it holds beyond each chunk's rows."""

    name = "delta"

    def __init__(self, found: dict[str, dict[int, list[list[Any]]]]) -> None:
        self.schemas = {T: TableSchema(T, (Column("id", "int", False),), ("id",))}
        self.found = found
        self.asked: list[list[int]] = []

    def extra_keys(self, refs: list[ChunkRef], files: Any) -> dict[str, dict[int, list[Any]]]:
        self.asked.append([r.chunk_id for r in refs])
        return self.found


def _ref(chunk_id: int, dump_id: int, **kw: Any) -> ChunkRef:
    fields: dict[str, Any] = {"low": "0001", "covers": [None, [9]], **kw}
    return ChunkRef(str(T), chunk_id, dump_id, "", "0002", 0, 0, (), 1, **fields)


def _committer(tmp_path: Path, lake: _Lake) -> tuple[BatchCommitter, MetadataStore]:
    store = MetadataStore(f"sqlite:///{tmp_path}/meta.db")
    spool = SimpleNamespace(chunks=None)
    for _ in range(7):  # dumps 1-7 of stream "s", which the chunks below belong to
        store.create_dump("s", "tables", [])
    return BatchCommitter(lake, None, store, spool, lake=lake), store  # type: ignore[arg-type]


def _follow_ups(store: MetadataStore) -> list[int]:
    return [d.id for d in store.dumps("s") if d.kind == "keys"]


def test_a_replayed_batch_asks_for_its_follow_up_dump_once(tmp_path: Path) -> None:
    lake = _Lake({str(T): {10: [[3]], 11: [[7], [8]]}})
    committer, store = _committer(tmp_path, lake)
    refs = [_ref(10, 2), _ref(11, 2), _ref(12, 2, covers=None, low="")]  # 12: a key list
    (created,) = committer.request_repairs(refs)
    assert lake.asked == [[10, 11]]
    dump = store.dump(created)
    assert (dump.kind, dump.tables) == ("keys", [str(T)])
    assert repaired_chunks(dump.requested_by, 2) == {10, 11}
    assert [c.keys for c in store.chunks(created)] == [[[3], [7], [8]]]
    assert committer.request_repairs(refs) == []  # the same batch after a crash
    assert _follow_ups(store) == [created]


def test_chunks_of_two_dumps_get_a_follow_up_each(tmp_path: Path) -> None:
    lake = _Lake({str(T): {10: [[3]], 20: [[30]]}})
    committer, store = _committer(tmp_path, lake)
    first, second = committer.request_repairs([_ref(10, 2), _ref(20, 5)])
    assert repaired_chunks(store.dump(first).requested_by, 2) == {10}
    assert repaired_chunks(store.dump(second).requested_by, 5) == {20}


def test_nothing_extra_asks_for_nothing_and_chunks_without_a_range_are_not_looked_at(
    tmp_path: Path,
) -> None:
    lake = _Lake({})
    committer, store = _committer(tmp_path, lake)
    assert committer.request_repairs([_ref(30, 7)]) == [] and _follow_ups(store) == []
    assert committer.request_repairs([_ref(31, 7, low="")]) == []
    assert lake.asked == [[30]]
