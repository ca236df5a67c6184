"""The launcher: start the stream unless it runs, wait until it commits, notice a dead one.

These tests run a stand-in for ``dblog stream`` (``python=`` a script that commits heartbeats
to the metadata store as the stream does, then sleeps), so the decisions are exercised without
a JVM (tests/integration/engine/test_launcher.py checks the lease on ZooKeeper,
tests/system/engine/test_launcher.py starts the real stream against MariaDB).
"""

from __future__ import annotations

import dataclasses
import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from airflow_dblog.config import load_config
from airflow_dblog.engine.launcher import (
    Launch,
    LaunchError,
    alive,
    ensure_stream,
    pid_path,
    read_record,
    run_dir,
    stop,
)
from airflow_dblog.engine.metadata import MetadataStore
from airflow_dblog.engine.metadata.database import utcnow
from tests.support import fake_stream

CONFIG = """
name: launched
source: {{type: mysql, url: "mysql://u:secret-pw@127.0.0.1:1/app", tables: [app.t]}}
metadata: {{url: "sqlite:///{dir}/meta.db"}}
sinks: {{delta: {{path: {dir}/delta}}}}
checkpoint: {dir}/cp
"""


@pytest.fixture
def config_path(tmp_path: Path) -> str:
    file = tmp_path / "dblog.yaml"
    file.write_text(CONFIG.format(dir=tmp_path))
    return str(file)


@pytest.fixture
def fake_python(tmp_path: Path) -> str:
    return fake_stream.fake_python(tmp_path)


@pytest.fixture
def launched(config_path: str) -> Any:
    """Kills (the session of) whatever the test started, at its end."""
    yield
    record = read_record(pid_path(load_config(config_path), Launch()))
    if record is not None:
        stop(record, grace_s=5)


def _until_dead(config_path: str) -> None:
    record = read_record(pid_path(load_config(config_path), Launch()))
    assert record is not None
    deadline = time.monotonic() + 10
    while alive(record):
        assert time.monotonic() < deadline, f"process {record.pid} outlived SIGKILL"
        time.sleep(0.05)


def _until_committed_after(store: MetadataStore, name: str, beat: Any) -> None:
    """Until a stream commits a heartbeat other than ``beat``: the other stream is up (its
    interpreter may take seconds to start on a busy machine, longer than the launcher's probe)."""
    deadline = time.monotonic() + 30
    while True:
        state = store.stream_state(name)
        if state is not None and state.heartbeat_at != beat:
            return
        assert time.monotonic() < deadline, "the stream started elsewhere never committed"
        time.sleep(0.05)


def test_starts_detached_then_does_nothing_then_restarts_after_kill_9(
    config_path: str, fake_python: str, launched: None
) -> None:
    config = load_config(config_path)
    launch = Launch(python=fake_python, timeout_s=20, poll_s=0.1, probe_s=1)
    first = ensure_stream(config_path, config, launch)
    assert first.started and first.pid is not None
    assert first.log_path == f"{config.checkpoint}/launcher/stream.log"
    assert os.getsid(first.pid) == first.pid  # its own session: the task's end does not reach it
    assert first.status is not None and first.status.state == "running"
    assert "fake stream up" in Path(first.log_path).read_text()

    again = ensure_stream(config_path, config, launch)
    assert not again.started and again.pid == first.pid
    assert f"process {first.pid} started" in again.reason

    os.kill(first.pid, signal.SIGKILL)  # its last heartbeat is fresh: the pid file knows better
    _until_dead(config_path)
    restarted = ensure_stream(config_path, config, launch)
    assert restarted.started and restarted.pid not in (None, first.pid)
    log = Path(first.log_path).read_text()
    assert log.count("started by the dblog launcher") == 2


