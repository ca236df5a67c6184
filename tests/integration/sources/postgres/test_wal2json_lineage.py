"""The wal2json reader across a promotion and on another cluster: never silent.

A private primary with a streaming standby (``pg_basebackup -R``). PostgreSQL 15 keeps logical
slots on the primary only, so after the standby is promoted the slot must be created again, at
the new primary's current LSN: the changes between the stream's offset and that point are in no
slot. The reader stops with one line naming the full dump that repairs it; a slot that still
holds everything after the offset is followed across the new timeline; another cluster's LSNs
are refused.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest

from airflow_dblog.core.events import TableId
from airflow_dblog.errors import SourceError
from airflow_dblog.sources.postgres.source import PostgresSource
from airflow_dblog.sources.postgres.wal2json_reader import Wal2jsonReader
from tests.support.private_postgres import PrivateCluster, primary_and_standby
from tests.support.services import run_sql
from tests.support.source_dbs import read_changes

pytestmark = [pytest.mark.integration, pytest.mark.slow]

TABLE = TableId("public", "items")
SLOT = "dblog_lineage"


@pytest.fixture
def clusters() -> Iterator[tuple[PrivateCluster, PrivateCluster]]:
    with primary_and_standby() as pair:
        yield pair


def _caught_up(primary: PrivateCluster, standby: PrivateCluster) -> None:
    conn = primary.server.connect()
    with conn.cursor() as cur:
        cur.execute("SELECT pg_current_wal_lsn()::text")
        (head,) = cur.fetchone()
    conn.close()
    deadline = time.monotonic() + 60
    while True:
        conn = standby.server.connect()
        with conn.cursor() as cur:
            cur.execute("SELECT pg_last_wal_replay_lsn() >= %s::pg_lsn", (head,))
            (done,) = cur.fetchone()
        conn.close()
        if done:
            return
        assert time.monotonic() < deadline, "the standby did not catch up"
        time.sleep(0.2)


def _reader(cluster: PrivateCluster, offset: Any = None, create: bool = True) -> Wal2jsonReader:
    return Wal2jsonReader(
        cluster.server.url(), [TABLE], slot=SLOT, offset=offset, create_slot=create
    )


def _offset_past_the_commit(reader: Wal2jsonReader) -> Any:
    """The offset once it says the transaction read is complete: the change can be handed out
    before its commit message arrives (then the offset's flush LSN is still 0/0)."""
    deadline = time.monotonic() + 30
    while reader.offset()["flush_lsn"] == "0/0":
        assert time.monotonic() < deadline, "the transaction's commit never arrived"
        reader.read(10, 0.2)
    return reader.offset()


def test_a_slot_created_after_a_promotion_is_refused_naming_the_full_dump(
    clusters: tuple[PrivateCluster, PrivateCluster],
) -> None:
    primary, standby = clusters
    run_sql(primary.server, "CREATE TABLE items (id int PRIMARY KEY, v int)")
    reader = _reader(primary)
    run_sql(primary.server, "INSERT INTO items VALUES (1, 0)")
    assert [e.key for e in read_changes(reader, 1)] == [(1,)]
    offset = reader.offset()
    assert offset["timeline"] == 1 and offset["system"]
    reader.close()
    run_sql(primary.server, "INSERT INTO items VALUES (2, 0)")  # in no slot on the standby
    _caught_up(primary, standby)
    primary.stop()
    standby.promote()
    PostgresSource(standby.server.url()).create_replication_slot(SLOT, "wal2json")
    run_sql(standby.server, "INSERT INTO items VALUES (3, 0)")
    with pytest.raises(SourceError) as err:
        _reader(standby, offset, create=False)
    message = str(err.value)
    assert "was promoted (timeline 1 -> 2) and replication slot dblog_lineage" in message
    assert "dblog dump --all" in message and "\n" not in message


def test_the_same_slot_is_followed_across_a_new_timeline_and_another_cluster_is_refused(
    clusters: tuple[PrivateCluster, PrivateCluster],
) -> None:
    """The promotion is simulated on the offset (timeline 0): PostgreSQL 15 cannot carry the
    slot over; what matters is that a slot holding everything after the offset is followed."""
    primary, _ = clusters
    run_sql(primary.server, "CREATE TABLE items (id int PRIMARY KEY, v int)")
    reader = _reader(primary)
    run_sql(primary.server, "INSERT INTO items VALUES (1, 0)")
    read_changes(reader, 1)
    offset = _offset_past_the_commit(reader)
    reader.close()
    run_sql(primary.server, "INSERT INTO items VALUES (2, 0)")
    follower = _reader(primary, {**offset, "timeline": 0})
    assert [e.key for e in read_changes(follower, 1)] == [(2,)]
    assert follower.offset()["timeline"] == 1
    follower.close()
    with pytest.raises(SourceError, match=r"is another cluster \(system identifier 42 -> "):
        _reader(primary, {**offset, "system": "42"})
