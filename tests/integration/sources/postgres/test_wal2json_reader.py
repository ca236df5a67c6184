"""Wal2jsonReader on the real PostgreSQL: images, order, positions, resume, acks, heartbeats."""

from __future__ import annotations

import datetime as dt
import decimal
import json
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from airflow_dblog.core.events import ChangeEvent, Heartbeat, LogItem, TableId, WatermarkEvent
from airflow_dblog.core.position import Position, int_to_lsn, lsn_to_int
from airflow_dblog.errors import InputError, SourceError
from airflow_dblog.sources.base import Wake
from airflow_dblog.sources.postgres.source import PostgresSource
from airflow_dblog.sources.postgres.wal2json_reader import UNAVAILABLE, Wal2jsonReader
from tests.support.source_dbs import PostgresDb as Db
from tests.support.source_dbs import current_lsn, drop_replication_slot

T = TableId("public", "items")
TC = TableId("public", "pairs")


class Readers:
    """Opens readers on unique slots; closes them and drops the slots afterwards."""

    def __init__(self, db: Db) -> None:
        self.db = db
        self.source = PostgresSource(db.url)
        self.readers: list[Wal2jsonReader] = []
        self.slots: set[str] = set()

    def new_slot(self) -> str:
        slot = "dblog_t_" + uuid.uuid4().hex[:12]
        self.slots.add(slot)
        return slot

    def open(self, tables: list[TableId], slot: str | None = None, **kwargs: Any) -> Wal2jsonReader:
        slot = slot or self.new_slot()
        self.slots.add(slot)
        reader = Wal2jsonReader(self.db.url, tables, slot=slot, **kwargs)
        self.readers.append(reader)
        return reader

    def slot_info(self, slot: str) -> dict[str, Any]:
        info = self.source.replication_slot(slot)
        assert info is not None
        return info

    def cleanup(self) -> None:
        for r in self.readers:
            r.close()
        for slot in self.slots:
            drop_replication_slot(self.source, slot)
        self.source.close()


@pytest.fixture
def db(postgres_db: Any) -> Iterator[Db]:
    handle = Db(postgres_db.url)
    yield handle
    handle.close()


@pytest.fixture(scope="module")
def postgres_module_db(postgres_server: Any) -> Iterator[Any]:
    """A database shared by one module's tests (the recorded resume stream)."""
    from tests.support import services

    with services.fresh_postgres_database(postgres_server, "wal2json_module") as database:
        yield database


@pytest.fixture
def readers(db: Db) -> Iterator[Readers]:
    r = Readers(db)
    yield r
    r.cleanup()


def read_items(reader: Wal2jsonReader, n: int, timeout: float = 15.0) -> list[LogItem]:
    """Read until ``n`` non-heartbeat items arrived (fails after ``timeout``)."""
    out: list[LogItem] = []
    deadline = time.monotonic() + timeout
    while len(out) < n:
        assert time.monotonic() < deadline, f"only {len(out)} of {n} items: {out}"
        out.extend(i for i in reader.read(n - len(out), 0.2) if not isinstance(i, Heartbeat))
    return out


def read_quiet(reader: Wal2jsonReader, seconds: float = 0.6) -> list[LogItem]:
    """Everything but heartbeats that arrives within ``seconds``."""
    out: list[LogItem] = []
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        out.extend(i for i in reader.read(100, 0.2) if not isinstance(i, Heartbeat))
    return out


def changes(items: list[LogItem]) -> list[ChangeEvent]:
    return [i for i in items if isinstance(i, ChangeEvent)]


# --------------------------------------------------------------------------------------------
# changes


@pytest.mark.integration
def test_insert_update_delete_images_ops_keys_xids(db: Db, readers: Readers) -> None:
    db.execute("CREATE TABLE items (id int PRIMARY KEY, v text, n numeric(6,2))")
    reader = readers.open([T])
    x1 = db.txn("INSERT INTO items VALUES (1, 'a', 1.5)")
    x2 = db.txn("UPDATE items SET v = 'b' WHERE id = 1")
    x3 = db.txn("DELETE FROM items WHERE id = 1")
    ins, upd, dele = changes(read_items(reader, 3))
    assert (ins.op, ins.key, ins.before, ins.xid) == ("c", (1,), None, x1)
    assert ins.after == {"id": 1, "v": "a", "n": decimal.Decimal("1.50")}
    assert (upd.op, upd.key, upd.xid) == ("u", (1,), x2)
    assert upd.before is None  # REPLICA IDENTITY DEFAULT: no old image for updates
    assert upd.after == {"id": 1, "v": "b", "n": decimal.Decimal("1.50")}
    assert (dele.op, dele.key, dele.after, dele.xid) == ("d", (1,), None, x3)
    assert dele.before == {"id": 1}  # the replica identity: key columns only
    assert ins.table == T and ins.ts_ms > 0 and abs(ins.ts_ms / 1000 - time.time()) < 60
    assert ins.position < upd.position < dele.position
    assert [e.position.coords[1:] for e in (ins, upd, dele)] == [(1, 0)] * 3


