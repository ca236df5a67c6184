"""dag.test() of the example DAGs against real MariaDB with `dblog stream` writing Delta."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest

from airflow_dblog.config import Config, load_config
from tests.support.stream_process import TEST_SPARK_CONF, Stream
from tests.support.workload import Db, restricted_user

DAGS = Path(__file__).resolve().parents[3] / "dags"
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


SECRET = f"Dag-{uuid.uuid4().hex[:12]}-never-logged"
GRANTS = [
    "GRANT ALL ON `{db}`.* TO {user}",
    "GRANT ALL ON dblog.* TO {user}",
    "GRANT REPLICATION SLAVE, REPLICATION CLIENT ON *.* TO {user}",
]


@pytest.fixture
def running_stream(
    mysql_db: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Config]:
    """A table of 100 orders, a config the DAGs find via DBLOG_CONFIG, and the stream running.

    The source user has a password of its own (SECRET), which no task log may show.
    """
    conn = mysql_db.connect()
    with conn.cursor() as cur:
        cur.execute(
            "CREATE TABLE orders (id INT, region VARCHAR(8), total INT, PRIMARY KEY (id, region))"
        )
        cur.executemany(
            "INSERT INTO orders VALUES (%s, %s, %s)", [(i, "eu", i * 10) for i in range(100)]
        )
    conn.close()
    db = Db("mysql", mysql_db.url, mysql_db.name, mysql_db.connect)
    with restricted_user(db, GRANTS, SECRET) as user:
        file = tmp_path / "dblog.yaml"
        file.write_text(
            f"""
name: dag-test
source: {{type: mysql, url: "{user.url}", tables: [{mysql_db.name}.orders]}}
metadata: {{url: "sqlite:///{tmp_path}/meta.db"}}
dump: {{chunk_size: 40}}
sinks: {{delta: {{path: {tmp_path}/delta}}}}
checkpoint: {tmp_path}/cp
spark:
  master: "local[2]"
  conf: {json.dumps(TEST_SPARK_CONF)}
"""
        )
        monkeypatch.setenv("DBLOG_CONFIG", str(file))
        stream = Stream(file)
        stream.start()
        stream.wait_capturing()
        yield load_config(file)
        assert stream.stop() == 0


def _delta(spark: Any, config: Config, db: str) -> dict[tuple[Any, ...], dict[str, Any]]:
    assert config.delta is not None
    df = spark.read.format("delta").load(f"{config.delta.path}/{db}/orders")
    return {(r["id"], r["region"]): {"total": r["total"]} for r in df.collect()}


def _dag(dag_id: str) -> Any:
    from airflow.dag_processing.dagbag import DagBag

    return DagBag(dag_folder=str(DAGS)).dags[dag_id]


def test_backfill_dag_writes_the_requested_keys_to_delta(
    airflow_db: None,
    running_stream: Config,
    mysql_db: Any,
    spark: Any,
    capsys: pytest.CaptureFixture[str],
) -> None:
    run = _dag("dblog_backfill").test(
        run_conf={"table": f"{mysql_db.name}.orders", "keys": '[3, "eu"]\n[7, "eu"]\n[42, "eu"]'}
    )
    assert str(run.state) in ("success", "DagRunState.SUCCESS")
    assert _delta(spark, running_stream, mysql_db.name) == {
        (k, "eu"): {"total": k * 10} for k in (3, 7, 42)
    }
    out, err = capsys.readouterr()
    assert "chunks 1/1 (100.0%), rows emitted 3" in out
    failed = _dag("dblog_backfill").test(
        run_conf={"table": f"{mysql_db.name}.orders", "keys": '["three", "eu"]'}
    )
    assert str(failed.state) in ("failed", "DagRunState.FAILED")
    out2, err2 = capsys.readouterr()
    assert "expects" in out2 + err2  # the one-line error reached the task log
    for text in (out, err, out2, err2):
        assert SECRET not in text and quote(SECRET, safe="") not in text


def test_scheduled_dump_dag_writes_every_row_to_delta(
    airflow_db: None,
    running_stream: Config,
    mysql_db: Any,
    spark: Any,
    capsys: pytest.CaptureFixture[str],
) -> None:
    run = _dag("dblog_scheduled_dump").test()
    assert str(run.state) in ("success", "DagRunState.SUCCESS")
    rows = _delta(spark, running_stream, mysql_db.name)
    assert rows == {(k, "eu"): {"total": k * 10} for k in range(100)}
    out, err = capsys.readouterr()
    assert "(100.0%), rows emitted 100," in out
    assert "[done]" in out
    assert SECRET not in out + err
