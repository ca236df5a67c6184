"""Delta's comparison of verify chunks with what it holds (real Spark, real Delta tables)."""

from __future__ import annotations

import datetime as dt
import decimal
from pathlib import Path
from typing import Any

import pytest

from airflow_dblog.config import DeltaSinkConfig
from airflow_dblog.core.events import ChangeEvent, TableId
from airflow_dblog.core.position import Position
from airflow_dblog.engine.chunk_file import ChunkFiles, ChunkRef, encode_rows
from airflow_dblog.sinks.delta_sink import DeltaSink, FrameBatch
from airflow_dblog.sources.base import Column, TableSchema
from tests.integration.sinks.test_delta_sink import NOW_MS, _event, _frame
from tests.integration.sinks.test_delta_sink import SCHEMA as TEXT_KEYED
from tests.integration.sinks.test_delta_sink import TABLE as TEXT_TABLE

pytestmark = pytest.mark.integration

TABLE = TableId("shop", "typed")
SCHEMA = TableSchema(
    TABLE,
    (
        Column("id", "bigint", False),
        Column("price", "decimal(10,2)", True),
        Column("at", "timestamp", True),
        Column("doc", "json", True),
        Column("raw", "varbinary(8)", True),
        Column("ratio", "float", True),
        Column("note", "text", True),
    ),
    ("id",),
)
ROW: dict[str, Any] = {
    "price": decimal.Decimal("1.50"),
    "at": dt.datetime(2024, 1, 2, 3, 4, 5, 600000),
    "raw": b"\x00\xff",
    "note": None,
}
F32 = float.fromhex("0x1.99999ap-4")  # 0.1 as a single-precision float column holds it
at = lambda offset: str(Position.mysql(1, offset))  # noqa: E731


def _logged(op: str, id_: int, offset: int, **values: Any) -> ChangeEvent:
    """A row as the log carried it: a decoded JSON document, a float's exact value."""
    row = {"id": id_, **ROW, "doc": {"b": [1, 2], "a": "x"}, "ratio": F32, **values}
    return ChangeEvent(
        TABLE,
        op,  # type: ignore[arg-type]
        (id_,),
        Position.mysql(1, offset),
        before=row if op == "d" else None,
        after=None if op == "d" else row,
        ts_ms=NOW_MS,
    )


def _selected(id_: int, **values: Any) -> tuple[tuple[int], dict[str, Any]]:
    """The same row as a SELECT reads it: the document's text, the float's shortest digits."""
    return (id_,), {"id": id_, **ROW, "doc": '{"a": "x", "b": [1, 2]}', "ratio": 0.1, **values}


def _log_batch(spark: Any, table: TableId, events: list[ChangeEvent]) -> FrameBatch:
    """A batch of log events of one table."""
    return FrameBatch(_frame(spark, events), {str(table)}, logged={str(table)})


def _sink(spark: Any, tmp_path: Path, events: list[ChangeEvent]) -> DeltaSink:
    schemas = {TABLE: SCHEMA, TEXT_TABLE: TEXT_KEYED}
    sink = DeltaSink(spark, DeltaSinkConfig(str(tmp_path / "delta")), schemas, "t")
    if events:
        sink.write(1, _log_batch(spark, TABLE, events))
    return sink


def _chunk(files: ChunkFiles, chunk_id: int, rows: list[Any], **fields: Any) -> ChunkRef:
    folder = ChunkFiles.new_folder(chunk_id)
    files.write(folder, encode_rows(chunk_id, rows)[0])
    spec: dict[str, Any] = {
        "table": str(TABLE), "dump_id": 3, "position": at(400), "first": 0, "drops": (),
        "ts_ms": 1, "verify": "dry-run", "key_span": [rows[0][0][0], rows[-1][0][0]], **fields,
    }  # fmt: skip
    return ChunkRef(chunk_id=chunk_id, folder=folder, selected=len(rows), **spec)


