"""Chunk files: a chunk's rows as Parquet under ``<checkpoint>/chunks`` (locally and on the
object store: tests/integration/engine/test_chunk_file.py), the rows a window drops, and the
spool's reference that places them."""

from __future__ import annotations

import dataclasses
import datetime as dt
import decimal
import json
import uuid
from pathlib import Path
from typing import Any

import pytest

from airflow_dblog.core.events import ChangeEvent, TableId
from airflow_dblog.core.keys import match_key, to_json
from airflow_dblog.core.merge import DumpedRows, expand
from airflow_dblog.core.position import Position
from airflow_dblog.engine import chunk_file, segment
from airflow_dblog.engine.chunk_file import (
    ChunkFiles,
    ChunkRef,
    ChunkRows,
    arrow_schema,
    encode_rows,
    span,
)
from airflow_dblog.engine.event_text import EventText
from airflow_dblog.errors import DblogError

pa = pytest.importorskip("pyarrow")  # the [spark] extra

TABLE = TableId("db", "t")
BASE = Position.mysql(3, 1234, 2, 0)  # a high watermark's position: rows are placed after it


def _rows(keys: list[Any]) -> list[tuple[tuple[Any, ...], dict[str, Any]]]:
    """Rows with these keys (a scalar is a one-column key), in this (SELECT) order."""
    out = []
    for k in keys:
        key = k if isinstance(k, tuple) else (k,)
        out.append((key, {"id": key[0], "n": len(out)}))
    return out


def _write(files: ChunkFiles, rows: list[Any], chunk_id: int = 1) -> str:
    folder = files.new_folder(chunk_id)
    files.write(folder, encode_rows(chunk_id, rows)[0])
    return folder


def _ref(folder: str, selected: int, drops: tuple[int, ...] = (), first: int = 0) -> ChunkRef:
    return ChunkRef(str(TABLE), 1, 7, folder, str(BASE), first, selected, drops, 1000, None)


# ---------------------------------------------------------------------------------------------
# encode_rows: the file's table and what the driver is told


def test_encode_rows_holds_the_texts_the_spool_and_kafka_would_hold() -> None:
    rows: list[tuple[tuple[Any, ...], dict[str, Any]]] = [
        (
            (1, 'ü"k'),
            {
                "id": 1,
                "name": 'ü"k',
                "price": decimal.Decimal("1.50"),
                "at": dt.datetime(2024, 1, 2, 3, 4, 5),
                "day": dt.date(2024, 1, 2),
                "raw": b"\x00\xff",
                "doc": {"a": [1, decimal.Decimal("2")]},
                "uid": uuid.UUID(int=1),
                "none": None,
            },
        ),
        ((2, "a"), {"id": 2, "name": "a", "price": None}),
        ((2, "b"), {"id": 2, "name": "b", "flag": True, "ratio": 0.25}),
    ]
    table, selected = encode_rows(42, rows, info={"gtids": "0-1-5"})
    assert table.schema == arrow_schema()
    columns = table.to_pydict()
    assert columns["chunk_id"] == [42] * 3
    assert columns["idx"] == [0, 1, 2]  # SELECT order, whatever the key order
    texts = [
        EventText.of(ChangeEvent(TABLE, "r", key, BASE, after=row, chunk_id=42, dump_id=1))
        for key, row in rows
    ]
    assert columns["key"] == [t.key for t in texts]
    assert columns["after"] == [t.after for t in texts]
    assert json.loads(columns["after"][0])["price"] == "1.50"  # the text the source gave
    assert columns["mkey"] == [match_key(key) for key, _ in rows]
    assert selected.count == 3 and selected.info == {"gtids": "0-1-5"}
    assert selected.last_key == to_json((2, "b")) == [2, "b"]
    assert selected.key_span == [1, 2]  # the first key column only
    assert selected.error is None