@pytest.mark.integration
def test_replica_identity_full_gives_before_images(db: Db, readers: Readers) -> None:
    db.execute("CREATE TABLE items (id int PRIMARY KEY, v text, w int)")
    db.execute("ALTER TABLE items REPLICA IDENTITY FULL")
    reader = readers.open([T], before_images="require")
    db.execute("INSERT INTO items VALUES (1, 'a', 10)")
    db.execute("UPDATE items SET v = 'b' WHERE id = 1")
    db.execute("DELETE FROM items WHERE id = 1")
    _, upd, dele = changes(read_items(reader, 3))
    assert upd.before == {"id": 1, "v": "a", "w": 10}
    assert upd.after == {"id": 1, "v": "b", "w": 10}
    assert dele.before == {"id": 1, "v": "b", "w": 10}


@pytest.mark.integration
def test_before_images_required_but_identity_default(db: Db, readers: Readers) -> None:
    db.execute("CREATE TABLE items (id int PRIMARY KEY, v text)")
    with pytest.raises(SourceError) as err:
        readers.open([T], before_images="require")
    assert str(err.value).endswith("ALTER TABLE public.items REPLICA IDENTITY FULL")
    assert readers.source.replica_identity(T) == "default"


@pytest.mark.integration
def test_primary_key_update_is_delete_then_insert(db: Db, readers: Readers) -> None:
    db.execute("CREATE TABLE pairs (a int, b text, v text, PRIMARY KEY (a, b))")
    reader = readers.open([TC])
    db.execute("INSERT INTO pairs VALUES (1, 'x', 'v')")
    xid = db.txn("UPDATE pairs SET b = 'y' WHERE a = 1")
    _, dele, new = changes(read_items(reader, 3))
    assert (dele.op, dele.key, dele.before, dele.xid) == ("d", (1, "x"), {"a": 1, "b": "x"}, xid)
    assert (new.op, new.key, new.after) == ("c", (1, "y"), {"a": 1, "b": "y", "v": "v"})
    assert dele.extra["pk_change"] == "deleted" and new.extra["pk_change"] == "inserted"
    assert dele.position.coords[0] == new.position.coords[0]
    assert dele.position < new.position


@pytest.mark.integration
def test_composite_int_text_key(db: Db, readers: Readers) -> None:
    db.execute("CREATE TABLE pairs (a int, b text, v int, PRIMARY KEY (a, b))")
    reader = readers.open([TC])
    db.execute("INSERT INTO pairs VALUES (1, 'é', 1), (1, 'e', 2), (2, 'a', 3)")
    db.execute("UPDATE pairs SET v = v + 10 WHERE a = 1")
    db.execute("DELETE FROM pairs WHERE b = 'a'")
    events = changes(read_items(reader, 6))
    assert [(e.op, e.key) for e in events] == [
        ("c", (1, "é")),
        ("c", (1, "e")),
        ("c", (2, "a")),
        ("u", (1, "é")),
        ("u", (1, "e")),
        ("d", (2, "a")),
    ]
    assert events[3].after == {"a": 1, "b": "é", "v": 11}
    # one multi-row statement = one transaction: same commit LSN, indexes 1, 2, 3
    assert {e.position.coords[0] for e in events[:3]} == {events[0].position.coords[0]}
    assert [e.position.coords[1] for e in events[:3]] == [1, 2, 3]


