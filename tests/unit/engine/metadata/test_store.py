"""The metadata store on SQLite: migrations, dump state machine, chunks, fencing, controls."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from airflow_dblog.config import DumpSettings
from airflow_dblog.engine.metadata import MetadataStore
from airflow_dblog.engine.metadata.database import Fence
from airflow_dblog.engine.metadata.dumps import FIRST_CHUNK_ROWS, TablePlan
from airflow_dblog.errors import FencedError, MetadataError


@pytest.fixture(params=["sqlite"])
def backend(request: pytest.FixtureRequest) -> str:
    """The metadata database these tests run on: SQLite here, PostgreSQL and MariaDB in
    tests/integration/engine/metadata/test_store.py, which collects the same tests again."""
    return request.param


@pytest.fixture
def store(backend: str, request: pytest.FixtureRequest, tmp_path: Path) -> MetadataStore:
    if backend == "sqlite":
        url = f"sqlite:///{tmp_path}/meta.db"
    elif backend == "postgres":
        url = request.getfixturevalue("postgres_db").sqlalchemy_url
    else:
        url = request.getfixturevalue("mysql_db").sqlalchemy_url
    store = MetadataStore(url)
    yield store
    store.engine.dispose()


def _bounded_dump(
    store: MetadataStore,
    table: str,
    key: list[str],
    max_key: list[Any] | None,
    rows: int,
    **kwargs: Any,
) -> int:
    """A range dump whose bound the stream has read (as the chunk executor does first)."""
    dump_id = store.create_dump("s", "tables", [TablePlan(table, key, rows)], **kwargs)
    store.set_table_bound(store.dump_tables(dump_id)[0].id, max_key)
    return dump_id


def test_migrations_apply_once_and_are_idempotent(store: MetadataStore) -> None:
    assert store.revision() == "0005"
    store.upgrade()
    assert store.revision() == "0005"


def test_processes_starting_together_migrate_a_new_database_once(
    backend: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    """The stream and an Airflow task often open a new metadata database at the same moment.

    Without a lock both ran 0001 and one failed with "table dblog_dumps already exists".
    """
    if backend == "sqlite":
        url = f"sqlite:///{tmp_path}/meta.db"
    else:
        url = request.getfixturevalue(f"{'postgres' if backend == 'postgres' else 'mysql'}_db")
        url = url.sqlalchemy_url
    stores = [MetadataStore(url, upgrade=False) for _ in range(4)]
    barrier = threading.Barrier(len(stores))

    def upgrade(store: MetadataStore) -> str | None:
        barrier.wait()
        store.upgrade()
        return store.revision()

    with ThreadPoolExecutor(len(stores)) as pool:
        revisions = list(pool.map(upgrade, stores))
    assert revisions == ["0005"] * len(stores)
    for store in stores:
        store.engine.dispose()


def test_0003_keeps_stream_state_and_adds_the_source_time(tmp_path: Path) -> None:
    """A store at 0002 with a stream row upgrades in place: the row stays, its time is None."""
    from alembic import command
    from alembic.config import Config as AlembicConfig

    from airflow_dblog.engine.metadata.database import MIGRATIONS

    old = MetadataStore(f"sqlite:///{tmp_path}/old.db", upgrade=False)
    cfg = AlembicConfig()
    cfg.set_main_option("script_location", str(MIGRATIONS))
    with old.engine.begin() as connection:
        cfg.attributes["connection"] = connection
        command.upgrade(cfg, "0002")
        connection.exec_driver_sql(
            "INSERT INTO dblog_stream_state (stream, position, fencing_token) VALUES ('s', 'p', 3)"
        )
    old.engine.dispose()
    store = MetadataStore(f"sqlite:///{tmp_path}/old.db")
    assert store.revision() == "0005"
    state = store.stream_state("s")
    assert state is not None and (state.position, state.source_ts_ms) == ("p", None)
    store.save_stream_state("s", source_ts_ms=1_700_000_000_123)
    state = store.stream_state("s")
    assert state is not None and state.source_ts_ms == 1_700_000_000_123


def test_a_range_dump_waits_for_the_stream_to_read_its_bound(store: MetadataStore) -> None:
    """The bound is read after the stream's log start is durable, never at request time."""
    dump_id = store.create_dump("s", "tables", [TablePlan("app.t", ["id"], 100)])
    (table,) = store.dump_tables(dump_id)
    assert (table.bounded, table.exhausted, table.max_key) == (False, False, None)
    store.finish_empty_dumps("s")
    assert store.progress(dump_id).state == "pending"  # not "done": nothing was read yet
    bound = store.set_table_bound(table.id, [42], "p42")
    assert (bound.bounded, bound.exhausted, bound.max_key) == (True, False, [42])
    assert bound.bound_position == "p42"  # where the log stood: the last chunk judges by it
    again = store.set_table_bound(table.id, [99], "p99")
    assert (again.max_key, again.bound_position) == ([42], "p42")  # read once
    chunk = store.cut_range_chunk(table.id, None, None, "w1")
    assert chunk is not None and chunk.upper_key == [42]
    store.requeue_chunk(chunk.id)
    assert store.chunk(chunk.id).state == "pending"


