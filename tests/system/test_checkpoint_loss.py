"""A checkpoint deleted while the stream is stopped: continue correctly, or refuse in one line.

Spark's batch ids restart at 0 without their checkpoint; were they the sinks' idempotence ids,
Delta and Kafka would skip every batch until the ids passed the old maximum. The sinks key
batches by spool segment instead: with ``<checkpoint>/spark`` deleted, Delta's restarted query
re-reads the segments on disk and skips what it holds (Kafka, not in Spark, continues after its
marker), and everything written while the stream was stopped arrives, once. With the whole
checkpoint deleted the segment numbers would start again below what the sinks hold: the stream
refuses to start, naming the fix.
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from airflow_dblog.cli import main as dblog
from airflow_dblog.config import load_config
from airflow_dblog.engine.metadata import MetadataStore
from tests.support.oracle import check_outputs
from tests.support.stream_process import Stream, until, write_config
from tests.support.workload import db_for, load, writers

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def test_a_deleted_spark_checkpoint_loses_and_doubles_nothing(
    request: pytest.FixtureRequest,
    tmp_path: Path,
    spark: Any,
    kafka_server: Any,
    stream_factory: Callable[[Path], Stream],
) -> None:
    db = db_for(request, "mysql")
    load(db)
    config_path = write_config(db, tmp_path, chunk_size=200, kafka=kafka_server.bootstrap_servers)
    config = load_config(config_path)
    store = MetadataStore(config.metadata_url)
    stream = stream_factory(config_path)
    stream.start()
    stream.wait_capturing()
    with writers(db, pause_s=0.05):
        assert dblog(["dump", "-c", str(config_path), "--all"]) == 0
        (dump,) = store.dumps(config.name)
        until("two chunks", lambda: store.progress(dump.id).chunks_done >= 2, 300, stream)
        assert stream.stop() == 0
        segment = store.stream_state(config.name).source_offset["segment"]
        shutil.rmtree(Path(config.checkpoint) / "spark")
        time.sleep(3)  # writes while the stream is down
        stream.start()
        until("the dump", lambda: store.progress(dump.id).state == "done", 600, stream)
        time.sleep(2)
    check_outputs(spark, config, [db], stream, ("a", "b", "v", "note"))
    assert stream.stop() == 0
    assert store.stream_state(config.name).source_offset["segment"] > segment

    shutil.rmtree(config.checkpoint)  # the spool too: segment numbers would start again
    stream.start()
    assert stream.proc is not None and stream.proc.wait(120) == 1
    line = stream.log.read_text().strip().splitlines()[-1]
    assert line.startswith("dblog: error: ") and "holds no segment but stream" in line
    assert "restore the checkpoint directory" in line