@pytest.mark.integration
def test_multi_statement_transaction(db: Db, readers: Readers) -> None:
    db.execute("CREATE TABLE items (id int PRIMARY KEY, v text)")
    db.execute("CREATE TABLE other (id int PRIMARY KEY)")
    reader = readers.open([T])
    xid = db.txn(
        "INSERT INTO items VALUES (1, 'a')",
        "INSERT INTO other VALUES (1)",  # not captured: no position is used up by it
        "UPDATE items SET v = 'b' WHERE id = 1",
        "SAVEPOINT s",
        "INSERT INTO items VALUES (2, 'rolled back')",
        "ROLLBACK TO SAVEPOINT s",
        "SAVEPOINT s2",
        "INSERT INTO items VALUES (3, 'sub')",
        "RELEASE SAVEPOINT s2",
        "DELETE FROM items WHERE id = 1",
    )
    events = changes(read_items(reader, 4))
    assert [(e.op, e.key) for e in events] == [("c", (1,)), ("u", (1,)), ("c", (3,)), ("d", (1,))]
    assert {e.xid for e in events} == {xid}  # subtransactions report the top-level xid
    lsn = events[0].position.coords[0]
    assert [e.position for e in events] == [Position.postgres(lsn, i) for i in range(1, 5)]
    assert read_quiet(reader, 0.3) == []


@pytest.mark.integration
def test_interleaved_transactions_come_in_commit_order(db: Db, readers: Readers) -> None:
    db.execute("CREATE TABLE items (id int PRIMARY KEY, v text)")
    reader = readers.open([T])
    first, second = db.connect(autocommit=False), db.connect(autocommit=False)
    try:
        c1, c2 = first.cursor(), second.cursor()
        c1.execute("INSERT INTO items VALUES (1, 'began first')")
        c1.execute("SELECT pg_current_xact_id()::text::bigint")
        x1 = c1.fetchone()[0]
        c2.execute("INSERT INTO items VALUES (2, 'began second')")
        c2.execute("SELECT pg_current_xact_id()::text::bigint")
        x2 = c2.fetchone()[0]
        c1.execute("INSERT INTO items VALUES (3, 'began first')")
        c2.execute("INSERT INTO items VALUES (4, 'began second')")
        second.commit()  # commits first although it began second
        first.commit()
    finally:
        first.close()
        second.close()
    events = changes(read_items(reader, 4))
    assert x1 < x2
    assert [(e.key[0], e.xid) for e in events] == [(2, x2), (4, x2), (1, x1), (3, x1)]
    positions = [e.position for e in events]
    assert positions == sorted(positions) and len(set(positions)) == 4
    assert positions[1].coords[0] < positions[2].coords[0]


@pytest.mark.integration
def test_only_configured_tables_are_read(db: Db, readers: Readers) -> None:
    db.execute("CREATE TABLE items (id int PRIMARY KEY)")
    db.execute("CREATE TABLE other (id int PRIMARY KEY)")
    reader = readers.open([T])
    db.execute("INSERT INTO other VALUES (1)")
    db.execute("INSERT INTO items VALUES (2)")
    (event,) = changes(read_items(reader, 1))
    assert event.table == T and event.key == (2,)


@pytest.mark.integration
def test_odd_table_names_are_captured(db: Db, readers: Readers) -> None:
    db.execute('CREATE SCHEMA "My Schema"')
    db.execute('CREATE TABLE "My Schema"."a.b,c *""q""\'" (id int PRIMARY KEY)')
    db.execute('CREATE TABLE "My Schema"."a" (id int PRIMARY KEY)')
    odd = TableId("My Schema", 'a.b,c *"q"\'')
    reader = readers.open([odd])
    db.execute('INSERT INTO "My Schema"."a" VALUES (1)')
    db.execute('INSERT INTO "My Schema"."a.b,c *""q""\'" VALUES (2)')
    (event,) = changes(read_items(reader, 1))
    assert event.table == odd and event.key == (2,)


@pytest.mark.integration
def test_truncate_is_reported_not_captured(db: Db, readers: Readers, caplog: Any) -> None:
    db.execute("CREATE TABLE items (id int PRIMARY KEY)")
    reader = readers.open([T])
    db.execute("INSERT INTO items VALUES (1)")
    with caplog.at_level("WARNING"):
        db.execute("TRUNCATE items")
        db.execute("INSERT INTO items VALUES (2)")
        events = changes(read_items(reader, 2))
    assert [e.key for e in events] == [(1,), (2,)]
    assert reader.stats["truncates"] == 1
    assert "TRUNCATE of public.items" in caplog.text


# --------------------------------------------------------------------------------------------
# TOAST and watermarks


BIG = "SELECT string_agg(md5(random()::text || g), '') FROM generate_series(1, 400) g"