def test_range_chunks_are_cut_from_the_cursor_and_finish_the_dump(store: MetadataStore) -> None:
    dump_id = _bounded_dump(
        store, "app.t", ["a", "b"], [9, "z"], 25, requested_by="tester", chunk_size=10
    )
    assert store.progress(dump_id).chunks_total == 3
    table = store.dump_tables(dump_id)[0]
    first = store.cut_range_chunk(table.id, None, [3, "k"], "w1")
    assert first is not None and (first.lower_key, first.upper_key) == (None, [3, "k"])
    # a second worker holding a stale cursor loses the compare-and-set
    assert store.cut_range_chunk(table.id, None, [4, "a"], "w2") is None
    last = store.cut_range_chunk(table.id, [3, "k"], None, "w2")
    assert last is not None and (last.lower_key, last.upper_key, last.seq) == (
        [3, "k"],
        [9, "z"],
        1,
    )
    assert store.dump(dump_id).state == "running"
    store.complete_chunk(first.id, 10, 2, 8)
    assert store.dump(dump_id).state == "running"
    store.complete_chunk(last.id, 15, 0, 15)
    progress = store.progress(dump_id)
    assert (progress.state, progress.chunks_done, progress.chunks_total) == ("done", 2, 2)
    assert (progress.rows_selected, progress.rows_dropped, progress.rows_emitted) == (25, 2, 23)
    assert progress.percent == 100.0


def test_progress_counts_a_tables_short_first_chunk(store: MetadataStore) -> None:
    rows, size = 4 * FIRST_CHUNK_ROWS, 2 * FIRST_CHUNK_ROWS
    dump_id = _bounded_dump(store, "app.t", ["id"], [rows], rows, chunk_size=size)
    assert store.progress(dump_id).chunks_total == 3  # the short one, then two of chunk_size
    table = store.dump_tables(dump_id)[0]
    first = store.cut_range_chunk(table.id, None, [FIRST_CHUNK_ROWS], "w")
    assert first is not None
    store.complete_chunk(first.id, FIRST_CHUNK_ROWS, 0, FIRST_CHUNK_ROWS)
    assert store.progress(dump_id).chunks_total == 3


def test_chunks_to_select_counts_claimed_and_uncut_chunks_of_running_dumps(
    store: MetadataStore,
) -> None:
    dump_id = _bounded_dump(store, "app.t", ["id"], [50], 50, chunk_size=10)
    assert store.chunks_to_select("s") == 0  # pending: no chunk cut yet, not running
    table = store.dump_tables(dump_id)[0]
    first = store.cut_range_chunk(table.id, None, [10], "w")
    assert first is not None
    assert store.chunks_to_select("s") == 1 + 4  # the claimed one, and 40 rows' chunks to cut
    store.mark_selected(first.id, 10)
    assert store.chunks_to_select("s") == 4
    last = store.cut_range_chunk(table.id, [10], None, "w")
    assert last is not None
    assert store.chunks_to_select("s") == 1  # the table is cut to its end: the last chunk
    store.mark_selected(last.id, 40)
    assert store.chunks_to_select("s") == 0


def test_a_commit_saves_the_stream_state_and_completes_its_chunks_together(
    store: MetadataStore,
) -> None:
    dump_id = _bounded_dump(store, "app.t", ["id"], [20], 20, chunk_size=10)
    table = store.dump_tables(dump_id)[0]
    first = store.cut_range_chunk(table.id, None, [10], "w")
    last = store.cut_range_chunk(table.id, [10], None, "w")
    assert first is not None and last is not None
    closed = [
        {"chunk_id": first.id, "selected": 10, "dropped": 1, "emitted": 9},
        {"chunk_id": last.id, "selected": 10, "dropped": 0, "emitted": 10},
    ]
    store.record_commit("s", closed, position="p1")
    progress = store.progress(dump_id)
    assert (progress.state, progress.chunks_done, progress.rows_emitted) == ("done", 2, 19)
    state = store.stream_state("s")
    assert state is not None and state.position == "p1"