def test_integer_keys_get_the_match_text_match_key_gives() -> None:
    keys: list[tuple[Any, ...]] = [(1,), (-5, 7), (2**70,), (True,), (3, decimal.Decimal("3.0"))]
    table, _ = encode_rows(1, [(key, {"id": key[0]}) for key in keys])
    assert table.column("mkey").to_pylist() == [match_key(key) for key in keys]


def test_encode_rows_of_no_rows_is_an_empty_file_and_nothing_to_tell() -> None:
    table, selected = encode_rows(3, [])
    assert table.num_rows == 0 and table.schema == arrow_schema()
    assert (selected.count, selected.last_key, selected.key_span) == (0, None, None)


def test_keys_asked_for_and_not_selected_are_reported_absent_whatever_their_spelling() -> None:
    rows = [((decimal.Decimal("1.50"),), {"k": decimal.Decimal("1.50")})]
    asked = [(decimal.Decimal("1.5"),), (decimal.Decimal("2"),)]
    _, selected = encode_rows(3, rows, asked=asked)
    assert selected.absent == ((decimal.Decimal("2"),),)
    assert encode_rows(3, rows)[1].absent == ()  # a range chunk asks for no keys


def test_the_last_key_is_json_as_the_metadata_store_keeps_keys() -> None:
    last = (dt.date(2024, 1, 2), b"\x01", decimal.Decimal("1.50"), uuid.UUID(int=2))
    _, selected = encode_rows(1, [(last, {"x": 1})])
    assert selected.last_key == to_json(last)
    assert selected.last_key == [
        "2024-01-02",
        {"$bytes": "01"},
        "1.50",
        "00000000-0000-0000-0000-000000000002",
    ]


@pytest.mark.parametrize(
    ("first_keys", "key_span"),
    [
        ([5, 2, 9, 3], [2, 9]),  # lowest and highest, not the first and the last
        ([-1], [-1, -1]),
        (["m", "b", "x"], ["b", "x"]),
        ([1, "a"], None),  # no order Python and Spark agree on
        (["a", 1], None),
        ([1, 2, decimal.Decimal("3")], None),  # decimals are text in Spark
        ([decimal.Decimal("1.5")], None),
        ([1.5], None),
        ([True, False], None),  # bool is not an int here
        ([1, None], None),
        ([dt.date(2024, 1, 1)], None),
        ([b"a"], None),
    ],
)
def test_the_key_span_is_the_first_key_columns_range_when_it_can_be_trusted(
    first_keys: list[Any], key_span: list[Any] | None
) -> None:
    rows = [((k, f"second{i}"), {"i": i}) for i, k in enumerate(first_keys)]
    assert encode_rows(1, rows)[1].key_span == key_span
    bounds: list[Any] | None = []
    for k in first_keys:
        bounds = span(bounds, k)
    assert (bounds or None) == key_span


def test_span_grows_and_stays_none_once_broken() -> None:
    assert span([], 3) == [3, 3]
    assert span([3, 3], 1) == [1, 3] and span([1, 3], 7) == [1, 7]
    assert span(None, 1) is None
    assert span([1, 3], "a") is None and span(["a", "a"], 1) is None
    assert span(["b", "c"], "a") == ["a", "c"]


# ---------------------------------------------------------------------------------------------
# ChunkFiles, on a local directory (tests/integration/engine/test_chunk_file.py: object store)


@pytest.fixture(params=["local"])
def files(tmp_path: Path) -> ChunkFiles:
    """Chunk files in a local folder; the integration tier collects the tests that take this
    fixture again with an object-store folder."""
    return ChunkFiles(str(tmp_path / "cp" / "chunks"))


def test_folder_names_carry_the_chunk_and_differ_per_select() -> None:
    a, b = ChunkFiles.new_folder(17), ChunkFiles.new_folder(17)
    assert a != b and a.startswith("000000000017-") and len(a) == 12 + 1 + 12
    assert ChunkFiles.chunk_of(a) == 17 == ChunkFiles.chunk_of(b)
    assert ChunkFiles.chunk_of("junk") is None and ChunkFiles.chunk_of("-x") is None


