"""BinlogReader against the real MariaDB: images, positions, resume, heartbeats, DDL, parity."""

from __future__ import annotations

import contextlib
import datetime as dt
import decimal
import json
import re
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from airflow_dblog.core.events import ChangeEvent, Heartbeat, LogItem, TableId, WatermarkEvent
from airflow_dblog.core.position import Position
from airflow_dblog.errors import InputError, SourceError
from airflow_dblog.sources.base import Wake
from airflow_dblog.sources.mysql.binlog_reader import BinlogReader
from airflow_dblog.sources.mysql.source import MysqlSource
from tests.support.source_dbs import MysqlDb as Db
from tests.support.source_dbs import after_snapshot

pytestmark = pytest.mark.integration


@pytest.fixture
def db(mysql_db: Any) -> Iterator[Db]:
    handle = Db(mysql_db.url, mysql_db.name)
    yield handle
    handle.close()


@pytest.fixture(scope="module")
def mysql_module_db(mysql_server: Any) -> Iterator[Any]:
    """A database shared by one module's tests (the recorded resume stream)."""
    from tests.support import services

    with services.fresh_mysql_database(mysql_server, "binlog_module") as database:
        yield database


@pytest.fixture
def source(db: Db) -> Iterator[MysqlSource]:
    src = MysqlSource(db.url)
    yield src
    src.close()


@pytest.fixture
def readers() -> Iterator[list[BinlogReader]]:
    opened: list[BinlogReader] = []
    yield opened
    for reader in opened:
        reader.close()


def open_reader(
    readers: list[BinlogReader],
    db: Db,
    tables: list[str],
    offset: dict[str, Any] | None = None,
    stream: str | None = None,
) -> BinlogReader:
    """A reader of ``tables``; watermark events only of ``stream`` (other tests write some too)."""
    reader = BinlogReader(
        db.url,
        [db.table(t) for t in tables],
        offset=offset,
        watermark_stream=stream or f"none-{uuid.uuid4().hex}",
    )
    readers.append(reader)
    return reader


def drain(reader: BinlogReader, want: int | None = None, budget_s: float = 30.0) -> list[LogItem]:
    """Items (no heartbeats) until ``want`` arrived, or until the reader reports idleness."""
    out: list[LogItem] = []
    deadline = time.monotonic() + budget_s
    while time.monotonic() < deadline:
        batch = reader.read(500, 0.3)
        data = [i for i in batch if not isinstance(i, Heartbeat)]
        out.extend(data)
        if want is not None and len(out) >= want:
            break
        if want is None and batch and not data:
            break
    return out


def changes(items: list[LogItem], table: TableId | None = None) -> list[ChangeEvent]:
    return [i for i in items if isinstance(i, ChangeEvent) and (table is None or i.table == table)]


GTID = re.compile(r"^\d+-\d+-\d+$|^[0-9a-f-]{36}:\d+$")


def assert_increasing(items: list[LogItem]) -> None:
    positions = [i.position for i in items]
    assert positions == sorted(positions)
    assert len(set(positions)) == len(positions)


# -- images, ops, keys, positions ---------------------------------------------------------------


def test_insert_update_delete(db: Db, readers: list[BinlogReader]) -> None:
    db.execute(f"CREATE TABLE {db.q('t')} (id int PRIMARY KEY, v varchar(10), n int NULL)")
    reader = open_reader(readers, db, ["t"])
    db.execute(f"INSERT INTO {db.q('t')} VALUES (1, 'a', NULL)")
    db.execute(f"UPDATE {db.q('t')} SET v = 'b', n = 5 WHERE id = 1")
    db.execute(f"DELETE FROM {db.q('t')} WHERE id = 1")
    items = drain(reader, 3)
    assert [(e.op, e.key) for e in changes(items)] == [("c", (1,)), ("u", (1,)), ("d", (1,))]
    c, u, d = changes(items)
    assert (c.before, c.after) == (None, {"id": 1, "v": "a", "n": None})
    assert (u.before, u.after) == ({"id": 1, "v": "a", "n": None}, {"id": 1, "v": "b", "n": 5})
    assert (d.before, d.after) == ({"id": 1, "v": "b", "n": 5}, None)
    assert_increasing(items)
    assert all(e.table == db.table("t") for e in changes(items))
    assert len({e.gtid for e in changes(items)}) == 3
    assert all(e.gtid and GTID.match(e.gtid) for e in changes(items))
    assert all(abs(e.ts_ms / 1000 - time.time()) < 120 for e in changes(items))


