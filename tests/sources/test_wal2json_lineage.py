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
from private_postgres import PrivateCluster, primary_and_standby

from airflow_dblog.errors import SourceError
from airflow_dblog.events import ChangeEvent, TableId
from airflow_dblog.sources.postgres import PostgresSource
from airflow_dblog.sources.wal2json_reader import Wal2jsonReader

pytestmark = [pytest.mark.integration, pytest.mark.slow]

TABLE = TableId("public", "items")
SLOT = "dblog_lineage"


def _sql(cluster: PrivateCluster, *statements: str) -> None:
    conn = cluster.server.connect()
    try:
        with conn.cursor() as cur:
            for statement in statements:
                cur.execute(statement)
    finally:
        conn.close()


def _changes(reader: Wal2jsonReader, want: int, budget_s: float = 30.0) -> list[ChangeEvent]:
    got: list[ChangeEvent] = []
    deadline = time.monotonic() + budget_s
    while len(got) < want:
        assert time.monotonic() < deadline, f"{len(got)} of {want} changes: {got}"
        got += [i for i in reader.read(want - len(got), 1.0) if isinstance(i, ChangeEvent)]
    return got


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


def test_a_slot_created_after_a_promotion_is_refused_naming_the_full_dump(
    clusters: tuple[PrivateCluster, PrivateCluster],
) -> None:
    primary, standby = clusters
    _sql(primary, "CREATE TABLE items (id int PRIMARY KEY, v int)")
    reader = _reader(primary)
    _sql(primary, "INSERT INTO items VALUES (1, 0)")
    assert [e.key for e in _changes(reader, 1)] == [(1,)]
    offset = reader.offset()
    assert offset["timeline"] == 1 and offset["system"]
    reader.close()
    _sql(primary, "INSERT INTO items VALUES (2, 0)")  # in no slot on the standby
    _caught_up(primary, standby)
    primary.stop()
    standby.promote()
    PostgresSource(standby.server.url()).create_replication_slot(SLOT, "wal2json")
    _sql(standby, "INSERT INTO items VALUES (3, 0)")
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
    _sql(primary, "CREATE TABLE items (id int PRIMARY KEY, v int)")
    reader = _reader(primary)
    _sql(primary, "INSERT INTO items VALUES (1, 0)")
    _changes(reader, 1)
    offset = reader.offset()
    reader.close()
    _sql(primary, "INSERT INTO items VALUES (2, 0)")
    follower = _reader(primary, {**offset, "timeline": 0})
    assert [e.key for e in _changes(follower, 1)] == [(2,)]
    assert follower.offset()["timeline"] == 1
    follower.close()
    with pytest.raises(SourceError, match=r"is another cluster \(system identifier 42 -> "):
        _reader(primary, {**offset, "system": "42"})