@pytest.mark.integration
def test_unchanged_toast_column_default_identity_is_marked(db: Db, readers: Readers) -> None:
    db.execute("CREATE TABLE items (id int PRIMARY KEY, v int, big text)")
    reader = readers.open([T])
    db.execute(f"INSERT INTO items VALUES (1, 0, ({BIG}))")
    big = db.execute("SELECT big FROM items")[0][0]
    assert db.execute("SELECT pg_column_size(big) < length(big) FROM items")[0][0] is not None
    db.execute("UPDATE items SET v = 1")  # big unchanged and stored out of line
    ins, upd = changes(read_items(reader, 2))
    assert ins.after is not None and ins.after["big"] == big
    assert upd.after == {"id": 1, "v": 1, "big": UNAVAILABLE}
    assert upd.extra["unavailable_columns"] == ("big",)
    db.execute("UPDATE items SET big = 'small now', v = 2")
    (upd2,) = changes(read_items(reader, 1))
    assert upd2.after == {"id": 1, "v": 2, "big": "small now"}
    assert "unavailable_columns" not in upd2.extra


@pytest.mark.integration
def test_unchanged_toast_column_full_identity_is_filled(db: Db, readers: Readers) -> None:
    db.execute("CREATE TABLE items (id int PRIMARY KEY, v int, big text)")
    db.execute("ALTER TABLE items REPLICA IDENTITY FULL")
    reader = readers.open([T])
    db.execute(f"INSERT INTO items VALUES (1, 0, ({BIG}))")
    big = db.execute("SELECT big FROM items")[0][0]
    db.execute("UPDATE items SET v = 1")
    _, upd = changes(read_items(reader, 2))
    assert upd.after == {"id": 1, "v": 1, "big": big}
    assert upd.before == {"id": 1, "v": 0, "big": big}
    assert "unavailable_columns" not in upd.extra


@pytest.mark.integration
def test_watermark_events(db: Db, readers: Readers) -> None:
    db.execute("CREATE TABLE items (id int PRIMARY KEY)")
    readers.source.ensure_watermark_table()
    reader = readers.open([T])
    readers.source.write_watermark("inventory", "low-1")
    db.execute("INSERT INTO items VALUES (1)")
    readers.source.write_watermark("inventory", "high-1")
    readers.source.write_watermark("other-stream", "x")
    items = read_items(reader, 4)
    assert [type(i).__name__ for i in items] == [
        "WatermarkEvent",
        "ChangeEvent",
        "WatermarkEvent",
        "WatermarkEvent",
    ]
    low, change, high, other = items
    assert isinstance(low, WatermarkEvent) and isinstance(high, WatermarkEvent)
    assert (low.stream, low.value) == ("inventory", "low-1")
    assert (high.stream, high.value) == ("inventory", "high-1")
    assert isinstance(other, WatermarkEvent) and other.stream == "other-stream"
    assert low.position < change.position < high.position < other.position


# --------------------------------------------------------------------------------------------
# types: the WAL gives what a SELECT gives

TYPES_DDL = """
CREATE TYPE mood AS ENUM ('sad', 'ok', 'happy');
CREATE DOMAIN posint AS int CHECK (VALUE > 0);
CREATE TABLE items (
  id int PRIMARY KEY, i2 smallint, i8 bigint, num numeric(12,3), numu numeric, f4 real,
  f8 double precision, b bool, t text, vc varchar(20), ch char(5), u uuid, d date,
  ts timestamp, tz timestamptz, tm time, tmz timetz, iv interval, ba bytea, j json, jb jsonb,
  ia int[], ta text[], na numeric[], m mood, dom posint, nothing text, big text
)
"""

TYPES_ROWS = [
    "INSERT INTO items VALUES (1, -32768, 9223372036854775807, 123456789.125, 1e-20,"
    " 1.5, 0.1, true, 'tëxt ☃ \"q\" \\ back', 'vc', 'ab', 'A0EEBC99-9C0B-4EF8-BB6D-6BB9BD380A11',"
    " '2024-02-29', '2024-02-29 23:59:59.999999', '2024-02-29 12:00:00.5+05:30', '13:14:15.5',"
    " '13:14:15+02', '1 year 2 mons 3 days 04:05:06.5', '\\x00ff10', '{\"a\": [1, 2.5, null]}',"
    " '{\"b\": {\"c\": \"d\"}, \"n\": 1.25}', '{1,2,NULL}', '{\"a b\",c}', '{1.5,2}', 'happy', 7,"
    " NULL, repeat('x', 5000))",
    "INSERT INTO items VALUES (2, 0, -1, -0.001, 12345678901234567890.123456789, -2.5e-10,"
    " 1e300, false, '', '', ' ', '00000000-0000-0000-0000-000000000000', 'infinity',"
    " '-infinity', '1970-01-01 00:00:00+00', '00:00', '00:00:00-11', '-1 day', '\\x',"
    " '[]', 'null', '{}', '{}', '{}', 'sad', 1, NULL, NULL)",
]


