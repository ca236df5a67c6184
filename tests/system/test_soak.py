"""The soak command (benchmarks/soak.py), for 30 seconds instead of an hour."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
pytestmark = [pytest.mark.integration, pytest.mark.slow]


def test_a_short_soak_reports_lag_and_memory_and_ends_equal(
    mysql_server: Any, tmp_path: Path
) -> None:
    args = ["--minutes", "0.5", "--dump-every", "15", "--report-every", "5"]
    args += ["--output", str(tmp_path / "soak"), "--port", str(mysql_server.port)]
    result = subprocess.run(
        [sys.executable, "soak.py", *args],
        cwd=BENCHMARKS,
        capture_output=True,
        text=True,
        timeout=540,
        env={**os.environ, "PYTHONPATH": str(BENCHMARKS)},
    )
    lines = [line for line in result.stdout.splitlines() if line.startswith("[soak] t=")]
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert len(lines) >= 5 and all(" rss " in line and " lag " in line for line in lines)
    assert all("lag p50" in line or "probe pending" in line for line in lines), lines
    assert "[soak] Delta vs source: dblog_demo.orders: equal" in result.stdout
