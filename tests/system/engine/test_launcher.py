"""The launcher spark-submits the real stream against MariaDB, then leaves it alone."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from airflow_dblog.config import load_config
from airflow_dblog.engine.launcher import Launch, ensure_stream, pid_path, read_record, stop


@pytest.mark.integration
@pytest.mark.slow
def test_spark_submits_the_real_stream_against_mariadb_and_then_leaves_it_alone(
    mysql_db: Any, tmp_path: Path
) -> None:
    """Through pyspark's own spark-submit, ``--master local[2]`` standing in for a cluster's
    master URL (the driver runs in the spark-submit process either way); ``dblog stream`` in
    local mode is started for real by the browser test's keep-alive DAG."""
    conn = mysql_db.connect()
    with conn.cursor() as cur:
        cur.execute("CREATE TABLE t (id INT PRIMARY KEY, v INT)")
        cur.execute("INSERT INTO t VALUES (1, 1)")
    conn.close()
    path = tmp_path / "real.yaml"
    path.write_text(
        f"""
name: launched-real
source: {{type: mysql, url: "{mysql_db.url}", tables: [{mysql_db.name}.t]}}
metadata: {{url: "sqlite:///{tmp_path}/meta.db"}}
sinks: {{delta: {{path: {tmp_path}/delta}}}}
checkpoint: {tmp_path}/cp
"""
    )
    config = load_config(path)
    spark_submit = Path(sys.executable).parent / "spark-submit"
    launch = Launch(
        mode="spark-submit",
        spark_submit=str(spark_submit),
        spark_args=[
            *("--master", "local[2]", "--conf", "spark.ui.enabled=false"),
            *("--conf", f"spark.pyspark.python={sys.executable}"),  # the workers' Python
        ],
        timeout_s=240,
    )
    started = time.monotonic()
    first = ensure_stream(str(path), config, launch)
    try:
        print(f"spark-submitted stream committing after {time.monotonic() - started:.1f}s")
        assert first.started and first.status is not None
        assert first.status.state == "running" and first.status.lag_bytes is not None
        again = ensure_stream(str(path), config, launch)
        assert not again.started and again.pid == first.pid
    finally:
        record = read_record(pid_path(config, launch))
        assert record is not None
        stop(record)
    deadline = time.monotonic() + 10  # spark-submit's JVM and the Python driver, reaped
    with pytest.raises(ProcessLookupError):
        while time.monotonic() < deadline:
            os.killpg(record.pid, 0)
            time.sleep(0.1)
    assert record.command[:2] == [str(spark_submit), "--master"]
    assert record.command[-2:] == ["-c", str(path)]
    assert ":secret" not in " ".join(record.command)
