"""The chunk executor against a source in memory: table bounds read when the first chunk is cut,
keyset chunks, the window between the watermarks, and whose fault a failure is."""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from airflow_dblog.core.events import ChangeEvent, LogItem, TableId, WatermarkEvent
from airflow_dblog.core.merge import DumpedRows, WatermarkMerge
from airflow_dblog.engine.chunk_executor import ChunkExecutor, page_limit
from airflow_dblog.engine.chunk_file import ChunkFiles, Covered
from airflow_dblog.engine.chunk_runner import ThreadChunkRunner
from airflow_dblog.engine.metadata import MetadataStore
from airflow_dblog.engine.metadata.dumps import FIRST_CHUNK_ROWS
from airflow_dblog.engine.planner import plan_dump
from airflow_dblog.engine.watermarks import watermark_strategy
from airflow_dblog.errors import SourceError
from tests.support.fake_source import FakeChangelogReader, FakeDatabase, FakeSource, fake_config

STREAM = "fake"


@pytest.fixture
def items(fake_db: FakeDatabase) -> TableId:
    table = fake_db.create_table("items", {"id": "int", "v": "text"})
    fake_db.insert(table, *({"id": i, "v": f"v{i}"} for i in range(1, 9)))
    return table


@pytest.fixture
def executor(fake_db: FakeDatabase, meta: MetadataStore, tmp_path: Path) -> Iterator[ChunkExecutor]:
    source = FakeSource(fake_db.url)
    files = ChunkFiles(str(tmp_path / "chunks"))
    strategy = watermark_strategy("table", source, STREAM)
    runner = ThreadChunkRunner(files)
    merge = WatermarkMerge(history_limit=0)
    executor = ChunkExecutor(
        source, meta, merge, STREAM, strategy, "worker", runner, files, fake_db.url
    )
    yield executor
    executor.close()
    runner.close()


def _dump(db: FakeDatabase, meta: MetadataStore, tmp_path: Path, **kw: object) -> int:
    config = fake_config(db, list(db.tables), tmp_path, chunk_size=3)
    return plan_dump(config, meta, **kw)  # type: ignore[arg-type]


def _poll_until_done(executor: ChunkExecutor) -> None:
    deadline = time.monotonic() + 10
    while executor.in_flight:
        assert time.monotonic() < deadline, "the chunk's SELECT never finished"
        executor.poll()
        time.sleep(0.005)


def _watermarks(db: FakeDatabase) -> list[WatermarkEvent]:
    return [i for i in db.log if isinstance(i, WatermarkEvent)]


def test_the_upper_bound_is_the_largest_key_when_the_first_chunk_is_cut(
    fake_db: FakeDatabase, items: TableId, meta: MetadataStore, executor: ChunkExecutor,
    tmp_path: Path,
) -> None:  # fmt: skip
    """Rows inserted after the request are dumped; rows inserted after the cut come by log."""
    dump_id = _dump(fake_db, meta, tmp_path, tables=["db.items"])
    fake_db.insert(items, {"id": 20, "v": "after the request"})
    assert executor.claim(3) is not None
    fake_db.insert(items, {"id": 30, "v": "after the cut"})
    (table,) = meta.dump_tables(dump_id)
    assert table.bounded and table.max_key == [20]


def test_range_chunks_end_at_every_nth_key_and_the_last_at_the_bound(
    fake_db: FakeDatabase, items: TableId, meta: MetadataStore, executor: ChunkExecutor,
    tmp_path: Path,
) -> None:  # fmt: skip
    dump_id = _dump(fake_db, meta, tmp_path)
    chunks = [executor.claim(3) for _ in range(3)]
    assert [(c.lower_key, c.upper_key) for c in chunks if c is not None] == [
        (None, [3]),
        ([3], [6]),
        ([6], [8]),
    ]
    assert executor.claim(3) is None
    assert meta.dump_tables(dump_id)[0].exhausted


