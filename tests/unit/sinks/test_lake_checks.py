"""The checks after Delta's batch: the keys a table's chunks found extra, sought once its last
chunk is in, and verify chunks' differences go to a follow-up dump, once; a verify chunk's first
verdict stays."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from airflow_dblog.core.events import TableId
from airflow_dblog.engine.chunk_file import ChunkFiles, ChunkRef, encode_rows
from airflow_dblog.engine.metadata import MetadataStore
from airflow_dblog.engine.metadata.dumps import TablePlan
from airflow_dblog.engine.repairs import repaired_chunks
from airflow_dblog.sinks.lake_checks import LakeChecks
from airflow_dblog.sources.base import Column, TableSchema

T = TableId("app", "t")


class _Lake:
    """Delta as the checks sees it: the keys it holds beyond each chunk's rows."""

    name = "delta"

    def __init__(self, found: dict[str, dict[int, list[list[Any]]]]) -> None:
        self.schemas = {T: TableSchema(T, (Column("id", "int", False),), ("id",))}
        self.found = found
        self.asked: list[list[int]] = []
        self.ranges: list[ChunkRef] = []

    def extra_keys(self, refs: list[ChunkRef], files: Any) -> dict[str, dict[int, list[Any]]]:
        self.asked.append([r.chunk_id for r in refs])
        self.ranges = refs
        return self.found

    def orders_keys(self, table: TableId) -> bool:
        return True


def _ref(chunk_id: int, dump_id: int, **kw: Any) -> ChunkRef:
    fields: dict[str, Any] = {
        "low": "0001", "covers": [None, [9]], "selected": 0, "drops": (), **kw
    }  # fmt: skip
    return ChunkRef(str(T), chunk_id, dump_id, "", "0002", 0, ts_ms=1, **fields)


def _checks(tmp_path: Path, lake: _Lake) -> tuple[LakeChecks, MetadataStore]:
    store = MetadataStore(f"sqlite:///{tmp_path}/meta.db")
    for _ in range(7):  # dumps 1-7 of stream "s", which the chunks below belong to
        store.create_dump("s", "tables", [])
    files = ChunkFiles(str(tmp_path / "chunks")), ChunkFiles(str(tmp_path / "keys"))
    return LakeChecks(lake, store, *files), store  # type: ignore[arg-type]


def _follow_ups(store: MetadataStore) -> list[int]:
    return [d.id for d in store.dumps("s") if d.kind == "keys"]


def test_a_tables_extra_keys_are_sought_once_its_last_chunk_is_in_each_chunk_by_its_window(
    tmp_path: Path,
) -> None:
    lake = _Lake({})
    checks, store = _checks(tmp_path, lake)
    dump_id, first, last = _two_chunks(store)
    lake.found = {str(T): {first: [[3]], last: [[17], [18]]}}
    files = checks.chunks
    assert checks.sweep([_closed(files, dump_id, first, [1, 2], "0005")]) == []
    assert lake.asked == []  # the table's last chunk is not in yet
    closed_last = _closed(files, dump_id, last, [11], "0007")
    checks.sweep([closed_last])
    assert lake.asked == [[first, last]]
    assert [(r.low, r.covers) for r in lake.ranges] == [
        ("0005", [None, [20]]),
        ("0007", [None, [20]]),
    ]
    (follow_up,) = _follow_ups(store)
    assert repaired_chunks(store.dump(follow_up).requested_by, dump_id) == {first, last}
    assert [c.keys for c in store.chunks(follow_up)] == [[[3], [17], [18]]]
    checks.sweep([closed_last])  # the same batch after a crash
    assert _follow_ups(store) == [follow_up]


def test_nothing_extra_asks_for_nothing_and_chunks_without_a_range_are_not_kept(
    tmp_path: Path,
) -> None:
    lake = _Lake({})
    checks, store = _checks(tmp_path, lake)
    dump_id, first, last = _two_chunks(store)
    files = checks.chunks
    checks.after_batch([_closed(files, dump_id, first, [1], "0005")])
    checks.after_batch([_closed(files, dump_id, last, [], "0007")])
    assert lake.asked == [[first, last]] and _follow_ups(store) == []
    assert checks.keys.folders() == []  # dropped once looked at
    checks.after_batch([_ref(31, 7, low=""), _ref(32, 7, covers=None)])
    assert checks.keys.folders() == [] and len(lake.asked) == 1


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
    checks, store = _checks(tmp_path, lake)
    chunk_id = _verify_chunk(store, "repair")
    lake.compared = {chunk_id: found}
    ref = _ref(chunk_id, 8, selected=3, verify="repair", covers=None, low="")
    assert checks.sweep([ref]) == []  # a verify chunk's extras are its own
    (verdict,) = checks.verify_chunks([ref]).values()
    assert (verdict.checked, verdict.missing, verdict.different, verdict.extra) == (3, 1, 1, 1)
    assert verdict.repaired == 3
    (follow_up,) = _follow_ups(store)[-1:]
    assert repaired_chunks(store.dump(follow_up).requested_by, 8) == {chunk_id}
    assert [sorted(c.keys or []) for c in store.chunks(follow_up)] == [[[1], [2], [9]]]

    lake.compared = {chunk_id: {"missing": [], "different": [], "extra": []}}
    assert checks.verify_chunks([ref]) == {}  # replayed after a crash: the first stays
    assert _follow_ups(store)[-1] == follow_up
    assert store.chunk(chunk_id).verified["missing"] == 1


