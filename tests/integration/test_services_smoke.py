"""Each test service proven for real: MariaDB/MySQL + binlog, PostgreSQL + wal2json, ZooKeeper,
Kafka (incl. transactions), Spark with Delta Lake and the Kafka source."""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.integration


# --- MySQL / MariaDB ---------------------------------------------------------------------------


def test_mysql_binlog_settings(mysql_server: Any) -> None:
    conn = mysql_server.connect()
    try:
        with conn.cursor() as cur:
            cur.execute(
                "SHOW GLOBAL VARIABLES WHERE Variable_name IN "
                "('log_bin', 'binlog_format', 'binlog_row_image', 'server_id')"
            )
            variables = dict(cur.fetchall())
    finally:
        conn.close()
    assert variables["log_bin"] == "ON"
    assert variables["binlog_format"] == "ROW"
    assert variables["binlog_row_image"] == "FULL"
    assert variables["server_id"] != "0"


def test_mysql_write_read_and_binlog_row_event(mysql_db: Any) -> None:
    from pymysqlreplication import BinLogStreamReader
    from pymysqlreplication.row_event import WriteRowsEvent

    server = mysql_db.server
    conn = mysql_db.connect()
    try:
        with conn.cursor() as cur:
            cur.execute("CREATE TABLE items (id INT PRIMARY KEY, name VARCHAR(50))")
            cur.execute("SHOW MASTER STATUS")
            log_file, log_pos = cur.fetchone()[:2]
            cur.execute("INSERT INTO items VALUES (%s, %s)", (1, "smoke"))
            cur.execute("SELECT id, name FROM items")
            assert cur.fetchall() == ((1, "smoke"),)
    finally:
        conn.close()

    stream = BinLogStreamReader(
        connection_settings=server.replication_settings(),
        server_id=100_000 + uuid.uuid4().int % 100_000,
        log_file=log_file,
        log_pos=log_pos,
        resume_stream=True,
        blocking=False,
        only_events=[WriteRowsEvent],
        only_schemas=[mysql_db.name],
    )
    try:
        rows = [row["values"] for event in stream for row in event.rows]
    finally:
        stream.close()
    assert rows == [{"id": 1, "name": "smoke"}]


# --- PostgreSQL --------------------------------------------------------------------------------


def test_postgres_write_read_and_wal2json_change(postgres_db: Any) -> None:
    slot = f"smoke_{uuid.uuid4().hex[:8]}"
    conn = postgres_db.connect()
    try:
        with conn.cursor() as cur:
            cur.execute("SHOW wal_level")
            assert cur.fetchone()[0] == "logical"
            cur.execute("CREATE TABLE items (id INT PRIMARY KEY, name TEXT)")
            cur.execute("SELECT pg_create_logical_replication_slot(%s, 'wal2json')", (slot,))
            cur.execute("INSERT INTO items VALUES (%s, %s)", (1, "smoke"))
            cur.execute("SELECT id, name FROM items")
            assert cur.fetchall() == [(1, "smoke")]
            cur.execute(
                "SELECT data FROM pg_logical_slot_get_changes(%s, NULL, NULL, "
                "'format-version', '2', 'include-xids', '1')",
                (slot,),
            )
            changes = [json.loads(row[0]) for row in cur.fetchall()]
    finally:
        conn.close()  # the slot is dropped with the database by the fixture
    inserts = [c for c in changes if c.get("action") == "I"]
    assert len(inserts) == 1
    insert = inserts[0]
    assert insert["table"] == "items"
    assert {col["name"]: col["value"] for col in insert["columns"]} == {"id": 1, "name": "smoke"}
    assert any(c.get("action") == "B" and "xid" in c for c in changes)


def test_postgres_db_fixture_drops_its_slots(postgres_server: Any) -> None:
    from tests.support import services

    with services.fresh_postgres_database(postgres_server, "slots") as db:
        conn = db.connect()
        with conn.cursor() as cur:
            cur.execute("SELECT pg_create_logical_replication_slot('leftover', 'wal2json')")
        conn.close()
    conn = postgres_server.connect()
    try:
        with conn.cursor() as cur:
            cur.execute("SELECT count(*) FROM pg_replication_slots WHERE database = %s", (db.name,))
            assert cur.fetchone()[0] == 0
            cur.execute("SELECT count(*) FROM pg_database WHERE datname = %s", (db.name,))
            assert cur.fetchone()[0] == 0
    finally:
        conn.close()


# --- ZooKeeper ---------------------------------------------------------------------------------


def test_zookeeper_create_and_read(zookeeper_server: Any, zk_path: str) -> None:
    client = zookeeper_server.client(chroot=zk_path)
    try:
        client.create("/leader", b"node-1", ephemeral=True)
        data, stat = client.get("/leader")
        assert data == b"node-1"
        assert stat.ephemeralOwner == client.client_id[0]
    finally:
        client.stop()
        client.close()
    root = zookeeper_server.client()
    try:
        assert root.exists(f"{zk_path}/leader") is None  # ephemeral: gone with its session
        assert root.exists(zk_path) is not None
    finally:
        root.stop()
        root.close()