def test_a_fenced_commit_writes_neither_state_nor_chunks(store: MetadataStore) -> None:
    old = MetadataStore(store.url, upgrade=False)
    old.take_lead(Fence("s", 7), "host-a")
    dump_id = _bounded_dump(store, "app.t", ["id"], [10], 10)
    chunk = old.cut_range_chunk(store.dump_tables(dump_id)[0].id, None, None, "a")
    assert chunk is not None
    store.take_lead(Fence("s", 9), "host-b")
    closed = [{"chunk_id": chunk.id, "selected": 10, "dropped": 0, "emitted": 10}]
    with pytest.raises(FencedError):
        old.record_commit("s", closed, position="stale")
    assert store.chunk(chunk.id).state == "running"
    state = store.stream_state("s")
    assert state is not None and state.position is None
    old.engine.dispose()


def test_key_list_chunks_and_requeue_after_restart(store: MetadataStore) -> None:
    dump_id = store.create_dump(
        "s", "keys", [TablePlan("app.t", ["id"], 2, key_chunks=[[[1], [2]], [[5]]])]
    )
    assert store.progress(dump_id).chunks_total == 2
    chunk = store.claim_pending_chunk(dump_id, "w1")
    assert chunk is not None and chunk.keys == [[1], [2]]
    store.mark_selected(chunk.id, 2)
    assert store.requeue_inflight("s") == 1
    again = store.claim_pending_chunk(dump_id, "w1")
    assert again is not None and again.id == chunk.id and again.attempts == 2


def test_claimable_dumps_say_whether_chunks_wait_and_which_tables_to_cut(
    store: MetadataStore,
) -> None:
    ranged = _bounded_dump(store, "app.t", ["id"], [100], 100)
    keyed = store.create_dump("s", "keys", [TablePlan("app.u", ["id"], 1, key_chunks=[[[7]]])])
    found = store.claimable("s")
    assert [(c.dump.id, c.pending) for c in found] == [(ranged, False), (keyed, True)]
    assert [t.table_name for t in found[0].tables] == ["app.t"]
    chunk = store.claim_pending_chunk(keyed, "w")
    assert chunk is not None
    assert [c.pending for c in store.claimable("s")] == [False, False]
    store.requeue_chunk(chunk.id)
    assert [c.pending for c in store.claimable("s")] == [False, True]


def test_pause_resume_cancel_state_machine(store: MetadataStore) -> None:
    dump_id = _bounded_dump(store, "app.t", ["id"], [100], 100)
    assert store.apply(dump_id, "pause").state == "paused"
    assert store.claimable("s") == []
    assert store.apply(dump_id, "resume").state == "pending"  # never started
    with pytest.raises(MetadataError, match=r"cannot resume dump \d+: it is pending"):
        store.apply(dump_id, "resume")
    assert store.apply(dump_id, "cancel").state == "cancelled"
    with pytest.raises(MetadataError, match="cannot pause dump"):
        store.apply(dump_id, "pause")
    with pytest.raises(MetadataError, match="no dump with id 999"):
        store.apply(999, "cancel")


def test_no_chunk_starts_or_moves_on_after_a_cancel(store: MetadataStore) -> None:
    """The race the live stream hits: a chunk whose SELECT runs while the dump is cancelled."""
    dump_id = _bounded_dump(store, "app.t", ["id"], [100], 100)
    table = store.dump_tables(dump_id)[0]
    inflight = store.cut_range_chunk(table.id, None, [10], "w1")
    assert inflight is not None
    store.apply(dump_id, "pause")
    assert store.cut_range_chunk(table.id, [10], [20], "w1") is None
    store.apply(dump_id, "cancel")
    store.mark_selected(inflight.id, 10)
    store.complete_chunk(inflight.id, 10, 0, 10)
    assert store.cut_range_chunk(table.id, [10], [20], "w1") is None
    assert store.claim_pending_chunk(dump_id, "w1") is None
    assert [c.state for c in store.chunks(dump_id)] == ["cancelled"]