def test_a_written_folder_reads_back_row_for_row(
    files: ChunkFiles, monkeypatch: pytest.MonkeyPatch
) -> None:
    rows = _rows(list(range(10)))
    table, _ = encode_rows(5, rows)
    folder = files.new_folder(5)
    files.write(folder, table)
    (path,) = files.files(folder)
    assert path.endswith(f"/{folder}/part-00000.parquet")
    monkeypatch.setattr(chunk_file, "_BATCH_ROWS", 3)  # several batches per file
    batches = list(files.batches(folder, ("idx", "key", "after")))
    assert [b.num_rows for b in batches] == [3, 3, 3, 1]
    back = pa.Table.from_batches(batches)
    assert back.column_names == ["idx", "key", "after"]
    assert back.to_pydict() == table.select(["idx", "key", "after"]).to_pydict()
    whole = pa.Table.from_batches(list(files.batches(folder, arrow_schema().names)))
    assert whole.equals(table)
    assert files.folders() == [folder]


def test_uri_is_what_spark_reads_and_writes(files: ChunkFiles, tmp_path: Path) -> None:
    folder = files.new_folder(1)
    if files.location.startswith("s3a://"):
        assert not files.location.endswith("/")
        assert files.uri(folder) == f"{files.location}/{folder}"
    else:
        assert files.uri(folder) == (tmp_path / "cp" / "chunks" / folder).resolve().as_uri()


def test_spark_markers_and_hidden_files_are_not_rows(files: ChunkFiles) -> None:
    folder = _write(files, _rows([1, 2]))
    for name in ("_SUCCESS", ".part-00001.parquet.crc", "._tmp.parquet", "notes.txt"):
        with files.fs.open_output_stream(f"{files._path(folder)}/{name}") as out:
            out.write(b"not parquet")
    assert [p.rsplit("/", 1)[1] for p in files.files(folder)] == ["part-00000.parquet"]
    assert [r for b in files.batches(folder, ("idx",)) for r in b.column(0).to_pylist()] == [0, 1]


def test_several_files_of_a_folder_are_read_in_name_order(files: ChunkFiles) -> None:
    """Spark may split a folder into files: part-00000..., part-00001...; idx runs across."""
    folder = files.new_folder(1)
    table, _ = encode_rows(1, _rows([1, 2, 3, 4, 5]))
    files.fs.create_dir(files._path(folder), recursive=True)
    for i, (offset, length) in enumerate([(0, 2), (2, 3)]):
        with files.fs.open_output_stream(f"{files._path(folder)}/part-0000{i}-x.parquet") as out:
            out.write(chunk_file.parquet_bytes(table.slice(offset, length)))
    idxs = [r for b in files.batches(folder, ("idx",)) for r in b.column(0).to_pylist()]
    assert idxs == [0, 1, 2, 3, 4]
    ref = _ref(folder, 5, drops=(1, 4))
    assert [json.loads(t.key) for t in ref.texts(files)] == [[1], [3], [4]]


def test_a_missing_folder_is_a_clear_error(files: ChunkFiles) -> None:
    with pytest.raises(DblogError, match=r"chunk folder 000000000009-gone is missing from"):
        files.files("000000000009-gone")
    with pytest.raises(DblogError, match="missing"):
        list(_ref("000000000009-gone", 1).texts(files))


def test_a_staged_file_is_rows_only_once_published(files: ChunkFiles) -> None:
    """A Spark task stages, the driver publishes the attempt whose result it got: the file of
    an attempt Spark gave up on, written later, is never read."""
    folder = files.new_folder(1)
    given_up = files.stage(folder, encode_rows(1, _rows([1, 2]))[0])
    answered = files.stage(folder, encode_rows(1, _rows([3]))[0])
    assert given_up != answered and files.files(folder) == []
    files.publish(folder, answered)
    assert [p.rsplit("/", 1)[1] for p in files.files(folder)] == ["part-00000.parquet"]
    assert [json.loads(t.key) for t in _ref(folder, 1).texts(files)] == [[3]]


