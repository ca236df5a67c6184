"""The stream across a failover to a promoted replica and a RESET MASTER, end to end.

A private MariaDB primary with a GTID replica (a second ``mariadbd``): the stream follows the
primary while writers run and a dump is under way; the stream is killed, the primary shut down,
the replica promoted and the config pointed at it; the restarted stream resumes after the last
transaction it read (by GTID: the replica's binlog holds the same transactions at other
offsets) and finishes the dump. Then, the stream stopped, the new primary's binlog is reset
(RESET MASTER) and written to; the restarted stream continues from the new binlog's start. Delta
and Kafka equal the source, and no key's position ever goes back in either.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from airflow_dblog.cli import main as dblog
from airflow_dblog.config import load_config
from airflow_dblog.core.position import Position, binlog_file_index
from airflow_dblog.engine.metadata import MetadataStore
from tests.support.oracle import check_outputs
from tests.support.private_mariadb import primary_and_replica, promote
from tests.support.services import MySQLServer, run_sql
from tests.support.stream_process import Stream, until, write_config
from tests.support.workload import Db, load, writers

pytestmark = [pytest.mark.integration, pytest.mark.slow]

COLUMNS = ("a", "b", "v", "note")


def _db(server: MySQLServer) -> Db:
    return Db("mysql", server.url("shop"), "shop", lambda: server.connect("shop"))


def _committed(store: MetadataStore, stream: str) -> str:
    state = store.stream_state(stream)
    return (state.position or "") if state else ""


def test_a_promoted_replica_and_a_reset_binlog_lose_and_double_nothing(
    tmp_path: Path,
    spark: Any,
    kafka_server: Any,
    stream_factory: Callable[[Path], Stream],
) -> None:
    with primary_and_replica(41, 42) as (primary, replica):
        run_sql(primary, "CREATE DATABASE shop")
        old, new = _db(primary), _db(replica)
        load(old)
        config_path = write_config(
            old, tmp_path, chunk_size=200, delay_ms=500, kafka=kafka_server.bootstrap_servers
        )
        config = load_config(config_path)
        store = MetadataStore(config.metadata_url)
        stream = stream_factory(config_path)
        stream.start()
        stream.wait_capturing()
        with writers(old, pause_s=0.05):
            assert dblog(["dump", "-c", str(config_path), "--all"]) == 0
            (dump,) = store.dumps(config.name)
            until("two chunks", lambda: store.progress(dump.id).chunks_done >= 2, 300, stream)
        stream.kill()
        promote(primary, replica, timeout_s=120)
        with contextlib.suppress(Exception):  # the server closes the connection
            run_sql(primary, "SHUTDOWN")
        config_path.write_text(config_path.read_text().replace(old.url, new.url))

        stream.start()
        with writers(new, pause_s=0.05):
            until(
                "the replica's first commit",
                lambda: "is another server" in stream.log.read_text(),
                120,
                stream,
            )
            assert dblog(["set", "-c", str(config_path), "--delay-ms", "0"]) == 0
            until("the dump", lambda: store.progress(dump.id).state == "done", 600, stream)
        # RESET MASTER discards what the stream has not read yet: an operator lets it catch up
        file, pos = run_sql(replica, "SHOW MASTER STATUS")[0][:2]
        head = str(Position.mysql(binlog_file_index(file), pos - 1, epoch=1))
        until("the stream to catch up", lambda: _committed(store, config.name) >= head, 120, stream)
        assert stream.stop() == 0

        run_sql(replica, "RESET MASTER")
        with writers(new, pause_s=0.05):
            time.sleep(3)
        stream.start()
        check_outputs(spark, config, [new], stream, COLUMNS)
        log = stream.log.read_text()
        assert "resuming after GTID" in log and "lineage epoch 1" in log
        assert "was reset since the stream read" in log and "lineage epoch 2" in log
        assert stream.stop() == 0