@pytest.mark.integration
def test_type_parity_select_vs_wal(db: Db, readers: Readers) -> None:
    db.execute(TYPES_DDL)
    reader = readers.open([T])
    for stmt in TYPES_ROWS:
        db.execute(stmt)
    events = changes(read_items(reader, 2))
    selected = dict(readers.source.select_range(T, None, (10,), 10))
    for event in events:
        row = selected[event.key]
        assert event.after == row
        for name, value in row.items():
            assert type(event.after[name]) is type(value), name  # type: ignore[index]
    first = selected[(1,)]
    assert first["num"] == decimal.Decimal("123456789.125") and isinstance(first["u"], str)
    assert first["u"] == "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11"
    assert first["ba"] == b"\x00\xff\x10" and first["j"] == {"a": [1, 2.5, None]}
    assert first["tz"] == dt.datetime(2024, 2, 29, 6, 30, 0, 500000, tzinfo=dt.timezone.utc)
    assert first["ia"] == [1, 2, None] and first["m"] == "happy" and first["dom"] == 7
    assert selected[(2,)]["d"] == dt.date.max and selected[(2,)]["jb"] is None
    # keys of every type round-trip through the reader as SELECT gives them
    assert [e.key for e in events] == [(1,), (2,)]


@pytest.mark.integration
def test_type_parity_for_keys_of_many_types(db: Db, readers: Readers) -> None:
    db.execute(
        "CREATE TABLE items (u uuid, d date, ts timestamptz, n numeric(8,2), ba bytea, t text,"
        " PRIMARY KEY (u, d, ts, n, ba, t))"
    )
    reader = readers.open([T])
    db.execute(
        "INSERT INTO items VALUES (gen_random_uuid(), '2024-01-02', '2024-01-02 03:04:05.678+01',"
        " 12.5, '\\xdeadbeef', 'k')"
    )
    db.execute("DELETE FROM items")
    ins, dele = changes(read_items(reader, 2))
    db.execute(
        "INSERT INTO items VALUES (%s, '2024-01-02', '2024-01-02 03:04:05.678+01', 12.5,"
        " '\\xdeadbeef', 'k')",
        (ins.key[0],),
    )
    ((key, _),) = readers.source.select_range(T, None, readers.source.max_key(T), 5)  # type: ignore[arg-type]
    assert ins.key == dele.key == key
    assert readers.source.coerce_key(T, list(key)) == key


# --------------------------------------------------------------------------------------------
# offsets, resume, acknowledgements


STREAM_ITEMS = 9


@dataclass
class Recorded:
    url: str
    slot: str
    items: list[LogItem]
    offsets: list[dict[str, Any]]  # offsets[k]: after the k-th item (0: before any)
    heartbeat_offset: dict[str, Any]


@pytest.fixture(scope="module")
def recorded(postgres_module_db: Any) -> Iterator[Recorded]:
    """A 9-item stream (multi-row statements, a multi-statement transaction, a watermark, a key
    change), read one item at a time, with the offset after every item."""
    db = Db(postgres_module_db.url)
    source = PostgresSource(db.url)
    db.execute("CREATE TABLE pairs (a int, b text, v int, PRIMARY KEY (a, b))")
    source.ensure_watermark_table()
    slot = "dblog_t_" + uuid.uuid4().hex[:12]
    reader = Wal2jsonReader(db.url, [TC], slot=slot)
    try:
        offsets = [reader.offset()]
        db.txn("INSERT INTO pairs VALUES (1, 'x', 0)")  # 1 item
        db.txn(  # one transaction, 3 items
            "INSERT INTO pairs VALUES (2, 'x', 0), (3, 'x', 0)",
            "UPDATE pairs SET v = 1 WHERE a = 2",
        )
        source.write_watermark("s", "w1")  # 1 item
        db.txn("DELETE FROM pairs WHERE a = 1", "UPDATE pairs SET b = 'y' WHERE a = 3")  # 1 + 2
        db.txn("INSERT INTO pairs VALUES (4, 'x', 4)")  # 1 item
        items: list[LogItem] = []
        deadline = time.monotonic() + 30
        while len(items) < STREAM_ITEMS and time.monotonic() < deadline:
            for item in reader.read(1, 0.3):
                if not isinstance(item, Heartbeat):
                    items.append(item)
                    offsets.append(json.loads(json.dumps(reader.offset())))  # JSON-able
        assert len(items) == STREAM_ITEMS
        while not any(isinstance(i, Heartbeat) for i in reader.read(10, 0.3)):
            assert time.monotonic() < deadline
        heartbeat_offset = reader.offset()
        reader.close()
        yield Recorded(db.url, slot, items, offsets, heartbeat_offset)
    finally:
        reader.close()
        drop_replication_slot(source, slot)
        source.close()
        db.close()


