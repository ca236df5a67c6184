"""PostgresSource on the real PostgreSQL: schema, keyset chunks, keys, watermarks, snapshots."""

from __future__ import annotations

import random
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from airflow_dblog.core.events import ChangeEvent, TableId
from airflow_dblog.core.keys import from_json, to_json
from airflow_dblog.errors import InputError, SourceError
from airflow_dblog.sources.postgres.connection import parse_postgres_url
from airflow_dblog.sources.postgres.source import WATERMARK_TABLE_ID, PostgresSource, SnapshotInfo
from tests.support.source_dbs import PostgresDb as Db
from tests.support.source_dbs import (
    after_snapshot,
    current_insert_lsn,
    drop_replication_slot,
    visible,
)


@pytest.fixture
def db(postgres_db: Any) -> Iterator[Db]:
    handle = Db(postgres_db.url)
    yield handle
    handle.close()


@pytest.fixture
def source(db: Db) -> Iterator[PostgresSource]:
    src = PostgresSource(db.url)
    yield src
    src.close()


T = TableId("public", "items")
TC = TableId("public", "pairs")


def explain(db: Db, query: Any, params: list[Any]) -> str:
    conn = db.connect()
    try:
        with conn.cursor() as cur:
            text = cur.mogrify(query, params).decode()
            cur.execute("EXPLAIN " + text)
            return "\n".join(r[0] for r in cur.fetchall())
    finally:
        conn.close()


# --------------------------------------------------------------------------------------------
# connection and server checks


@pytest.mark.integration
def test_unreachable_server_names_host_port_not_password() -> None:
    src = PostgresSource("postgres://dblog:s3cretpw@127.0.0.1:1/nope", connect_timeout=2)
    with pytest.raises(SourceError) as err:
        src.describe(T)
    text = str(err.value)
    assert "127.0.0.1:1" in text and "s3cretpw" not in text and "\n" not in text


@pytest.mark.integration
def test_wrong_password_is_one_line(db: Db) -> None:
    settings = parse_postgres_url(db.url)
    url = f"postgres://{settings.user}:wrong-pw-xyz@{settings.host}:{settings.port}/{settings.database}"
    src = PostgresSource(url)
    try:
        src.describe(T)
    except SourceError as err:
        assert "wrong-pw-xyz" not in str(err) and "\n" not in str(err)
        assert settings.where in str(err)
    # a trust-authenticated server accepts any password: then describe fails on the table
    except InputError:
        pass
    finally:
        src.close()


@pytest.mark.integration
def test_logical_decoding_check_and_wal_level_message(source: PostgresSource) -> None:
    source.check_logical_decoding()  # the test server is set up right
    assert source.setting("wal_level") == "logical"
    source._settings_cache["wal_level"] = "replica"  # what a misconfigured server reports
    with pytest.raises(SourceError) as err:
        source.check_logical_decoding()
    assert str(err.value).startswith("wal_level is replica")
    assert "ALTER SYSTEM SET wal_level=logical and restart PostgreSQL" in str(err.value)


@pytest.mark.integration
def test_no_plugin_library_setting_exists(source: PostgresSource) -> None:
    """PostgreSQL 15 loads output plugins from $libdir: there is no allow-list GUC to set."""
    names = {r[0] for r in source.query("SELECT name FROM pg_settings")}
    assert "output_plugin_libraries" not in names
    assert source.setting("dynamic_library_path") == "$libdir"


@pytest.mark.integration
def test_reconnects_after_the_server_drops_the_connection(db: Db, source: PostgresSource) -> None:
    db.execute("CREATE TABLE items (id int PRIMARY KEY, v text)")
    assert source.describe(T).key == ("id",)
    pid = source.query("SELECT pg_backend_pid()")[0][0]
    db.execute("SELECT pg_terminate_backend(%s)", (pid,))
    assert source.max_key(T) is None  # reconnected transparently
    assert source.query("SELECT pg_backend_pid()")[0][0] != pid


# --------------------------------------------------------------------------------------------
# describe


@pytest.mark.integration
def test_describe_columns_and_composite_key(db: Db, source: PostgresSource) -> None:
    db.execute(
        "CREATE TABLE pairs (b text NOT NULL, a int NOT NULL, v varchar(20), n numeric(10,2),"
        " PRIMARY KEY (a, b))"
    )
    schema = source.describe(TC)
    assert schema.key == ("a", "b")  # index order, not column order
    assert [(c.name, c.type, c.nullable) for c in schema.columns] == [
        ("b", "text", False),
        ("a", "integer", False),
        ("v", "character varying(20)", True),
        ("n", "numeric(10,2)", True),
    ]


