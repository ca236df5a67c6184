"""The binlog reader across a change of binlog history: a promoted replica, RESET MASTER.

Private MariaDB servers (replication and RESET MASTER are server-wide): a primary and a GTID
replica of it, or one server whose binlog is reset. An offset taken on the old history resumes
on the new one exactly after the last transaction read, and every new position sorts after
every old one, so a sink that keeps the newest position per key applies what comes next.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
from private_mariadb import private_mariadb
from services import MySQLServer

from airflow_dblog.errors import SourceError
from airflow_dblog.events import ChangeEvent, TableId
from airflow_dblog.sources.binlog_reader import BinlogReader

pytestmark = [pytest.mark.integration, pytest.mark.slow]

TABLE = TableId("shop", "items")


def _sql(server: MySQLServer, *statements: str) -> list[tuple[Any, ...]]:
    conn = server.connect()
    try:
        with conn.cursor() as cur:
            for statement in statements:
                cur.execute(statement)
            return list(cur.fetchall())
    finally:
        conn.close()


def _changes(reader: BinlogReader, want: int, budget_s: float = 30.0) -> list[ChangeEvent]:
    got: list[ChangeEvent] = []
    deadline = time.monotonic() + budget_s
    while len(got) < want:
        assert time.monotonic() < deadline, f"{len(got)} of {want} changes: {got}"
        got += [i for i in reader.read(want - len(got), 1.0) if isinstance(i, ChangeEvent)]
    return got


def _seen(events: list[ChangeEvent]) -> list[tuple[str, Any, Any]]:
    return [(e.op, e.key[0], (e.after or {}).get("v")) for e in events]


@pytest.fixture
def readers() -> Iterator[list[BinlogReader]]:
    opened: list[BinlogReader] = []
    yield opened
    for reader in opened:
        reader.close()


def _reader(readers: list[BinlogReader], server: MySQLServer, offset: Any = None) -> BinlogReader:
    reader = BinlogReader(server.url(), [TABLE], offset=offset, heartbeat_s=0.1)
    readers.append(reader)
    return reader


def _create(server: MySQLServer) -> None:
    _sql(
        server,
        "CREATE DATABASE shop",
        "CREATE TABLE shop.items (id int PRIMARY KEY, v int)",
    )


def test_a_promoted_replica_continues_after_the_last_transaction_read(
    readers: list[BinlogReader],
) -> None:
    with private_mariadb(server_id=11) as primary, private_mariadb(server_id=12) as replica:
        _sql(
            replica,
            f"CHANGE MASTER TO MASTER_HOST='127.0.0.1', MASTER_PORT={primary.port},"
            " MASTER_USER='dblog', MASTER_PASSWORD='dblog', MASTER_USE_GTID=slave_pos",
            "START SLAVE",
        )
        _create(primary)
        on_primary = _reader(readers, primary)
        _sql(primary, *(f"INSERT INTO shop.items VALUES ({i}, 0)" for i in range(1, 6)))
        old = _changes(on_primary, 5)
        offset = on_primary.offset()
        # the replica's binlog holds the same transactions at other offsets (its own events)
        _sql(replica, "FLUSH BINARY LOGS", "FLUSH BINARY LOGS")
        _sql(
            primary,
            "INSERT INTO shop.items VALUES (6, 0), (7, 0)",
            "UPDATE shop.items SET v = 1 WHERE id = 1",
            "DELETE FROM shop.items WHERE id = 2",
        )
        head = _sql(primary, "SELECT @@gtid_binlog_pos")[0][0]
        deadline = time.monotonic() + 60
        while _sql(replica, "SELECT @@gtid_slave_pos")[0][0] != head:
            assert time.monotonic() < deadline, "the replica did not catch up"
            time.sleep(0.2)
        on_primary.close()
        _sql(replica, "STOP SLAVE", "RESET SLAVE ALL")  # promoted; the primary is gone

        on_replica = _reader(readers, replica, offset)
        assert on_replica.lineage_epoch == 1
        _sql(replica, "INSERT INTO shop.items VALUES (8, 0)")
        new = _changes(on_replica, 5)
        assert _seen(new) == [("c", 6, 0), ("c", 7, 0), ("u", 1, 1), ("d", 2, None), ("c", 8, 0)]
        assert min(e.position for e in new) > max(e.position for e in old)
        assert [e.position for e in new] == sorted(e.position for e in new)

        # a restart on the promoted server continues from its own file and offset
        offset = on_replica.offset()
        assert offset["epoch"] == 1 and offset["file"] is not None
        on_replica.close()
        _sql(replica, "UPDATE shop.items SET v = 2 WHERE id = 8")
        again = _reader(readers, replica, offset)
        latest = _changes(again, 1)
        assert _seen(latest) == [("u", 8, 2)] and latest[0].position > new[-1].position


def test_after_reset_master_the_stream_continues_with_higher_positions(
    readers: list[BinlogReader],
) -> None:
    """Two resets: the offset's file is gone with only lower numbers left, then the same file
    name is reused for other transactions. Both continue from the new binlog's start."""
    with private_mariadb(server_id=21) as server:
        _create(server)
        _sql(server, "FLUSH BINARY LOGS", "FLUSH BINARY LOGS")
        reader = _reader(readers, server)
        _sql(server, "INSERT INTO shop.items VALUES (1, 0), (2, 0)")
        old = _changes(reader, 2)
        offset = reader.offset()
        reader.close()

        _sql(server, "RESET MASTER")
        _sql(server, "INSERT INTO shop.items VALUES (3, 0)", "UPDATE shop.items SET v = 1")
        reader = _reader(readers, server, offset)
        assert reader.lineage_epoch == 1
        new = _changes(reader, 4)
        assert _seen(new) == [("c", 3, 0), ("u", 1, 1), ("u", 2, 1), ("u", 3, 1)]
        assert min(e.position for e in new) > max(e.position for e in old)
        offset = reader.offset()
        reader.close()

        _sql(server, "RESET MASTER")  # mariadb-bin.000001 again, other transactions
        _sql(server, "INSERT INTO shop.items VALUES (4, 0)")
        reader = _reader(readers, server, offset)
        assert reader.lineage_epoch == 2
        newer = _changes(reader, 1)
        assert _seen(newer) == [("c", 4, 0)] and newer[0].position > new[-1].position


def test_another_server_without_a_gtid_position_is_refused_in_one_line(
    readers: list[BinlogReader],
) -> None:
    with private_mariadb(server_id=31) as server:
        _create(server)
        offset = _reader(readers, server).offset()
        moved = {**offset, "server": "7", "gtid": None}
        with pytest.raises(SourceError) as err:
            _reader(readers, server, moved)
    assert "is another server (server 7 -> 31)" in str(err.value)
    assert "no MariaDB GTID position" in str(err.value) and "\n" not in str(err.value)