def _resume(recorded: Recorded, offset: dict[str, Any], expect: int) -> list[LogItem]:
    source = PostgresSource(recorded.url)
    try:
        for _ in range(100):  # the previous test's walsender may still be exiting
            info = source.replication_slot(recorded.slot)
            if info is not None and not info["active"]:
                break
            time.sleep(0.05)
    finally:
        source.close()
    reader = Wal2jsonReader(recorded.url, [TC], slot=recorded.slot, offset=offset)
    try:
        rest = read_items(reader, expect) if expect else []
        return rest + read_quiet(reader, 0.5)  # and nothing more
    finally:
        reader.close()


@pytest.mark.integration
@pytest.mark.parametrize("stop", range(STREAM_ITEMS + 1))
def test_resume_from_every_offset_gives_exactly_the_rest(recorded: Recorded, stop: int) -> None:
    rest = _resume(recorded, recorded.offsets[stop], STREAM_ITEMS - stop)
    assert rest == recorded.items[stop:]


@pytest.mark.integration
def test_resume_from_a_heartbeat_offset_replays_nothing(recorded: Recorded) -> None:
    assert recorded.heartbeat_offset["position"].endswith("-" + "0" * 20 + "-" + "0" * 20)
    assert _resume(recorded, recorded.heartbeat_offset, 0) == []


@pytest.mark.integration
def test_recorded_stream_shape(recorded: Recorded) -> None:
    items = recorded.items
    kinds = [i.op if isinstance(i, ChangeEvent) else "w" for i in items]
    assert kinds == ["c", "c", "c", "u", "w", "d", "d", "c", "c"]
    positions = [i.position for i in items]
    assert positions == sorted(positions) and len(set(positions)) == STREAM_ITEMS
    # stops inside a transaction keep the flush LSN at the transaction's start
    inside = [
        k for k in range(1, STREAM_ITEMS) if positions[k - 1].coords[0] == positions[k].coords[0]
    ]
    assert inside == [2, 3, 6, 7]
    for k in inside:
        assert lsn_to_int(recorded.offsets[k]["flush_lsn"]) <= positions[k].coords[0]


def _wait_inactive(readers: Readers, slot: str) -> None:
    for _ in range(100):
        if not readers.slot_info(slot)["active"]:
            return
        time.sleep(0.05)
    raise AssertionError(f"slot {slot} stays active")


