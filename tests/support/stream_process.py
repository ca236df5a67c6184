"""``dblog stream -c FILE`` as a child process, and its config, for the end-to-end tests."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from tests.support.workload import Db

HA_SESSION_S = 4
# The streams' Spark JVMs (driver, executors) compile with C1 alone, as every session
# build_spark_session makes does (spark/session.py). The serial collector: no concurrent
# marking threads beside the work on two cores (G1's took a tenth of a stream JVM's CPU here);
# the lease lives in the Python driver, not in the JVM, so a collection's pause cannot cost a
# leader its session.
TEST_JVM_OPTIONS = "-XX:+UseSerialGC"
# Nor do they generate code: a test's batches hold tens to hundreds of rows, so generating and
# compiling Java for each new plan (Janino) costs more than evaluating its expressions does; it
# was a quarter of a stream JVM's CPU in these tests. Spark's interpreted operators compute the
# same results (its own suites run both ways). The tests' own session, which drives the Delta
# sink directly in the integration tier, keeps code generation as users run it.
TEST_SPARK_CONF = {  # what every stream the tests start adds to ``spark.conf``
    "spark.ui.enabled": "false",
    "spark.driver.extraJavaOptions": TEST_JVM_OPTIONS,
    "spark.executor.extraJavaOptions": TEST_JVM_OPTIONS,
    "spark.sql.codegen.wholeStage": "false",
    "spark.sql.codegen.factoryMode": "NO_CODEGEN",
}
_ERROR_LINE = re.compile(r"ERROR|Exception|Error:|Caused by")


def write_config(
    db: Db,
    tmp_path: Path,
    chunk_size: int,
    delay_ms: int = 0,
    kafka: str | None = None,
    signal_topic: str | None = None,
    zookeeper: str | None = None,
    metadata_url: str | None = None,
    watermark: str = "table",
    tables: Sequence[str] | None = None,
    checkpoint: str | None = None,
    delta: str | None = None,
    master: str = "local[2]",
    deletion_vectors: bool = True,
    spark_conf: Mapping[str, str] | None = None,
    delta_sink: bool = True,
    warm_up: bool = False,
) -> Path:
    """A fresh stream (new name, metadata, checkpoint) of ``tables`` (default: ``db``'s table);
    ``checkpoint`` and ``delta`` default to folders of ``tmp_path``; ``spark_conf`` adds to the
    session's settings; without ``delta_sink`` Kafka is its only sink (it starts no Spark);
    ``warm_up``: rehearse Delta's batches at start, as users' streams do (a test's first batches
    wait for no dump worth the seconds it costs)."""
    path = tmp_path / "stream.yaml"
    # a small Delta batch waits 1 s, not the default 5: each test ends waiting for its last
    # changes in Delta (the default's wait is taken by the browser, DAG and race tests' streams)
    delta_options = ", batch_wait_s: 1" + ("" if deletion_vectors else ", deletion_vectors: false")
    delta_options += "" if warm_up else ", warm_up: false"
    name = f"st-{uuid.uuid4().hex[:8]}"
    signals = f", signal_topic: {signal_topic}" if signal_topic else ""
    kafka_sink = (
        f", kafka: {{bootstrap_servers: '{kafka}', topic_prefix: {name}{signals}}}" if kafka else ""
    )
    delta_sink_text = (
        f'delta: {{path: "{delta or f"{tmp_path}/delta"}"{delta_options}}}' if delta_sink else ""
    )
    if not delta_sink:
        assert kafka, "a stream needs a sink"
        kafka_sink = kafka_sink.removeprefix(", ")
    conf = {**TEST_SPARK_CONF, "spark.sql.shuffle.partitions": "2", **(spark_conf or {})}
    path.write_text(
        f"""
name: {name}
source:
  type: {db.kind}
  url: {db.url}
  tables: [{", ".join(tables or [str(db.table())])}]
  watermark: {watermark}
metadata: {{url: "{metadata_url or f"sqlite:///{tmp_path}/meta.db"}"}}
dump: {{chunk_size: {chunk_size}, parallelism: 2, delay_ms: {delay_ms}}}
sinks: {{{delta_sink_text}{kafka_sink}}}
checkpoint: "{checkpoint or f"{tmp_path}/checkpoint"}"
spark:
  master: "{master}"
  conf: {json.dumps(conf)}
"""
        + (
            f"ha: {{zookeeper: '{zookeeper}', session_timeout_s: {HA_SESSION_S}}}\n"
            if zookeeper
            else ""
        )
    )
    return path


def _signal_all(processes: Sequence[Any], sig: int) -> None:
    import psutil

    for process in processes:
        with contextlib.suppress(psutil.NoSuchProcess):
            process.send_signal(sig)


def _cpu_s(processes: Sequence[Any]) -> float:
    """The CPU seconds ``processes`` have used, all threads."""
    import psutil

    total = 0.0
    for process in processes:
        with contextlib.suppress(psutil.NoSuchProcess):
            times = process.cpu_times()
            total += times.user + times.system
    return total


def _stopped(process: Any) -> bool:
    """Whether a ``psutil.Process`` is stopped by a signal, or gone: a child that exited just
    as its parent stopped stays a zombie (nobody reaps it), which never becomes "stopped"."""
    import psutil

    try:
        return process.status() in (psutil.STATUS_STOPPED, psutil.STATUS_ZOMBIE, psutil.STATUS_DEAD)
    except psutil.NoSuchProcess:
        return True


def until(what: str, done: Callable[[], bool], timeout_s: float, stream: Stream) -> None:
    """Poll ``done`` every half second; fail if the stream dies or time runs out."""
    deadline = time.monotonic() + timeout_s
    while not done():
        stream.check_alive()
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.5)


class Stream:
    """``dblog stream -c FILE`` in a child process, its output in a log file."""

    def __init__(self, config_path: Path, name: str = "") -> None:
        self.config_path = config_path
        self.log = config_path.with_suffix(f".{name}.log" if name else ".log")
        self.proc: subprocess.Popen[bytes] | None = None
        self.run_starts_at = 0  # where this run's output begins in the log

    def start(self) -> None:
        self.run_starts_at = self.log.stat().st_size if self.log.exists() else 0
        with open(self.log, "ab") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "airflow_dblog.cli", "stream", "-c", str(self.config_path)],
                stdout=out,
                stderr=subprocess.STDOUT,
                env={**os.environ, "PYTHONUNBUFFERED": "1"},
            )

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(30)

    def freeze(self, frozen: bool, tree: bool = False) -> None:
        """SIGSTOP / SIGCONT: a leader that stalls (GC pause, partition) and later wakes up.

        ``tree``: the whole process tree, Spark's JVM and its Python workers too (a host or VM
        that stalls), and a freeze returns once all of them stopped; else only the Python
        driver stops, and a Delta MERGE under way in the JVM runs on to its commit.
        """
        assert self.proc is not None
        sig = signal.SIGSTOP if frozen else signal.SIGCONT
        if not tree:
            self.proc.send_signal(sig)
            return
        family = self.processes()
        _signal_all(family, sig)
        deadline = time.monotonic() + 10
        while frozen and not all(_stopped(p) for p in family):
            assert time.monotonic() < deadline, "the stream's processes did not stop"
            time.sleep(0.01)

    def wake_spark_first(self, timeout_s: float = 120) -> float:
        """SIGCONT a frozen tree's Spark side (JVM, Python workers) and, once the JVM's work
        under way is done (its CPU rests), the driver: what the JVM was doing, e.g. a Delta
        commit, runs to its end before the driver's own threads (lease checks) can interrupt
        it. Returns how long the driver stayed frozen after the JVM woke."""
        *spark_side, driver = self.processes()
        assert spark_side, "no Spark JVM under the stream process"
        woke = time.monotonic()
        _signal_all(spark_side, signal.SIGCONT)
        time.sleep(2)
        busy = _cpu_s(spark_side)
        while time.monotonic() < woke + timeout_s:
            time.sleep(1)
            busy, before = _cpu_s(spark_side), busy
            if busy - before < 0.1:  # idle (heartbeats aside) for a second
                break
        _signal_all([driver], signal.SIGCONT)
        return time.monotonic() - woke

    def processes(self) -> list[Any]:
        """``psutil.Process`` of the stream and every descendant, descendants first (the JVM,
        where a MERGE runs, stops first)."""
        import psutil

        assert self.proc is not None
        root = psutil.Process(self.proc.pid)
        return [*root.children(recursive=True), root]

    def stop(self) -> int:
        assert self.proc is not None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(30)
        return self.proc.returncode

    def wait_capturing(self, timeout_s: float = 180) -> None:
        """Until the stream has committed a batch: from then on the log is captured.

        Not just its state row: a standby that just took the lease writes the row first.
        """
        from airflow_dblog.config import load_config
        from airflow_dblog.engine.metadata import MetadataStore

        config = load_config(self.config_path)
        store = MetadataStore(config.metadata_url)
        deadline = time.monotonic() + timeout_s
        while (state := store.stream_state(config.name)) is None or state.heartbeat_at is None:
            self.check_alive()
            assert time.monotonic() < deadline, "the stream did not start"
            time.sleep(0.5)
        store.engine.dispose()

    def wait_running(self, timeout_s: float = 180) -> None:
        """Until this run of the process has logged that its query and capture thread run.

        Its reader has its start position by then, and no batch has been committed yet (the
        first one takes seconds of Spark): the moment to kill "before the first commit".
        """
        assert self.proc is not None
        deadline = time.monotonic() + timeout_s
        while True:
            with open(self.log, "rb") as log:
                log.seek(self.run_starts_at)
                if b" running: " in log.read():
                    return
            self.check_alive()
            assert time.monotonic() < deadline, "the stream did not start running"
            time.sleep(0.05)

    def check_alive(self) -> None:
        assert self.proc is not None
        if self.proc.poll() is not None:
            with open(self.log, "rb") as log:
                log.seek(self.run_starts_at)
                run = log.read().decode(errors="replace")
            # the first errors say why; the tail is mostly the shutdown they caused
            first = [line for line in run.splitlines() if _ERROR_LINE.search(line)][:15]
            pytest.fail(
                f"the stream exited with {self.proc.returncode}; its first errors:\n"
                + "\n".join(first)
                + f"\n...\n{run[-3000:]}"
            )
