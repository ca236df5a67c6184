"""No key's version ever goes back, in Delta or in Kafka, through the real stream (issue 12, 4).

Versioned writers (tests/support/workload.py) run throughout. A dump of the table is requested
either before the stream ever ran (a fresh config: ``dblog dump --all``, then ``dblog stream``) or
once it is capturing; the stream is killed with SIGKILL at the case's kill points and started
again. Once the dump is done the writers stop, the stream catches up, and tests/support/oracle.py
checks the Delta change data feed and Kafka read_committed per key (the version never goes back)
and that both equal the source; the stream's status then says it caught up. ``gtid`` is not
here: the library refuses it on MariaDB.

Kill points:

- ``first-commit``: as soon as a run logs that it is running (its reader has a start position),
  before anything is committed: no Delta version exists yet;
- ``first-chunk``: as soon as a chunk is claimed in this run (state running or selected);
- ``random``: a seeded random delay after a run is running.

A case's seed (in its id) drives the writers and the random delays; ``DBLOG_SEED=N`` runs every
case with seed N instead. Timing still varies from run to run: the seed fixes what is written
and when kills happen relative to a run's start, not where the stream is then.
"""

from __future__ import annotations

import os
import random
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil
import pytest

from airflow_dblog.cli import main as dblog
from airflow_dblog.config import Config, load_config
from airflow_dblog.engine.lag import stream_status
from airflow_dblog.engine.metadata import MetadataStore
from airflow_dblog.engine.metadata.database import utcnow
from tests.support.oracle import check_outputs, delta_path, delta_version
from tests.support.stream_process import Stream, until, write_config
from tests.support.workload import VERSIONED_COLUMNS, Db, db_for, load_versioned, versioned_writers

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(1200)]

ROWS = 3_000
CHUNK_SIZE = 500  # about six chunks
DELAY_MS = 300  # so the dump lasts a few batches and kills land inside it
WRITER_PAUSE_S = 0.1  # ~50 transactions/s from three writers
RANDOM_KILL_S = (0.0, 15.0)  # after a run logs that it is running


@dataclass(frozen=True)
class Case:
    kind: str
    watermark: str
    dump: str  # "before" the stream first runs, or "after" it is capturing
    kills: tuple[str, ...]
    seed: int
    delta: bool = True  # else Kafka is the only sink: chunks are selected in worker processes

    def __str__(self) -> str:
        kills = "+".join(self.kills) or "straight"
        sinks = "" if self.delta else "-kafka-only"
        return f"{self.kind}-{self.watermark}-dump-{self.dump}-{kills}{sinks}-seed{self.seed}"


# 8 kill points (first-commit x2, first-chunk x3, random x3) and one straight run; every
# watermark of both databases, each database's dump requested before and after the stream first
# runs (MySQL's table watermark with the dump before the stream: tests/system/test_start_gap.py)
CASES = [
    Case("mysql", "snapshot", "before", ("first-commit", "random"), 1203),
    Case("mysql", "table", "after", ("first-chunk", "random"), 1204),
    Case("postgres", "table", "before", ("first-commit", "first-chunk"), 1205),
    Case("postgres", "table", "after", ("first-chunk", "random"), 1206),
    Case("postgres", "snapshot", "before", (), 1207),
    Case("mysql", "table", "after", ("first-chunk", "random"), 1208, delta=False),
]


@dataclass
class Run:
    """The stream under test, its metadata, and what each kill hit."""

    config_path: Path
    config: Config
    store: MetadataStore
    stream: Stream
    db: Db
    dump_id: int | None = None
    run_started: Any = None  # UTC, as the metadata store writes it

    def start(self) -> None:
        self.run_started = utcnow()
        self.stream.start()

    def request_dump(self) -> None:
        assert dblog(["dump", "-c", str(self.config_path), "--all"]) == 0
        (dump,) = self.store.dumps(self.config.name)
        self.dump_id = dump.id

    def kill_and_restart(self, point: str) -> str:
        """SIGKILL now, note where the stream stood, start it again."""
        children = self.stream.processes()[:-1]
        self.stream.kill()
        if self.config.delta is None:  # its chunk workers exit with it, connections and all
            _, alive = psutil.wait_procs(children, timeout=15)
            assert not alive, f"left behind by the killed stream: {alive}"
        version = (
            delta_version(delta_path(self.config, self.db.table())) if self.config.delta else -1
        )
        chunks = self.store.chunks(self.dump_id) if self.dump_id else []
        states = dict(Counter(c.state for c in chunks))
        if point == "first-commit":  # version 0: the table the stream created at its start
            assert version <= 0, f"killed too late: Delta is at version {version}"
        self.start()
        return f"{point}: Delta v{version}, chunks {states}"

    def chunk_claimed(self) -> bool:
        """A chunk claimed by this run (one a killed run claimed may still say running)."""
        assert self.dump_id is not None
        return any(
            c.state in ("running", "selected") and c.started_at >= self.run_started
            for c in self.store.chunks(self.dump_id)
        )


