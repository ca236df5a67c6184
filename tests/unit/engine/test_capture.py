"""The capture loop against a source in memory: log events in commit order, a dump interleaved
with writes that converges to the table, and restarts from the saved offset.

(tests/integration/engine/test_capture.py runs the loop on the real servers.)
"""

from __future__ import annotations

import dataclasses
import random
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from airflow_dblog.config import Config
from airflow_dblog.core.events import ChangeEvent, LogItem, TableId, WatermarkEvent
from airflow_dblog.engine.capture import Published
from airflow_dblog.engine.chunk_file import ChunkRef
from airflow_dblog.engine.metadata import MetadataStore
from airflow_dblog.engine.metadata.dumps import TablePlan
from airflow_dblog.engine.planner import plan_dump
from tests.support.fake_source import FakeChangelogReader, FakeDatabase, FakeSource, fake_config
from tests.support.memory_sink import MemoryCapture, MemorySink


@pytest.fixture
def items(fake_db: FakeDatabase) -> TableId:
    return fake_db.create_table("items", {"id": "int", "v": "text"})


def _open(config: Config, meta: MetadataStore, db: FakeDatabase, sink: MemorySink) -> MemoryCapture:
    """The capture as a (re)started stream opens it: from the saved offset, if any."""
    state = meta.stream_state(config.name)
    saved = (state.source_offset or {}) if state else {}
    reader = FakeChangelogReader(db, saved.get("reader"))
    return MemoryCapture(
        config, meta, FakeSource(db.url), reader, [sink], batch_id=saved.get("batch_id", 0)
    )


def _run_until(capture: MemoryCapture, done: Callable[[], bool], timeout_s: float = 30) -> None:
    deadline = time.monotonic() + timeout_s
    while not done():
        assert time.monotonic() < deadline, "the capture did not get there in time"
        capture.step(timeout_s=0)


def _drain(capture: MemoryCapture, db: FakeDatabase) -> None:
    """Step until the reader has read the whole log and nothing is in flight."""
    _run_until(
        capture,
        lambda: capture.reader.offset()["next"] == len(db.log) and not capture.executor.busy(),
    )
    capture.step(timeout_s=0)


def _logged_changes(db: FakeDatabase) -> list[ChangeEvent]:
    return [i for i in db.log if isinstance(i, ChangeEvent)]


def _writes(db: FakeDatabase, table: TableId, rng: random.Random, n: int, keys: int) -> None:
    """``n`` random inserts, updates and deletes on keys below ``keys``."""
    for _ in range(n):
        key = rng.randrange(keys)
        exists = (key,) in db.tables[table].rows
        if not exists:
            db.insert(table, {"id": key, "v": f"new {rng.random():.6f}"})
        elif rng.random() < 0.3:
            db.delete(table, (key,))
        else:
            db.update(table, (key,), v=f"upd {rng.random():.6f}")


def test_log_events_reach_the_sink_in_commit_order(
    fake_db: FakeDatabase, items: TableId, meta: MetadataStore, tmp_path: Path
) -> None:
    config = fake_config(fake_db, [items], tmp_path)
    sink = MemorySink()
    capture = _open(config, meta, fake_db, sink)
    _writes(fake_db, items, random.Random(7), 60, 10)
    _drain(capture, fake_db)
    capture.close()
    assert sink.received == _logged_changes(fake_db)
    assert sink.rows(items) == fake_db.rows(items)


def test_rows_written_before_the_stream_started_are_not_in_its_log(
    fake_db: FakeDatabase, items: TableId, meta: MetadataStore, tmp_path: Path
) -> None:
    fake_db.insert(items, {"id": 1, "v": "old"})
    config = fake_config(fake_db, [items], tmp_path)
    sink = MemorySink()
    capture = _open(config, meta, fake_db, sink)
    fake_db.insert(items, {"id": 2, "v": "new"})
    _drain(capture, fake_db)
    capture.close()
    assert sink.rows(items) == {(2,): {"id": 2, "v": "new"}}  # the old row comes by dump only


@pytest.mark.parametrize(("seed", "parallelism"), [(1, 1), (2, 3)])
def test_a_dump_interleaved_with_writes_converges_to_the_tables_state(
    fake_db: FakeDatabase, items: TableId, meta: MetadataStore, tmp_path: Path,
    seed: int, parallelism: int,
) -> None:  # fmt: skip
    rng = random.Random(seed)
    fake_db.insert(items, *({"id": i, "v": f"seed {i}"} for i in range(0, 60, 2)))
    config = fake_config(fake_db, [items], tmp_path, chunk_size=4, parallelism=parallelism)
    sink = MemorySink()
    capture = _open(config, meta, fake_db, sink)  # the seed rows can only come by dump
    dump_id = plan_dump(config, meta)
    deadline = time.monotonic() + 60
    while meta.progress(dump_id).state != "done":
        assert time.monotonic() < deadline, meta.progress(dump_id)
        _writes(fake_db, items, rng, 3, 70)
        capture.step(timeout_s=0)
    _drain(capture, fake_db)
    capture.close()
    progress = meta.progress(dump_id)
    assert sink.rows(items) == fake_db.rows(items)
    dumped = [e for e in sink.received if e.op == "r"]
    assert len(dumped) == progress.rows_emitted > 0
    assert progress.rows_dropped > 0  # writes did land inside windows: the test exercised them
    positions = {}
    for event in sink.received:  # no key's position ever goes back in what the sink received
        assert positions.get(event.key, event.position) <= event.position, event
        positions[event.key] = event.position


