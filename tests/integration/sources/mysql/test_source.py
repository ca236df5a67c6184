"""MysqlSource against the real MariaDB: schema, keyset chunks, keys, watermarks, binlog facts."""

from __future__ import annotations

import datetime as dt
import decimal
import uuid
from collections.abc import Iterator
from typing import Any

import pymysql
import pytest

from airflow_dblog.core.events import TableId
from airflow_dblog.core.keys import from_json, to_json
from airflow_dblog.core.position import Position
from airflow_dblog.errors import InputError, SourceError
from airflow_dblog.sources.mysql.source import END_OF_EVENT, WATERMARK_TABLE_ID, MysqlSource
from tests.support.source_dbs import MysqlDb as Db
from tests.support.source_dbs import after_snapshot

pytestmark = pytest.mark.integration


@pytest.fixture
def db(mysql_db: Any) -> Iterator[Db]:
    handle = Db(mysql_db.url, mysql_db.name)
    yield handle
    handle.close()


@pytest.fixture
def source(db: Db) -> Iterator[MysqlSource]:
    src = MysqlSource(db.url)
    yield src
    src.close()


def explain(db: Db, sql: str, params: list[Any]) -> list[dict[str, Any]]:
    conn = db.connect()
    try:
        with conn.cursor(pymysql.cursors.DictCursor) as cur:
            cur.execute("EXPLAIN " + sql, params)
            return list(cur.fetchall())
    finally:
        conn.close()


# -- describe ---------------------------------------------------------------------------------


def test_describe_columns_and_key_order(db: Db, source: MysqlSource) -> None:
    db.execute(
        f"CREATE TABLE {db.q('t')} (a int NOT NULL, b varchar(10) NOT NULL, c text,"
        " PRIMARY KEY (b, a))"
    )
    schema = source.describe(db.table("t"))
    assert [c.name for c in schema.columns] == ["a", "b", "c"]
    assert schema.key == ("b", "a")
    assert schema.columns[2].nullable and not schema.columns[0].nullable
    assert schema.columns[1].type.startswith("varchar(10)")


def test_describe_refuses_unknown_table_and_missing_key(db: Db, source: MysqlSource) -> None:
    with pytest.raises(InputError, match=rf"^table {db.name}\.nope does not exist; ") as err:
        source.describe(db.table("nope"))
    assert "\n" not in str(err.value)
    db.execute(f"CREATE TABLE {db.q('nokey')} (a int)")
    with pytest.raises(
        InputError, match=rf"^table {db.name}\.nokey has no primary key; dblog needs one to cut"
    ):
        source.describe(db.table("nokey"))


# -- keyset chunks ----------------------------------------------------------------------------

NAMES = ["apple", "Apple2", "Äpfel", "banana", "Zebra", "zulu", "éclair", "eclairs", "Ω", "m"]


@pytest.fixture
def composite(db: Db) -> TableId:
    """(int, varchar) key in an accent- and case-insensitive collation."""
    db.execute(
        f"CREATE TABLE {db.q('comp')} (g int NOT NULL, name varchar(20) NOT NULL, v int,"
        " PRIMARY KEY (g, name)) CHARACTER SET utf8mb4 COLLATE utf8mb4_unicode_ci"
    )
    rows = [(g, name, g * 100 + i) for g in range(4) for i, name in enumerate(NAMES)]
    db.execute(f"INSERT INTO {db.q('comp')} VALUES (%s, %s, %s)", rows)
    return db.table("comp")


def server_order(db: Db, table: TableId) -> list[tuple[Any, ...]]:
    return [
        tuple(r) for r in db.execute(f"SELECT g, name FROM {db.q(table.table)} ORDER BY g, name")
    ]


def test_keyset_pages_walk_the_table_in_collation_order(
    db: Db, source: MysqlSource, composite: TableId
) -> None:
    expected = server_order(db, composite)
    names_g0 = [name for g, name in expected if g == 0]
    assert names_g0 != sorted(names_g0), "collation order must differ from Python's order"
    upper = source.max_key(composite)
    assert upper == expected[-1]
    seen: list[tuple[Any, ...]] = []
    lower = None
    while True:
        page = source.select_range(composite, lower, upper, 7)
        if not page:
            break
        for key, row in page:
            assert key == (row["g"], row["name"])
        seen.extend(k for k, _ in page)
        lower = page[-1][0]
    assert seen == expected
    assert len(set(seen)) == len(seen)