def test_multi_row_statements_and_transactions(db: Db, readers: list[BinlogReader]) -> None:
    db.execute(f"CREATE TABLE {db.q('m')} (id int PRIMARY KEY, v int)")
    reader = open_reader(readers, db, ["m"])
    db.execute(f"INSERT INTO {db.q('m')} VALUES (1, 1), (2, 2), (3, 3), (4, 4), (5, 5)")
    db.execute(f"UPDATE {db.q('m')} SET v = v * 10")
    db.execute(f"DELETE FROM {db.q('m')} WHERE id > 2")
    conn = db.connect()
    with conn.cursor() as cur:
        cur.execute("BEGIN")
        cur.execute(f"INSERT INTO {db.q('m')} VALUES (6, 6)")
        cur.execute(f"UPDATE {db.q('m')} SET v = 0 WHERE id IN (1, 6)")
        cur.execute("COMMIT")
    conn.close()
    events = changes(drain(reader, 16))
    assert [e.op for e in events] == ["c"] * 5 + ["u"] * 5 + ["d"] * 3 + ["c", "u", "u"]
    inserts = events[:5]
    assert len({e.position.coords[:2] for e in inserts}) == 1, "one rows event"
    assert [e.position.coords[2] for e in inserts] == [0, 1, 2, 3, 4]
    assert [e.key for e in events[10:13]] == [(3,), (4,), (5,)]
    assert [e.after["v"] for e in events[5:10]] == [10, 20, 30, 40, 50]  # type: ignore[index]
    assert len({e.gtid for e in events[13:]}) == 1, "one transaction, one GTID"
    assert_increasing(events)  # type: ignore[arg-type]


def test_composite_key_and_key_change(db: Db, readers: list[BinlogReader]) -> None:
    db.execute(
        f"CREATE TABLE {db.q('c')} (a int, b varchar(10), v int, PRIMARY KEY (a, b))"
        " COLLATE utf8mb4_unicode_ci"
    )
    reader = open_reader(readers, db, ["c"])
    db.execute(f"INSERT INTO {db.q('c')} VALUES (1, 'x', 1), (1, 'Élan', 2)")
    db.execute(f"UPDATE {db.q('c')} SET b = 'y' WHERE a = 1 AND b = 'x'")
    db.execute(f"UPDATE {db.q('c')} SET v = 3 WHERE a = 1 AND b = 'y'")
    events = changes(drain(reader, 5))
    assert [(e.op, e.key) for e in events] == [
        ("c", (1, "x")),
        ("c", (1, "Élan")),
        ("d", (1, "x")),
        ("c", (1, "y")),
        ("u", (1, "y")),
    ]
    delete, create = events[2], events[3]
    assert delete.position.coords[:2] == create.position.coords[:2]
    assert (delete.after, create.before) == (None, None)
    assert create.after == {"a": 1, "b": "y", "v": 1}
    assert_increasing(events)  # type: ignore[arg-type]


def test_only_configured_tables_produce_events(db: Db, readers: list[BinlogReader]) -> None:
    db.execute(f"CREATE TABLE {db.q('yes')} (id int PRIMARY KEY)")
    db.execute(f"CREATE TABLE {db.q('no')} (id int PRIMARY KEY)")
    reader = open_reader(readers, db, ["yes"])
    db.execute(f"INSERT INTO {db.q('no')} VALUES (1)")
    db.execute(f"INSERT INTO {db.q('yes')} VALUES (2)")
    db.execute(f"INSERT INTO {db.q('no')} VALUES (3)")
    items = drain(reader)
    assert [(e.table.table, e.key) for e in changes(items)] == [("yes", (2,))]


def test_unknown_table_is_refused(db: Db, readers: list[BinlogReader]) -> None:
    with pytest.raises(InputError, match="does not exist"):
        open_reader(readers, db, ["missing"])


# -- resume ------------------------------------------------------------------------------------

STREAM_ITEMS = 12


