"""The spool's segment files: atomic appends, Parquet rows in order and the footer in the
metadata, chunk references, plain JSON values, the conversion of JSON-lines segments of 0.2,
garbage collection of segments and the chunk files they refer to (on the object store:
tests/integration/engine/test_spool.py)."""

from __future__ import annotations

import datetime as dt
import decimal
import json
import os
import time
import uuid
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from airflow_dblog.core.events import ChangeEvent, TableId
from airflow_dblog.core.position import Position
from airflow_dblog.engine import segment
from airflow_dblog.engine.chunk_file import ChunkFiles, ChunkRef, encode_rows
from airflow_dblog.engine.event_text import EventText, plain_value
from airflow_dblog.engine.spool import (
    Spool,
    chunks_beside,
    dump_bounds,
    logged_tables,
    row_bounds,
    sole_dump_spans,
)
from airflow_dblog.errors import DblogError

pytest.importorskip("pyarrow")  # segments are Parquet (the [spark] extra)

TABLE = TableId("db", "t")
BASE = Position.mysql(1, 9)  # where the chunks below place their rows


def _event(offset: int) -> ChangeEvent:
    return ChangeEvent(TABLE, "c", (offset,), Position.mysql(1, offset), after={"id": offset})


def _chunk(
    files: ChunkFiles,
    keys: list[object],
    table: TableId = TABLE,
    chunk_id: int = 1,
    drops: tuple[int, ...] = (),
    first: int = 0,
) -> ChunkRef:
    """A closed chunk whose SELECT returned rows with these (one-column) keys, in this order:
    its chunk file written as the chunk's SELECT writes it, and the spool's reference to it."""
    pytest.importorskip("pyarrow")
    arrow, selected = encode_rows(chunk_id, [((k,), {"id": k}) for k in keys])
    folder = files.new_folder(chunk_id)
    files.write(folder, arrow)
    return ChunkRef(
        str(table), chunk_id, 1, folder, str(BASE), first, selected.count, drops, 1000,
        selected.key_span,
    )  # fmt: skip


def _rows(spool: Spool, seq: int) -> list[dict[str, Any]]:
    """The segment's rows as any Parquet reader sees them, in file order."""
    import pyarrow.parquet as pq

    with spool.store.open(spool.name(seq)) as source:
        rows: list[dict[str, Any]] = pq.read_table(source).to_pylist()
    return rows


def test_segments_are_numbered_whole_files_with_the_footer_last(tmp_path: Path) -> None:
    spool = Spool(tmp_path)
    assert spool.end() == 0
    assert spool.append([_event(1), _event(2)], {"reader": {"pos": 2}, "closed": []}) == 0
    assert spool.append([], {"reader": {"pos": 3}, "closed": [{"chunk_id": 7}]}) == 1
    assert spool.segments() == [0, 1] and spool.end() == 2
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "000000000000.parquet",
        "000000000001.parquet",
    ]
    assert (tmp_path / spool.name(0)).read_bytes()[:4] == b"PAR1"
    rows = _rows(spool, 0)
    assert [r["kind"] for r in rows] == ["event", "event", "footer"]
    assert [r["position"] for r in rows] == [
        str(Position.mysql(1, 1)),
        str(Position.mysql(1, 2)),
        None,
    ]
    assert json.loads(rows[-1]["record"]) == spool.footer(0)
    assert [r["kind"] for r in _rows(spool, 1)] == ["footer"]  # a heartbeat: its footer alone
    assert spool.read(0).items == [EventText.of(_event(1)), EventText.of(_event(2))]
    assert spool.footer(0) == {
        "reader": {"pos": 2},
        "closed": [],
        "seq": 0,
        "events": 2,
        "dumped": 0,
        "tables": ["db.t"],
        "logged": ["db.t"],
        "dump_keys": {},
        "log_keys": {"db.t": [1, 2]},
        "chunk_folders": [],
    }
    assert spool.footer(1)["closed"] == [{"chunk_id": 7}]
    assert not list(tmp_path.glob(".*.tmp"))  # nothing half-written is left behind


def test_a_half_written_segment_is_invisible(tmp_path: Path) -> None:
    spool = Spool(tmp_path)
    spool.append([_event(1)], {"closed": []})
    (tmp_path / ".1.tmp").write_text('{"table": "db.t"')  # a crash in the middle of append
    assert spool.segments() == [0]
    assert spool.append([_event(2)], {"closed": []}) == 1