def test_next_bound_cuts_chunks_that_cover_the_table(
    db: Db, source: MysqlSource, composite: TableId
) -> None:
    expected = server_order(db, composite)
    upper = source.max_key(composite)
    assert upper is not None
    assert source.next_bound(composite, None, upper, 1) == expected[0]
    assert source.next_bound(composite, None, upper, 5) == expected[4]
    assert source.next_bound(composite, expected[4], upper, 3) == expected[7]
    assert source.next_bound(composite, expected[-3], upper, 2) == expected[-1]
    assert source.next_bound(composite, expected[-3], upper, 3) is None
    assert source.next_bound(composite, None, expected[2], 4) is None  # bounded by upto
    covered: list[tuple[Any, ...]] = []
    after = None
    while True:
        bound = source.next_bound(composite, after, upper, 6)
        chunk_upper = upper if bound is None else bound
        covered.extend(k for k, _ in source.select_range(composite, after, chunk_upper, 1000))
        if bound is None:
            break
        after = bound
    assert covered == expected


def test_keyset_sql_is_a_range_scan_on_primary(
    db: Db, source: MysqlSource, composite: TableId
) -> None:
    sql, params = source.chunk_sql(composite, (1, "banana"), (2, "eclairs"), 10)
    plan = explain(db, sql, params)
    assert plan[0]["key"] == "PRIMARY"
    assert plan[0]["type"] == "range", plan
    keys = [(1, "banana"), (2, "zulu"), (3, "Ω")]
    sql, params = source.keys_sql(composite, keys)
    plan = explain(db, sql, params)
    assert (plan[0]["key"], plan[0]["type"]) == ("PRIMARY", "range"), plan
    assert [k for k, _ in source.select_keys(composite, [*keys, (9, "none")])] == keys


def test_select_keys_in_batches(db: Db, source: MysqlSource) -> None:
    db.execute(f"CREATE TABLE {db.q('many')} (id bigint unsigned PRIMARY KEY, v varchar(5))")
    db.execute(f"INSERT INTO {db.q('many')} VALUES (%s, %s)", [(i, str(i)) for i in range(1200)])
    keys = [(i,) for i in range(0, 1200, 2)] + [(5000,)]
    got = source.select_keys(db.table("many"), keys)
    assert [k for k, _ in got] == keys[:-1]
    assert got[3][1] == {"id": 6, "v": "6"}


def test_max_key_and_estimate(db: Db, source: MysqlSource) -> None:
    db.execute(f"CREATE TABLE {db.q('e')} (id int PRIMARY KEY)")
    assert source.max_key(db.table("e")) is None
    db.execute(f"INSERT INTO {db.q('e')} VALUES (%s)", [(i,) for i in range(1, 301)])
    db.execute(f"ANALYZE TABLE {db.q('e')}")
    assert source.max_key(db.table("e")) == (300,)
    estimate = source.estimate_rows(db.table("e"))
    assert 30 <= estimate <= 3000


def test_identifiers_are_quoted(db: Db, source: MysqlSource) -> None:
    db.execute(f"CREATE TABLE {db.q('we``ird')} (`k``ey` int PRIMARY KEY, `v; DROP TABLE x` int)")
    table = db.table("we`ird")
    db.execute(f"INSERT INTO {db.q('we``ird')} VALUES (1, 10), (2, 20), (3, 30)")
    assert source.describe(table).key == ("k`ey",)
    assert source.max_key(table) == (3,)
    assert source.next_bound(table, (1,), (3,), 1) == (2,)
    assert source.select_range(table, (1,), (3,), 10)[0] == (
        (2,),
        {"k`ey": 2, "v; DROP TABLE x": 20},
    )
    assert [k for k, _ in source.select_keys(table, [(3,)])] == [(3,)]
    hostile = "x'); DROP TABLE t; --"
    db.execute(f"CREATE TABLE {db.q('s')} (k varchar(40) PRIMARY KEY)")
    db.execute(f"INSERT INTO {db.q('s')} VALUES (%s)", (hostile,))
    assert source.select_keys(db.table("s"), [(hostile,)]) == [((hostile,), {"k": hostile})]


def test_reconnects_after_losing_its_connection(db: Db, source: MysqlSource) -> None:
    db.execute(f"CREATE TABLE {db.q('r')} (id int PRIMARY KEY)")
    db.execute(f"INSERT INTO {db.q('r')} VALUES (1), (2)")
    assert source.max_key(db.table("r")) == (2,)
    conn = source._conn
    assert conn is not None
    db.execute("KILL %s", (conn.thread_id(),))
    assert source.max_key(db.table("r")) == (2,)
    assert source._conn is not conn