@pytest.fixture(scope="module")
def recorded(mysql_module_db: Any) -> Iterator[tuple[str, list[LogItem], list[dict[str, Any]]]]:
    """A 12-item stream (multi-row events, a multi-statement transaction, watermarks, a key
    change), read one item at a time, with the offset after every item."""
    db = Db(mysql_module_db.url, mysql_module_db.name)
    stream = f"resume-{uuid.uuid4().hex[:10]}"
    db.execute(f"CREATE TABLE {db.q('r')} (id int PRIMARY KEY, v int)")
    source = MysqlSource(db.url)
    source.ensure_watermark_table()
    reader = BinlogReader(db.url, [db.table("r")], watermark_stream=stream)
    try:
        first = reader.offset()
        db.execute(f"INSERT INTO {db.q('r')} VALUES (1, 1), (2, 2), (3, 3)")  # 3 items
        conn = db.connect()
        with conn.cursor() as cur:  # one transaction, 4 items
            cur.execute("BEGIN")
            cur.execute(f"UPDATE {db.q('r')} SET v = v + 1 WHERE id IN (1, 2)")
            cur.execute(f"INSERT INTO {db.q('r')} VALUES (4, 4)")
            cur.execute(f"DELETE FROM {db.q('r')} WHERE id = 3")
            cur.execute("COMMIT")
        conn.close()
        source.write_watermark(stream, str(uuid.uuid4()))  # 1 item
        db.execute(f"UPDATE {db.q('r')} SET id = 10 WHERE id = 4")  # 2 items: d + c
        db.execute(f"INSERT INTO {db.q('r')} VALUES (5, 5), (6, 6)")  # 2 items
        items: list[LogItem] = []
        offsets = [first]
        deadline = time.monotonic() + 30
        while len(items) < STREAM_ITEMS and time.monotonic() < deadline:
            for item in reader.read(1, 0.5):
                if not isinstance(item, Heartbeat):
                    items.append(item)
                    offsets.append(reader.offset())
        assert len(items) == STREAM_ITEMS
        yield stream, items, offsets
    finally:
        reader.close()
        db.execute("DELETE FROM `dblog`.`dblog_watermarks` WHERE stream = %s", (stream,))
        source.close()
        db.close()


@pytest.mark.parametrize("stop", range(STREAM_ITEMS + 1))
def test_resume_from_every_offset_gives_exactly_the_rest(
    mysql_module_db: Any,
    recorded: tuple[str, list[LogItem], list[dict[str, Any]]],
    stop: int,
) -> None:
    stream, items, offsets = recorded
    db = Db(mysql_module_db.url, mysql_module_db.name)
    offset = json.loads(json.dumps(offsets[stop]))  # offsets are JSON-able
    reader = BinlogReader(db.url, [db.table("r")], offset=offset, watermark_stream=stream)
    try:
        rest: list[LogItem] = []
        deadline = time.monotonic() + 30
        while len(rest) < STREAM_ITEMS - stop and time.monotonic() < deadline:
            rest.extend(i for i in reader.read(3, 0.3) if not isinstance(i, Heartbeat))
        rest.extend(drain(reader))  # and nothing more
        assert rest == items[stop:]
    finally:
        reader.close()
        db.close()


def test_recorded_stream_shape(recorded: tuple[str, list[LogItem], list[dict[str, Any]]]) -> None:
    _, items, offsets = recorded
    kinds = [i.op if isinstance(i, ChangeEvent) else "w" for i in items]
    assert kinds == ["c", "c", "c", "u", "u", "c", "d", "w", "d", "c", "c", "c"]
    assert_increasing(items)
    # inside the 4-item transaction every offset restarts at the transaction's start
    assert len({(o["file"], o["pos"]) for o in offsets[4:8]}) == 1


# -- idleness, rotation, reconnects -------------------------------------------------------------