def test_a_segment_is_never_overwritten_by_a_second_writer(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    spool = Spool(tmp_path)
    spool.append([_event(1)], {"closed": []})
    before = (tmp_path / spool.name(0)).read_bytes()
    late = Spool(tmp_path)
    monkeypatch.setattr(late, "end", lambda: 0)  # it numbered its segment before the first wrote
    with pytest.raises(DblogError, match=r"segment 0 in .* was written by another process"):
        late.append([_event(2)], {"closed": []})
    assert (tmp_path / spool.name(0)).read_bytes() == before
    assert not list(tmp_path.glob(".*.tmp"))


def test_a_segment_a_deposed_leader_adds_after_the_takeover_stops_the_new_one(
    tmp_path: Path,
) -> None:
    """The new leader resumed after segment 0; the old one, frozen between its fence check and
    its write, then adds segment 1 with the events the new leader reads again. Numbering on past
    it would send those events twice; the new leader stops instead (a restart continues after
    segment 1), and whichever of the two writes second is refused."""
    old = Spool(tmp_path)
    old.append([_event(1)], {"closed": []})
    new = Spool(tmp_path)
    new.continue_after(new.segments()[-1])
    old.append([_event(2)], {"closed": []})  # the deposed leader wakes up and writes
    with pytest.raises(DblogError, match=r"segment 1 in .* deposed leader"):
        new.append([_event(2)], {"closed": []})
    assert new.segments() == [0, 1]
    new.continue_after(0)
    with pytest.raises(DblogError, match="written by another process"):
        new.append([_event(2)], {"closed": []})
    newest = Spool(tmp_path)
    newest.continue_after(1)
    assert newest.append([_event(3)], {"closed": []}) == 2 and newest.append([], {}) == 3


def test_a_full_disk_is_one_clear_error_and_leaves_nothing_half_written(tmp_path: Path) -> None:
    spool = Spool(tmp_path)
    spool.append([_event(1)], {"closed": []})
    # the kernel's own "no space left": the next segment's temporary file is /dev/full
    (tmp_path / f".1.{os.getpid()}.tmp").symlink_to("/dev/full")
    with pytest.raises(DblogError, match=r"checkpoint disk is full: no space for spool segment 1"):
        spool.append([_event(2)] * 1000, {"closed": []})
    assert spool.segments() == [0] and not list(tmp_path.glob(".*"))
    assert spool.append([_event(2)], {"closed": []}) == 1  # space again: it carries on


def test_drop_before_deletes_only_older_segments(tmp_path: Path) -> None:
    spool = Spool(tmp_path)
    for i in range(4):
        spool.append([_event(i)], {"closed": []})
    assert spool.drop_before(2) == 2
    assert spool.segments() == [2, 3] and spool.end() == 4


def test_footers_say_which_tables_hold_only_dumped_rows_and_their_key_range(
    tmp_path: Path,
) -> None:
    spool = Spool(tmp_path / "spool")
    other = TableId("db", "u")
    files = spool.chunks
    spool.append([_chunk(files, [3, 5]), _chunk(files, ["b"], other, 2)], {"closed": []})
    spool.append([_chunk(files, [8]), _chunk(files, ["a"], other, 3), _event(1)], {"closed": []})
    spool.append([_chunk(files, [decimal.Decimal("1.5")], other, 4)], {"closed": []})
    footers = [spool.footer(seq) for seq in spool.segments()]
    assert footers[0]["dump_keys"] == {"db.t": [3, 5], "db.u": ["b", "b"]}
    assert footers[2]["dump_keys"] == {"db.u": None}  # decimals are text in Spark: no order
    assert dump_bounds(footers[:1]) == {"db.t": (3, 5), "db.u": ("b", "b")}
    assert dump_bounds(footers[:2]) == {"db.t": (3, 8), "db.u": ("a", "b")}
    assert logged_tables(footers[:2]) == {"db.t"}  # db.t has a log event too
    assert footers[1]["tables"] == ["db.t", "db.u"] and footers[1]["logged"] == ["db.t"]
    assert dump_bounds(footers) == {"db.t": (3, 8)}  # decimals are text here: no order to trust


def test_a_table_dumped_with_int_and_str_first_keys_has_no_key_range(tmp_path: Path) -> None:
    spool = Spool(tmp_path / "spool")
    files = spool.chunks
    spool.append([_chunk(files, [1, 2]), _chunk(files, ["x"], chunk_id=2)], {"closed": []})
    spool.append([_chunk(files, [7], chunk_id=3)], {"closed": []})
    mixed, alone = spool.footer(0), spool.footer(1)
    assert mixed["dump_keys"] == {"db.t": None} and mixed["tables"] == ["db.t"]
    assert alone["dump_keys"] == {"db.t": [7, 7]}
    assert dump_bounds([mixed, alone]) == {} and dump_bounds([alone]) == {"db.t": (7, 7)}
    spool.append([_chunk(files, [True], chunk_id=4)], {"closed": []})  # bools are not ints here
    assert spool.footer(2)["dump_keys"] == {"db.t": None}


def test_a_batchs_merge_bounds_span_each_logged_tables_log_and_dumped_keys(
    tmp_path: Path,
) -> None:
    spool = Spool(tmp_path / "spool")
    other = TableId("db", "u")
    files = spool.chunks
    spool.append([_event(12), _event(4), _chunk(files, ["b"], other, 2)], {"closed": []})
    spool.append([_chunk(files, [30, 31], chunk_id=3), _event(9)], {"closed": []})
    first, second = spool.footer(0), spool.footer(1)
    assert first["log_keys"] == {"db.t": [4, 12]}  # db.u has dumped rows alone: not logged
    assert row_bounds([first]) == {"db.t": (4, 12)}
    assert row_bounds([first, second]) == {"db.t": (4, 31)}  # its dumped keys too
    spool.append([ChangeEvent(other, "c", ("x",), Position.mysql(1, 99), after={})], {"closed": []})
    assert row_bounds([spool.footer(2)]) == {"db.u": ("x", "x")}
    unordered = _chunk(files, [decimal.Decimal("2.5")], chunk_id=5)
    spool.append([_event(1), unordered], {"closed": []})
    assert row_bounds([first, spool.footer(3)]) == {}  # a dumped key Spark orders otherwise
    older = {k: v for k, v in first.items() if k != "log_keys"}  # a footer from before
    assert row_bounds([older]) == {} and dump_bounds([older]) == {"db.u": ("b", "b")}


def _range(chunk_id: int, covers: list[Any] | None, **fields: Any) -> ChunkRef:
    """A closed chunk of dump 1 covering ``covers`` ([lower key or None, upper key])."""
    fields = {"dump_id": 1, "low": "p", **fields}
    return ChunkRef(
        "db.t", chunk_id, folder="", position=str(BASE), first=0, selected=0, drops=(),
        ts_ms=1, covers=covers, **fields,
    )  # fmt: skip


def test_a_batch_of_one_dumps_range_chunks_alone_spans_the_keys_they_cover() -> None:
    first, middle = _range(1, [None, [9]]), _range(2, [[9], [20]])
    last = _range(3, [[20], [30]], beyond="q")  # keys above its bound count too
    assert sole_dump_spans([first, middle], set()) == {"db.t": ({1, 2}, None, 20)}
    assert sole_dump_spans([middle, last], set()) == {"db.t": ({2, 3}, 9, None)}
    assert sole_dump_spans([_range(4, [["a"], ["k"]])], set()) == {"db.t": ({4}, "a", "k")}


def test_a_batch_mixing_log_events_dumps_key_lists_or_verify_chunks_spans_nothing() -> None:
    middle = _range(2, [[9], [20]])
    assert sole_dump_spans([middle], {"db.t"}) == {}  # log events of the table too
    assert sole_dump_spans([middle, _range(5, [[20], [30]], dump_id=2)], set()) == {}
    assert sole_dump_spans([middle, _range(6, None)], set()) == {}  # a key-list chunk
    assert sole_dump_spans([_range(7, [[9], [20]], verify="rows")], set()) == {}
    assert sole_dump_spans([_range(8, [["a"], [3]])], set()) == {}  # no order to trust


def test_a_chunk_reference_stands_where_its_rows_belong_and_the_footer_counts_them(
    tmp_path: Path,
) -> None:
    spool = Spool(tmp_path / "spool")
    assert spool.chunks.location == str(tmp_path / "chunks") == chunks_beside(spool.location)
    ref = _chunk(spool.chunks, [10, 11, 12, 13], drops=(1, 3), first=4)
    empty = ChunkRef("db.t", 9, 1, "", str(BASE), 0, 0, (), 1000)  # selected nothing: no folder
    seq = spool.append([_event(1), ref, empty, _event(2)], {"closed": [{"chunk_id": 1}]})
    rows = _rows(spool, seq)
    assert [r["kind"] for r in rows] == ["event", "chunk", "chunk", "event", "footer"]
    assert [r["record"] is None for r in rows] == [True, False, False, True, False]
    assert ChunkRef.from_record(json.loads(rows[1]["record"])) == ref
    assert ChunkRef.from_record(json.loads(rows[2]["record"])) == empty
    assert {r["table"] for r in rows[1:3]} == {None}  # a reference is no event: no event column
    assert Spool(tmp_path / "spool").read(seq).items == [
        EventText.of(_event(1)),
        ref,
        empty,
        EventText.of(_event(2)),
    ]
    footer = spool.footer(seq)
    assert (footer["events"], footer["dumped"]) == (4, 2)  # 2 log events, 2 of 4 rows kept
    assert footer["chunk_folders"] == [ref.folder]
    assert footer["tables"] == ["db.t"] and footer["dump_keys"] == {"db.t": [10, 13]}
    # every row dropped: the chunk closes (its folder goes with the segment), no row is dumped
    gone = _chunk(spool.chunks, ["a", "b"], TableId("db", "u"), 2, drops=(0, 1))
    seq = spool.append([gone], {"closed": [{"chunk_id": 2}]})
    footer = spool.footer(seq)
    assert (footer["events"], footer["dumped"], footer["tables"]) == (0, 0, [])
    assert footer["dump_keys"] == {} and footer["chunk_folders"] == [gone.folder]
    assert spool.read(seq).items == [gone]
    rows = [(t.position, t.after) for t in ref.texts(spool.chunks)]  # rows 0 and 2 of the file
    assert rows == [
        (str(BASE.dumped_row(4)), '{"id":10}'),
        (str(BASE.dumped_row(6)), '{"id":12}'),
    ]


def test_drop_before_deletes_the_chunk_files_of_the_dropped_segments_only(
    tmp_path: Path,
) -> None:
    spool = Spool(tmp_path / "spool")
    files = spool.chunks
    a, b, c = _chunk(files, [1]), _chunk(files, [2], chunk_id=2), _chunk(files, [3], chunk_id=3)
    unreferenced = _chunk(files, [4], chunk_id=4).folder  # selected, its window still open
    spool.append([a, _event(1)], {"closed": []})
    spool.append([_event(2), b], {"closed": []})
    spool.append([], {"closed": []})
    spool.append([c], {"closed": []})
    assert files.folders() == sorted([a.folder, b.folder, c.folder, unreferenced])
    assert spool.drop_before(1) == 1
    assert files.folders() == sorted([b.folder, c.folder, unreferenced])
    with pytest.raises(DblogError, match="missing"):
        files.files(a.folder)
    # another process (a restart) learns a segment's folders from its footer
    restarted = Spool(tmp_path / "spool")
    assert restarted.drop_before(3) == 2 and restarted.segments() == [3]
    assert files.folders() == sorted([c.folder, unreferenced])
    assert spool.drop_before(4) == 1 and spool.segments() == []
    assert files.folders() == [unreferenced]  # delete_except's, at the capture's restart


def test_a_backlog_is_read_in_bites_of_bounded_size(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("pyspark")
    from airflow_dblog.spark import changelog_source

    spool = Spool(tmp_path)
    for i in range(10):
        spool.append([_event(i)] * 50, {"closed": []})
    three = sum(spool.size(seq) for seq in range(3))  # compressed: sizes differ by a byte or so
    assert list(spool.entries()) == list(range(10))
    assert list(spool.entries(after=6)) == [7, 8, 9] and spool.entries(after=9) == {}
    monkeypatch.setattr(changelog_source, "MAX_BATCH_BYTES", three)
    reader = changelog_source.ChangelogStreamReader(str(tmp_path))
    assert reader.latestOffset(None) == {"segment": 10}  # the first call: where the spool ends
    assert reader.latestOffset({"segment": 0}) == {"segment": 3}
    monkeypatch.setattr(changelog_source, "MAX_BATCH_BYTES", three - 1)
    assert reader.latestOffset({"segment": 0}) == {"segment": 2}
    assert reader.latestOffset({"segment": 9}) == {"segment": 10}
    monkeypatch.setattr(changelog_source, "MAX_BATCH_BYTES", 1)
    assert reader.latestOffset({"segment": 4}) == {"segment": 5}  # one segment, however big
    assert len(reader.partitions({"segment": 0}, {"segment": 10})) == 1  # small: one task


def test_a_small_batch_waits_until_its_oldest_segment_is_old(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A Delta batch costs seconds of CPU however small: a quiet log's few events a second
    wait ``wait_s`` and go together; a big batch or a dump chunk's completion goes at once."""
    pytest.importorskip("pyspark")
    from airflow_dblog.spark import changelog_source

    spool = Spool(tmp_path)
    spool.append([], {"closed": []})  # heartbeats
    spool.append([_event(1)], {"closed": []})
    reader = changelog_source.ChangelogStreamReader(str(tmp_path), wait_s=60)
    assert reader.latestOffset({"segment": 0}) == {"segment": 0}  # one event: it waits
    spool.append([], {"closed": [{"chunk_id": 1}]})  # a chunk closed with no rows left
    assert reader.latestOffset({"segment": 0}) == {"segment": 3}
    spool.append([_event(2)] * 10, {"closed": []})
    assert reader.latestOffset({"segment": 3}) == {"segment": 3}
    monkeypatch.setattr(changelog_source, "FULL_BATCH_EVENTS", 11)
    spool.append([_event(3)], {"closed": []})
    assert reader.latestOffset({"segment": 3}) == {"segment": 3}  # 11 events, still arriving
    monkeypatch.setattr(changelog_source, "QUIET_S", 0.0)
    assert reader.latestOffset({"segment": 3}) == {"segment": 5}  # 11 events, the log paused
    spool.append([_event(4)], {"closed": []})
    assert reader.latestOffset({"segment": 5}) == {"segment": 5}
    assert changelog_source.ChangelogStreamReader(str(tmp_path)).latestOffset({"segment": 5}) == {
        "segment": 6
    }  # wait_s 0: at once


def test_a_due_batch_waits_a_moment_for_a_chunk_still_being_selected(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A dump's chunk that misses a big batch by a moment would cost a whole batch of its own."""
    changelog_source, clock, spool, reader = _reader_after_a_chunk(
        tmp_path, monkeypatch, selecting=1
    )
    assert reader.latestOffset({"segment": 0}) == {"segment": 0}  # chunk 2 is being selected
    spool.append([], {"closed": [{"chunk_id": 2}], "selecting": 0})
    assert reader.latestOffset({"segment": 0}) == {"segment": 2}  # it closed: both go
    spool.append([_event(1)], {"closed": [], "selecting": 1})
    clock[0] += 0.25  # that batch took 0.25 s: the wait is CHUNK_WAIT_S
    assert reader.latestOffset({"segment": 2}) == {"segment": 2}  # due by age, waits too
    clock[0] += changelog_source.CHUNK_WAIT_S
    assert reader.latestOffset({"segment": 2}) == {"segment": 3}  # no longer than that


def test_a_due_batch_waits_for_a_chunk_being_selected_as_long_as_the_last_batch_took(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A chunk that closes just after a batch starts waits for it and then for a batch of its
    own: waiting up to one batch's time for it costs its rows nothing and saves a batch."""
    changelog_source, clock, spool, reader = _reader_after_a_chunk(
        tmp_path, monkeypatch, selecting=0
    )
    assert reader.latestOffset({"segment": 0}) == {"segment": 1}
    clock[0] += 6.0  # Spark asks again once that batch is written: it took 6 s
    spool.append([], {"closed": [{"chunk_id": 2}], "selecting": 1})
    assert reader.latestOffset({"segment": 1}) == {"segment": 1}
    clock[0] += 5.5
    assert reader.latestOffset({"segment": 1}) == {"segment": 1}
    clock[0] += 0.5
    assert reader.latestOffset({"segment": 1}) == {"segment": 2}  # a batch's time: it goes
    clock[0] += 0.5  # that one took 0.5 s: the next waits CHUNK_WAIT_S
    spool.append([], {"closed": [{"chunk_id": 3}], "selecting": 1})
    assert reader.latestOffset({"segment": 2}) == {"segment": 2}
    clock[0] += changelog_source.CHUNK_WAIT_S
    assert reader.latestOffset({"segment": 2}) == {"segment": 3}


def test_a_due_batch_holding_a_heavy_log_waits_for_a_chunk_only_a_moment_however_long_the_last_took(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Waiting as long as the last batch took would make the next one as much bigger: under a
    heavy log each batch would wait longer than the one before, until the log outran Delta."""
    changelog_source, clock, spool, reader = _reader_after_a_chunk(
        tmp_path, monkeypatch, selecting=0
    )
    monkeypatch.setattr(changelog_source, "FULL_BATCH_EVENTS", 3)
    assert reader.latestOffset({"segment": 0}) == {"segment": 1}
    clock[0] += 6.0  # that batch took 6 s
    spool.append([_event(1), _event(2)], {"closed": [{"chunk_id": 2}], "selecting": 1})
    assert reader.latestOffset({"segment": 1}) == {"segment": 1}  # 2 log events: it waits
    clock[0] += changelog_source.CHUNK_WAIT_S
    assert reader.latestOffset({"segment": 1}) == {"segment": 1}  # up to 6 s
    spool.append([_event(3)], {"closed": [], "selecting": 1})
    assert reader.latestOffset({"segment": 1}) == {"segment": 3}  # 3: no longer


@pytest.mark.parametrize(("unselected", "waits_s"), [(1, 8.0), (12, 3.0)])
def test_a_due_batch_waits_longer_for_a_dump_whose_end_is_due_before_its_longest_wait_runs_out(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, unselected: int, waits_s: float
) -> None:
    """Left behind, the last chunks would wait for this batch and then make one of their own."""
    changelog_source, clock, spool, reader = _reader_after_a_chunk(
        tmp_path, monkeypatch, selecting=0
    )
    assert changelog_source.DUMP_END_S == 10.0
    assert reader.latestOffset({"segment": 0}) == {"segment": 1}
    clock[0] += 3.0  # that batch took 3 s: the wait is 3 s, and at most 10 s (DUMP_END_S)
    for n, written_ago in enumerate([2.5, 1.5, 0.5], start=2):  # a chunk closed every second
        seq = spool.append([], {"closed": [{"chunk_id": n}], "selecting": 1, "unselected": 0})
        os.utime(tmp_path / Spool.name(seq), (clock[0] - written_ago,) * 2)
    seq = spool.append([], {"closed": [], "selecting": 1, "unselected": unselected})
    os.utime(tmp_path / Spool.name(seq), (clock[0],) * 2)
    # 1 + 1 chunks left close in 2 s: it waits while they would close before 10 s have
    # passed; 1 + 12 would not even after the 3 s
    assert reader.latestOffset({"segment": 1}) == {"segment": 1}
    clock[0] += waits_s - 0.125
    assert reader.latestOffset({"segment": 1}) == {"segment": 1}
    clock[0] += 0.125
    assert reader.latestOffset({"segment": 1}) == {"segment": 5}


def test_a_dumps_slow_first_chunks_do_not_set_the_pace_of_its_last_ones(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _, clock, spool, reader = _reader_after_a_chunk(tmp_path, monkeypatch, selecting=0)
    assert reader.latestOffset({"segment": 0}) == {"segment": 1}
    clock[0] += 3.0  # that batch took 3 s: the wait is 3 s, and at most 10 s
    # chunks closed 4 s apart at first, then every half second
    for n, written_ago in enumerate([6.0, 2.0, 1.5, 1.0, 0.5], start=2):
        seq = spool.append([], {"closed": [{"chunk_id": n}], "selecting": 1, "unselected": 0})
        os.utime(tmp_path / Spool.name(seq), (clock[0] - written_ago,) * 2)
    seq = spool.append([], {"closed": [], "selecting": 1, "unselected": 9})
    os.utime(tmp_path / Spool.name(seq), (clock[0],) * 2)
    # 1 + 9 chunks at half a second each are due in 5 s: it waits 5 s (at the whole run's
    # pace, 1.375 s each, they would be due after the 10 s: it would go after 3 s)
    assert reader.latestOffset({"segment": 1}) == {"segment": 1}
    clock[0] += 5.0 - 0.125
    assert reader.latestOffset({"segment": 1}) == {"segment": 1}
    clock[0] += 0.125
    assert reader.latestOffset({"segment": 1}) == {"segment": 7}


def test_a_batch_waiting_for_a_chunk_starts_when_it_lands_not_at_the_next_trigger(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    changelog_source, clock, spool, reader = _reader_after_a_chunk(
        tmp_path, monkeypatch, selecting=1
    )
    monkeypatch.setattr(changelog_source, "FOLLOW_S", 0.8)
    asked = clock[0]
    assert reader.latestOffset({"segment": 0}) == {"segment": 0}  # nothing landed: one call
    assert clock[0] - asked == pytest.approx(0.8)  # looked for 0.8 s, under the trigger's 1 s
    looks = [0]
    sleep = changelog_source.time.sleep

    def chunk_lands_at_the_third_look(seconds: float) -> None:
        sleep(seconds)
        looks[0] += 1
        if looks[0] == 3:
            spool.append([], {"closed": [{"chunk_id": 2}], "selecting": 0})

    monkeypatch.setattr(changelog_source.time, "sleep", chunk_lands_at_the_third_look)
    asked = clock[0]
    assert reader.latestOffset({"segment": 0}) == {"segment": 2}
    assert clock[0] - asked == pytest.approx(0.3)


def _reader_after_a_chunk(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, selecting: int
) -> tuple[Any, list[float], Spool, Any]:
    """The changelog source module, its clock, and its reader on a spool whose first segment
    closes chunk 1 with ``selecting`` chunks being selected; a waiting batch looks once per call
    (as if each look found nothing new, see the test above)."""
    pytest.importorskip("pyspark")
    from airflow_dblog.spark import changelog_source

    clock = _fake_clock(monkeypatch, changelog_source)
    monkeypatch.setattr(changelog_source, "FOLLOW_S", 0.0)
    spool = Spool(tmp_path)
    spool.append([], {"closed": [{"chunk_id": 1}], "selecting": selecting})
    return changelog_source, clock, spool, changelog_source.ChangelogStreamReader(str(tmp_path))


def _fake_clock(monkeypatch: pytest.MonkeyPatch, module: Any) -> list[float]:
    """The reader's clock, moved by the test alone: whole seconds ahead of the segments' times
    (they are old enough for any age rule), steps the tests take in exact binary fractions."""
    clock = [float(int(time.time()) + 10)]

    def sleep(seconds: float) -> None:
        clock[0] += seconds

    monkeypatch.setattr(module, "time", SimpleNamespace(time=lambda: clock[0], sleep=sleep))
    return clock


def test_a_batch_is_due_when_old_big_or_completing_a_chunk() -> None:
    pytest.importorskip("pyspark")
    from airflow_dblog.spark.changelog_source import (
        FULL_BATCH_EVENTS,
        IDLE_BATCH_S,
        QUIET_S,
        batch_due,
    )

    def due(
        age_s: float, events: int, closes: bool = False, wait_s: float = 5, quiet_s: float = 0.0
    ) -> bool:
        return batch_due(age_s, quiet_s, events, closes, wait_s)

    assert not due(4.9, events=1)
    assert due(5.0, events=1)
    assert due(0.0, events=0, closes=True)
    # a big batch goes once the log pauses (a burst still arriving is one MERGE), or when old
    assert not due(0.0, events=FULL_BATCH_EVENTS, quiet_s=QUIET_S - 0.1)
    assert due(0.0, events=FULL_BATCH_EVENTS, quiet_s=QUIET_S)
    assert not due(0.0, events=FULL_BATCH_EVENTS - 1, quiet_s=QUIET_S)
    assert due(5.0, events=FULL_BATCH_EVENTS, quiet_s=0.0)
    # heartbeats alone only move the committed offset: they wait at least IDLE_BATCH_S
    assert not due(IDLE_BATCH_S - 0.1, events=0, wait_s=0)
    assert due(IDLE_BATCH_S, events=0, wait_s=0)
    assert not due(IDLE_BATCH_S, events=0, wait_s=30)


def test_a_segment_read_from_memory_equals_the_one_read_from_disk(tmp_path: Path) -> None:
    """The Kafka forwarder takes recent segments from memory; after a restart, from the file."""
    memory = Spool(tmp_path / "spool", remember_events=10)
    update = ChangeEvent(
        TABLE,
        "u",
        ('ü"k', 2),
        Position.mysql(1, 7),
        before={"a": decimal.Decimal("1.50"), "b": None},
        after={"a": dt.date(2024, 1, 2), "b": b"\x00"},
        gtid="0-1-9",
        extra={"unavailable_columns": ["c"]},
    )
    chunk = _chunk(memory.chunks, [1, 2], drops=(0,), first=3)
    events = [_event(1), chunk, update]
    seq = memory.append(events, {"closed": []})
    from_memory = memory.read(seq)
    from_disk = Spool(tmp_path / "spool").read(seq)
    assert from_memory == from_disk
    data = memory.store.read(memory.name(seq))
    assert segment.encode(*from_disk) == data  # what was read is what was written, byte for byte
    assert Spool(tmp_path / "spool").read(seq) == from_disk  # the same file read again
    _, ref, updated = from_disk.items
    assert isinstance(ref, ChunkRef) and ref == chunk
    assert isinstance(updated, EventText) and updated == EventText.of(update)
    assert json.loads(updated.before) == {"a": "1.50", "b": None}
    assert memory.read(seq) == from_disk  # taken once from memory, then from the file


def test_the_footer_is_read_from_the_parquet_metadata_alone(tmp_path: Path) -> None:
    """``footer`` (every Delta trigger, every restart) reads the file's end, never its rows."""
    spool = Spool(tmp_path / "spool")
    ref = _chunk(spool.chunks, [4, 2], drops=(1,))
    closed = [{"chunk_id": 1, "selected": 2, "dropped": 1, "emitted": 1}]
    seq = spool.append([_event(1), ref, _event(2)], {"reader": {"pos": 9}, "closed": closed})
    data = spool.store.read(spool.name(seq))
    footer = spool.footer(seq)
    assert footer == segment.decode(data).footer == json.loads(_rows(spool, seq)[-1]["record"])
    assert footer["closed"] == closed and footer["chunk_folders"] == [ref.folder]
    assert (footer["events"], footer["dumped"], footer["reader"]) == (3, 1, {"pos": 9})
    # the same file with every row page wiped: the metadata (its last bytes) still says it all
    size = int.from_bytes(data[-8:-4], "little")  # the Parquet footer's length, then "PAR1"
    assert data[-4:] == b"PAR1"
    wiped = data[:4] + bytes(len(data) - 12 - size) + data[-8 - size :]
    assert len(wiped) == len(data)
    spool.store.create(spool.name(seq + 1), wiped)
    assert spool.footer(seq + 1) == footer
    with pytest.raises((OSError, ValueError)):  # the rows are gone (pyarrow: ArrowInvalid)
        spool.read(seq + 1)


def test_a_batch_gets_the_outline_of_segments_this_process_wrote_without_reading_them(
    tmp_path: Path,
) -> None:
    """Footers and chunk references as reading the files gives them; none of another run's."""
    earlier = Spool(tmp_path / "spool").append([_event(0)], {"closed": []})
    spool = Spool(tmp_path / "spool")
    ref = _chunk(spool.chunks, [4, 2], drops=(1,))
    seqs = [
        spool.append([_event(1), ref, _event(2)], {"reader": {"pos": 9}, "closed": []}),
        spool.append([_event(3)], {"closed": []}),
    ]
    outlines = spool.outlines([earlier, *seqs])
    assert list(outlines) == seqs  # the earlier run's segment: its file is read
    on_disk = [segment.decode(spool.store.read(spool.name(seq))) for seq in seqs]
    assert [o.footer for o in outlines.values()] == [d.footer for d in on_disk]
    assert [o.refs for o in outlines.values()] == [[ref], []]
    assert [r.key_span for r in outlines[seqs[0]].refs] == [
        i.key_span for i in on_disk[0].items if isinstance(i, ChunkRef)
    ]
    spool.drop_before(seqs[1])
    assert spool.outlines(seqs) == {seqs[1]: outlines[seqs[1]]}


def test_a_segment_has_the_typed_columns_of_the_arrow_schema(tmp_path: Path) -> None:
    import pyarrow.parquet as pq

    spool = Spool(tmp_path / "spool")
    update = ChangeEvent(
        TABLE,
        "u",
        (7,),
        Position.mysql(1, 7),
        before={"id": 7, "v": None},
        after={"id": 7, "v": 1},
        ts_ms=1234,
        gtid="0-1-9",
        extra={"unavailable_columns": ["v", "w"]},
    )
    dumped = ChangeEvent(
        TABLE, "r", (8,), BASE.dumped_row(0), after={"id": 8}, ts_ms=5, dump_id=2, chunk_id=3
    )
    ref = _chunk(spool.chunks, [1])
    seq = spool.append([update, ref, dumped, _event(1)], {"closed": []})
    with spool.store.open(spool.name(seq)) as source:
        schema = pq.read_schema(source)
    assert schema.names == segment.arrow_schema().names
    assert schema.remove_metadata().equals(segment.arrow_schema())
    assert schema.metadata[segment.FOOTER_KEY] == json.dumps(spool.footer(seq)).encode()
    ddl_names = [column.split()[0] for column in segment.SPARK_DDL.split(",")]
    assert ddl_names == schema.names  # what Spark reads the files with
    assert set(segment.EVENT_COLUMNS) == set(schema.names) - {"kind", "record"}
    rows = _rows(spool, seq)
    assert [r["kind"] for r in rows] == ["event", "chunk", "event", "event", "footer"]
    typed = {c: rows[0][c] for c in ("before", "ts_ms", "dump_id", "chunk_id", "unavailable")}
    assert typed == {
        "before": '{"id":7,"v":null}',
        "ts_ms": 1234,
        "dump_id": None,
        "chunk_id": None,
        "unavailable": ["v", "w"],
    }
    assert json.loads(rows[0]["source"]) == {"gtid": "0-1-9"} and rows[0]["key"] == "[7]"
    assert (rows[2]["op"], rows[2]["before"], rows[2]["dump_id"], rows[2]["chunk_id"]) == (
        "r",
        None,
        2,
        3,
    )
    assert (rows[3]["before"], rows[3]["unavailable"], rows[3]["source"]) == (None, None, "{}")
    assert all(rows[i][c] is None for i in (1, 4) for c in segment.EVENT_COLUMNS)
    assert spool.read(seq).items == [
        EventText.of(update),
        ref,
        EventText.of(dumped),
        EventText.of(_event(1)),
    ]


def test_the_same_input_is_the_same_bytes(tmp_path: Path) -> None:
    """A batch Spark planned before a crash reads back the same after it: a file is never
    rewritten, and a replayed append writes what the first one did."""
    first, second = Spool(tmp_path / "a" / "spool"), Spool(tmp_path / "b" / "spool")
    ref = ChunkRef("db.t", 9, 1, "000000000009-f", str(BASE), 0, 3, (1,), 1000, [1, 3])
    for spool in (first, second):
        spool.append([_event(1), ref, _event(2)], {"reader": {"pos": 2}, "closed": []})
        spool.append([], {"reader": {"pos": 3}, "closed": []})
    for seq in (0, 1):
        data = first.store.read(first.name(seq))
        assert second.store.read(second.name(seq)) == data
        assert first.read(seq) == first.read(seq) == segment.decode(data)


# ---------------------------------------------------------------------------------------------
# Segments of 0.2 (JSON lines): rewritten as Parquet when the stream starts


def _legacy(events: list[ChangeEvent], footer: dict[str, Any]) -> bytes:
    """A segment as 0.2 wrote it: a line per event (dumped rows inline), the footer last."""
    lines = [*(EventText.of(e).line() for e in events), json.dumps({"footer": footer})]
    return "".join(f"{line}\n" for line in lines).encode("utf-8")


def _legacy_footer(seq: int, events: list[ChangeEvent], **fields: Any) -> dict[str, Any]:
    """The footer fields 0.2 wrote."""
    return {
        "batch_id": 10 + seq,
        "reader": {"file": "mysql-bin.000001", "pos": 100 + seq},
        "position": str(Position.mysql(1, 100 + seq)),
        "source_ts_ms": 1700,
        "closed": [],
        "seq": seq,
        "events": len(events),
        "tables": sorted({str(e.table) for e in events}),
        "logged": sorted({str(e.table) for e in events if e.chunk_id is None}),
        "dump_keys": {},
        **fields,
    }


@pytest.fixture(params=["local"])
def spool_location(tmp_path: Path) -> str:
    """A local spool; tests/integration/engine/test_spool.py collects the tests that take this
    fixture again with a spool on the object store."""
    return str(tmp_path / "spool")


def test_json_lines_segments_of_0_2_are_rewritten_as_parquet(spool_location: str) -> None:
    spool = Spool(spool_location)
    other = TableId("db", "u")
    dumped = ChangeEvent(
        other, "r", (5,), BASE.dumped_row(0), after={"id": 5}, ts_ms=1000, dump_id=2, chunk_id=4
    )
    update = ChangeEvent(
        TABLE,
        "u",
        ('ü"k',),
        Position.mysql(1, 7),
        before={"a": decimal.Decimal("1.50"), "b": None},
        after={"a": dt.date(2024, 1, 2), "b": b"\x00"},
        gtid="0-1-9",
        extra={"unavailable_columns": ["c"]},
    )
    segments = [[_event(1), dumped, update, _event(2)], []]
    closed = [{"chunk_id": 4, "selected": 1, "dropped": 0, "emitted": 1}]
    footers = [
        _legacy_footer(0, segments[0], dump_keys={"db.u": [5, 5]}),
        _legacy_footer(1, segments[1], closed=closed),
    ]
    for seq, (events, footer) in enumerate(zip(segments, footers, strict=True)):
        spool.store.create(f"{seq:012d}.jsonl", _legacy(events, footer))
    assert spool.segments() == []  # not segments until converted
    assert spool.convert_legacy() == 2
    assert spool.segments() == [0, 1] and spool.store.list(".jsonl") == []
    restarted = Spool(spool_location)
    for seq, (events, footer) in enumerate(zip(segments, footers, strict=True)):
        read = restarted.read(seq)
        assert read.items == [EventText.of(e) for e in events]  # the same events, in order
        assert read.footer == restarted.footer(seq) == {**footer, "chunk_folders": []}
    assert restarted.read(0).items[1].chunk_id == "4"  # the dumped row stays an event
    assert restarted.footer(0)["events"] == 4 and restarted.footer(1)["closed"]  # no heartbeats
    assert dump_bounds([restarted.footer(0)]) == {"db.u": (5, 5)}
    assert logged_tables([restarted.footer(0)]) == {"db.t"}
    data = [restarted.store.read(restarted.name(seq)) for seq in (0, 1)]
    assert restarted.convert_legacy() == 0  # nothing left to convert
    restarted.continue_after(restarted.segments()[-1])  # as the capture resumes
    assert restarted.append([_event(3)], {"closed": []}) == 2  # numbering carries on
    assert Spool(spool_location).append([], {"closed": []}) == 3
    assert Spool(spool_location).convert_legacy() == 0
    assert [restarted.store.read(restarted.name(seq)) for seq in (0, 1)] == data


def test_a_conversion_interrupted_after_its_write_only_deletes_the_json_lines(
    spool_location: str,
) -> None:
    """A crash between writing ``N.parquet`` and deleting ``N.jsonl``: the Parquet file is the
    segment (the sinks may have read it already), never written again."""
    spool = Spool(spool_location)
    spool.append([_event(1), _event(2)], {"reader": {"pos": 2}, "closed": []})  # converted
    before = spool.store.read(spool.name(0))
    old = [_event(1), _event(2)]
    spool.store.create("000000000000.jsonl", _legacy(old, _legacy_footer(0, old)))
    later = [_event(3)]
    spool.store.create("000000000001.jsonl", _legacy(later, _legacy_footer(1, later)))
    spool.store.create("notes.jsonl", b"not a segment\n")
    assert spool.convert_legacy() == 1  # segment 1; 0 was written before the crash
    assert spool.store.read(spool.name(0)) == before  # untouched
    assert spool.read(1).items == [EventText.of(_event(3))]
    assert sorted(e.name for e in spool.store.list(".jsonl")) == ["notes.jsonl"]
    assert spool.segments() == [0, 1] and spool.convert_legacy() == 0


def test_plain_values_are_what_consumers_can_read() -> None:
    assert plain_value(decimal.Decimal("1.10")) == "1.10"
    assert plain_value(dt.datetime(2024, 1, 2, 3, 4, 5)) == "2024-01-02T03:04:05"
    assert plain_value(dt.date(2024, 1, 2)) == "2024-01-02"
    assert plain_value(b"\x00\xff") == "AP8="
    assert plain_value(uuid.UUID(int=1)) == "00000000-0000-0000-0000-000000000001"
    assert plain_value({"a": [1, decimal.Decimal("2")]}) == '{"a":[1,"2"]}'
    assert plain_value(dt.timedelta(minutes=1)) == 60.0