def test_a_tables_first_chunk_is_short_when_chunks_are_long_so_its_first_rows_come_early(
    fake_db: FakeDatabase, meta: MetadataStore, executor: ChunkExecutor, tmp_path: Path
) -> None:
    big = fake_db.create_table("big", {"id": "int"})
    fake_db.insert(big, *({"id": i} for i in range(1, 4 * FIRST_CHUNK_ROWS + 1)))
    _dump(fake_db, meta, tmp_path)
    size = 2 * FIRST_CHUNK_ROWS
    chunks = [executor.claim(size) for _ in range(3)]
    assert [(c.lower_key, c.upper_key) for c in chunks if c is not None] == [
        (None, [FIRST_CHUNK_ROWS]),
        ([FIRST_CHUNK_ROWS], [FIRST_CHUNK_ROWS + size]),
        ([FIRST_CHUNK_ROWS + size], [4 * FIRST_CHUNK_ROWS]),
    ]


def test_an_empty_tables_dump_finishes_without_a_chunk(
    fake_db: FakeDatabase, meta: MetadataStore, executor: ChunkExecutor, tmp_path: Path
) -> None:
    fake_db.create_table("empty", {"id": "int"})
    dump_id = _dump(fake_db, meta, tmp_path)
    assert executor.claim(3) is None
    assert meta.chunks(dump_id) == []
    assert meta.dump(dump_id).state == "done"


def test_a_chunk_selects_its_keyset_page_and_writes_the_high_watermark_after_the_rows(
    fake_db: FakeDatabase, items: TableId, meta: MetadataStore, executor: ChunkExecutor,
    tmp_path: Path,
) -> None:  # fmt: skip
    _dump(fake_db, meta, tmp_path)
    chunk = executor.claim(3)
    assert chunk is not None
    executor.start(chunk, 3)
    assert len(_watermarks(fake_db)) == 1  # the low one, before the SELECT was sent
    _poll_until_done(executor)
    low, high = _watermarks(fake_db)
    assert low.stream == high.stream == STREAM and low.value != high.value
    assert fake_db.selects == [(items, None, (3,), page_limit(3))]
    (done,) = meta.chunks(chunk.dump_id)
    assert (done.state, done.low_watermark, done.high_watermark) == (
        "selected",
        low.value,
        high.value,
    )
    assert executor.files.folders() != []


def _first_chunk_with_rows_inserted_after_its_cut(
    fake_db: FakeDatabase,
    meta: MetadataStore,
    executor: ChunkExecutor,
    tmp_path: Path,
    inserted: tuple[int, ...],
) -> int:
    """Keys 2, 4, 6, 8 cut by 3 (the first chunk up to 6), ``inserted`` between the cut and the
    SELECT; the dump's id once the chunk is selected."""
    table = fake_db.create_table("gaps", {"id": "int"})
    fake_db.insert(table, *({"id": i} for i in (2, 4, 6, 8)))
    _dump(fake_db, meta, tmp_path)
    chunk = executor.claim(3)
    assert chunk is not None and chunk.upper_key == [6]
    fake_db.insert(table, *({"id": i} for i in inserted))
    executor.start(chunk, 3)
    _poll_until_done(executor)
    return chunk.dump_id


def test_a_page_filled_before_its_upper_key_leaves_the_rest_of_the_range_to_a_new_chunk(
    fake_db: FakeDatabase, meta: MetadataStore, executor: ChunkExecutor, tmp_path: Path
) -> None:
    # the page of 4 now ends at 4
    dump_id = _first_chunk_with_rows_inserted_after_its_cut(
        fake_db, meta, executor, tmp_path, (1, 3, 5)
    )
    first, rest = meta.chunks(dump_id)
    assert (first.lower_key, first.upper_key, first.state) == (None, [4], "selected")
    assert (rest.lower_key, rest.upper_key, rest.state) == ([4], [6], "pending")


def test_a_row_inserted_into_a_chunks_range_since_its_cut_stays_in_the_chunk(
    fake_db: FakeDatabase, meta: MetadataStore, executor: ChunkExecutor, tmp_path: Path
) -> None:
    """No chunk of its own for the last few keys: the page has room beyond the cut's count."""
    dump_id = _first_chunk_with_rows_inserted_after_its_cut(fake_db, meta, executor, tmp_path, (3,))
    (only,) = meta.chunks(dump_id)
    assert (only.lower_key, only.upper_key, only.state) == (None, [6], "selected")
    assert only.rows_selected == 4