def test_a_chunk_select_reconnects_after_losing_its_mysqlclient_connection(
    db: Db, source: MysqlSource
) -> None:
    assert source._c_rows is not None, "scripts/test.sh installs the mysqlclient extra"
    db.execute(f"CREATE TABLE {db.q('r')} (id int PRIMARY KEY)")
    db.execute(f"INSERT INTO {db.q('r')} VALUES (1), (2)")
    assert [k for k, _ in source.select_range(db.table("r"), None, (2,), 10)] == [(1,), (2,)]
    conn = source._c_rows._conn
    db.execute("KILL %s", (conn.thread_id(),))
    assert [k for k, _ in source.select_keys(db.table("r"), [(2,)])] == [(2,)]
    assert source._c_rows._conn is not conn


def test_a_chunk_select_failing_on_mysqlclient_is_one_line_naming_the_chunk_and_the_error(
    db: Db, source: MysqlSource
) -> None:
    assert source._c_rows is not None, "scripts/test.sh installs the mysqlclient extra"
    db.execute(f"CREATE TABLE {db.q('gone')} (id int PRIMARY KEY)")
    table = db.table("gone")
    source.describe(table)
    db.execute(f"DROP TABLE {db.q('gone')}")
    with pytest.raises(SourceError, match=r"failed to select a chunk of .*gone: \(1146\)") as err:
        source.select_range(table, None, (2,), 10)
    assert "\n" not in str(err.value)


# -- coerce_key --------------------------------------------------------------------------------


@pytest.fixture
def typed(db: Db) -> TableId:
    db.execute(
        f"CREATE TABLE {db.q('typed')} (i int, u bigint unsigned, s varchar(8), d decimal(8,2),"
        " dd date, ts datetime(6), b varbinary(4), c char(36),"
        " PRIMARY KEY (i, u, s, d, dd, ts, b, c))"
    )
    return db.table("typed")


def test_coerce_key_round_trip(db: Db, source: MysqlSource, typed: TableId) -> None:
    cid = str(uuid.uuid4())
    db.execute(
        f"INSERT INTO {db.q('typed')} VALUES (-5, 18446744073709551615, 'héllo', 12.5,"
        " '2024-02-29', '2024-02-29 10:11:12.5', 0x00ff, %s)",
        (cid,),
    )
    ((key, _row),) = source.select_range(typed, None, source.max_key(typed), 10)  # type: ignore[arg-type]
    assert key == (
        -5,
        2**64 - 1,
        "héllo",
        decimal.Decimal("12.50"),
        dt.date(2024, 2, 29),
        dt.datetime(2024, 2, 29, 10, 11, 12, 500000),
        b"\x00\xff",
        cid,
    )
    assert source.coerce_key(typed, from_json(to_json(key))) == key
    user = [
        "-5",
        18446744073709551615,
        "héllo",
        "12.5",
        "2024-02-29",
        "2024-02-29T10:11:12.5",
        "0x00ff",
        cid,
    ]
    coerced = source.coerce_key(typed, user)
    assert coerced == key
    assert [type(v) for v in coerced] == [type(v) for v in key]
    assert source.select_keys(typed, [coerced])[0][0] == key


@pytest.mark.parametrize(
    ("key", "match"),
    [
        ([1, 2, "x"], r"has 3 value\(s\) but .*typed has the 8-column primary key"),
        (
            ["x", 1, "a", 1, "2024-01-01", "2024-01-01", "0x00", "c"],
            "key column i of .* expects an integer",
        ),
        (
            [1, -1, "a", 1, "2024-01-01", "2024-01-01", "0x00", "c"],
            "key column u .* expects an integer .*out of range",
        ),
        (
            [1, 1, "a" * 9, 1, "2024-01-01", "2024-01-01", "0x00", "c"],
            "key column s .* expects a string",
        ),
        ([1, 1, "a", "1.234", "2024-01-01", "2024-01-01", "0x00", "c"], "key column d .* decimal"),
        ([1, 1, "a", 1, "31/01/2024", "2024-01-01", "0x00", "c"], "key column dd .* ISO date"),
        ([1, 1, "a", 1, "2024-01-01", "noon", "0x00", "c"], "key column ts .* ISO date-time"),
        ([1, 1, "a", 1, "2024-01-01", "2024-01-01", 7, "c"], "key column b .* bytes"),
        ([1, 1, "a", 1, "2024-01-01", "2024-01-01", "0x00", 5], "key column c .* string"),
    ],
)
def test_coerce_key_errors(source: MysqlSource, typed: TableId, key: list[Any], match: str) -> None:
    with pytest.raises(InputError, match=match) as err:
        source.coerce_key(typed, key)
    assert "\n" not in str(err.value)