@contextmanager
def _a_chunk_cut_paused(
    store: MetadataStore, monkeypatch: pytest.MonkeyPatch
) -> Iterator[tuple[int, MetadataStore, ThreadPoolExecutor]]:
    """A chunk cut paused inside its transaction, right after it read its dump as running
    (a leader stopped mid-write): the dump, a second store (another connection) and a pool
    to call it from. On leaving, the cut goes on and must commit."""
    dump_id = _bounded_dump(store, "app.t", ["id"], [100], 100)
    table = store.dump_tables(dump_id)[0]
    other = MetadataStore(store.url, upgrade=False)
    dump_read, go_on = threading.Event(), threading.Event()
    lock_active_dump = store._lock_active_dump

    def read_then_wait(*args: Any) -> Any:
        dump = lock_active_dump(*args)
        dump_read.set()
        assert go_on.wait(30)
        return dump

    monkeypatch.setattr(store, "_lock_active_dump", read_then_wait)
    try:
        with ThreadPoolExecutor(2) as pool:
            cut = pool.submit(store.cut_range_chunk, table.id, None, [10], "w1")
            assert dump_read.wait(30)
            try:
                yield dump_id, other, pool
            finally:
                go_on.set()
            assert cut.result(30) is not None
    finally:
        other.engine.dispose()


def test_a_cancel_waits_for_a_chunk_being_cut_and_cancels_it(
    store: MetadataStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The dump row stays held from the read that finds it running to the new chunk's commit.

    On SQLite that read ran outside any transaction: a cancel from another process committed
    in between, and the chunk cut after it stayed "running" in a cancelled dump.
    """
    with _a_chunk_cut_paused(store, monkeypatch) as (dump_id, other, pool):
        cancel = pool.submit(other.apply, dump_id, "cancel")
        time.sleep(1)
        assert not cancel.done(), "the cancel did not wait for the chunk being cut"
    assert cancel.result(30).state == "cancelled"
    assert [c.state for c in store.chunks(dump_id)] == ["cancelled"]


def test_reads_go_on_while_another_process_holds_a_write(
    store: MetadataStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A writer paused mid-transaction (a frozen leader) must not stall status reads.

    On SQLite every transaction once took the write lock, so a leader SIGSTOPped inside one
    made ``dblog status`` and the standbys' reads fail after the busy timeout.
    """
    with _a_chunk_cut_paused(store, monkeypatch) as (dump_id, other, pool):
        reads = pool.submit(
            lambda: (
                other.progress(dump_id).state,
                [d.id for d in other.dumps("s")],
                other.stream_state("s"),
                other.controls("s", DumpSettings(chunk_size=7)).chunk_size,
            )
        )
        assert reads.result(5) == ("pending", [dump_id], None, 7)


def test_a_newer_lease_token_fences_every_write_of_the_old_leader(store: MetadataStore) -> None:
    old = MetadataStore(store.url, upgrade=False)
    old.take_lead(Fence("s", 7), "host-a")
    dump_id = _bounded_dump(store, "app.t", ["id"], [100], 100)
    table = store.dump_tables(dump_id)[0]
    assert old.cut_range_chunk(table.id, None, [10], "a") is not None
    store.take_lead(Fence("s", 9), "host-b")
    with pytest.raises(FencedError, match=r"lease token 7.*newer leader .token 9"):
        old.cut_range_chunk(table.id, [10], [20], "a")
    with pytest.raises(FencedError):
        old.save_stream_state("s", position="stale")
    with pytest.raises(FencedError, match="older than the recorded 9"):
        old.take_lead(Fence("s", 8), "host-a")
    assert store.cut_range_chunk(table.id, [10], [20], "b") is not None
    state = store.stream_state("s")
    assert state is not None and (state.position, state.leader) == (None, "host-b")
    old.engine.dispose()


def test_empty_table_dump_finishes_without_chunks(store: MetadataStore) -> None:
    dump_id = _bounded_dump(store, "app.empty", ["id"], None, 0)
    store.finish_empty_dumps("s")
    assert store.progress(dump_id).state == "done"


def test_controls_override_config_defaults(store: MetadataStore) -> None:
    defaults = DumpSettings(chunk_size=100, delay_ms=5, parallelism=2)
    assert store.controls("s", defaults) == defaults
    store.set_controls("s", chunk_size=7)
    store.set_controls("s", delay_ms=0)
    assert store.controls("s", defaults) == DumpSettings(chunk_size=7, delay_ms=0, parallelism=2)
    with pytest.raises(MetadataError, match="parallelism must be >= 1"):
        store.set_controls("s", parallelism=0)


def test_unreachable_database_is_one_line_without_password() -> None:
    with pytest.raises(MetadataError) as info:
        MetadataStore("postgresql://dblog:hunter2@127.0.0.1:1/nothing")
    assert "hunter2" not in str(info.value)
    assert "cannot reach the metadata database" in str(info.value)
    assert "\n" not in str(info.value)
