"""The planner: a dump request checked against the source and recorded, or refused whole."""

from __future__ import annotations

from pathlib import Path

import pytest

from airflow_dblog.core.events import TableId
from airflow_dblog.engine import planner
from airflow_dblog.engine.metadata import MetadataStore
from airflow_dblog.engine.planner import plan_dump
from airflow_dblog.errors import InputError
from tests.support.fake_source import FakeDatabase, fake_config


@pytest.fixture
def shop(fake_db: FakeDatabase) -> FakeDatabase:
    items = fake_db.create_table("items", {"id": "int", "name": "text"})
    fake_db.insert(items, *({"id": i, "name": f"n{i}"} for i in range(1, 8)))
    pairs = fake_db.create_table("pairs", {"a": "int", "b": "text", "v": "int"}, key=("a", "b"))
    fake_db.insert(pairs, {"a": 1, "b": "x", "v": 0}, {"a": 1, "b": "y", "v": 0})
    fake_db.create_table("empty", {"id": "int"})
    return fake_db


def _tables(db: FakeDatabase) -> list[TableId]:
    return sorted(db.tables, key=str)


def _one_line(err: pytest.ExceptionInfo[InputError]) -> str:
    text = str(err.value)
    assert "\n" not in text
    return text


def test_a_dump_of_every_table_plans_each_captured_table_with_its_key_and_estimate(
    shop: FakeDatabase, meta: MetadataStore, tmp_path: Path
) -> None:
    config = fake_config(shop, _tables(shop), tmp_path)
    dump_id = plan_dump(config, meta, requested_by="me")
    dump = meta.dump(dump_id)
    assert (dump.kind, dump.state, dump.requested_by) == ("all", "pending", "me")
    planned = {t.table_name: t for t in meta.dump_tables(dump_id)}
    assert sorted(planned) == ["db.empty", "db.items", "db.pairs"]
    assert planned["db.pairs"].key_columns == ["a", "b"]
    assert planned["db.items"].estimated_rows == 7 and planned["db.empty"].estimated_rows == 0
    assert meta.chunks(dump_id) == []  # range chunks are cut by the stream, not the planner


def test_no_upper_bound_is_read_when_a_range_dump_is_planned(
    shop: FakeDatabase, meta: MetadataStore, tmp_path: Path
) -> None:
    """The stream reads each table's bound once its log position is durable (invariant 5)."""
    config = fake_config(shop, _tables(shop), tmp_path)
    dump_id = plan_dump(config, meta, tables=["db.items"])
    (table,) = meta.dump_tables(dump_id)
    assert not table.bounded and table.max_key is None and table.cursor is None


def test_a_dump_of_one_table_plans_only_that_table(
    shop: FakeDatabase, meta: MetadataStore, tmp_path: Path
) -> None:
    config = fake_config(shop, _tables(shop), tmp_path)
    dump_id = plan_dump(config, meta, tables=["db.pairs"])
    assert meta.dump(dump_id).kind == "tables"
    assert [t.table_name for t in meta.dump_tables(dump_id)] == ["db.pairs"]


def test_a_table_the_stream_does_not_capture_is_refused_and_nothing_is_recorded(
    shop: FakeDatabase, meta: MetadataStore, tmp_path: Path
) -> None:
    config = fake_config(shop, [t for t in _tables(shop) if t.table != "pairs"], tmp_path)
    with pytest.raises(InputError) as err:
        plan_dump(config, meta, tables=["db.items", "db.pairs"])
    assert "'db.pairs' is not captured by stream fake" in _one_line(err)
    assert meta.dumps("fake") == []


def test_a_captured_table_missing_from_the_source_refuses_the_whole_request(
    shop: FakeDatabase, meta: MetadataStore, tmp_path: Path
) -> None:
    config = fake_config(shop, [*_tables(shop), TableId("db", "gone")], tmp_path)
    with pytest.raises(InputError) as err:
        plan_dump(config, meta)
    assert "table db.gone does not exist" in _one_line(err)
    assert meta.dumps("fake") == []