@pytest.mark.integration
def test_acknowledge_moves_confirmed_flush_only_when_called(db: Db, readers: Readers) -> None:
    db.execute("CREATE TABLE items (id int PRIMARY KEY)")
    slot = readers.new_slot()
    reader = readers.open([T], slot=slot, status_interval_s=1)  # feedback every second
    start = readers.slot_info(slot)["confirmed_flush_lsn"]
    db.execute("INSERT INTO items VALUES (1)")
    db.execute("INSERT INTO items VALUES (2)")
    first = changes(read_items(reader, 2))
    deadline = time.monotonic() + 5
    while not any(isinstance(i, Heartbeat) for i in reader.read(10, 0.2)):
        assert time.monotonic() < deadline  # idle now: the offset has both transactions
    offset = reader.offset()
    db.execute("INSERT INTO items VALUES (3)")
    read_items(reader, 1)
    read_quiet(reader, 1.5)  # status messages go out meanwhile, keepalives come in
    # Nothing read but not acknowledged is freed. (psycopg2 itself confirms WAL that carried no
    # message for this reader, here what came before the first insert: never a change.)
    confirmed = readers.slot_info(slot)["confirmed_flush_lsn"]
    assert start <= confirmed <= first[0].position.coords[0]
    reader.close()
    _wait_inactive(readers, slot)
    reader = readers.open([T], slot=slot, status_interval_s=1)  # no offset: all of it again
    assert [e.key for e in changes(read_items(reader, 3))] == [(1,), (2,), (3,)]
    assert readers.slot_info(slot)["confirmed_flush_lsn"] <= first[0].position.coords[0]

    reader.acknowledge(offset)
    flush = lsn_to_int(offset["flush_lsn"])
    assert flush > first[1].position.coords[0]  # the end of the second transaction
    deadline = time.monotonic() + 5
    while readers.slot_info(slot)["confirmed_flush_lsn"] != flush:
        assert time.monotonic() < deadline, readers.slot_info(slot)
        reader.read(10, 0.1)
    reader.acknowledge(offset)  # again, or an older one: nothing moves back
    assert readers.slot_info(slot)["confirmed_flush_lsn"] == flush
    with pytest.raises(ValueError, match="has returned only up to"):
        reader.acknowledge({**offset, "flush_lsn": int_to_lsn(2**40)})
    reader.close()
    _wait_inactive(readers, slot)
    # after the acknowledgement the slot starts after the acknowledged transactions
    fresh = readers.open([T], slot=slot)
    assert [e.key for e in changes(read_items(fresh, 1))] == [(3,)]
    fresh.close()
    _wait_inactive(readers, slot)
    # and a reader opened with the offset continues right after it
    again = readers.open([T], slot=slot, offset=offset)
    assert [e.key for e in changes(read_items(again, 1))] == [(3,)]


@pytest.mark.integration
def test_heartbeat_on_idle_passes_current_lsn(db: Db, readers: Readers) -> None:
    db.execute("CREATE TABLE items (id int PRIMARY KEY)")
    reader = readers.open([T])
    db.execute("CREATE TABLE other (id int PRIMARY KEY)")
    db.execute("INSERT INTO other VALUES (1)")  # WAL that yields no item for this reader
    lsn = current_lsn(readers.source)
    started = time.monotonic()
    while True:
        items = reader.read(100, 0.5)
        assert all(isinstance(i, Heartbeat) for i in items)
        if items and items[-1].position >= Position.postgres(lsn, 0):
            break
        assert time.monotonic() - started < 2.0, (items, int_to_lsn(lsn))
    hb = items[-1]
    assert hb.position.coords[1:] == (0, 0)
    assert reader.offset()["position"] == str(hb.position)
    # a change after the heartbeat comes after it
    db.execute("INSERT INTO items VALUES (1)")
    (event,) = changes(read_items(reader, 1))
    assert event.position > hb.position
    # read() returns promptly when idle
    t0 = time.monotonic()
    reader.read(10, 0.3)
    assert time.monotonic() - t0 < 1.0


@pytest.mark.integration
def test_a_wake_ends_an_idle_read_and_the_log_still_comes(db: Db, readers: Readers) -> None:
    db.execute("CREATE TABLE items (id int PRIMARY KEY)")
    reader = readers.open([T])
    read_quiet(reader)
    wake = Wake()
    threading.Timer(0.1, wake.set).start()
    started = time.monotonic()
    assert not changes(reader.read(100, 30.0, wake))
    assert time.monotonic() - started < 15.0  # not the read's timeout
    wake.clear()
    db.execute("INSERT INTO items VALUES (1)")
    assert [e.key for e in changes(read_items(reader, 1))] == [(1,)]
    wake.close()


@pytest.mark.integration
def test_heartbeat_reaches_a_snapshot_close_on_an_idle_server(db: Db, readers: Readers) -> None:
    """A ``snapshot`` chunk's window can close without any new write."""
    db.execute("CREATE TABLE items (id int PRIMARY KEY)")
    reader = readers.open([T])
    db.execute("INSERT INTO items SELECT generate_series(1, 10)")
    read_items(reader, 10)
    _, info = readers.source.snapshot_select_range(T, None, (100,), 100)
    started = time.monotonic()
    while True:
        items = reader.read(100, 0.3)
        if items and items[-1].position >= info.close_position:
            break
        assert time.monotonic() - started < 3.0, (items, info)


@pytest.mark.integration
def test_heartbeat_offset_acknowledges_idle_wal(db: Db, readers: Readers) -> None:
    db.execute("CREATE TABLE items (id int PRIMARY KEY)")
    db.execute("CREATE TABLE other (id int PRIMARY KEY)")
    slot = readers.new_slot()
    reader = readers.open([T], slot=slot)
    db.execute("INSERT INTO other SELECT generate_series(1, 100)")
    lsn = current_lsn(readers.source)
    deadline = time.monotonic() + 5
    while not (items := reader.read(10, 0.3)) or items[-1].position < Position.postgres(lsn, 0):
        assert time.monotonic() < deadline
    reader.acknowledge(reader.offset())
    deadline = time.monotonic() + 5
    while readers.slot_info(slot)["confirmed_flush_lsn"] < lsn:
        assert time.monotonic() < deadline
        reader.read(10, 0.1)


