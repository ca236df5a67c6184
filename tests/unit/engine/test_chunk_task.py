"""A chunk's SELECT where it runs: its own source per worker thread, its own errors returned as
values, the URL's password kept out of its text; and the watermark strategy a config names."""

from __future__ import annotations

import threading

import pytest

from airflow_dblog.core.events import TableId
from airflow_dblog.engine.chunk_file import ChunkSelected
from airflow_dblog.engine.chunk_task import ChunkTask, _cached_source, error_of, prepare, run_task
from airflow_dblog.engine.watermarks import watermark_strategy
from airflow_dblog.errors import ConfigError, DblogError, InputError, SourceError
from airflow_dblog.sources.mysql.watermarks import MysqlTableWatermarks
from tests.support.fake_source import FakeDatabase, FakeSource


@pytest.fixture
def items(fake_db: FakeDatabase) -> TableId:
    table = fake_db.create_table("items", {"id": "int", "v": "text"})
    fake_db.insert(table, *({"id": i, "v": f"v{i}"} for i in range(5)))
    return table


def _task(db: FakeDatabase, table: TableId, **kw: object) -> ChunkTask:
    return ChunkTask(7, "chunk-7-x", table, MysqlTableWatermarks, "fake", db.url, **kw)  # type: ignore[arg-type]


def test_a_range_task_selects_its_page_and_reports_the_last_key_and_span(
    fake_db: FakeDatabase, items: TableId
) -> None:
    arrow, selected = run_task(_task(fake_db, items, lower=(0,), upper=(4,), limit=3))
    assert (selected.count, selected.last_key, selected.key_span, selected.error) == (
        3,
        [3],
        [1, 3],
        None,
    )
    assert arrow.num_rows == 3


def test_a_key_list_task_selects_the_keys_that_exist(fake_db: FakeDatabase, items: TableId) -> None:
    _, selected = run_task(_task(fake_db, items, keys=[(4,), (9,), (0,)]))
    assert selected.count == 2


def test_an_error_of_the_chunk_comes_back_as_a_value_with_an_empty_file(
    fake_db: FakeDatabase, items: TableId
) -> None:
    del fake_db.tables[items]
    arrow, selected = run_task(_task(fake_db, items, upper=(4,), limit=3))
    assert arrow.num_rows == 0 and selected.count == 0
    assert selected.error == (
        "InputError",
        "table db.items does not exist; create it or remove it from source.tables",
    )
    error = error_of(selected)
    assert isinstance(error, InputError) and str(error).startswith("table db.items does not")


@pytest.mark.parametrize(
    ("name", "kind"),
    [("SourceError", SourceError), ("InputError", InputError), ("OddError", DblogError)],
)
def test_a_returned_error_is_raised_again_as_its_own_kind(name: str, kind: type) -> None:
    error = error_of(ChunkSelected(error=(name, "it broke")))
    assert type(error) is kind and str(error).startswith("it broke")
    assert error_of(ChunkSelected(count=1)) is None


def test_the_task_text_leaves_out_the_url_and_its_password() -> None:
    task = ChunkTask(
        1, "f", TableId("db", "t"), MysqlTableWatermarks, "mysql", "mysql://u:s3cret@h/db"
    )
    assert "s3cret" not in repr(task) and "mysql://" not in repr(task)


def test_each_worker_thread_keeps_its_own_source(fake_db: FakeDatabase) -> None:
    mine = _cached_source("fake", fake_db.url)
    assert _cached_source("fake", fake_db.url) is mine
    theirs: list[object] = []
    worker = threading.Thread(target=lambda: theirs.append(_cached_source("fake", fake_db.url)))
    worker.start()
    worker.join()
    assert theirs[0] is not mine and isinstance(theirs[0], FakeSource)


def test_preparing_a_worker_reaches_the_source_or_fails_in_one_line(fake_db: FakeDatabase) -> None:
    prepare("fake", fake_db.url)
    with fake_db.outage(), pytest.raises(SourceError, match="fake server is down"):
        prepare("fake", fake_db.url)


def test_a_watermark_mode_the_source_kind_does_not_offer_is_a_one_line_config_error(
    fake_db: FakeDatabase,
) -> None:
    source = FakeSource(fake_db.url)
    with pytest.raises(ConfigError) as err:
        watermark_strategy("gtid", source, "s")
    assert str(err.value).splitlines() == [str(err.value)]
    assert "source.watermark 'gtid' is not available on fake" in str(err.value)
    assert isinstance(watermark_strategy("table", source, "s"), MysqlTableWatermarks)