@pytest.mark.integration
def test_describe_errors_are_one_line_input_errors(db: Db, source: PostgresSource) -> None:
    db.execute("CREATE TABLE nokey (a int)")
    with pytest.raises(InputError) as err:
        source.describe(TableId("public", "missing_table"))
    assert "public.missing_table does not exist" in str(err.value)
    with pytest.raises(InputError) as err:
        source.describe(TableId("public", "nokey"))
    assert str(err.value).startswith("table public.nokey has no primary key;")
    # quoting: a name that would be SQL if spliced is just an unknown table
    with pytest.raises(InputError):
        source.describe(TableId("public", "x'; DROP TABLE nokey; --"))
    assert db.execute("SELECT count(*) FROM nokey") == [(0,)]


@pytest.mark.integration
def test_odd_identifiers_are_quoted(db: Db, source: PostgresSource) -> None:
    db.execute('CREATE SCHEMA "My Schema"')
    db.execute('CREATE TABLE "My Schema"."Odd ""Table""" ("Key Col" int PRIMARY KEY, "v.x" text)')
    db.execute('INSERT INTO "My Schema"."Odd ""Table""" VALUES (1, \'a\'), (2, \'b\')')
    t = TableId("My Schema", 'Odd "Table"')
    assert source.describe(t).key == ("Key Col",)
    assert [k for k, _ in source.select_range(t, None, (2,), 10)] == [(1,), (2,)]
    assert source.select_keys(t, [(2,)])[0][1] == {"Key Col": 2, "v.x": "b"}
    assert source.max_key(t) == (2,)


# --------------------------------------------------------------------------------------------
# keyset chunks


def _text_keys() -> list[str]:
    rng = random.Random(7)
    alphabet = "aAbBzZ09 -_.éÉçœ"
    keys = {"".join(rng.choice(alphabet) for _ in range(rng.randint(1, 6))) for _ in range(400)}
    keys |= {"a", "A", "b", "B", "é", "e", "E", "10", "9", "a b", "a-b", "ab", "Ab", "aB"}
    return sorted(keys)  # Python order only to make the insert deterministic; never compared


@pytest.mark.integration
def test_keyset_pages_walk_text_keys_in_server_collation_order(
    db: Db, source: PostgresSource
) -> None:
    db.execute("CREATE TABLE items (k text PRIMARY KEY, v int)")
    keys = _text_keys()
    db.execute("INSERT INTO items VALUES (%s, %s)", [(k, i) for i, k in enumerate(keys)])
    expected = [r[0] for r in db.execute("SELECT k FROM items ORDER BY k")]
    t = TableId("public", "items")
    upto = source.max_key(t)
    assert upto == (expected[-1],)
    seen: list[str] = []
    lower = None
    while True:
        page = source.select_range(t, lower, upto, 7)
        seen.extend(k[0] for k, _ in page)
        if len(page) < 7:
            break
        lower = page[-1][0]
    assert seen == expected  # same order as the server's, nothing repeated or skipped
    assert len(set(seen)) == len(seen)
    # chunk bounds from the key index give the same walk
    bounds: list[Any] = []
    after = None
    while (bound := source.next_bound(t, after, upto, 50)) is not None:
        bounds.append(bound)
        after = bound
    assert [b[0] for b in bounds] == expected[49::50]
    chunks: list[str] = []
    lower = None
    for upper in [*bounds, upto]:
        chunks.extend(k[0] for k, _ in source.select_range(t, lower, upper, 1000))
        lower = upper
    assert chunks == expected


@pytest.mark.integration
def test_composite_key_pages_and_bounds(db: Db, source: PostgresSource) -> None:
    db.execute("CREATE TABLE pairs (a int, b text, v int, PRIMARY KEY (a, b))")
    rows = [(a, b, a * 10) for a in range(30) for b in ("x", "Y", "z")]
    db.execute("INSERT INTO pairs VALUES (%s, %s, %s)", rows)
    expected = db.execute("SELECT a, b FROM pairs ORDER BY a, b")
    upto = source.max_key(TC)
    assert upto == expected[-1]
    page = source.select_range(TC, (3, expected[10][1]), upto, 5)
    start = expected.index((3, expected[10][1]))
    assert [k for k, _ in page] == expected[start + 1 : start + 6]
    assert page[0][1] == {"a": page[0][0][0], "b": page[0][0][1], "v": page[0][0][0] * 10}
    assert source.next_bound(TC, None, upto, 4) == expected[3]
    assert source.next_bound(TC, expected[85], upto, 4) == expected[89]
    assert source.next_bound(TC, expected[86], upto, 4) is None  # fewer than 4 keys remain
    assert source.next_bound(TC, None, expected[2], 4) is None  # bounded by upto
    assert source.select_range(TC, None, expected[1], 100) == [
        (k, {"a": k[0], "b": k[1], "v": k[0] * 10}) for k in expected[:2]
    ]
    with pytest.raises(InputError, match="2-column primary key"):
        source.select_range(TC, (1,), upto, 5)