def test_heartbeat_on_idle(db: Db, source: MysqlSource, readers: list[BinlogReader]) -> None:
    db.execute(f"CREATE TABLE {db.q('h')} (id int PRIMARY KEY)")
    db.execute(f"CREATE TABLE {db.q('other')} (id int PRIMARY KEY)")
    reader = open_reader(readers, db, ["h"])
    before = source.binlog_position()
    started = time.monotonic()
    batch = reader.read(100, 0.5)
    elapsed = time.monotonic() - started
    assert len(batch) == 1 and isinstance(batch[0], Heartbeat), batch
    assert elapsed < 5.0
    first = batch[0].position
    assert first >= before
    db.execute(f"INSERT INTO {db.q('other')} VALUES (1)")  # not captured: moves the log only
    moved = source.binlog_position()
    batch = reader.read(100, 0.5)
    assert [type(i) for i in batch] == [Heartbeat]
    assert batch[0].position >= moved > first
    # a heartbeat's offset resumes after it: nothing to replay
    again = open_reader(readers, db, ["h"], offset=reader.offset())
    db.execute(f"INSERT INTO {db.q('h')} VALUES (7)")
    assert [e.key for e in changes(drain(again, 1))] == [(7,)]


def test_a_wake_ends_an_idle_read_without_a_heartbeat_and_the_log_still_comes(
    db: Db, readers: list[BinlogReader]
) -> None:
    db.execute(f"CREATE TABLE {db.q('w')} (id int PRIMARY KEY)")
    reader = open_reader(readers, db, ["w"])
    reader.read(100, 0.3)  # the first read connects
    wake = Wake()
    threading.Timer(0.1, wake.set).start()
    started = time.monotonic()
    assert reader.read(100, 30.0, wake) == []
    assert time.monotonic() - started < 15.0  # not the read's timeout
    wake.clear()
    db.execute(f"INSERT INTO {db.q('w')} VALUES (1)")
    assert [e.key for e in changes(reader.read(100, 30.0, wake))] == [(1,)]
    wake.close()


def test_rotation_is_followed_and_resumable(
    db: Db, source: MysqlSource, readers: list[BinlogReader]
) -> None:
    db.execute(f"CREATE TABLE {db.q('rot')} (id int PRIMARY KEY)")
    reader = open_reader(readers, db, ["rot"])
    db.execute(f"INSERT INTO {db.q('rot')} VALUES (1)")
    first = changes(drain(reader, 1))
    offset = reader.offset()
    db.execute("FLUSH BINARY LOGS")
    db.execute(f"INSERT INTO {db.q('rot')} VALUES (2)")
    second = changes(drain(reader, 1))
    assert second[0].position.coords[0] > first[0].position.coords[0]
    resumed = open_reader(readers, db, ["rot"], offset=offset)
    assert changes(drain(resumed, 1)) == second


def test_connection_loss_neither_loses_nor_doubles(db: Db, readers: list[BinlogReader]) -> None:
    db.execute(f"CREATE TABLE {db.q('k')} (id int PRIMARY KEY)")
    reader = open_reader(readers, db, ["k"])
    db.execute(f"INSERT INTO {db.q('k')} VALUES (1), (2), (3)")
    got = changes(reader.read(2, 5.0))
    assert [e.key for e in got] == [(1,), (2,)]
    stream = reader._stream
    assert stream is not None
    db.execute("KILL %s", (stream._stream_connection.thread_id(),))
    db.execute(f"INSERT INTO {db.q('k')} VALUES (4)")
    rest = changes(drain(reader, 2))
    assert [e.key for e in rest] == [(3,), (4,)]


