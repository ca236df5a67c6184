"""The streaming job's capture loop against a source in memory: each step spooled with the
reader's offset, committed and acknowledged only once the sinks hold it, and restarted after the
last segment written."""

from __future__ import annotations

from pathlib import Path

import pytest

from airflow_dblog.config import Config
from airflow_dblog.core.events import ChangeEvent, TableId
from airflow_dblog.engine import capture as capture_module
from airflow_dblog.engine.capture import SpooledCapture
from airflow_dblog.engine.chunk_file import ChunkRef
from airflow_dblog.engine.event_text import EventText
from airflow_dblog.engine.metadata import MetadataStore
from airflow_dblog.engine.planner import plan_dump
from airflow_dblog.engine.spool import Spool
from airflow_dblog.errors import DblogError
from airflow_dblog.sources.base import Offset
from tests.support.fake_source import FakeChangelogReader, FakeDatabase, FakeSource, fake_config
from tests.support.held_runner import HeldRunner

pytest.importorskip("pyarrow")  # segments are Parquet


@pytest.fixture(autouse=True)
def _a_segment_per_step(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(capture_module, "SEGMENT_S", 0.0)
    monkeypatch.setattr(capture_module, "IDLE_SEGMENT_S", 0.0)
    monkeypatch.setattr(capture_module, "IDLE_CLAIM_S", 0.0)


@pytest.fixture
def items(fake_db: FakeDatabase) -> TableId:
    return fake_db.create_table("items", {"id": "int", "v": "text"})


class Readers:
    """Opens the capture's readers, noting the offset each resumes from."""

    def __init__(self, db: FakeDatabase) -> None:
        self.db = db
        self.offsets: list[Offset | None] = []

    def __call__(self, offset: Offset | None) -> FakeChangelogReader:
        self.offsets.append(offset)
        return FakeChangelogReader(self.db, offset)


def _open(config: Config, store: MetadataStore, db: FakeDatabase) -> tuple[SpooledCapture, Readers]:
    readers = Readers(db)
    spool = Spool(Path(config.checkpoint) / "spool")
    return SpooledCapture(config, store, FakeSource(db.url), readers, spool), readers


def test_each_step_goes_to_the_spool_with_the_readers_offset_in_its_footer(
    fake_db: FakeDatabase, items: TableId, tmp_path: Path
) -> None:
    config = fake_config(fake_db, [items], tmp_path)
    store = MetadataStore(config.metadata_url)
    capture, _ = _open(config, store, fake_db)
    fake_db.insert(items, {"id": 1, "v": "a"}, {"id": 2, "v": "b"})
    capture.step(timeout_s=0)
    assert capture.spool.segments() == [0]
    footer = capture.spool.footer(0)
    assert footer["reader"] == {"next": 2} and footer["batch_id"] == 1
    logged = [EventText.of(i) for i in fake_db.log if isinstance(i, ChangeEvent)]
    assert capture.spool.read(0).items == logged
    capture.close()


def test_nothing_is_saved_or_acknowledged_before_the_sinks_commit_the_segment(
    fake_db: FakeDatabase, items: TableId, tmp_path: Path
) -> None:
    config = fake_config(fake_db, [items], tmp_path)
    store = MetadataStore(config.metadata_url)
    capture, _ = _open(config, store, fake_db)
    fake_db.insert(items, {"id": 1, "v": "a"})
    capture.step(timeout_s=0)
    state = store.stream_state(config.name)
    assert state is not None and state.source_offset == {"reader": {"next": 0}, "batch_id": 0}
    assert fake_db.acknowledged == []
    capture.committed([capture.spool.footer(0)])
    state = store.stream_state(config.name)
    assert state is not None
    assert state.source_offset == {"reader": {"next": 1}, "batch_id": 1, "segment": 0}
    assert fake_db.acknowledged == []  # the reader is only touched on the capture's thread
    capture.step(timeout_s=0)
    assert fake_db.acknowledged == [{"next": 1}]
    capture.close()


def test_a_restart_reads_on_after_the_last_segment_written_not_the_last_commit(
    fake_db: FakeDatabase, items: TableId, tmp_path: Path
) -> None:
    config = fake_config(fake_db, [items], tmp_path)
    store = MetadataStore(config.metadata_url)
    capture, _ = _open(config, store, fake_db)
    for i in range(3):
        fake_db.insert(items, {"id": i, "v": "x"})
        capture.step(timeout_s=0)
    capture.committed([capture.spool.footer(0)])
    capture.reader.close()  # a crash: segments 1 and 2 are written, not committed
    again, readers = _open(config, store, fake_db)
    assert readers.offsets == [{"next": 3}]
    assert again.batch_id == 3
    fake_db.insert(items, {"id": 9, "v": "y"})
    again.step(timeout_s=0)
    assert again.spool.segments()[-1] == 3
    again.close()


def _until_a_chunk_closes(
    fake_db: FakeDatabase, items: TableId, tmp_path: Path
) -> tuple[Config, MetadataStore, SpooledCapture, int]:
    """A three-row table's dump (one chunk), stepped until a segment closes its chunk."""
    fake_db.insert(items, *({"id": i, "v": "x"} for i in range(3)))
    config = fake_config(fake_db, [items], tmp_path, chunk_size=10)
    store = MetadataStore(config.metadata_url)
    capture, _ = _open(config, store, fake_db)
    dump_id = plan_dump(config, store)
    for _ in range(200):
        capture.step(timeout_s=0)
        seqs = capture.spool.segments()
        if any(isinstance(i, ChunkRef) for s in seqs for i in capture.spool.read(s).items):
            break
    return config, store, capture, dump_id


def test_a_chunk_closed_in_a_segment_still_on_disk_is_not_selected_again(
    fake_db: FakeDatabase, items: TableId, tmp_path: Path
) -> None:
    config, store, capture, dump_id = _until_a_chunk_closes(fake_db, items, tmp_path)
    (chunk,) = store.chunks(dump_id)
    assert chunk.state == "selected"
    capture.reader.close()  # a crash before Spark committed the segment holding the chunk
    again, _ = _open(config, store, fake_db)
    assert store.chunk(chunk.id).state == "selected"  # not requeued: its rows are spooled
    again.committed([again.spool.footer(s) for s in again.spool.segments()])
    assert store.progress(dump_id).state == "done"
    assert len([s for s in fake_db.selects if s[0] == items]) == 1
    again.close()


def test_each_segment_counts_the_chunks_being_selected_when_it_was_written(
    fake_db: FakeDatabase, items: TableId, tmp_path: Path
) -> None:
    """Delta's next batch waits a moment for a chunk its segments say is being selected."""
    _, _, capture, _ = _until_a_chunk_closes(fake_db, items, tmp_path)
    footers = [capture.spool.footer(s) for s in capture.spool.segments()]
    assert next(f for f in footers if f["closed"])["selecting"] == 0  # nothing left to select
    capture.close()

    config = fake_config(fake_db, [items], tmp_path / "again", chunk_size=10)
    store = MetadataStore(config.metadata_url)
    spool = Spool(Path(config.checkpoint) / "spool")
    readers = Readers(fake_db)
    held = SpooledCapture(
        config, store, FakeSource(fake_db.url), readers, spool, runner=HeldRunner()
    )
    plan_dump(config, store)
    for _ in range(5):
        held.step(timeout_s=0)
    assert held.spool.footer(held.spool.segments()[-1])["selecting"] == 1
    held.close()


def test_a_deleted_checkpoint_after_a_committed_segment_is_refused_in_one_line(
    fake_db: FakeDatabase, items: TableId, tmp_path: Path
) -> None:
    config = fake_config(fake_db, [items], tmp_path)
    store = MetadataStore(config.metadata_url)
    store.save_stream_state(config.name, source_offset={"reader": {"next": 0}, "segment": 4})
    with pytest.raises(DblogError) as err:
        _open(config, store, fake_db)
    assert "holds no segment but stream fake committed segment 4" in str(err.value)
    assert "restore the checkpoint directory" in str(err.value)
    assert "\n" not in str(err.value)
