"""What steers the capture loop between chunks: a dump paused, resumed or cancelled, the
parallelism, the delay and chunk size of the controls, a runner not started yet, and what each
commit records of the log."""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import Future
from pathlib import Path

import pytest

from airflow_dblog.config import Config
from airflow_dblog.core.events import ChangeEvent, Heartbeat, LogItem, TableId
from airflow_dblog.engine import capture as capture_module
from airflow_dblog.engine.chunk_executor import page_limit
from airflow_dblog.engine.chunk_file import ChunkFiles, ChunkSelected
from airflow_dblog.engine.chunk_runner import LateRunner, ThreadChunkRunner
from airflow_dblog.engine.chunk_task import ChunkTask, run_task
from airflow_dblog.engine.metadata import MetadataStore
from airflow_dblog.engine.planner import plan_dump
from airflow_dblog.sources.base import Wake
from tests.support.fake_source import FakeChangelogReader, FakeDatabase, FakeSource, fake_config
from tests.support.held_runner import HeldRunner
from tests.support.memory_sink import MemoryCapture, MemorySink


@pytest.fixture(autouse=True)
def _controls_read_every_step(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(capture_module, "CONTROLS_REFRESH_S", 0.0)
    monkeypatch.setattr(capture_module, "IDLE_CLAIM_S", 0.0)


@pytest.fixture
def items(fake_db: FakeDatabase) -> TableId:
    table = fake_db.create_table("items", {"id": "int", "v": "text"})
    fake_db.insert(table, *({"id": i, "v": f"v{i}"} for i in range(10)))
    return table


def _capture(
    fake_db: FakeDatabase, items: TableId, tmp_path: Path, **kw: int
) -> tuple[Config, MetadataStore, MemoryCapture, MemorySink]:
    config = fake_config(fake_db, [items], tmp_path, **kw)
    store = MetadataStore(config.metadata_url)
    sink = MemorySink()
    reader = FakeChangelogReader(fake_db)
    return (
        config,
        store,
        MemoryCapture(config, store, FakeSource(fake_db.url), reader, [sink]),
        sink,
    )


def _run_until(capture: MemoryCapture, done: Callable[[], bool], timeout_s: float = 30) -> None:
    deadline = time.monotonic() + timeout_s
    while not done():
        assert time.monotonic() < deadline, "the capture did not get there in time"
        capture.step(timeout_s=0)


def _hold(capture: MemoryCapture) -> HeldRunner:
    held = HeldRunner()
    capture.runner.close()
    capture.runner = capture.executor.runner = held
    return held


def test_a_paused_dump_starts_no_chunk_until_it_is_resumed(
    fake_db: FakeDatabase, items: TableId, tmp_path: Path
) -> None:
    config, store, capture, sink = _capture(fake_db, items, tmp_path)
    dump_id = plan_dump(config, store)
    store.apply(dump_id, "pause")
    for _ in range(5):
        capture.step(timeout_s=0)
    assert store.chunks(dump_id) == [] and not [e for e in sink.received if e.op == "r"]
    store.apply(dump_id, "resume")
    _run_until(capture, lambda: store.progress(dump_id).state == "done")
    capture.close()
    assert sink.rows(items) == fake_db.rows(items)


def test_a_chunk_claimed_while_a_select_ran_waits_out_a_pause_and_then_runs(
    fake_db: FakeDatabase, items: TableId, tmp_path: Path
) -> None:
    config, store, capture, _ = _capture(fake_db, items, tmp_path, chunk_size=3)
    held = _hold(capture)
    dump_id = plan_dump(config, store)
    capture.step(timeout_s=0)
    assert len(held.tasks) == 1
    assert [c.state for c in store.chunks(dump_id)] == ["running", "running"]  # one ahead
    store.apply(dump_id, "pause")
    store.set_controls(config.name, parallelism=2)
    for _ in range(3):
        capture.step(timeout_s=0)
    assert len(held.tasks) == 1
    assert [c.state for c in store.chunks(dump_id)] == ["running", "pending"]
    store.apply(dump_id, "resume")
    capture.step(timeout_s=0)
    assert [(t.lower, t.upper) for t in held.tasks] == [(None, (2,)), ((2,), (5,))]
    capture.close()


def test_a_dump_cancelled_while_its_chunk_runs_sends_none_of_its_rows(
    fake_db: FakeDatabase, items: TableId, tmp_path: Path
) -> None:
    config, store, capture, sink = _capture(fake_db, items, tmp_path, chunk_size=100)
    dump_id = plan_dump(config, store)
    _run_until(capture, lambda: capture.executor.in_flight > 0)
    store.apply(dump_id, "cancel")
    for _ in range(20):
        capture.step(timeout_s=0)
    capture.close()
    assert store.dump(dump_id).state == "cancelled"
    assert [e for e in sink.received if e.op == "r"] == []
    assert capture.merge.open_ids() == set()


def test_no_more_chunks_run_at_once_than_the_parallelism(
    fake_db: FakeDatabase, items: TableId, tmp_path: Path
) -> None:
    config, store, capture, _ = _capture(fake_db, items, tmp_path, chunk_size=1, parallelism=2)
    held = _hold(capture)
    plan_dump(config, store)
    for _ in range(5):
        capture.step(timeout_s=0)
    assert len(held.tasks) == 2 and capture.executor.busy() == 2
    store.set_controls(config.name, parallelism=3)
    capture.step(timeout_s=0)
    assert len(held.tasks) == 3
    capture.close()


class GatedRunner:
    """A runner whose SELECTs run when the test lets them, one at a time."""

    ready = True

    def __init__(self, files: ChunkFiles) -> None:
        self.files = files
        self.sent: list[tuple[ChunkTask, Future[ChunkSelected]]] = []

    def submit(self, task: ChunkTask) -> Future[ChunkSelected]:
        future: Future[ChunkSelected] = Future()
        self.sent.append((task, future))
        return future

    def finish(self, index: int) -> None:
        task, future = self.sent[index]
        table, selected = run_task(task)
        self.files.write(task.folder, table)
        future.set_result(selected)

    def close(self) -> None:
        pass


class HeldLog(FakeChangelogReader):
    """The fake log, held back while ``held``: windows stay open."""

    held = False

    def read(self, max_items: int, timeout_s: float, wake: Wake | None = None) -> list[LogItem]:
        return [] if self.held else super().read(max_items, timeout_s, wake)


def test_the_next_chunk_selects_while_the_last_ones_window_closes_but_not_further_ahead(
    fake_db: FakeDatabase, items: TableId, tmp_path: Path
) -> None:
    config = fake_config(fake_db, [items], tmp_path, chunk_size=3, parallelism=1)
    store = MetadataStore(config.metadata_url)
    reader = HeldLog(fake_db)
    capture = MemoryCapture(config, store, FakeSource(fake_db.url), reader, [MemorySink()])
    runner = GatedRunner(capture.files)
    capture.runner.close()
    capture.runner = capture.executor.runner = runner
    plan_dump(config, store)
    capture.step(timeout_s=0)
    assert len(runner.sent) == 1
    reader.held = True  # the high watermarks are written but not read back
    runner.finish(0)
    capture.step(timeout_s=0)
    assert len(runner.sent) == 2  # the first one's window is still open
    runner.finish(1)
    for _ in range(3):
        capture.step(timeout_s=0)
    assert len(runner.sent) == 2  # two windows wait for the log: no third SELECT
    reader.held = False
    capture.step(timeout_s=0)
    assert len(runner.sent) == 3  # both windows closed: the next chunk selects
    capture.close()


def test_a_delay_between_chunks_starts_one_chunk_per_delay(
    fake_db: FakeDatabase, items: TableId, tmp_path: Path
) -> None:
    config, store, capture, _ = _capture(fake_db, items, tmp_path, chunk_size=1, parallelism=4)
    held = _hold(capture)
    store.set_controls(config.name, delay_ms=60_000)
    plan_dump(config, store)
    for _ in range(5):
        capture.step(timeout_s=0)
    assert len(held.tasks) == 1
    capture.close()


def test_chunks_wait_for_a_runner_that_is_not_started_but_the_log_does_not(
    fake_db: FakeDatabase, items: TableId, tmp_path: Path
) -> None:
    config, store, capture, sink = _capture(fake_db, items, tmp_path)
    late = LateRunner()
    capture.runner.close()
    capture.runner = capture.executor.runner = late
    dump_id = plan_dump(config, store)
    fake_db.update(items, (1,), v="while Spark starts")
    for _ in range(3):
        capture.step(timeout_s=0)
    assert [e.key for e in sink.received] == [(1,)]
    assert store.chunks(dump_id) == []
    late.runner = ThreadChunkRunner(capture.files)
    _run_until(capture, lambda: store.progress(dump_id).state == "done")
    capture.close()
    assert sink.rows(items) == fake_db.rows(items)


def test_the_chunk_size_of_the_controls_applies_from_the_next_cut(
    fake_db: FakeDatabase, items: TableId, tmp_path: Path
) -> None:
    config, store, capture, _ = _capture(fake_db, items, tmp_path, chunk_size=3)
    held = _hold(capture)
    plan_dump(config, store)
    capture.step(timeout_s=0)  # starts (.., 2] and, while it runs, claims (2, 5] ahead
    store.set_controls(config.name, chunk_size=5, parallelism=3)
    capture.step(timeout_s=0)
    assert [(t.lower, t.upper, t.limit) for t in held.tasks] == [
        (None, (2,), page_limit(3)),
        ((2,), (5,), page_limit(5)),  # cut before the change
        ((5,), (9,), page_limit(5)),
    ]
    capture.close()


def test_a_commit_saves_the_last_items_position_and_the_source_time_of_the_last_change(
    fake_db: FakeDatabase, items: TableId, tmp_path: Path
) -> None:
    config, store, capture, _ = _capture(fake_db, items, tmp_path)
    fake_db.update(items, (3,), v="x")
    fake_db.update(items, (4,), v="y")
    capture.step(timeout_s=0)
    last = fake_db.log[-1]
    assert isinstance(last, ChangeEvent)
    state = store.stream_state(config.name)
    assert state is not None
    assert (state.position, state.source_ts_ms) == (str(last.position), last.ts_ms)
    assert state.last_event_at is not None
    capture.close()


def test_an_idle_step_commits_the_heartbeat_but_no_event_time(
    fake_db: FakeDatabase, items: TableId, tmp_path: Path
) -> None:
    config, store, capture, sink = _capture(fake_db, items, tmp_path)
    result = capture.step(timeout_s=0)
    assert (result.items, result.emitted) == (1, 0) and sink.received == []
    state = store.stream_state(config.name)
    assert state is not None and state.last_event_at is None
    heartbeat = Heartbeat(capture.reader.read(1, 0)[0].position)  # the same end of the log
    assert state.position == str(heartbeat.position)
    capture.close()