def test_each_range_chunk_covers_its_keys_the_first_from_below_and_the_last_above_its_bound(
    fake_db: FakeDatabase, meta: MetadataStore, executor: ChunkExecutor, tmp_path: Path
) -> None:
    """What the lake's extra keys are looked for in: (lower, upper], where a page that filled
    early ends at its last row, the first chunk has no lower end and the last reaches above the
    bound (for keys the lake last changed before the bound was read)."""
    reader = FakeChangelogReader(fake_db)
    table = fake_db.create_table("gaps", {"id": "int"})
    fake_db.insert(table, *({"id": i} for i in (2, 4, 6, 8, 10)))
    _feed(executor, reader)  # the log read so far: where the bound is read
    read = executor.merge.last_position
    dump_id = _dump(fake_db, meta, tmp_path)
    covers = []
    for inserted in ((1, 3, 5), (), (), ()):
        chunk = executor.claim(3)
        if chunk is None:
            break
        fake_db.insert(table, *({"id": i} for i in inserted))  # the first page ends at 4
        executor.start(chunk, 3)
        _poll_until_done(executor)
        (dumped,) = [o for o in _feed(executor, reader) if isinstance(o, DumpedRows)]
        covers.append(dumped.rows.covers)
    assert read is not None and meta.dump_tables(dump_id)[0].bound_position == str(read)
    assert covers == [
        Covered(None, [4]),  # filled early: up to its last row; from the table's first key
        Covered([4], [6]),  # the rest of the first cut
        Covered([6], [10], last=True, bound_position=str(read)),
    ]


def test_a_key_list_chunk_selects_only_the_keys_that_still_exist(
    fake_db: FakeDatabase, items: TableId, meta: MetadataStore, executor: ChunkExecutor,
    tmp_path: Path,
) -> None:  # fmt: skip
    dump_id = _dump(fake_db, meta, tmp_path, tables=["db.items"], keys=[[2], [5], [99]])
    chunk = executor.claim(3)
    assert chunk is not None and chunk.keys == [[2], [5], [99]]
    executor.start(chunk, 3)
    _poll_until_done(executor)
    assert fake_db.selects == []  # no keyset page
    assert [c.state for c in meta.chunks(dump_id)] == ["selected"]


def _feed(executor: ChunkExecutor, reader: FakeChangelogReader) -> list[object]:
    out: list[object] = []
    items: list[LogItem] = reader.read(1000, 0)
    for item in items:
        out.extend(executor.merge.feed(item))
    return out


def test_a_change_inside_the_window_drops_that_keys_dumped_row(
    fake_db: FakeDatabase, items: TableId, meta: MetadataStore, executor: ChunkExecutor,
    tmp_path: Path,
) -> None:  # fmt: skip
    reader = FakeChangelogReader(fake_db)
    _dump(fake_db, meta, tmp_path)
    chunk = executor.claim(3)
    assert chunk is not None
    executor.start(chunk, 3)
    fake_db.update(items, (2,), v="changed while the chunk ran")
    _poll_until_done(executor)
    out = _feed(executor, reader)
    changes = [o for o in out if isinstance(o, ChangeEvent)]
    (dumped,) = [o for o in out if isinstance(o, DumpedRows)]
    assert [c.key for c in changes] == [(2,)] and out.index(changes[0]) < out.index(dumped)
    assert dumped.changed == frozenset({(2,)}) and dumped.selected == 3
    high = _watermarks(fake_db)[-1]
    assert dumped.position == high.position  # rows go out at the high watermark
    assert executor.files.dropped(dumped.rows.folder, dumped.changed) == (1,)  # the file's 2nd row


