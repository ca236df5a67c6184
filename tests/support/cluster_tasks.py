"""Driver programs for tests/system/spark/test_cluster.py, each run in its own process.

A Python process has one SparkContext: the tests' ``local[2]`` session (conftest's ``spark``)
and a session on the standalone cluster cannot share one, so the tests run this as
``python cluster_tasks.py JSON_ARGS`` and read one JSON object from its last line. One cluster
application does both (an application's start is most of the time on a 2-core machine):

- ``disk``: the driver writes a file under its tmp dir and reads it back; tasks on every executor
  try to open that file and a file of the source checkout, and run ``SELECT 1`` against MySQL
  and PostgreSQL.
- ``delta``: writes rows to a Delta table at an ``s3a://`` path from the cluster and reports
  what it wrote.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any


def _session(name: str, paths: list[str] = ()) -> Any:
    from airflow_dblog.spark.session import build_spark_session

    return build_spark_session(
        name,
        master=os.environ["DBLOG_SPARK_MASTER"],
        extra_conf={
            "spark.ui.enabled": False,
            "spark.executor.memory": "1g",
            "spark.executor.cores": 1,
            "spark.sql.shuffle.partitions": 2,
            "spark.databricks.delta.snapshotPartitions": 2,
        },
        paths=paths,
    )


def _probe(args: dict[str, Any]) -> dict[str, Any]:
    """What one task sees from its executor."""
    import pymysql

    out: dict[str, Any] = {"pid": os.getpid(), "mnt_ns": os.readlink("/proc/self/ns/mnt")}
    for key in ("driver_file", "repo_file"):
        try:
            with open(args[key]) as f:
                out[key] = "read:" + f.read()[:20]
        except OSError as err:
            out[key] = type(err).__name__
    import airflow_dblog

    out["package"] = airflow_dblog.__file__
    conn = pymysql.connect(
        host=args["mysql_host"],
        port=args["mysql_port"],
        user=args["mysql_user"],
        password=args["mysql_password"],
        connect_timeout=10,
    )
    try:
        with conn.cursor() as cur:
            cur.execute("SELECT 1")
            out["mysql"] = cur.fetchone()[0]
    finally:
        conn.close()
    import psycopg2

    conn = psycopg2.connect(args["postgres_dsn"], connect_timeout=10)
    try:
        with conn.cursor() as cur:
            cur.execute("SELECT 1")
            out["postgres"] = cur.fetchone()[0]
    finally:
        conn.close()
    return out


def disk(spark: Any, args: dict[str, Any]) -> dict[str, Any]:
    sc = spark.sparkContext
    driver_file = Path(args["driver_file"])
    driver_file.parent.mkdir(parents=True, exist_ok=True)
    driver_file.write_text("written by the driver")
    args = {**args, "driver_file": str(driver_file)}
    # one task per core of the two workers, twice over: every executor runs some
    n = 4
    probes = sc.parallelize(range(n), n).map(lambda _: _probe(args)).collect()
    executors = sc._jsc.sc().getExecutorMemoryStatus().size() - 1  # minus the driver
    return {
        "driver_mnt_ns": os.readlink("/proc/self/ns/mnt"),
        "driver_reads": driver_file.read_text(),
        "executors": executors,
        "probes": probes,
    }


def delta(spark: Any, args: dict[str, Any]) -> dict[str, Any]:
    rows = [(i, f"v{i}", i % 3 == 0) for i in range(args["rows"])]
    df = spark.createDataFrame(rows, "id BIGINT, v STRING, flag BOOLEAN").repartition(2)
    df.write.format("delta").save(args["path"])
    return {"written": rows}


if __name__ == "__main__":
    payload = json.loads(sys.argv[1])
    t0 = time.monotonic()
    session = _session("dblog-test-cluster", [payload["delta"]["path"]])
    seconds = {"session": time.monotonic() - t0}
    try:
        result: dict[str, Any] = {"disk": disk(session, payload["disk"])}
        seconds["disk"] = time.monotonic() - t0 - sum(seconds.values())
        result["delta"] = delta(session, payload["delta"])
        seconds["delta"] = time.monotonic() - t0 - sum(seconds.values())
    finally:
        session.stop()
    result["phases"] = {k: round(v, 1) for k, v in seconds.items()}
    print(json.dumps(result))