@pytest.mark.integration
def test_keyset_sql_uses_the_primary_key_index(db: Db, source: PostgresSource) -> None:
    db.execute("CREATE TABLE pairs (a int, b text, v text, PRIMARY KEY (a, b))")
    db.execute(
        "INSERT INTO pairs SELECT g / 10, 'k' || (g % 10), repeat('v', 50)"
        " FROM generate_series(1, 20000) g"
    )
    db.execute("VACUUM ANALYZE pairs")
    query, params = source.range_sql(TC, None, (100, "k3"), (900, "k1"), limit=100)
    plan = explain(db, query, params)
    assert "Index Scan using pairs_pkey on pairs" in plan, plan
    assert "Sort" not in plan and "Seq Scan" not in plan, plan
    # the row comparisons are the index condition, not a filter
    assert "Index Cond: ((ROW(a, b) > ROW(100, 'k3'::text)) AND (ROW(a, b) <= ROW(900," in plan
    assert "Filter" not in plan, plan
    # chunk bounds read the key index only
    query, params = source.range_sql(TC, ["a", "b"], (100, "k3"), (900, "k1"), offset=99, limit=1)
    plan = explain(db, query, params)
    assert "Index Only Scan using pairs_pkey on pairs" in plan, plan
    # the largest key: a backward index scan, no sort
    query, params = source.range_sql(TC, ["a", "b"], None, None, limit=1, descending=True)
    plan = explain(db, query, params)
    assert "Index Only Scan Backward using pairs_pkey" in plan, plan
    # key lists: the index too
    query, params = source.keys_sql(TC, [(5, "k1"), (7, "k2"), (900, "k9")])
    plan = explain(db, query, params)
    assert "pairs_pkey" in plan and "Seq Scan" not in plan, plan


@pytest.mark.integration
def test_estimate_rows_uses_statistics_not_count(db: Db, source: PostgresSource) -> None:
    db.execute("CREATE TABLE items (id int PRIMARY KEY)")
    db.execute("INSERT INTO items SELECT generate_series(1, 3000)")
    db.execute("ANALYZE items")
    assert source.estimate_rows(T) == 3000
    db.execute("INSERT INTO items SELECT generate_series(3001, 3500)")
    assert source.estimate_rows(T) == 3000  # the planner's number until the next ANALYZE


@pytest.mark.integration
def test_select_keys_batches_and_skips_missing(db: Db, source: PostgresSource) -> None:
    db.execute("CREATE TABLE pairs (a int, b text, v int, PRIMARY KEY (a, b))")
    db.execute("INSERT INTO pairs SELECT g, 'k', g FROM generate_series(1, 1200) g")
    keys = [(g, "k") for g in range(0, 1300, 2)]  # 650 keys: two batches, some missing
    rows = source.select_keys(TC, keys)
    assert [k for k, _ in rows] == [(g, "k") for g in range(2, 1201, 2)]
    assert all(r == {"a": k[0], "b": "k", "v": k[0]} for k, r in rows)
    assert source.select_keys(TC, []) == []
    # a value that would be SQL if spliced is just a key that does not exist
    assert source.select_keys(TC, [(1, "k' OR '1'='1")]) == []


# --------------------------------------------------------------------------------------------
# keys from users


@pytest.mark.integration
def test_coerce_key_to_column_types(db: Db, source: PostgresSource) -> None:
    db.execute(
        "CREATE TABLE items (i int, bi bigint, t text, vc varchar(4), n numeric(8,2), u uuid,"
        " d date, ts timestamp, tz timestamptz, ba bytea, PRIMARY KEY (i, bi, t, vc, n, u, d,"
        " ts, tz, ba))"
    )
    u = str(uuid.uuid4())
    row = (
        1,
        2**40,
        "tê",
        "ab",
        "3.5",
        u,
        "2024-02-29",
        "2024-02-29 10:00:00.25",
        "2024-02-29 10:00:00+02",
        b"\x00\xff",
    )
    db.execute("INSERT INTO items VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s)", row)
    (stored,) = [k for k, _ in source.select_range(T, None, source.max_key(T), 5)]
    given = [
        1,
        2**40,
        "tê",
        "ab",
        3.5,
        u.upper(),
        "2024-02-29",
        "2024-02-29T10:00:00.25",
        "2024-02-29T08:00:00Z",
        "00ff",
    ]
    key = source.coerce_key(T, given)
    assert key == stored
    assert [type(v) for v in key] == [type(v) for v in stored]
    assert str(key[4]) == "3.50"
    # the JSON round trip the metadata store makes gives the same key back
    assert source.coerce_key(T, from_json(to_json(stored))) == stored
    assert source.select_keys(T, [key])[0][0] == stored
    by_name = dict(zip(source.describe(T).key, given, strict=True))
    assert source.coerce_key(T, by_name) == stored