def test_a_change_logged_before_the_low_watermark_is_no_conflict(
    fake_db: FakeDatabase, items: TableId, meta: MetadataStore, executor: ChunkExecutor,
    tmp_path: Path,
) -> None:  # fmt: skip
    reader = FakeChangelogReader(fake_db)
    _dump(fake_db, meta, tmp_path)
    fake_db.update(items, (2,), v="before the chunk")
    chunk = executor.claim(3)
    assert chunk is not None
    executor.start(chunk, 3)
    _poll_until_done(executor)
    (dumped,) = [o for o in _feed(executor, reader) if isinstance(o, DumpedRows)]
    assert dumped.changed == frozenset() and dumped.selected == 3


def test_a_chunk_of_a_dropped_table_fails_its_dump_in_one_line_and_the_stream_goes_on(
    fake_db: FakeDatabase, items: TableId, meta: MetadataStore, executor: ChunkExecutor,
    tmp_path: Path,
) -> None:  # fmt: skip
    dump_id = _dump(fake_db, meta, tmp_path)
    chunk = executor.claim(3)
    assert chunk is not None
    del fake_db.tables[items]
    executor.start(chunk, 3)  # no exception: the dump's own error
    dump = meta.dump(dump_id)
    assert dump.state == "failed"
    assert dump.reason is not None and "\n" not in dump.reason
    assert dump.reason.startswith("chunk db.items#") and "db.items does not exist" in dump.reason


def test_a_source_that_stops_answering_stops_the_stream_and_not_the_dump(
    fake_db: FakeDatabase, items: TableId, meta: MetadataStore, executor: ChunkExecutor,
    tmp_path: Path,
) -> None:  # fmt: skip
    dump_id = _dump(fake_db, meta, tmp_path)
    chunk = executor.claim(3)
    assert chunk is not None
    with fake_db.outage(), pytest.raises(SourceError, match="the fake server is down"):
        executor.start(chunk, 3)
    assert meta.dump(dump_id).state not in ("failed", "cancelled")


def test_a_primary_key_changed_since_the_request_fails_the_dump_naming_both_keys(
    fake_db: FakeDatabase, items: TableId, meta: MetadataStore, executor: ChunkExecutor,
    tmp_path: Path,
) -> None:  # fmt: skip
    dump_id = _dump(fake_db, meta, tmp_path)
    table = fake_db.tables[items]
    table.schema = replace(table.schema, key=("v",))
    assert executor.claim(3) is None
    dump = meta.dump(dump_id)
    assert dump.state == "failed" and dump.reason is not None
    assert "the primary key of db.items is (v), not (id)" in dump.reason


def test_a_cancelled_dumps_chunk_in_flight_is_dropped_with_its_file(
    fake_db: FakeDatabase, items: TableId, meta: MetadataStore, executor: ChunkExecutor,
    tmp_path: Path,
) -> None:  # fmt: skip
    dump_id = _dump(fake_db, meta, tmp_path)
    chunk = executor.claim(3)
    assert chunk is not None
    executor.start(chunk, 3)
    executor.cancel_dump(dump_id)
    _poll_until_done(executor)
    assert executor.merge.open_ids() == set()
    assert executor.files.folders() == []
    assert len(_watermarks(fake_db)) == 1  # no high watermark for a dropped chunk


@pytest.mark.parametrize("typed", [False, True], ids=["kafka-only", "with-delta"])
def test_a_stream_writing_to_delta_has_its_chunks_hold_the_columns_typed(
    fake_db: FakeDatabase, items: TableId, meta: MetadataStore, executor: ChunkExecutor,
    tmp_path: Path, typed: bool,
) -> None:  # fmt: skip
    executor.typed = typed
    reader = FakeChangelogReader(fake_db)
    _dump(fake_db, meta, tmp_path)
    chunk = executor.claim(3)
    assert chunk is not None
    executor.start(chunk, 3)
    _poll_until_done(executor)
    (dumped,) = [o for o in _feed(executor, reader) if isinstance(o, DumpedRows)]
    expected = (("id", "bigint"), ("v", "string")) if typed else ()
    assert dumped.rows.typed == expected
    (batch,) = executor.files.batches(dumped.rows.folder, ["v0"] if typed else ["after"])
    assert batch.column(0).to_pylist() == (
        [1, 2, 3] if typed else [f'{{"id":{i},"v":"v{i}"}}' for i in (1, 2, 3)]
    )