def test_dumped_rows_are_placed_at_their_high_watermark_in_select_order(
    fake_db: FakeDatabase, items: TableId, meta: MetadataStore, tmp_path: Path
) -> None:
    fake_db.insert(items, *({"id": i, "v": f"v{i}"} for i in range(5)))
    config = fake_config(fake_db, [items], tmp_path, chunk_size=10)
    sink = MemorySink()
    capture = _open(config, meta, fake_db, sink)
    dump_id = plan_dump(config, meta)
    _run_until(capture, lambda: meta.progress(dump_id).state == "done")
    capture.close()
    high = [i for i in fake_db.log if isinstance(i, WatermarkEvent)][-1]
    dumped = [e for e in sink.received if e.op == "r"]
    assert [e.key for e in dumped] == [(i,) for i in range(5)]
    assert [e.position for e in dumped] == [high.position.dumped_row(i) for i in range(5)]
    assert {(e.dump_id, e.chunk_id) for e in dumped} == {(dump_id, meta.chunks(dump_id)[0].id)}


def test_a_restart_from_the_saved_offset_resumes_without_doubling(
    fake_db: FakeDatabase, items: TableId, meta: MetadataStore, tmp_path: Path
) -> None:
    rng = random.Random(3)
    config = fake_config(fake_db, [items], tmp_path)
    sink = MemorySink()
    capture = _open(config, meta, fake_db, sink)
    _writes(fake_db, items, rng, 30, 8)
    _drain(capture, fake_db)
    capture.reader.close()  # a crash after the commit: nothing else is closed
    _writes(fake_db, items, rng, 30, 8)
    again = _open(config, meta, fake_db, sink)
    _drain(again, fake_db)
    again.close()
    assert sink.received == _logged_changes(fake_db)  # each change once, in order
    assert sink.rows(items) == fake_db.rows(items)


def test_a_restart_in_the_middle_of_a_dump_selects_unfinished_chunks_again_and_converges(
    fake_db: FakeDatabase, items: TableId, meta: MetadataStore, tmp_path: Path
) -> None:
    rng = random.Random(5)
    fake_db.insert(items, *({"id": i, "v": f"seed {i}"} for i in range(40)))
    config = fake_config(fake_db, [items], tmp_path, chunk_size=3, parallelism=2)
    sink = MemorySink()
    capture = _open(config, meta, fake_db, sink)
    dump_id = plan_dump(config, meta)
    _run_until(capture, lambda: meta.progress(dump_id).chunks_done >= 3)
    capture.reader.close()  # crash with chunks in flight
    capture.runner.close()
    again = _open(config, meta, fake_db, sink)
    deadline = time.monotonic() + 60
    while meta.progress(dump_id).state != "done":
        assert time.monotonic() < deadline, meta.progress(dump_id)
        _writes(fake_db, items, rng, 2, 45)
        again.step(timeout_s=0)
    _drain(again, fake_db)
    again.close()
    assert sink.rows(items) == fake_db.rows(items)
    seeded = 40  # logged before the stream started
    assert [e for e in sink.received if e.op != "r"] == _logged_changes(fake_db)[seeded:]


def test_a_new_stream_saves_its_first_offset_before_it_reads(
    fake_db: FakeDatabase, items: TableId, meta: MetadataStore, tmp_path: Path
) -> None:
    fake_db.insert(items, {"id": 1, "v": "before"})
    config = fake_config(fake_db, [items], tmp_path)
    capture = _open(config, meta, fake_db, MemorySink())
    state = meta.stream_state(config.name)
    assert state is not None and state.source_offset == {"reader": {"next": 1}, "batch_id": 0}
    capture.close()


def test_the_source_is_acknowledged_only_with_committed_offsets(
    fake_db: FakeDatabase, items: TableId, meta: MetadataStore, tmp_path: Path
) -> None:
    config = fake_config(fake_db, [items], tmp_path)
    capture = _open(config, meta, fake_db, MemorySink())
    fake_db.insert(items, {"id": 1, "v": "a"}, {"id": 2, "v": "b"})
    capture.step(max_items=1, timeout_s=0)
    state = meta.stream_state(config.name)
    assert state is not None and state.source_offset["reader"] == {"next": 1}
    assert fake_db.acknowledged == [{"next": 1}]
    capture.step(max_items=1, timeout_s=0)
    assert fake_db.acknowledged == [{"next": 1}, {"next": 2}]
    capture.close()
    assert capture.reader.closed  # type: ignore[attr-defined]