def test_a_verify_chunk_finds_exactly_the_rows_the_lake_lacks_holds_otherwise_or_holds_extra(
    spark: Any, tmp_path: Path
) -> None:
    """Equal rows compare equal across the spellings of a log and a SELECT (decimals, times,
    JSON documents, bytes, single-precision floats, NULLs); a key the log changed after the
    window, or inside it (a dropped row), is not compared; nothing is written."""
    sink = _sink(
        spark,
        tmp_path,
        [
            _logged("c", 1, 10),  # equal
            _logged("c", 2, 10, price=decimal.Decimal("9.99")),  # different
            _logged("c", 4, 10),
            _logged("d", 4, 11),  # a tombstone: missing
            _logged("c", 5, 500, note="newer"),  # changed after the window
            _logged("c", 6, 10, note="changed inside"),  # dropped: not compared
            _logged("c", 7, 10),  # in range, not selected: extra
            _logged("c", 8, 150),  # changed after the window began: the log's
            _logged("c", 30, 10),  # a key-list chunk's absent key: extra
            _logged("c", 31, 10),
            _logged("d", 31, 12),  # absent and deleted: agrees
        ],
    )
    before = _version(spark, sink.table_path(TABLE))
    files = ChunkFiles(str(tmp_path / "chunks"))
    rows = [_selected(i) for i in (1, 2, 3, 4, 5, 6)]  # 3: the lake lacks it
    ranged = _chunk(files, 11, rows, drops=(5,), low=at(100), covers=[None, [10]])  # 5: key 6
    listed = _chunk(files, 12, [_selected(20)], absent=[[30], [31], [32]])
    found = sink.compare([ranged, listed], files)
    assert {c: {k: sorted(v or []) for k, v in f.items()} for c, f in found.items()} == {
        11: {"missing": [[3], [4]], "different": [[2]], "extra": [[7]]},
        12: {"missing": [[20]], "different": [], "extra": [[30]]},
    }
    assert _version(spark, sink.table_path(TABLE)) == before


def test_a_table_delta_does_not_hold_is_all_missing_and_is_not_created(
    spark: Any, tmp_path: Path
) -> None:
    sink = _sink(spark, tmp_path, [])
    files = ChunkFiles(str(tmp_path / "chunks"))
    ref = _chunk(files, 11, [_selected(1), _selected(2)], low=at(100), covers=[None, [10]])
    assert sink.compare([ref], files) == {11: {"missing": [[1], [2]], "different": [], "extra": []}}
    from delta.tables import DeltaTable

    assert not DeltaTable.isDeltaTable(spark, sink.table_path(TABLE))


def test_keys_of_no_order_spark_and_the_source_share_are_compared_but_not_sought_extra(
    spark: Any, tmp_path: Path
) -> None:
    sink = _sink(spark, tmp_path, [])
    files = ChunkFiles(str(tmp_path / "chunks"))
    row = {"a": 1, "b": "x", "qty": 1, "price": None, "at": None, "blob": None}
    folder = ChunkFiles.new_folder(11)
    files.write(folder, encode_rows(11, [((1, "x"), row)])[0])
    ref = ChunkRef(
        str(TEXT_TABLE), 11, 3, folder, at(400), 0, 1, (), 1,
        verify="repair", low=at(100), covers=[None, [9, "z"]],
    )  # fmt: skip
    sink.write(1, _log_batch(spark, TEXT_TABLE, [_event("c", 2, 1, 10)]))
    assert sink.compare([ref], files)[11] == {"missing": [[1, "x"]], "different": [], "extra": None}


def _version(spark: Any, path: str) -> int:
    from delta.tables import DeltaTable

    return int(DeltaTable.forPath(spark, path).history(1).collect()[0]["version"])


def test_the_keys_no_listed_folder_holds_are_the_live_ones_changed_before_the_sweep_point(
    spark: Any, tmp_path: Path
) -> None:
    """A text key's sweep: Delta's live keys, last changed before ``before``, that no chunk
    selected; tombstones and keys the log changed later are not counted."""
    from airflow_dblog.engine.dump_keys import record

    sink = _sink(spark, tmp_path, [])
    events = [_event("c", a, 1, 10) for a in (1, 2, 3, 4)]
    events += [_event("d", 3, 1, 11), _event("c", 5, 1, 500)]
    sink.write(1, _log_batch(spark, TEXT_TABLE, events))
    chunks, keys = ChunkFiles(str(tmp_path / "chunks")), ChunkFiles(str(tmp_path / "keys"))
    row = {"a": 2, "b": "x", "qty": 1, "price": None, "at": None, "blob": None}
    folder = ChunkFiles.new_folder(11)
    chunks.write(folder, encode_rows(11, [((2, "x"), row)])[0])
    listed = ChunkRef(str(TEXT_TABLE), 11, 3, folder, at(400), 0, 1, (), 1, low=at(100))
    empty = ChunkRef(str(TEXT_TABLE), 12, 3, "", at(400), 0, 0, (), 1, low=at(200))
    for ref in (listed, empty):
        record(chunks, keys, ref)
    uris = [keys.uri(f) for f in keys.folders()]
    assert sorted(sink.unlisted_keys(TEXT_TABLE, uris, at(100))) == [[1, "x"], [4, "x"]]
