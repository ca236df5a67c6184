"""Delta's batch hands the keys its range chunks found extra, and the differences its verify
chunks found, to a follow-up dump, once."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from airflow_dblog.core.events import TableId
from airflow_dblog.engine.chunk_file import ChunkRef
from airflow_dblog.engine.metadata import MetadataStore
from airflow_dblog.engine.metadata.dumps import TablePlan
from airflow_dblog.engine.repairs import repaired_chunks
from airflow_dblog.errors import DblogError
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
    fields: dict[str, Any] = {
        "low": "0001", "covers": [None, [9]], "selected": 0, "drops": (), **kw
    }  # fmt: skip
    return ChunkRef(str(T), chunk_id, dump_id, "", "0002", 0, ts_ms=1, **fields)


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


class _VerifyingLake(_Lake):
    """Delta as a verify sees it: what it found in each chunk."""

    def __init__(self, found: dict[int, dict[str, Any]]) -> None:
        super().__init__({})
        self.compared = found

    def compare(self, refs: list[ChunkRef], files: Any) -> dict[int, dict[str, Any]]:
        self.asked.append([r.chunk_id for r in refs])
        return {r.chunk_id: self.compared.get(r.chunk_id, {}) for r in refs}


def _verify_chunk(store: MetadataStore, mode: str) -> int:
    dump_id = store.create_dump(
        "s", "keys", [TablePlan(str(T), ["id"], 3, [[[1], [2], [3]]])], verify=mode
    )
    return store.chunks(dump_id)[0].id


def test_a_repair_verify_asks_once_for_its_differences_and_keeps_its_first_verdict(
    tmp_path: Path,
) -> None:
    found = {"missing": [[1]], "different": [[2]], "extra": [[9]]}
    lake = _VerifyingLake({})
    committer, store = _committer(tmp_path, lake)
    chunk_id = _verify_chunk(store, "repair")
    lake.compared = {chunk_id: found}
    ref = _ref(chunk_id, 8, selected=3, verify="repair", covers=None, low="")
    assert committer.request_repairs([ref]) == []  # a verify chunk's extras are its own
    (verdict,) = committer.verify_chunks([ref]).values()
    assert (verdict.checked, verdict.missing, verdict.different, verdict.extra) == (3, 1, 1, 1)
    assert verdict.repaired == 3
    (follow_up,) = _follow_ups(store)[-1:]
    assert repaired_chunks(store.dump(follow_up).requested_by, 8) == {chunk_id}
    assert [sorted(c.keys or []) for c in store.chunks(follow_up)] == [[[1], [2], [9]]]

    lake.compared = {chunk_id: {"missing": [], "different": [], "extra": []}}
    assert committer.verify_chunks([ref]) == {}  # replayed after a crash: the first stays
    assert _follow_ups(store)[-1] == follow_up
    assert store.chunk(chunk_id).verified["missing"] == 1


def test_a_dry_run_verify_records_its_counts_and_asks_for_nothing(tmp_path: Path) -> None:
    lake = _VerifyingLake({})
    committer, store = _committer(tmp_path, lake)
    chunk_id = _verify_chunk(store, "dry-run")
    lake.compared = {chunk_id: {"missing": [[1]], "different": [], "extra": None}}
    ref = _ref(chunk_id, 8, selected=3, drops=(0,), verify="dry-run")
    (verdict,) = committer.verify_chunks([ref]).values()
    assert (verdict.checked, verdict.missing, verdict.extra, verdict.repaired) == (2, 1, None, 0)
    assert verdict.examples == (("missing", (1,)),)
    assert [d.id for d in store.dumps("s") if d.kind == "keys"] == [8]  # the verify itself
    report = store.progress(8).verify
    assert report is not None and report.extra_unchecked == {str(T)}


def test_a_verify_chunk_on_a_stream_without_delta_stops_it_with_the_fix(tmp_path: Path) -> None:
    committer, store = _committer(tmp_path, _Lake({}))
    committer.lake = None
    ref = _ref(_verify_chunk(store, "repair"), 8, verify="repair")
    with pytest.raises(DblogError, match=r"verify needs sinks\.delta"):
        committer.verify_chunks([ref])