def test_a_local_write_leaves_no_temporary_file(tmp_path: Path) -> None:
    files = ChunkFiles(str(tmp_path / "chunks"))
    folder = _write(files, _rows([1]))
    assert sorted(p.name for p in (tmp_path / "chunks" / folder).iterdir()) == [
        "part-00000.parquet"
    ]


def test_dropped_matches_changed_keys_as_python_compares_them(
    files: ChunkFiles, monkeypatch: pytest.MonkeyPatch
) -> None:
    D = decimal.Decimal
    keys = [D("1.5"), D("2"), D("2.25"), D("3.10"), D("4"), D("-0")]
    folder = _write(files, _rows(keys))
    monkeypatch.setattr(chunk_file, "_BATCH_ROWS", 2)  # matches across batches
    assert files.dropped(folder, [(D("1.50"),)]) == (0,)  # the log's text of the same value
    assert files.dropped(folder, [(D("3.1"),), (D("2.0"),), (2,)]) == (1, 3)
    assert files.dropped(folder, [(D("4.000"),), (D("1.5"),), (D("0.00"),)]) == (0, 4, 5)
    assert files.dropped(folder, [(D("2.5"),), (D("2.250001"),)]) == ()
    assert files.dropped(folder, frozenset({(D("2.250"),)})) == (2,)
    assert all(
        (match_key(changed) == match_key(row)) == (changed == row)
        for changed in [(D("1.50"),), (D("2.0"),), (D("2.5"),)]
        for row, _ in _rows(keys)
    )


def test_dropped_matches_whole_composite_keys(files: ChunkFiles) -> None:
    keys = [
        (1, "a", dt.date(2024, 1, 1)),
        (1, "b", dt.date(2024, 1, 1)),
        (2, "a", dt.date(2024, 1, 1)),
        (2, "a", dt.date(2024, 1, 2)),
        (3, "ü\"'", dt.date(2024, 1, 1)),
    ]
    folder = _write(files, _rows(keys))
    day = dt.date(2024, 1, 1)
    assert files.dropped(folder, [(2, "a", day)]) == (2,)
    assert files.dropped(folder, [(1, "b", day), (3, "ü\"'", day)]) == (1, 4)
    assert files.dropped(folder, [(1, day, "a"), (1, "a"), (2, "a", dt.date(2024, 1, 3))]) == ()
    binary = _write(files, _rows([(b"\x00", 1), (b"\xff", 1)]), chunk_id=2)
    assert files.dropped(binary, [(bytearray(b"\xff"), 1)]) == (1,)


def test_dropped_reads_nothing_when_no_key_changed(files: ChunkFiles) -> None:
    assert files.dropped("000000000001-never-written", []) == ()  # the file is not even opened
    assert files.dropped("000000000001-never-written", frozenset()) == ()


def test_delete_and_delete_except_leave_what_is_kept(files: ChunkFiles) -> None:
    assert files.folders() == []
    a, b, c = (_write(files, _rows([i]), chunk_id=i) for i in (1, 2, 3))
    assert files.folders() == sorted([a, b, c])
    files.delete(b)
    files.delete(b)  # deleting twice (a replayed drop_before) is no error
    files.delete("000000000009-never-written")
    assert files.folders() == sorted([a, c])
    with pytest.raises(DblogError, match="missing"):
        files.files(b)
    d = _write(files, _rows([4]), chunk_id=4)
    assert files.delete_except([a, d, "000000000008-unknown"]) == 1  # c: selected, never closed
    assert files.folders() == sorted([a, d])
    assert files.delete_except([a, d]) == 0
    assert [r for x in files.batches(a, ("idx",)) for r in x.column(0).to_pylist()] == [0]
    assert files.delete_except([]) == 2 and files.folders() == []