@pytest.mark.integration
@pytest.mark.parametrize(
    ("key", "message"),
    [
        ([1], "has 1 value(s) but public.pairs has the 2-column primary key (a, b)"),
        ([1, "x", 3], "has 3 value(s)"),
        (["one", "x"], "key column a of public.pairs expects an integer (integer), got 'one'"),
        ([1, 2], "key column b of public.pairs expects a string (text), got 2"),
        ([True, "x"], "key column a of public.pairs expects an integer"),
        ([2**31, "x"], "out of range for integer"),
        ({"a": 1}, "names columns ['a']"),
    ],
)
def test_coerce_key_errors_name_column_and_type(
    db: Db, source: PostgresSource, key: Any, message: str
) -> None:
    db.execute("CREATE TABLE pairs (a int, b text, PRIMARY KEY (a, b))")
    with pytest.raises(InputError) as err:
        source.coerce_key(TC, key)
    assert message in str(err.value)
    assert "\n" not in str(err.value)


@pytest.mark.integration
@pytest.mark.parametrize(
    ("column", "bad", "expects"),
    [
        ("uuid", "xyz", "a UUID string (uuid)"),
        ("date", "29/02/2024", "an ISO date string YYYY-MM-DD (date)"),
        ("timestamp", "yesterday", "an ISO timestamp string without time zone (timestamp)"),
        ("timestamptz", 5, "an ISO timestamp string, UTC unless it has an offset (timestamptz)"),
        ("numeric(6,1)", "1.25", "a number or a decimal string (numeric)"),
        ("bytea", "xyz", "a hex string (bytea)"),
        ("bigint", "1e3", "an integer (bigint)"),
    ],
)
def test_coerce_key_type_mismatch(
    db: Db, source: PostgresSource, column: str, bad: Any, expects: str
) -> None:
    db.execute(f"CREATE TABLE items (k {column} PRIMARY KEY)")
    with pytest.raises(InputError) as err:
        source.coerce_key(T, [bad])
    assert f"key column k of public.items expects {expects}, got {bad!r}" in str(err.value)


# --------------------------------------------------------------------------------------------
# watermarks and replica identity


@pytest.mark.integration
def test_watermark_table_is_created_once_and_upserted(db: Db, source: PostgresSource) -> None:
    source.ensure_watermark_table()
    source.ensure_watermark_table()  # idempotent
    source.write_watermark("inventory", "low-1")
    source.write_watermark("inventory", "high-1")
    source.write_watermark("other", "x")
    rows = db.execute(f"SELECT stream, value FROM {WATERMARK_TABLE_ID} ORDER BY stream")
    assert rows == [("inventory", "high-1"), ("other", "x")]
    assert source.describe(WATERMARK_TABLE_ID).key == ("stream",)


@pytest.mark.integration
def test_write_watermark_creates_the_table_when_missing(db: Db, source: PostgresSource) -> None:
    source.write_watermark("s", "v")  # autocommit: visible to another session at once
    assert db.execute("SELECT value FROM dblog.dblog_watermarks WHERE stream = 's'") == [("v",)]


@pytest.mark.integration
def test_replica_identity_checks(db: Db, source: PostgresSource, caplog: Any) -> None:
    db.execute("CREATE TABLE items (id int PRIMARY KEY, v text)")
    db.execute("CREATE TABLE pairs (a int, b text, PRIMARY KEY (a, b))")
    assert source.check_replica_identity([T, TC], "ignore") == {T: "default", TC: "default"}
    with caplog.at_level("WARNING"):
        source.check_replica_identity([T], "warn")
    assert "REPLICA IDENTITY FULL" in caplog.text
    with pytest.raises(SourceError) as err:
        source.check_replica_identity([T], "require")
    assert str(err.value).endswith("ALTER TABLE public.items REPLICA IDENTITY FULL")
    assert source.replica_identity(T) == "default"  # never changed implicitly
    db.execute("ALTER TABLE items REPLICA IDENTITY FULL")
    assert source.check_replica_identity([T], "require") == {T: "full"}
    db.execute("ALTER TABLE pairs REPLICA IDENTITY NOTHING")
    with pytest.raises(SourceError, match="REPLICA IDENTITY NOTHING"):
        source.check_replica_identity([TC], "ignore")