def test_keys_are_coerced_deduplicated_and_cut_into_chunks_of_the_chunk_size(
    shop: FakeDatabase, meta: MetadataStore, tmp_path: Path
) -> None:
    config = fake_config(shop, _tables(shop), tmp_path, chunk_size=2)
    dump_id = plan_dump(config, meta, tables=["db.items"], keys=[[3], [1], [3], 5, [99]])
    assert meta.dump(dump_id).kind == "keys"
    (table,) = meta.dump_tables(dump_id)
    assert table.estimated_rows == 4  # a key given twice counts once; 99 need not exist
    assert [c.keys for c in meta.chunks(dump_id)] == [[[3], [1]], [[5], [99]]]


def test_composite_keys_keep_their_column_order(
    shop: FakeDatabase, meta: MetadataStore, tmp_path: Path
) -> None:
    config = fake_config(shop, _tables(shop), tmp_path)
    dump_id = plan_dump(config, meta, tables=["db.pairs"], keys=[[1, "y"], [2, "x"]])
    assert [c.keys for c in meta.chunks(dump_id)] == [[[1, "y"], [2, "x"]]]


def test_a_key_chunk_never_holds_more_keys_than_one_select_accepts(
    shop: FakeDatabase, meta: MetadataStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(planner, "MAX_KEYS_PER_CHUNK", 2)
    config = fake_config(shop, _tables(shop), tmp_path, chunk_size=100)
    dump_id = plan_dump(config, meta, tables=["db.items"], keys=[[1], [2], [3]])
    assert [len(c.keys or []) for c in meta.chunks(dump_id)] == [2, 1]


@pytest.mark.parametrize(
    ("keys", "message"),
    [
        ([["one"]], "key column id of db.items expects an integer (int), got 'one'"),
        ([[1, 2]], "has 2 value(s) but db.items has the 1-column primary key (id)"),
        ([[True]], "expects an integer (int), got True"),
    ],
)
def test_a_key_that_does_not_fit_the_table_is_a_one_line_input_error(
    shop: FakeDatabase, meta: MetadataStore, tmp_path: Path, keys: list[list[object]], message: str
) -> None:
    config = fake_config(shop, _tables(shop), tmp_path)
    with pytest.raises(InputError) as err:
        plan_dump(config, meta, tables=["db.items"], keys=[[1], *keys])
    assert message in _one_line(err)
    assert meta.dumps("fake") == []


def test_keys_for_several_tables_are_refused(
    shop: FakeDatabase, meta: MetadataStore, tmp_path: Path
) -> None:
    config = fake_config(shop, _tables(shop), tmp_path)
    with pytest.raises(InputError) as err:
        plan_dump(config, meta, tables=["db.items", "db.empty"], keys=[[1]])
    assert "primary keys were given for several tables" in _one_line(err)
    with pytest.raises(InputError):
        plan_dump(config, meta, keys=[[1]])  # every table: several
    assert meta.dumps("fake") == []


def test_more_keys_than_one_request_takes_are_refused(
    shop: FakeDatabase, meta: MetadataStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(planner, "MAX_KEYS", 3)
    config = fake_config(shop, _tables(shop), tmp_path)
    with pytest.raises(InputError) as err:
        plan_dump(config, meta, tables=["db.items"], keys=[[1], [2], [3], [4]])
    assert "4 keys in one request" in _one_line(err)


def test_the_chunk_size_of_the_controls_wins_over_the_config(
    shop: FakeDatabase, meta: MetadataStore, tmp_path: Path
) -> None:
    config = fake_config(shop, _tables(shop), tmp_path, chunk_size=100)
    meta.set_controls("fake", chunk_size=1)
    dump_id = plan_dump(config, meta, tables=["db.items"], keys=[[1], [2]])
    assert meta.dump(dump_id).chunk_size == 1
    assert [c.keys for c in meta.chunks(dump_id)] == [[[1]], [[2]]]


def test_the_planner_closes_the_source_it_opened(
    shop: FakeDatabase, meta: MetadataStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    opened = []
    real = planner.open_source
    monkeypatch.setattr(planner, "open_source", lambda c: opened.append(real(c)) or opened[-1])
    config = fake_config(shop, _tables(shop), tmp_path)
    with pytest.raises(InputError):
        plan_dump(config, meta, tables=["db.items"], keys=[["bad"]])
    assert [s.closed for s in opened] == [True]
