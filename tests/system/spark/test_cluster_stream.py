"""`dblog stream` on the standalone cluster; checkpoint (with the spool) and Delta on S3.

The user's whole configuration for the cluster is ``spark.master``, an ``s3a://`` checkpoint and an
``s3a://`` Delta path; the endpoint and credentials come from ``scripts/services.sh env``. The
executors run in mount namespaces that hide the driver's disk (tests/spark/test_cluster.py proves
it), so a batch that reached Delta was read from the object store. Writers change the table while
a dump runs, straight and with a kill -9 mid-dump; afterwards the Delta table, read back by
another engine (``deltalake``) from the object store, equals the source, its change feed never
takes a key back, and Kafka's read_committed topic rebuilds it.
"""

from __future__ import annotations

import contextlib
import os
import re
import time
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest

from airflow_dblog.cli import main as dblog
from airflow_dblog.config import Config, load_config
from airflow_dblog.engine.metadata import MetadataStore
from airflow_dblog.engine.spool_store import open_store
from tests.support.oracle import (
    KEY,
    SENTINEL,
    Rows,
    Step,
    assert_equal,
    check_history,
    kafka_histories,
)
from tests.support.services import (
    cluster_missing,
    ensure_cluster,
    read_committed_until,
    s3_storage_options,
)
from tests.support.stream_process import Stream, until, write_config
from tests.support.workload import Db, db_for, insert_rows, key_of, load, source_rows, writers

# the cluster's driver and executors take the machine: one test at a time
pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.alone]

if MISSING := cluster_missing():
    pytest.skip(
        f"{', '.join(MISSING)} not set: run scripts/services.sh up spark object-store and"
        ' eval "$(scripts/services.sh env)" (scripts/test.sh does both)',
        allow_module_level=True,
    )

COLUMNS = ("a", "b", "v", "note")
# CI's size; DBLOG_CLUSTER_ROWS=30000 DBLOG_CLUSTER_WRITER_PAUSE_S=0.004 is issue 32's heavier
# case (three writers at full speed), timed by the dump's line in the output
WRITER_PAUSE_S = float(os.environ.get("DBLOG_CLUSTER_WRITER_PAUSE_S", "0.1"))  # ~30 writes/s
ROWS = int(os.environ.get("DBLOG_CLUSTER_ROWS", "3000"))  # the seed rows the dump reads
KEY_SPACE = 8 * ROWS  # most updates and deletes miss: the log rate its S3 batches were sized for


def _table(config: Config, db: Db) -> Any:
    """The Delta table in the object store, through ``deltalake``; None before its first commit."""
    from deltalake import DeltaTable

    assert config.delta is not None
    table = db.table()
    uri = f"{config.delta.path}/{table.db}/{table.table}".replace("s3a://", "s3://", 1)
    if not DeltaTable.is_deltatable(uri, storage_options=s3_storage_options()):
        return None
    return DeltaTable(uri, storage_options=s3_storage_options())


def _rows(table: Any) -> Rows:
    if table is None:
        return {}
    live = [r for r in table.to_pyarrow_table().to_pylist() if not r["_dblog_deleted"]]
    return {tuple(r[c] for c in KEY): {c: r[c] for c in COLUMNS} for r in live}


def _histories(table: Any) -> dict[Any, list[Step]]:
    """Per key, the change data feed's new images in commit order."""
    import pyarrow as pa

    feed = pa.table(table.load_cdf(starting_version=0)).to_pylist()
    feed = [r for r in feed if r["_change_type"] in ("insert", "update_postimage")]
    histories: dict[Any, list[Step]] = {}
    for r in sorted(feed, key=lambda r: (r["_commit_version"], r["_dblog_position"])):
        histories.setdefault(tuple(r[c] for c in KEY), []).append(
            Step(
                f"delta v{r['_commit_version']}",
                r["_dblog_op"],
                r["_dblog_position"],
                None,
                bool(r["_dblog_deleted"]),
            )
        )
    return histories


def _settle(config: Config, db: Db, stream: Stream, timeout_s: float = 300) -> Rows:
    """Delta's rows once a sentinel row inserted now has arrived (so every earlier change).

    The table's files are read only when its version moved: each read is many GETs from the
    object store the stream itself is committing to.
    """
    insert_rows(db, [SENTINEL], 0, "sentinel")
    deadline = time.monotonic() + timeout_s
    read: tuple[int, Rows] | None = None
    while True:
        table = _table(config, db)
        version = -1 if table is None else table.version()
        if read is None or read[0] != version:
            read = (version, _rows(table))
        rows = read[1]
        if key_of(SENTINEL) in rows:
            return rows
        stream.check_alive()
        assert time.monotonic() < deadline, "the stream did not catch up with the log"
        time.sleep(2)


def _check_outputs(config: Config, db: Db, stream: Stream) -> None:
    actual = _settle(config, db, stream)
    expected = source_rows(db, COLUMNS)
    assert_equal([(f"Delta {db.table()} (deltalake, s3)", expected, actual)])
    for key, steps in _histories(_table(config, db)).items():
        check_history(key, steps, ranked=False)
    assert config.kafka is not None
    topic = f"{config.kafka.topic_prefix}.{db.table().db}.{db.table().table}"
    messages = read_committed_until(
        config.kafka.bootstrap_servers,
        topic,
        lambda m: key_of(SENTINEL) in kafka_histories(m, COLUMNS, None)[1],
    )
    histories, replayed = kafka_histories(messages, COLUMNS, None)
    for key, steps in histories.items():
        check_history(key, steps, ranked=False)
    assert_equal([(f"Kafka {topic} replayed", expected, replayed)])


