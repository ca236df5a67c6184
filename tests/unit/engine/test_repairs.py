"""Follow-up dumps of the keys the lake holds and the source lacks: named once per chunk."""

from __future__ import annotations

from airflow_dblog.engine import repairs
from airflow_dblog.engine.metadata import MetadataStore


def test_chunk_ids_are_written_as_runs_and_read_back() -> None:
    assert repairs.id_ranges([7, 3, 4, 5, 9, 10, 4]) == "3-5,7,9-10"
    assert repairs.parse_ranges("3-5,7,9-10") == {3, 4, 5, 7, 9, 10}
    assert repairs.id_ranges([]) == "" and repairs.parse_ranges("") == set()


def test_a_repair_names_its_dump_and_chunks_and_no_other_dumps_request_counts() -> None:
    text = repairs.requested_by(12, [40, 41, 43])
    assert text.startswith("dblog repair of dump 12, chunks 40-41,43: ")
    assert repairs.repaired_chunks(text, 12) == {40, 41, 43}
    assert repairs.repaired_chunks(text, 1) == set()  # another dump's chunks
    assert repairs.repaired_chunks("airflow: nightly", 12) == set()
    assert repairs.repaired_chunks("", 12) == set()


def test_scattered_chunk_ids_are_split_so_each_request_fits_its_column() -> None:
    ids = list(range(1, 400, 2))  # no two consecutive: one long list
    parts = list(repairs.groups(5, ids))
    assert len(parts) > 1 and sorted(i for p in parts for i in p) == ids
    assert all(len(repairs.requested_by(5, p)) <= repairs.REQUESTED_BY_MAX for p in parts)
    assert list(repairs.groups(5, [1, 2, 3])) == [[1, 2, 3]]


def test_a_replayed_request_creates_no_second_dump_of_the_same_chunks(tmp_path) -> None:
    store = MetadataStore(f"sqlite:///{tmp_path}/meta.db")
    for _ in range(4):  # dumps 1-4 of stream "s"; the chunks below are of dumps 3 and 4
        store.create_dump("s", "tables", [])
    first = store.request_repair("app.t", ["id"], 3, {10: [[5], [6]], 11: [[6], [9]]}, 2)
    assert len(first) == 1
    dump = store.dump(first[0])
    assert (dump.kind, dump.tables, dump.state) == ("keys", ["app.t"], "pending")
    assert dump.requested_by.startswith("dblog repair of dump 3, chunks 10-11: ")
    chunks = store.chunks(first[0])
    assert [c.keys for c in chunks] == [[[5], [6]], [[9]]]  # each key once, 2 per chunk
    assert store.request_repair("app.t", ["id"], 3, {10: [[5]], 11: [[9]]}) == []
    # a batch cut differently names one chunk already asked for and one new: only the new one
    again = store.request_repair("app.t", ["id"], 3, {11: [[9]], 12: [[20]]})
    assert len(again) == 1 and [c.keys for c in store.chunks(again[0])] == [[[20]]]
    assert store.request_repair("app.t", ["id"], 3, {13: []}) == []  # nothing extra
    # another dump's chunks with the same ids are its own
    assert len(store.request_repair("app.t", ["id"], 4, {10: [[5]]})) == 1


def test_a_cancelled_dumps_chunks_ask_for_no_repair(tmp_path) -> None:
    from airflow_dblog.engine.metadata.dumps import TablePlan

    store = MetadataStore(f"sqlite:///{tmp_path}/meta.db")
    dump_id = store.create_dump("s", "tables", [TablePlan("app.t", ["id"], 10)])
    store.set_table_bound(store.dump_tables(dump_id)[0].id, [9])
    chunk = store.cut_range_chunk(store.dump_tables(dump_id)[0].id, None, None, "w")
    assert chunk is not None
    store.apply(dump_id, "cancel")
    assert store.request_repair("app.t", ["id"], dump_id, {chunk.id: [[5]]}) == []
