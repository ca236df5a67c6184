"""The binlog reader across a change of binlog history: a promoted replica, RESET MASTER.

Private MariaDB servers (replication and RESET MASTER are server-wide): a primary and a GTID
replica of it, or one server whose binlog is reset. An offset taken on the old history resumes
on the new one exactly after the last transaction read, and every new position sorts after
every old one, so a sink that keeps the newest position per key applies what comes next.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from airflow_dblog.core.events import ChangeEvent, TableId
from airflow_dblog.errors import SourceError
from airflow_dblog.sources.mysql.binlog_reader import BinlogReader
from tests.support.private_mariadb import primary_and_replica, private_mariadb, promote
from tests.support.services import MySQLServer, run_sql
from tests.support.source_dbs import read_changes

pytestmark = [pytest.mark.integration, pytest.mark.slow]

TABLE = TableId("shop", "items")


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
    run_sql(
        server,
        "CREATE DATABASE shop",
        "CREATE TABLE shop.items (id int PRIMARY KEY, v int)",
    )


def test_a_promoted_replica_continues_after_the_last_transaction_read(
    readers: list[BinlogReader],
) -> None:
    with primary_and_replica(11, 12) as (primary, replica):
        _create(primary)
        on_primary = _reader(readers, primary)
        run_sql(primary, *(f"INSERT INTO shop.items VALUES ({i}, 0)" for i in range(1, 6)))
        old = read_changes(on_primary, 5)
        offset = on_primary.offset()
        # the replica's binlog holds the same transactions at other offsets (its own events)
        run_sql(replica, "FLUSH BINARY LOGS", "FLUSH BINARY LOGS")
        run_sql(
            primary,
            "INSERT INTO shop.items VALUES (6, 0), (7, 0)",
            "UPDATE shop.items SET v = 1 WHERE id = 1",
            "DELETE FROM shop.items WHERE id = 2",
        )
        on_primary.close()
        promote(primary, replica, timeout_s=60)  # the primary is gone

        on_replica = _reader(readers, replica, offset)
        assert on_replica.lineage_epoch == 1
        run_sql(replica, "INSERT INTO shop.items VALUES (8, 0)")
        new = read_changes(on_replica, 5)
        assert _seen(new) == [("c", 6, 0), ("c", 7, 0), ("u", 1, 1), ("d", 2, None), ("c", 8, 0)]
        assert min(e.position for e in new) > max(e.position for e in old)
        assert [e.position for e in new] == sorted(e.position for e in new)

        # a restart on the promoted server continues from its own file and offset
        offset = on_replica.offset()
        assert offset["epoch"] == 1 and offset["file"] is not None
        on_replica.close()
        run_sql(replica, "UPDATE shop.items SET v = 2 WHERE id = 8")
        again = _reader(readers, replica, offset)
        latest = read_changes(again, 1)
        assert _seen(latest) == [("u", 8, 2)] and latest[0].position > new[-1].position


def test_after_reset_master_the_stream_continues_with_higher_positions(
    readers: list[BinlogReader],
) -> None:
    """Two resets: the offset's file is gone with only lower numbers left, then the same file
    name is reused for other transactions. Both continue from the new binlog's start."""
    with private_mariadb(server_id=21) as server:
        _create(server)
        run_sql(server, "FLUSH BINARY LOGS", "FLUSH BINARY LOGS")
        reader = _reader(readers, server)
        run_sql(server, "INSERT INTO shop.items VALUES (1, 0), (2, 0)")
        old = read_changes(reader, 2)
        offset = reader.offset()
        reader.close()

        run_sql(server, "RESET MASTER")
        run_sql(server, "INSERT INTO shop.items VALUES (3, 0)", "UPDATE shop.items SET v = 1")
        reader = _reader(readers, server, offset)
        assert reader.lineage_epoch == 1
        new = read_changes(reader, 4)
        assert _seen(new) == [("c", 3, 0), ("u", 1, 1), ("u", 2, 1), ("u", 3, 1)]
        assert min(e.position for e in new) > max(e.position for e in old)
        offset = reader.offset()
        reader.close()

        run_sql(server, "RESET MASTER")  # mariadb-bin.000001 again, other transactions
        run_sql(server, "INSERT INTO shop.items VALUES (4, 0)")
        reader = _reader(readers, server, offset)
        assert reader.lineage_epoch == 2
        newer = read_changes(reader, 1)
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
    assert "no GTIDs to resume from there" in str(err.value) and "\n" not in str(err.value)