def _log(stream: Stream) -> str:
    """This run's output of the stream."""
    with open(stream.log, "rb") as out:
        out.seek(stream.run_starts_at)  # a byte offset
        return out.read().decode("utf-8", "replace")


def _on_the_object_store(config: Config) -> Sequence[str]:
    """What the stream keeps under its s3a:// checkpoint (the spool, Spark's checkpoint)."""
    from pyarrow import fs

    store = open_store(config.checkpoint, config.spark.conf)
    selector = fs.FileSelector(store.root, recursive=True, allow_not_found=True)  # type: ignore[attr-defined]
    infos = store.fs.get_file_info(selector)  # type: ignore[attr-defined]
    return [i.path[len(store.root) + 1 :] for i in infos if i.type == fs.FileType.File]  # type: ignore[attr-defined]


def _assert_selected_on_executors(log: str, driver: int) -> None:
    """Each chunk's SELECT ran in a Python worker of a cluster executor, not in the driver's
    process tree (an idle Python worker exits after a minute: those still there are checked
    for their executor)."""
    import psutil

    pids = {int(m) for m in re.findall(r"rows selected \(by pid (\d+)\)", log)}
    assert pids, "no chunk was selected in this run"
    tree = {driver, *(p.pid for p in psutil.Process(driver).children(recursive=True))}
    assert not pids & tree, f"chunks selected in the driver's processes {pids & tree}"
    for pid in pids:
        with contextlib.suppress(psutil.NoSuchProcess):
            chain = [psutil.Process(pid), *psutil.Process(pid).parents()]
            assert any("CoarseGrainedExecutorBackend" in " ".join(p.cmdline()) for p in chain)


# Each case takes 1-3 min on this 2-core machine; CI runs the kill -9 cases, which also converge
# with writers running.
ALL_CASES = os.environ.get("DBLOG_CLUSTER_E2E", "").strip().lower() == "all"
STRAIGHT = pytest.param(
    False,
    id="straight",
    marks=pytest.mark.skipif(not ALL_CASES, reason="DBLOG_CLUSTER_E2E=all runs it (~3 min)"),
)


@pytest.mark.parametrize("kill", [STRAIGHT, pytest.param(True, id="kill-9")])
@pytest.mark.parametrize("kind", ["mysql", "postgres"])
def test_the_stream_on_the_cluster_with_an_object_store_checkpoint_converges(
    request: pytest.FixtureRequest,
    tmp_path: Path,
    kafka_server: Any,
    stream_factory: Callable[[Path], Stream],
    kind: str,
    kill: bool,
) -> None:
    ensure_cluster()
    db = db_for(request, kind)
    load(db, ROWS)
    prefix = f"s3a://dblog/tests/{uuid.uuid4().hex}"
    config_path = write_config(
        db,
        tmp_path,
        chunk_size=500,
        delay_ms=600 if kill else 0,
        kafka=kafka_server.bootstrap_servers,
        checkpoint=f"{prefix}/cp",
        delta=f"{prefix}/delta",
        master=os.environ["DBLOG_SPARK_MASTER"],
        deletion_vectors=False,  # deltalake (delta-rs) 1.6 cannot read deletion vectors
        warm_up=True,  # its scratch table on the store, written and read by the executors
    )
    config = load_config(config_path)
    store = MetadataStore(config.metadata_url)
    stream = stream_factory(config_path)
    stream.start()
    stream.wait_capturing(300)
    with writers(db, pause_s=WRITER_PAUSE_S, key_space=KEY_SPACE) as counts:
        in_delta = lambda: _table(config, db) is not None  # noqa: E731
        until("the writers' first changes in Delta", in_delta, 300, stream)
        assert dblog(["dump", "-c", str(config_path), "--all"]) == 0
        requested = time.monotonic()
        (dump,) = store.dumps(config.name)
        if kill:
            # the first chunk selected (a Delta batch on this cluster can take a minute, so
            # "a chunk done" would come after the whole dump)
            until("a chunk", lambda: " rows selected" in _log(stream), 300, stream)
            stream.kill()
            assert store.progress(dump.id).state == "running"
            stream.start()
            assert dblog(["set", "-c", str(config_path), "--delay-ms", "0"]) == 0  # finish fast
        until("the dump", lambda: store.progress(dump.id).state == "done", 900, stream)
        print(f"the dump of {ROWS} rows took {time.monotonic() - requested:.0f} s; {counts}")
        time.sleep(2)
    _check_outputs(config, db, stream)
    kept = _on_the_object_store(config)
    assert any(k.startswith("spool/") for k in kept), kept  # the spool is on the object store
    assert any(k.startswith("spark/delta/") for k in kept), kept
    assert not (tmp_path / "cp").exists() and not (tmp_path / "checkpoint").exists()
    spooled = [k for k in kept if k.startswith("spool/")]
    assert "spool/000000000000.parquet" not in spooled  # deleted once every sink held it
    assert not [k for k in spooled if k.endswith(".jsonl")], spooled  # segments are Parquet
    print(f"{len(spooled)} spool segments left; {len(kept)} objects under the checkpoint")
    _assert_selected_on_executors(_log(stream), stream.proc.pid)
    assert stream.stop() == 0
    assert counts["insert"] and counts["update"] and counts["delete"]
    assert store.progress(dump.id).rows_emitted > 0
    attempts = [c.attempts for c in store.chunks(dump.id)]
    assert max(attempts) <= (2 if kill else 1)