def test_a_reconnect_that_meets_another_server_stops_the_reader(
    db: Db, readers: list[BinlogReader], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A failover behind the same address: the reader's offsets mean other bytes there."""
    db.execute(f"CREATE TABLE {db.q('v')} (id int PRIMARY KEY)")
    reader = open_reader(readers, db, ["v"])
    db.execute(f"INSERT INTO {db.q('v')} VALUES (1)")
    assert len(changes(drain(reader, 1))) == 1
    # what the promoted replica behind the address would answer (failure injection)
    monkeypatch.setattr(reader.source, "identity", lambda: "7")
    stream = reader._stream
    assert stream is not None
    db.execute("KILL %s", (stream._stream_connection.thread_id(),))
    db.execute(f"INSERT INTO {db.q('v')} VALUES (2)")
    with pytest.raises(SourceError, match=r"is now another server \(server \d+ -> 7\)"):
        drain(reader, 1)


def test_purged_binlog_is_reported(
    db: Db, source: MysqlSource, readers: list[BinlogReader]
) -> None:
    db.execute(f"CREATE TABLE {db.q('p')} (id int PRIMARY KEY)")
    file, _ = source.master_status()
    gone = file.rsplit(".", 1)[0] + ".000000"
    with pytest.raises(SourceError) as err:
        open_reader(readers, db, ["p"], offset={"file": gone, "pos": 4, "after": None})
    assert str(err.value) == (
        f"binlog {gone} needed to resume was purged; run a new full dump (dblog dump --all)"
        " after resetting the stream offset"
    )


def test_statement_binlog_is_refused(
    db: Db, readers: list[BinlogReader], monkeypatch: pytest.MonkeyPatch
) -> None:
    db.execute(f"CREATE TABLE {db.q('s')} (id int PRIMARY KEY)")
    real = MysqlSource.variables

    def statement(self: MysqlSource, names: Any) -> dict[str, str]:
        found = real(self, names)
        found["binlog_format"] = "STATEMENT"
        return found

    monkeypatch.setattr(MysqlSource, "variables", statement)
    with pytest.raises(
        SourceError, match=r"^binlog_format is STATEMENT; dblog needs ROW: SET GLOBAL"
    ):
        open_reader(readers, db, ["s"])


def test_unreachable_server(readers: list[BinlogReader]) -> None:
    with pytest.raises(SourceError) as err:
        BinlogReader("mysql://dblog:hunter2secret@127.0.0.1:1/x", [TableId("x", "y")])
    assert "127.0.0.1:1" in str(err.value)
    assert "hunter2secret" not in str(err.value)


# -- schema changes -----------------------------------------------------------------------------


def test_alter_table_add_and_drop_column_while_following(
    db: Db, readers: list[BinlogReader]
) -> None:
    db.execute(f"CREATE TABLE {db.q('a')} (id int PRIMARY KEY, old varchar(10))")
    reader = open_reader(readers, db, ["a"])
    db.execute(f"INSERT INTO {db.q('a')} VALUES (1, 'x')")
    first = changes(drain(reader, 1))
    db.execute(f"ALTER TABLE {db.q('a')} ADD COLUMN n int NOT NULL DEFAULT 0")
    db.execute(f"INSERT INTO {db.q('a')} VALUES (2, 'y', 5)")
    second = changes(drain(reader, 1))
    db.execute(f"ALTER TABLE {db.q('a')} DROP COLUMN old")
    db.execute(f"UPDATE {db.q('a')} SET n = 7 WHERE id = 2")
    third = changes(drain(reader, 1))
    assert first[0].after == {"id": 1, "old": "x"}
    assert second[0].after == {"id": 2, "old": "y", "n": 5}
    assert (third[0].before, third[0].after) == ({"id": 2, "n": 5}, {"id": 2, "n": 7})


def test_a_table_map_decoded_once_still_serves_after_ddl_naming_the_table_and_a_rotation(
    db: Db, readers: list[BinlogReader]
) -> None:
    """The reader decodes a table id's map once per binlog file (the library's freeze_schema).

    A statement that names the table without changing it (its id stays) makes the reader
    forget what it knew of the table: the id's next map must be decoded again, not skipped,
    or the table's rows would have no columns to be read with. After a rotation every map is
    decoded again (ids are only unique until the server restarts, which starts a new file).
    """
    db.execute(f"CREATE TABLE {db.q('m')} (id int PRIMARY KEY, v int)")
    reader = open_reader(readers, db, ["m"])
    for i in range(3):
        db.execute(f"INSERT INTO {db.q('m')} VALUES ({i}, {i})")
    assert [e.key for e in changes(drain(reader, 3))] == [(0,), (1,), (2,)]
    db.execute(f"CREATE TABLE {db.q('m_copy')} LIKE {db.q('m')}")  # names `m`, keeps its id
    db.execute(f"UPDATE {db.q('m')} SET v = 10 WHERE id = 1")
    db.execute("FLUSH BINARY LOGS")
    db.execute(f"DELETE FROM {db.q('m')} WHERE id = 2")
    later = changes(drain(reader, 2))
    assert [(e.op, e.key) for e in later] == [("u", (1,)), ("d", (2,))]
    assert later[0].after == {"id": 1, "v": 10} and later[1].before == {"id": 2, "v": 2}


def test_alter_table_while_lagging(
    db: Db, source: MysqlSource, readers: list[BinlogReader]
) -> None:
    """Events written before an ALTER but read after it.

    A reader that knew the table before the ALTER decodes them right in any case (the ALTER's
    query event refreshes its column cache in log order). A reader that first sees the table
    after the ALTER is exact with binlog_row_metadata=FULL and refuses (never silently
    mislabels columns) without it.
    """
    db.execute(f"CREATE TABLE {db.q('l')} (id int PRIMARY KEY, old varchar(10))")
    warm = open_reader(readers, db, ["l"])
    start = warm.offset()
    db.execute(f"INSERT INTO {db.q('l')} VALUES (1, 'x')")
    db.execute(f"ALTER TABLE {db.q('l')} ADD COLUMN n int NOT NULL DEFAULT 0")
    db.execute(f"ALTER TABLE {db.q('l')} DROP COLUMN old")
    db.execute(f"INSERT INTO {db.q('l')} VALUES (2, 5)")
    expected = [{"id": 1, "old": "x"}, {"id": 2, "n": 5}]
    assert [e.after for e in changes(drain(warm, 2))] == expected
    cold = open_reader(readers, db, ["l"], offset=start)
    full = source.variables(["binlog_row_metadata"]).get("binlog_row_metadata", "") == "FULL"
    if full:
        assert [e.after for e in changes(drain(cold, 2))] == expected
    else:
        with pytest.raises(SourceError, match="binlog_row_metadata=FULL"):
            drain(cold, 2)


# -- watermarks, parity, snapshots --------------------------------------------------------------


def test_watermark_events(db: Db, source: MysqlSource, readers: list[BinlogReader]) -> None:
    db.execute(f"CREATE TABLE {db.q('t')} (id int PRIMARY KEY)")
    source.ensure_watermark_table()
    stream = f"wm-{uuid.uuid4().hex[:10]}"
    reader = open_reader(readers, db, ["t"], stream=stream)
    low, high = str(uuid.uuid4()), str(uuid.uuid4())
    try:
        source.write_watermark(stream, low)
        db.execute(f"INSERT INTO {db.q('t')} VALUES (1)")
        source.write_watermark(stream, high)
        items = drain(reader)
    finally:
        db.execute("DELETE FROM `dblog`.`dblog_watermarks` WHERE stream = %s", (stream,))
    assert [type(i) for i in items] == [WatermarkEvent, ChangeEvent, WatermarkEvent]
    assert (items[0].stream, items[0].value) == (stream, low)  # type: ignore[union-attr]
    assert items[2].value == high  # type: ignore[union-attr]
    assert_increasing(items)


_EVERY_TYPE = {  # column definition: a value, an edge value (NULL is the third row's)
    "ti": ("tinyint", -128, 127),
    "tiu": ("tinyint unsigned", 0, 255),
    "smu": ("smallint unsigned", 65535, 1),
    "mi": ("mediumint", -8388608, 8388607),
    "miu": ("mediumint unsigned", 16777215, 0),
    "iu": ("int unsigned", 4294967295, 0),
    "bi": ("bigint", -(2**63), 2**63 - 1),
    "bu": ("bigint unsigned", 2**64 - 1, 0),
    "fl": ("float", 3.14159, -1.5e-7),
    "db": ("double", 2.718281828459045, -0.0),
    "d0": ("decimal(5,0)", decimal.Decimal("-99999"), decimal.Decimal("7")),
    "d4": ("decimal(4,4)", decimal.Decimal("0.0001"), decimal.Decimal("-0.9999")),
    "d30": (
        "decimal(30,10)",
        decimal.Decimal("-12345678901234567890.0123456789"),
        decimal.Decimal("0.0000000001"),
    ),
    "day": ("date", dt.date(1000, 1, 1), dt.date(9999, 12, 31)),
    "at0": ("datetime", dt.datetime(2038, 1, 19, 3, 14, 8), dt.datetime(2000, 1, 1)),
    "at6": ("datetime(6)", dt.datetime(2024, 2, 29, 23, 59, 59, 999999), dt.datetime(1999, 12, 31)),
    "at3": ("datetime(3)", dt.datetime(2024, 2, 29, 1, 2, 3, 456000), dt.datetime(1000, 1, 1)),
    "at5": ("datetime(5)", dt.datetime(2001, 1, 1, 0, 0, 0, 12340), dt.datetime(2001, 1, 1)),
    "ts1": ("timestamp(1) NULL", dt.datetime(2020, 5, 6, 7, 8, 9, 100000), None),
    "ts3": ("timestamp(3) NULL", dt.datetime(2024, 1, 1, 12, 0, 0, 123000), None),
    "tm": ("time", dt.timedelta(hours=-838, minutes=-59, seconds=-59), dt.timedelta(0)),
    "tm6": (
        "time(6)",
        dt.timedelta(hours=12, minutes=34, seconds=56, microseconds=789012),
        dt.timedelta(hours=838, minutes=59, seconds=59),
    ),
    "yr": ("year", 2024, 0),
    "ch": ("char(5)", "ab ✓", ""),
    "vc": ("varchar(300)", "é" * 300, ""),
    "bn": ("binary(4)", b"\x01\x00", b"\x00\x00\x00\x00"),
    "vb": ("varbinary(10)", b"\xff\x00", b""),
    "tt": ("tinytext", "tiny", ""),
    "tx": ("text", "héllo ✓", ""),
    "bl": ("blob", b"\xff\x00\xfe", b""),
    "mb": ("mediumblob", b"\x00" * 70000, b""),
    "js": ("json", '{"a": [1, 2.5, "✓"]}', "null"),
    "en": ("enum('x','y''s','z')", "y's", "z"),
    "st": ("set('a','b','c')", "a,c", ""),
    "b1": ("bit(1)", b"\x01", b"\x00"),
    "b10": ("bit(10)", b"\x02\x01", b"\x00\x00"),
    "u": ("uuid", "0123abcd-4567-89ab-cdef-0123456789ab", "d4a20e44-c917-40a9-b1a2-b3d87b790000"),
    "u1": ("uuid", "6ba7b810-9dad-11d1-80b4-00c04fd43000", "00000000-0000-0000-0000-000000000000"),
    "lat": ("varchar(10) CHARACTER SET latin1", "Ærø€", ""),
}


def test_every_type_reads_from_the_binlog_as_a_select_returns_it_in_every_image(
    db: Db, source: MysqlSource, readers: list[BinlogReader]
) -> None:
    """The reader decodes row images itself: each value of an insert, of both images of an
    update and of a delete equals what a SELECT returned at that moment, type included."""
    columns = ", ".join(f"{name} {kind} NULL" for name, (kind, _, _) in _EVERY_TYPE.items())
    db.execute(
        f"CREATE TABLE {db.q('every')} (id int PRIMARY KEY, {columns}) CHARACTER SET utf8mb4"
    )
    reader = open_reader(readers, db, ["every"])
    marks = ", ".join(["%s"] * (len(_EVERY_TYPE) + 1))
    firsts = [first for _, first, _ in _EVERY_TYPE.values()]
    edges = [edge for _, _, edge in _EVERY_TYPE.values()]
    nulls = [None] * len(_EVERY_TYPE)
    db.execute(
        f"INSERT INTO {db.q('every')} VALUES ({marks})", [[1, *firsts], [2, *edges], [3, *nulls]]
    )
    inserted = dict(source.select_range(db.table("every"), None, (3,), 10))
    assert inserted[(3,)] == {"id": 3, **dict.fromkeys(_EVERY_TYPE)}
    db.execute(f"UPDATE {db.q('every')} SET id = id + 10, tiu = 255 - tiu WHERE id < 3")
    updated = {
        (key[0] - 10,): row
        for key, row in dict(source.select_range(db.table("every"), (10,), None, 10)).items()
    }
    db.execute(f"DELETE FROM {db.q('every')}")
    events = changes(drain(reader, 3 + 4 + 3))
    expected = [
        *(("c", None, inserted[k]) for k in [(1,), (2,), (3,)]),
        *(
            (op, inserted[k] if op == "d" else None, updated[k] if op == "c" else None)
            for k in [(1,), (2,)]
            for op in "dc"
        ),
        ("d", inserted[(3,)], None),
        *(("d", updated[k], None) for k in [(1,), (2,)]),
    ]
    assert [e.op for e in events] == [op for op, _, _ in expected]
    for event, (_, before, after) in zip(events, expected, strict=True):
        for got, want in ((event.before, before), (event.after, after)):
            assert (got is None) == (want is None)
            if want is not None:
                assert got == want
                assert {k: type(v) for k, v in got.items()} == {k: type(v) for k, v in want.items()}


def test_every_type_reads_the_same_through_mysqlclient_and_pymysql(db: Db) -> None:
    """Chunk SELECTs run on mysqlclient when it is installed (scripts/test.sh installs it) and
    on PyMySQL otherwise: each value, and its type, is the same either way."""
    columns = ", ".join(f"{name} {kind} NULL" for name, (kind, _, _) in _EVERY_TYPE.items())
    db.execute(
        f"CREATE TABLE {db.q('every')} (id int PRIMARY KEY, {columns}) CHARACTER SET utf8mb4"
    )
    marks = ", ".join(["%s"] * (len(_EVERY_TYPE) + 1))
    rows = [[1, *(first for _, first, _ in _EVERY_TYPE.values())]]
    rows += [[2, *(edge for _, _, edge in _EVERY_TYPE.values())], [3, *[None] * len(_EVERY_TYPE)]]
    db.execute(f"INSERT INTO {db.q('every')} VALUES ({marks})", rows)
    db.execute("SET SESSION sql_mode = 'ALLOW_INVALID_DATES'")  # a lax server's stored dates
    db.execute(f"INSERT INTO {db.q('every')} (id, at0, day) VALUES (4, '0000-00-00', '2024-02-30')")
    table, keys = db.table("every"), [(1,), (2,), (3,), (4,)]
    read = {}
    for mysqlclient in (True, False):
        with contextlib.closing(MysqlSource(db.url, mysqlclient=mysqlclient)) as source:
            read[mysqlclient] = [
                source.select_range(table, None, (4,), 10),
                source.select_keys(table, keys),
            ]
    assert read[True] == read[False]
    assert _types(read[True]) == _types(read[False])


def _types(reads: list[list[tuple[Any, dict[str, Any]]]]) -> list[list[dict[str, type]]]:
    return [[{k: type(v) for k, v in row.items()} for _, row in rows] for rows in reads]


def test_snapshot_position_splits_the_binlog(
    db: Db, source: MysqlSource, readers: list[BinlogReader]
) -> None:
    if source.flavor != "mariadb":
        pytest.skip("binlog snapshot positions are MariaDB only")
    db.execute(f"CREATE TABLE {db.q('snap')} (id int PRIMARY KEY, v int)")
    reader = open_reader(readers, db, ["snap"])
    db.execute(f"INSERT INTO {db.q('snap')} VALUES (1, 1), (2, 2)")
    db.execute(f"UPDATE {db.q('snap')} SET v = 3 WHERE id IN (1, 2)")
    writer = db.connect()

    def write_after_snapshot(position: Position) -> None:
        with writer.cursor() as cur:
            cur.execute(f"INSERT INTO {db.q('snap')} VALUES (3, 3)")
            cur.execute(f"UPDATE {db.q('snap')} SET v = 20 WHERE id = 2")

    try:
        with after_snapshot(source, write_after_snapshot):
            rows, snap = source.snapshot_select_range(db.table("snap"), None, (10,), 100)
    finally:
        writer.close()
    assert [row for _, row in rows] == [{"id": 1, "v": 3}, {"id": 2, "v": 3}]
    events = changes(drain(reader, 6))
    seen = [e for e in events if e.position.log_part() <= snap.log_part()]
    unseen = [e for e in events if e.position.log_part() > snap.log_part()]
    assert [(e.op, e.key) for e in seen] == [("c", (1,)), ("c", (2,)), ("u", (1,)), ("u", (2,))]
    assert [(e.op, e.key) for e in unseen] == [("c", (3,)), ("u", (2,))]
    # idle again: the heartbeat is at or past the snapshot position, so a window that closes at
    # the snapshot position closes without waiting for another write
    heartbeat = reader.read(100, 0.3)
    assert [type(i) for i in heartbeat] == [Heartbeat]
    assert heartbeat[0].position >= snap
    assert heartbeat[0].position > events[-1].position
