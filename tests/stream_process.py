"""``dblog stream -c FILE`` as a child process, for the end-to-end tests."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest


class Stream:
    """``dblog stream -c FILE`` in a child process, its output in a log file."""

    def __init__(self, config_path: Path, name: str = "") -> None:
        self.config_path = config_path
        self.log = config_path.with_suffix(f".{name}.log" if name else ".log")
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
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

    def freeze(self, frozen: bool) -> None:
        """SIGSTOP / SIGCONT: a leader that stalls (GC pause, partition) and later wakes up."""
        assert self.proc is not None
        self.proc.send_signal(signal.SIGSTOP if frozen else signal.SIGCONT)

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
        from airflow_dblog.metadata import MetadataStore

        config = load_config(self.config_path)
        store = MetadataStore(config.metadata_url)
        deadline = time.monotonic() + timeout_s
        while (state := store.stream_state(config.name)) is None or state.heartbeat_at is None:
            self.check_alive()
            assert time.monotonic() < deadline, "the stream did not start"
            time.sleep(0.5)
        store.engine.dispose()

    def check_alive(self) -> None:
        assert self.proc is not None
        if self.proc.poll() is not None:
            tail = self.log.read_text(errors="replace")[-3000:]
            pytest.fail(f"the stream exited with {self.proc.returncode}:\n{tail}")
