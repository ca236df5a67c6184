"""dag.test() of the backfill DAG against real MariaDB with the capture loop as the stream."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

from airflow_dblog.capture import Capture
from airflow_dblog.config import load_config
from airflow_dblog.events import TableId
from airflow_dblog.metadata import MetadataStore
from airflow_dblog.sinks.memory_sink import MemorySink
from airflow_dblog.sources import open_reader, open_source

DAGS = Path(__file__).resolve().parents[2] / "dags"
pytestmark = [pytest.mark.integration, pytest.mark.slow]


@pytest.fixture(scope="module")
def airflow_db() -> None:
    """Airflow's own metadata database (SQLite in the throwaway AIRFLOW_HOME)."""
    subprocess.run(
        [sys.executable, "-m", "airflow", "db", "migrate"],
        check=True,
        capture_output=True,
        env={**os.environ},
        timeout=600,
    )


def test_backfill_dag_dumps_the_requested_keys(
    airflow_db: None,
    mysql_db: Any,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    conn = mysql_db.connect()
    with conn.cursor() as cur:
        cur.execute(
            "CREATE TABLE orders (id INT, region VARCHAR(8), total INT, PRIMARY KEY (id, region))"
        )
        cur.executemany(
            "INSERT INTO orders VALUES (%s, %s, %s)", [(i, "eu", i * 10) for i in range(100)]
        )
    conn.close()
    file = tmp_path / "dblog.yaml"
    file.write_text(
        f"""
name: backfill-test
source: {{type: mysql, url: "{mysql_db.url}", tables: [{mysql_db.name}.orders]}}
metadata: {{url: "sqlite:///{tmp_path}/meta.db"}}
sinks: {{delta: {{path: {tmp_path}/delta}}}}
checkpoint: {tmp_path}/cp
"""
    )
    monkeypatch.setenv("DBLOG_CONFIG", str(file))
    config = load_config(file)
    store = MetadataStore(config.metadata_url)
    sink = MemorySink()
    capture = Capture(config, store, open_source(config), open_reader(config, None), [sink])
    stop = threading.Event()

    def stream() -> None:
        while not stop.is_set():
            capture.step(timeout_s=0.1)

    thread = threading.Thread(target=stream, daemon=True)
    thread.start()
    try:
        from airflow.dag_processing.dagbag import DagBag

        dag = DagBag(dag_folder=str(DAGS)).dags["dblog_backfill"]
        run = dag.test(
            run_conf={
                "table": f"{mysql_db.name}.orders",
                "keys": '[3, "eu"]\n[7, "eu"]\n[42, "eu"]',
            }
        )
    finally:
        stop.set()
        thread.join(timeout=30)
        capture.close()
    assert str(run.state) in ("success", "DagRunState.SUCCESS")
    rows = sink.rows(TableId(mysql_db.name, "orders"))
    assert rows == {(k, "eu"): {"id": k, "region": "eu", "total": k * 10} for k in (3, 7, 42)}
    out = capsys.readouterr().out
    assert "chunks 1/1 (100.0%), rows emitted 3" in out