def _dump_keys_after_a_lost_row(
    db: FakeDatabase, items: TableId, meta: MetadataStore, folder: Path, verify: str | None = None
) -> tuple[MemoryCapture, MemorySink, int]:
    """Rows 1 and 3 logged, row 3 then lost without the log, and a dump of keys 1, 3 and 4 run
    to its end (the capture closed)."""
    config = fake_config(db, [items], folder)
    sink = MemorySink()
    capture = _open(config, meta, db, sink)
    db.insert(items, {"id": 1, "v": "a"}, {"id": 3, "v": "c"})
    _drain(capture, db)
    del db.tables[items].rows[(3,)]  # a delete the log never carried (no writer runs)
    dump_id = plan_dump(config, meta, [str(items)], keys=[1, 3, 4], verify=verify)
    _run_until(capture, lambda: meta.progress(dump_id).state == "done")
    capture.close()
    return capture, sink, dump_id


def test_a_dump_of_keys_the_source_lacks_deletes_them_after_the_rows_it_found(
    fake_db: FakeDatabase, items: TableId, meta: MetadataStore, tmp_path: Path
) -> None:
    _, sink, dump_id = _dump_keys_after_a_lost_row(fake_db, items, meta, tmp_path)
    high = [i for i in fake_db.log if isinstance(i, WatermarkEvent)][-1]
    dumped = [e for e in sink.received if e.dump_id == dump_id]
    assert [(e.op, e.key, e.position) for e in dumped] == [
        ("r", (1,), high.position.dumped_row(0)),
        ("d", (3,), high.position.dumped_row(1)),
        ("d", (4,), high.position.dumped_row(2)),
    ]
    assert [e.before for e in dumped[1:]] == [{"id": 3}, {"id": 4}]
    assert sink.rows(items) == fake_db.rows(items) == {(1,): {"id": 1, "v": "a"}}
    assert meta.progress(dump_id).rows_emitted == 3


def test_a_verify_dump_writes_nothing_and_its_references_carry_the_keys_the_source_lacks(
    fake_db: FakeDatabase, items: TableId, meta: MetadataStore, tmp_path: Path
) -> None:
    capture, sink, dump_id = _dump_keys_after_a_lost_row(
        fake_db, items, meta, tmp_path, verify="dry-run"
    )
    assert [e for e in sink.received if e.dump_id == dump_id] == []
    (ref,) = [r for r in capture.placed if r.dump_id == dump_id]
    assert (ref.verify, ref.selected, ref.emitted, ref.deleted) == ("dry-run", 1, 0, 0)
    assert ref.absent == [[3], [4]]
    assert meta.progress(dump_id).rows_emitted == 0


def test_a_verify_dump_on_a_stream_without_delta_fails_instead_of_comparing_nothing(
    fake_db: FakeDatabase, items: TableId, meta: MetadataStore, tmp_path: Path
) -> None:
    config = dataclasses.replace(fake_config(fake_db, [items], tmp_path), delta=None)
    capture = _open(config, meta, fake_db, MemorySink())
    fake_db.insert(items, {"id": 1, "v": "a"})
    _drain(capture, fake_db)
    plan = TablePlan(str(items), ["id"], 1, [[[1]]])
    dump_id = meta.create_dump(config.name, "keys", [plan], verify="repair")
    _run_until(capture, lambda: meta.progress(dump_id).state == "failed")
    capture.close()
    assert "no sinks.delta" in (meta.progress(dump_id).reason or "")


def test_a_range_chunks_reference_carries_its_window_start_and_the_keys_it_covered(
    fake_db: FakeDatabase, items: TableId, meta: MetadataStore, tmp_path: Path
) -> None:
    """What Delta needs to find the keys it holds that the source lacks: the low watermark's
    position, the chunk's range (the first open below) and, for the last chunk, the position
    below which a key above the bound was not in the source either."""
    config = fake_config(fake_db, [items], tmp_path, chunk_size=3)
    refs: list[ChunkRef] = []

    class Recording(MemoryCapture):
        def _publish(self, output: list[Published], log: list[LogItem]) -> None:
            refs.extend(o for o in output if isinstance(o, ChunkRef))
            super()._publish(output, log)

    capture = Recording(
        config, meta, FakeSource(fake_db.url), FakeChangelogReader(fake_db), [MemorySink()]
    )
    fake_db.insert(items, *({"id": i, "v": f"v{i}"} for i in range(1, 6)))
    _drain(capture, fake_db)  # the stream has read the inserts when the bound is read
    dump_id = plan_dump(config, meta)
    _run_until(capture, lambda: meta.progress(dump_id).state == "done")
    capture.close()
    written = {i.value: i.position for i in fake_db.log if isinstance(i, WatermarkEvent)}
    lows = [written[c.low_watermark] for c in meta.chunks(dump_id)]
    assert [(r.low, r.covers) for r in refs] == [
        (str(lows[0]), [None, [3]]),
        (str(lows[1]), [[3], [5]]),
    ]
    (table,) = meta.dump_tables(dump_id)
    assert table.bound_position is not None and table.bound_position < refs[1].low
    assert (refs[0].beyond, refs[1].beyond) == ("", table.bound_position)
    assert all(r.checks_extras for r in refs)