def test_coerce_key_accepts_an_object_by_column(db: Db, source: MysqlSource) -> None:
    db.execute(f"CREATE TABLE {db.q('kv')} (a int, b varchar(3), PRIMARY KEY (a, b))")
    assert source.coerce_key(db.table("kv"), {"b": "x", "a": "7"}) == (7, "x")
    with pytest.raises(InputError, match="names columns"):
        source.coerce_key(db.table("kv"), {"a": 1})


# -- watermarks and binlog facts ---------------------------------------------------------------


def test_watermark_table_upsert(db: Db, source: MysqlSource) -> None:
    stream = f"test-{uuid.uuid4().hex[:12]}"
    source.ensure_watermark_table()
    source.ensure_watermark_table()  # idempotent
    try:
        first, second = str(uuid.uuid4()), str(uuid.uuid4())
        source.write_watermark(stream, first)
        q = "SELECT value FROM `dblog`.`dblog_watermarks` WHERE stream = %s"
        assert db.execute(q, (stream,)) == [(first,)]
        source.write_watermark(stream, second)
        assert db.execute(q, (stream,)) == [(second,)]
        schema = source.describe(WATERMARK_TABLE_ID)
        assert schema.key == ("stream",)
    finally:
        db.execute("DELETE FROM `dblog`.`dblog_watermarks` WHERE stream = %s", (stream,))


def test_binlog_facts_grow_after_a_write(db: Db, source: MysqlSource) -> None:
    variables = source.check_binlog()
    assert variables["binlog_format"].upper() == "ROW"
    db.execute(f"CREATE TABLE {db.q('w')} (id int PRIMARY KEY)")
    before_gtid, before_pos = source.gtid_executed(), source.binlog_position()
    assert before_pos.coords[2] == END_OF_EVENT
    db.execute(f"INSERT INTO {db.q('w')} VALUES (1)")
    after_gtid, after_pos = source.gtid_executed(), source.binlog_position()
    assert after_pos > before_pos
    assert after_gtid != before_gtid
    if source.flavor == "mariadb":
        domains_before = {
            g.split("-")[0]: int(g.split("-")[2]) for g in before_gtid.split(",") if g
        }
        domain, _, seq = next(g for g in after_gtid.split(",") if g).split("-")
        assert int(seq) > domains_before.get(domain, 0)


def test_snapshot_is_refused_on_mysql(db: Db, source: MysqlSource) -> None:
    db.execute(f"CREATE TABLE {db.q('m')} (id int PRIMARY KEY)")
    source._version = "8.0.36"  # pretend: MySQL has no binlog snapshot position
    with pytest.raises(SourceError, match=r"needs MariaDB.*source\.watermark: gtid"):
        source.snapshot_select_range(db.table("m"), None, (1,), 10)


def test_snapshot_select_sees_exactly_the_binlog_up_to_its_position(
    db: Db, source: MysqlSource
) -> None:
    if source.flavor != "mariadb":
        pytest.skip("binlog snapshot positions are MariaDB only")
    db.execute(f"CREATE TABLE {db.q('snap')} (id int PRIMARY KEY, v int)")
    db.execute(f"INSERT INTO {db.q('snap')} VALUES (1, 1), (2, 2)")
    before = source.binlog_position()
    writer = db.connect()
    late: list[Position] = []

    def write_after_snapshot(position: Position) -> None:
        with writer.cursor() as cur:
            cur.execute(f"INSERT INTO {db.q('snap')} VALUES (3, 3)")
            cur.execute(f"UPDATE {db.q('snap')} SET v = 20 WHERE id = 2")
        late.append(source_two.binlog_position())

    source_two = MysqlSource(db.url)
    try:
        with after_snapshot(source, write_after_snapshot):
            rows, position = source.snapshot_select_range(db.table("snap"), None, (10,), 100)
    finally:
        writer.close()
        source_two.close()
    assert position >= before
    assert [row for _, row in rows] == [{"id": 1, "v": 1}, {"id": 2, "v": 2}]
    assert late[0] > position
    rows, position2 = source.snapshot_select_keys(db.table("snap"), [(2,), (3,)])
    assert [row for _, row in rows] == [{"id": 2, "v": 20}, {"id": 3, "v": 3}]
    assert position2 >= late[0]