def test_a_stale_folder_still_being_written_is_left_for_the_next_start(
    files: ChunkFiles, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A task of the killed run still writing its chunk file: an S3 store with directories
    refuses the delete ("Directory object not empty"); the restart goes on without it."""
    busy, _ = (_write(files, _rows([i]), chunk_id=i) for i in (1, 2))
    delete = files.delete

    def refuse(folder: str) -> None:
        if folder == busy:
            raise OSError(f"when deleting {folder}/_temporary/: Directory object not empty")
        delete(folder)

    monkeypatch.setattr(files, "delete", refuse)
    assert files.delete_except([]) == 1
    assert files.folders() == [busy] and busy in caplog.text
    monkeypatch.setattr(files, "delete", delete)  # the task ended: the next start deletes it
    assert files.delete_except([]) == 1 and files.folders() == []


def test_folders_of_a_location_never_written_is_empty(tmp_path: Path) -> None:
    assert ChunkFiles(str(tmp_path / "nowhere" / "chunks")).folders() == []


# ---------------------------------------------------------------------------------------------
# ChunkRef: the spool's record, the positions of the rows, the events they become


def test_a_range_chunks_reference_keeps_its_window_start_and_covered_keys() -> None:
    low = str(Position.mysql(1, 40))
    ref = ChunkRef(
        "db.t", 5, 2, "f", str(BASE), 0, 4, (), 1700, [1, 9],
        low=low, covers=[None, [9, "z"]], beyond=low,
    )  # fmt: skip
    back = ChunkRef.from_record(json.loads(ref.record()))
    assert back == ref and back.checks_extras
    assert (back.low, back.covers, back.beyond) == (low, [None, [9, "z"]], low)
    key_list = dataclasses.replace(ref, covers=None, low="", beyond="")
    assert not key_list.checks_extras
    assert not dataclasses.replace(ref, low="").checks_extras  # window start unknown


def test_a_reference_is_one_spool_record_and_back() -> None:
    ref = ChunkRef(
        "db.t", 5, 2, "000000000005-abc", str(BASE), 10, 4, (0, 3), 1700, [1, 9], {"x": 1}
    )
    record = ref.record()
    assert "\n" not in record and "extra" not in record
    back = ChunkRef.from_record(json.loads(record))
    assert back == ref and back.drops == (0, 3) and back.extra == {}
    assert json.loads(record) == {
        "table": "db.t",
        "chunk_id": 5,
        "dump_id": 2,
        "folder": "000000000005-abc",
        "position": str(BASE),
        "first": 10,
        "selected": 4,
        "drops": [0, 3],
        "ts_ms": 1700,
        "key_span": [1, 9],
        "deleted": 0,
        "low": "",
        "covers": None,
        "beyond": "",
        "verify": "",
        "absent": [],
        "typed": [],
    }
    # a record written before chunks counted their deletes (or their range) reads as none
    older = {
        k: v
        for k, v in json.loads(record).items()
        if k not in ("deleted", "low", "covers", "beyond")
    }
    assert ChunkRef.from_record(older) == ref and not ChunkRef.from_record(older).checks_extras
    plain = ChunkRef("db.t", 6, 2, "", str(BASE), 0, 0, (), 1700)
    assert ChunkRef.from_record(json.loads(plain.record())) == plain and plain.key_span is None
    assert (ref.emitted, plain.emitted) == (2, 0)
    assert ref.closed_record() == {"chunk_id": 5, "selected": 4, "dropped": 2, "emitted": 2}
    deleting = dataclasses.replace(ref, deleted=3)  # its deletes count as emitted
    assert deleting.closed_record()["emitted"] == 5 and deleting.emitted == 2
    # in a segment: a row of kind "chunk" whose record is this, in its place among the events
    event = EventText(
        "db.t", "c", "[1]", str(BASE), "null", '{"id":1}', "0", "null", "null", "[]", "{}"
    )
    stored = segment.decode(segment.encode([ref, event, plain], {"seq": 0}))
    assert stored.items == [ref, event, plain] and stored.footer == {"seq": 0}


@pytest.mark.parametrize(
    "base",
    [
        Position.mysql(3, 1234, 2, 0),
        Position.mysql(1, 4, epoch=2),
        Position.postgres(2**63 + 5, 17),
        Position.mysql(2**32 - 1, 2**63, 2**20),
    ],
)
@pytest.mark.parametrize("first", [0, 1, 999])
def test_a_rows_position_is_the_bases_dumped_row(base: Position, first: int) -> None:
    ref = ChunkRef("db.t", 1, 1, "f", str(base), first, 10, (), 0)
    for idx in (0, 1, 9, 12345):
        expected = str(Position.parse(str(base)).dumped_row(first + idx))
        assert ref.row_position(idx) == expected
        assert Position.parse(ref.row_position(idx)) > base  # after the watermark


def test_texts_are_the_events_the_window_emits_with_drops_left_out(files: ChunkFiles) -> None:
    """The same events as the merge's own rule (``expand``) for the same rows and changes."""
    D = decimal.Decimal
    rows = [
        ((D("1.5"), "a"), {"k": D("1.5"), "s": "a", "at": dt.datetime(2024, 5, 6, 7, 8, 9)}),
        ((D("1.5"), "b"), {"k": D("1.5"), "s": "b", "raw": b"\x00"}),
        ((D("2"), "a"), {"k": D("2"), "s": "a", "doc": {"x": [1]}}),
        ((D("3"), "c"), {"k": D("3"), "s": "c", "none": None}),
        ((D("4"), "d"), {"k": D("4"), "s": "d"}),
    ]
    changed = frozenset({(D("1.50"), "b"), (D("4.0"), "d"), (D("9"), "z")})
    table, selected = encode_rows(11, rows)
    folder = files.new_folder(11)
    files.write(folder, table)
    dumped = DumpedRows(
        11, 3, TABLE, selected.count, BASE, 20, changed, ChunkRows(folder, None), 1234
    )
    ref = ChunkRef(
        str(TABLE), 11, 3, folder, str(BASE), 20, selected.count,
        files.dropped(folder, changed), 1234, selected.key_span,
    )  # fmt: skip
    assert ref.drops == (1, 4) and ref.emitted == 3
    texts = list(ref.texts(files))
    assert texts == [EventText.of(e) for e in expand(dumped, rows)]
    assert [t.position for t in texts] == [ref.row_position(i) for i in (0, 2, 3)]
    assert [t.position for t in texts] == [str(BASE.dumped_row(20 + i)) for i in (0, 2, 3)]
    assert {(t.op, t.before, t.ts_ms, t.dump_id, t.chunk_id, t.source) for t in texts} == {
        ("r", "null", "1234", "3", "11", "{}")
    }
    line = texts[0].line()  # a dumped row's JSON line in a 0.2 segment (segment.decode_legacy)
    assert EventText.parse(line) == texts[0]
    assert segment.decode_legacy(f'{line}\n{{"footer": {{}}}}\n'.encode()).items == [texts[0]]
    everything = dataclasses.replace(ref, drops=())
    assert [json.loads(t.key) for t in everything.texts(files)] == [
        ["1.5", "a"],
        ["1.5", "b"],
        ["2", "a"],
        ["3", "c"],
        ["4", "d"],
    ]


def test_a_verify_chunk_emits_nothing_and_keeps_the_keys_it_found_absent() -> None:
    ref = ChunkRef(
        "db.t", 5, 2, "000000000005-abc", str(BASE), 10, 4, (0,), 1700,
        verify="dry-run", absent=[[7, "x"]],
    )  # fmt: skip
    back = ChunkRef.from_record(json.loads(ref.record()))
    assert back == ref and back.absent == [[7, "x"]]
    assert (back.compared, back.emitted) == (3, 0)
    assert back.closed_record()["emitted"] == 0