def test_a_dry_run_verify_records_its_counts_and_asks_for_nothing(tmp_path: Path) -> None:
    lake = _VerifyingLake({})
    checks, store = _checks(tmp_path, lake)
    chunk_id = _verify_chunk(store, "dry-run")
    lake.compared = {chunk_id: {"missing": [[1]], "different": [], "extra": None}}
    ref = _ref(chunk_id, 8, selected=3, drops=(0,), verify="dry-run")
    (verdict,) = checks.verify_chunks([ref]).values()
    assert (verdict.checked, verdict.missing, verdict.extra, verdict.repaired) == (2, 1, None, 0)
    assert verdict.examples == (("missing", (1,)),)
    assert [d.id for d in store.dumps("s") if d.kind == "keys"] == [8]  # the verify itself
    report = store.progress(8).verify
    assert report is not None and report.extra_unchecked == {str(T)}


class _UnorderedLake(_Lake):
    """Delta for a table whose key order Spark does not share: the keys no chunk listed."""

    def __init__(self, unlisted: list[list[Any]]) -> None:
        super().__init__({})
        self.unlisted = unlisted
        self.swept: list[tuple[list[str], str]] = []

    def orders_keys(self, table: TableId) -> bool:
        return False

    def unlisted_keys(self, table: TableId, listed: list[str], before: str) -> list[list[Any]]:
        self.swept.append((listed, before))
        return self.unlisted


def _two_chunks(store: MetadataStore) -> tuple[int, int, int]:
    """A dump of T cut into ``(-inf, 10]`` and ``(10, 20]``: the dump and its chunks."""
    dump_id = store.create_dump("s", "tables", [TablePlan(str(T), ["id"], 20)])
    table_id = store.dump_tables(dump_id)[0].id
    store.set_table_bound(table_id, [20])
    first = store.cut_range_chunk(table_id, None, [10], "w")
    last = store.cut_range_chunk(table_id, [10], None, "w")
    assert first is not None and last is not None
    return dump_id, first.id, last.id


def _closed(files: ChunkFiles, dump_id: int, chunk_id: int, keys: list[int], low: str) -> ChunkRef:
    folder = ChunkFiles.new_folder(chunk_id)
    files.write(folder, encode_rows(chunk_id, [((k,), {"id": k}) for k in keys])[0])
    return ChunkRef(
        str(T), chunk_id, dump_id, folder, "0009", 0, len(keys), (), 1, low=low,
        covers=[None, [20]],
    )  # fmt: skip


def test_a_table_whose_key_order_spark_lacks_is_swept_once_its_last_chunk_is_in(
    tmp_path: Path,
) -> None:
    lake = _UnorderedLake([[15]])
    checks, store = _checks(tmp_path, lake)
    dump_id, first, last = _two_chunks(store)
    files = checks.chunks
    assert checks.sweep([_closed(files, dump_id, first, [1, 2], "0005")]) == []
    assert lake.swept == []  # the table's last chunk is not in yet
    (swept,) = checks.sweep([_closed(files, dump_id, last, [], "0003")])
    ((listed, before),) = lake.swept
    assert (swept.chunk_id, swept.keys, before, len(listed)) == (last, [[15]], "0003", 2)
    (follow_up,) = [d.id for d in store.dumps("s") if d.id > dump_id]
    assert repaired_chunks(store.dump(follow_up).requested_by, dump_id) == {last}
    assert [c.keys for c in store.chunks(follow_up)] == [[[15]]]


def test_a_cancelled_dump_sweeps_nothing_and_drops_the_keys_it_kept(tmp_path: Path) -> None:
    lake = _UnorderedLake([[15]])
    checks, store = _checks(tmp_path, lake)
    dump_id, first, last = _two_chunks(store)
    files = checks.chunks
    checks.sweep([_closed(files, dump_id, first, [1, 2], "0005")])
    assert checks.keys.folders()
    store.apply(dump_id, "cancel")
    assert checks.sweep([_closed(files, dump_id, last, [], "0003")]) == []
    assert lake.swept == [] and checks.keys.folders() == []