# --------------------------------------------------------------------------------------------
# snapshot chunks


@pytest.mark.integration
def test_snapshot_select_sees_exactly_its_snapshot(db: Db, source: PostgresSource) -> None:
    db.execute("CREATE TABLE items (id int PRIMARY KEY, v text)")
    db.execute("INSERT INTO items SELECT g, 'old' FROM generate_series(1, 10) g")
    before = current_insert_lsn(source)
    xids: dict[str, int] = {}
    open_tx = db.connect()
    open_tx.autocommit = False
    with open_tx.cursor() as cur:  # in progress while the snapshot is taken
        cur.execute("UPDATE items SET v = 'in-progress' WHERE id = 2")
        cur.execute("SELECT pg_current_xact_id()::text::bigint")
        xids["open"] = cur.fetchone()[0]
    db.execute("CREATE TABLE bump (x int)")  # a later xid commits: the open one lands in xip
    db.execute("INSERT INTO bump VALUES (1)")

    def concurrent(info: SnapshotInfo) -> None:
        # commits after the snapshot, before the SELECT
        other = db.connect()
        other.autocommit = False
        with other.cursor() as cur:
            cur.execute("UPDATE items SET v = 'late' WHERE id = 1")
            cur.execute("INSERT INTO items VALUES (11, 'late')")
            cur.execute("SELECT pg_current_xact_id()::text::bigint")
            xids["late"] = cur.fetchone()[0]
        other.commit()
        other.close()
        open_tx.commit()

    with after_snapshot(source, concurrent):
        rows, info = source.snapshot_select_range(T, None, (100,), 100)
    open_tx.close()
    assert {k[0]: r["v"] for k, r in rows} == {i: "old" for i in range(1, 11)}
    assert info.close_lsn >= before
    assert not visible(info, xids["late"]) and xids["late"] >= info.xmax
    assert not visible(info, xids["open"]) and xids["open"] in info.xip
    assert db.execute("SELECT v FROM items WHERE id = 1") == [("late",)]
    # the same for key lists
    rows, info2 = source.snapshot_select_keys(T, [(1,), (11,), (99,)])
    assert [(k, r["v"]) for k, r in rows] == [((1,), "late"), ((11,), "late")]
    assert visible(info2, xids["late"]) and visible(info2, xids["open"])
    assert info2.close_lsn >= info.close_lsn
    rows, _ = source.snapshot_select_keys(T, [])
    assert rows == []


@pytest.mark.integration
def test_snapshot_visible_changes_commit_before_close_lsn(db: Db, source: PostgresSource) -> None:
    """Through the WAL reader: visible => commit LSN < close_lsn; invisible => xid says so."""
    from airflow_dblog.sources.postgres.wal2json_reader import Wal2jsonReader

    db.execute("CREATE TABLE items (id int PRIMARY KEY, v text)")
    slot = "dblog_t_" + uuid.uuid4().hex[:12]
    reader = Wal2jsonReader(db.url, [T], slot=slot)
    try:
        for i in range(5):
            db.execute("INSERT INTO items VALUES (%s, 'visible')", (i,))

        def concurrent(info: SnapshotInfo) -> None:
            db.execute("INSERT INTO items VALUES (100, 'invisible')")
            db.execute("UPDATE items SET v = 'invisible' WHERE id = 0")

        with after_snapshot(source, concurrent):
            rows, info = source.snapshot_select_range(T, None, (1000,), 1000)
        db.execute("INSERT INTO items VALUES (101, 'after')")
        events: list[ChangeEvent] = []
        deadline = 50
        while len(events) < 8 and deadline:
            events.extend(e for e in reader.read(100, 0.2) if isinstance(e, ChangeEvent))
            deadline -= 1
        assert len(events) == 8
        assert {k[0] for k, _ in rows} == set(range(5))
        for e in events:
            if e.after is not None and e.after["v"] == "visible":
                assert visible(info, e.xid)
                assert e.position.coords[0] < info.close_lsn
                assert e.position < info.close_position
            else:
                assert not visible(info, e.xid)
        late = [e for e in events if e.after and e.after["v"] == "after"]
        assert late[0].position >= info.close_position
    finally:
        reader.close()
        drop_replication_slot(source, slot)