def test_a_stream_started_elsewhere_after_ours_died_counts_as_running(
    config_path: str, fake_python: str, launched: None
) -> None:
    config = load_config(config_path)
    launch = Launch(python=fake_python, timeout_s=20, poll_s=0.1, probe_s=2)
    ours = ensure_stream(config_path, config, launch)
    assert ours.pid is not None
    os.kill(ours.pid, signal.SIGKILL)
    _until_dead(config_path)
    store = MetadataStore(config.metadata_url)
    last = store.stream_state(config.name)
    elsewhere = subprocess.Popen([fake_python, "-c", config_path], start_new_session=True)
    try:
        _until_committed_after(store, config.name, last.heartbeat_at if last else None)
        ensured = ensure_stream(config_path, config, launch)
    finally:
        elsewhere.kill()
        elsewhere.wait(10)
    assert not ensured.started
    assert f"after process {ours.pid} started here had died" in ensured.reason


def test_a_stream_committing_without_a_pid_file_counts_as_running(
    config_path: str, tmp_path: Path
) -> None:
    config = load_config(config_path)
    MetadataStore(config.metadata_url).save_stream_state(config.name, heartbeat_at=utcnow())
    ensured = ensure_stream(config_path, config, Launch(python="/nonexistent/python"))
    assert not ensured.started and ensured.pid is None
    assert ensured.reason.startswith("stream launched is running: it committed at ")
    assert "secret-pw" not in ensured.reason


def test_a_process_that_exits_fails_naming_its_log(config_path: str) -> None:
    config = load_config(config_path)
    with pytest.raises(LaunchError) as err:
        ensure_stream(config_path, config, Launch(python="/bin/false", timeout_s=20, poll_s=0.1))
    log = f"{config.checkpoint}/launcher/stream.log"
    assert str(err.value) == (
        f"stream launched exited with code 1 before it ran; see its log {log}"
    )


def test_a_stream_that_never_commits_is_stopped_and_fails_naming_its_log(
    config_path: str, tmp_path: Path
) -> None:
    sleeper = tmp_path / "sleeper"
    sleeper.write_text("#!/bin/sh\nexec sleep 600\n")
    sleeper.chmod(0o755)
    config = load_config(config_path)
    log = tmp_path / "mine.log"
    launch = Launch(python=str(sleeper), log_path=str(log), timeout_s=1, poll_s=0.1)
    with pytest.raises(
        LaunchError, match=rf"did not commit within 1s and was stopped; see its log {log}$"
    ):
        ensure_stream(config_path, config, launch)
    record = read_record(pid_path(config, launch))
    assert record is not None and not alive(record)


def test_unknown_mode_and_a_remote_checkpoint_without_run_dir_are_refused(
    config_path: str, tmp_path: Path
) -> None:
    with pytest.raises(LaunchError, match="unknown launch mode 'yarn'"):
        Launch(mode="yarn")
    # object-store checkpoints are coming (the Spark data plane): the pid file needs a folder
    remote = dataclasses.replace(load_config(config_path), checkpoint="s3a://b/cp")
    with pytest.raises(LaunchError, match=r"not a local folder .* pass run_dir"):
        run_dir(remote, Launch())
    assert run_dir(remote, Launch(run_dir=str(tmp_path))) == tmp_path


def test_spark_submit_command_carries_the_jars_and_the_job(
    config_path: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from airflow_dblog.engine.launcher import DEFAULT_APPLICATION, stream_command

    monkeypatch.setattr(
        "airflow_dblog.engine.connector_jars.spark_jars", lambda: ["/j/a.jar", "/j/b.jar"]
    )
    launch = Launch(mode="spark-submit", spark_args=["--master", "spark://m:7077"])
    assert stream_command(config_path, launch) == [
        "spark-submit",
        "--master",
        "spark://m:7077",
        "--jars",
        "/j/a.jar,/j/b.jar",
        str(DEFAULT_APPLICATION),
        "-c",
        config_path,
    ]
    with pytest.raises(LaunchError, match=r"application /no/job\.py not found"):
        stream_command(config_path, Launch(mode="spark-submit", application="/no/job.py"))