def _kill_at(run: Run, point: str, rng: random.Random) -> str:
    stream = run.stream
    if point == "first-commit":
        stream.wait_running()
    elif point == "first-chunk":
        # the capture starts before Spark: a small dump may be all selected (its rows in the
        # spool) before an earlier kill, leaving this run no chunk to claim: then kill once
        # the dump is done
        assert run.dump_id is not None
        deadline = time.monotonic() + 300
        while not run.chunk_claimed():
            if run.store.progress(run.dump_id).state == "done":
                point = "first-chunk (none left: dump done)"
                break
            stream.check_alive()
            assert time.monotonic() < deadline, "no chunk was claimed"
            time.sleep(0.05)
    else:
        stream.wait_running()
        time.sleep(rng.uniform(*RANDOM_KILL_S))
    return run.kill_and_restart(point)


@pytest.mark.parametrize("case", CASES, ids=str)
def test_no_key_ever_goes_back_in_delta_or_kafka(
    request: pytest.FixtureRequest,
    tmp_path: Path,
    spark: Any,
    kafka_server: Any,
    stream_factory: Callable[[Path], Stream],
    case: Case,
) -> None:
    seed = int(os.environ.get("DBLOG_SEED", case.seed))
    print(f"\n{case}: seed {seed} (DBLOG_SEED={seed} re-runs it)")
    rng = random.Random(seed)
    db = db_for(request, case.kind)
    load_versioned(db, rows=ROWS)
    config_path = write_config(
        db,
        tmp_path,
        chunk_size=CHUNK_SIZE,
        delay_ms=DELAY_MS,
        kafka=kafka_server.bootstrap_servers,
        watermark=case.watermark,
        delta_sink=case.delta,
    )
    config = load_config(config_path)
    run = Run(
        config_path, config, MetadataStore(config.metadata_url), stream_factory(config_path), db
    )
    kills = list(case.kills)
    hits = []
    started = time.monotonic()
    with versioned_writers(db, seed, pause_s=WRITER_PAUSE_S, rows=ROWS) as counts:
        time.sleep(1)
        if case.dump == "before":
            run.request_dump()
            time.sleep(rng.uniform(1, 3))  # changes, inserts above the max key among them
        run.start()
        if kills and kills[0] == "first-commit":
            hits.append(_kill_at(run, kills.pop(0), rng))
        if case.dump == "after":
            run.stream.wait_capturing()
            run.request_dump()
        for point in kills:
            hits.append(_kill_at(run, point, rng))
        dump_id = run.dump_id
        assert dump_id is not None
        until("the dump", lambda: run.store.progress(dump_id).state == "done", 600, run.stream)
    print(f"writers: {dict(counts)}; kills: {hits}")
    check_outputs(spark, config, [db], run.stream, VERSIONED_COLUMNS, version="ver")
    lag = stream_status(config, run.store)  # caught up: the heartbeats carried the position along
    assert lag.state == "running" and lag.lag_bytes is not None, lag
    assert lag.lag_s is not None and lag.lag_s < 30, lag
    assert run.stream.stop() == 0
    assert counts["insert"] and counts["update"] and counts["delete"]
    # a chunk is selected again only when a kill cut it off: at most once per kill
    attempts = max(c.attempts for c in run.store.chunks(dump_id))
    assert attempts <= 1 + len(case.kills), f"a chunk ran {attempts} times"
    progress = run.store.progress(dump_id)
    assert progress.rows_emitted > 0
    print(
        f"{case}: {time.monotonic() - started:.0f} s, dump {progress.rows_emitted} rows emitted,"
        f" {progress.rows_dropped} dropped"
    )