@pytest.mark.integration
def test_reconnects_after_the_walsender_is_killed(db: Db, readers: Readers) -> None:
    db.execute("CREATE TABLE items (id int PRIMARY KEY)")
    slot = readers.new_slot()
    reader = readers.open([T], slot=slot)
    db.txn("INSERT INTO items VALUES (1)", "INSERT INTO items VALUES (2)")
    db.txn("INSERT INTO items VALUES (3)")
    got = changes(read_items(reader, 1))  # stops inside the first transaction
    pid = readers.slot_info(slot)["active_pid"]
    db.execute("SELECT pg_terminate_backend(%s)", (pid,))
    db.txn("INSERT INTO items VALUES (4)")
    got += changes(read_items(reader, 3))
    assert [e.key for e in got] == [(1,), (2,), (3,), (4,)]
    assert reader.stats["reconnects"] >= 1


# --------------------------------------------------------------------------------------------
# bad input


@pytest.mark.integration
def test_missing_output_plugin_names_the_package(db: Db, readers: Readers) -> None:
    db.execute("CREATE TABLE items (id int PRIMARY KEY)")
    slot = readers.new_slot()
    with pytest.raises(SourceError) as err:
        readers.open([T], slot=slot, plugin="wal2json_not_installed")
    text = str(err.value)
    assert 'could not access file "wal2json_not_installed"' in text
    assert text.endswith("install postgresql-15-wal2json on the database server")
    assert readers.source.replication_slot(slot) is None  # nothing half-made


@pytest.mark.integration
def test_slot_with_another_plugin_is_refused(db: Db, readers: Readers) -> None:
    db.execute("CREATE TABLE items (id int PRIMARY KEY)")
    slot = readers.new_slot()
    readers.source.create_replication_slot(slot, "test_decoding")
    with pytest.raises(SourceError) as err:
        readers.open([T], slot=slot)
    assert f"replication slot {slot}" in str(err.value)
    assert "uses plugin test_decoding, not wal2json" in str(err.value)
    assert f"pg_drop_replication_slot('{slot}')" in str(err.value)


@pytest.mark.integration
def test_missing_slot_when_resuming_is_an_error(db: Db, readers: Readers) -> None:
    db.execute("CREATE TABLE items (id int PRIMARY KEY)")
    slot = readers.new_slot()
    offset = {"version": 1, "slot": slot, "position": None, "flush_lsn": "0/1000"}
    with pytest.raises(SourceError) as err:
        readers.open([T], slot=slot, offset=offset)
    assert f"replication slot {slot} does not exist" in str(err.value)
    assert readers.source.replication_slot(slot) is None  # not silently recreated
    with pytest.raises(SourceError, match="does not exist"):
        readers.open([T], slot=slot, create_slot=False)


@pytest.mark.integration
def test_slot_in_use_and_bad_tables(db: Db, readers: Readers) -> None:
    db.execute("CREATE TABLE items (id int PRIMARY KEY)")
    db.execute("CREATE TABLE nokey (id int)")
    slot = readers.new_slot()
    readers.open([T], slot=slot)
    with pytest.raises(SourceError, match="in use"):
        readers.open([T], slot=slot)
    with pytest.raises(InputError, match="does not exist"):
        readers.open([TableId("public", "nope")])
    with pytest.raises(InputError, match="no primary key"):
        readers.open([TableId("public", "nokey")])
    db.execute("ALTER TABLE items REPLICA IDENTITY NOTHING")
    with pytest.raises(SourceError, match="REPLICA IDENTITY NOTHING"):
        readers.open([T])
    with pytest.raises(SourceError, match="slot name"):
        readers.open([T], slot="Bad-Name")


@pytest.mark.integration
def test_unreachable_server(readers: Readers) -> None:
    with pytest.raises(SourceError) as err:
        Wal2jsonReader("postgres://u:pw-secret@127.0.0.1:1/x", [T], slot="s", connect_timeout=2)
    assert "127.0.0.1:1" in str(err.value) and "pw-secret" not in str(err.value)