# --- Kafka -------------------------------------------------------------------------------------


def _consume(kafka_server: Any, topic: str, count: int, **extra: Any) -> list[Any]:
    from confluent_kafka import Consumer

    consumer = Consumer(
        kafka_server.config(
            group_id=f"smoke-{uuid.uuid4().hex[:8]}",
            auto_offset_reset="earliest",
            enable_auto_commit=False,
            **extra,
        )
    )
    consumer.subscribe([topic])
    messages: list[Any] = []
    try:
        for _ in range(60):
            message = consumer.poll(1.0)
            if message is None:
                if len(messages) >= count:
                    break
                continue
            assert message.error() is None, message.error()
            messages.append(message)
    finally:
        consumer.close()
    return messages


def test_kafka_produce_and_consume(kafka_server: Any, kafka_topic: str) -> None:
    from confluent_kafka import Producer

    producer = Producer(kafka_server.config())
    producer.produce(kafka_topic, key=b"k1", value=b"hello")
    assert producer.flush(30) == 0
    messages = _consume(kafka_server, kafka_topic, 1)
    assert [(m.key(), m.value()) for m in messages] == [(b"k1", b"hello")]


def test_kafka_transactions_read_committed(kafka_server: Any, kafka_topic: str) -> None:
    from confluent_kafka import Producer

    producer = Producer(
        kafka_server.config(transactional_id=f"smoke-{uuid.uuid4().hex[:8]}", linger_ms=0)
    )
    producer.init_transactions(60)
    producer.begin_transaction()
    producer.produce(kafka_topic, key=b"k", value=b"aborted")
    producer.flush(30)
    producer.abort_transaction(60)
    producer.begin_transaction()
    producer.produce(kafka_topic, key=b"k", value=b"committed")
    producer.commit_transaction(60)

    committed = _consume(kafka_server, kafka_topic, 1, isolation_level="read_committed")
    assert [m.value() for m in committed] == [b"committed"]
    everything = _consume(kafka_server, kafka_topic, 2, isolation_level="read_uncommitted")
    assert [m.value() for m in everything] == [b"aborted", b"committed"]


# --- Spark -------------------------------------------------------------------------------------


def test_spark_jars_do_not_duplicate_pyspark() -> None:
    import pyspark

    from airflow_dblog.engine.connector_jars import spark_jars

    def artifact(jar: str) -> str:
        return Path(jar).name.rsplit("-", 1)[0]

    ours = {artifact(j) for j in spark_jars()}
    shipped = {artifact(str(j)) for j in (Path(pyspark.__file__).parent / "jars").glob("*.jar")}
    assert ours & shipped == set()
    assert any(name.startswith("delta-spark_4.2_2.13") for name in ours)
    assert "spark-sql-kafka-0-10_2.13" in ours


def test_spark_jars_missing_is_a_one_line_error(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from airflow_dblog.engine.connector_jars import spark_jars
    from airflow_dblog.errors import DblogError

    monkeypatch.setenv("DBLOG_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("DBLOG_SPARK_JARS_DIR", raising=False)
    with pytest.raises(DblogError, match=r"run scripts/services\.sh spark-jars") as err:
        spark_jars()
    assert "\n" not in str(err.value)


def test_spark_delta_write_and_read(spark: Any, tmp_path: Path) -> None:
    from delta.tables import DeltaTable

    path = str(tmp_path / "delta" / "items")
    spark.createDataFrame([(1, "a"), (2, "b")], "id INT, name STRING").write.format("delta").save(
        path
    )
    target = DeltaTable.forPath(spark, path)
    updates = spark.createDataFrame([(2, "B"), (3, "c")], "id INT, name STRING")
    (
        target.alias("t")
        .merge(updates.alias("s"), "t.id = s.id")
        .whenMatchedUpdateAll()
        .whenNotMatchedInsertAll()
        .execute()
    )
    rows = spark.read.format("delta").load(path).orderBy("id").collect()
    assert [(r.id, r.name) for r in rows] == [(1, "a"), (2, "B"), (3, "c")]
    assert target.history().count() == 2


def test_spark_reads_kafka_topic(spark: Any, kafka_server: Any, kafka_topic: str) -> None:
    from confluent_kafka import Producer

    producer = Producer(kafka_server.config())
    for i in range(3):
        producer.produce(kafka_topic, key=f"k{i}".encode(), value=f"v{i}".encode())
    assert producer.flush(30) == 0
    frame = (
        spark.read.format("kafka")
        .option("kafka.bootstrap.servers", kafka_server.bootstrap_servers)
        .option("subscribe", kafka_topic)
        .option("startingOffsets", "earliest")
        .option("endingOffsets", "latest")
        .load()
        .selectExpr("CAST(key AS STRING) AS k", "CAST(value AS STRING) AS v", "offset")
        .orderBy("offset")
    )
    assert [(r.k, r.v) for r in frame.collect()] == [("k0", "v0"), ("k1", "v1"), ("k2", "v2")]
