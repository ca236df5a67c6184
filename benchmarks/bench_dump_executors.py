"""Dumps read on Spark executors: rows/s into Delta vs a plain keyset SELECT, by parallelism and
master, and the driver's memory as the table doubles.

One run, one JSON object. A MariaDB table of ``--rows`` rows (and one of twice as many) is
dumped by ``dblog stream`` with Delta as its only sink, once per (master, parallelism):

- ``local[2]``: the driver and its executor threads on this machine;
- the standalone cluster (``DBLOG_SPARK_MASTER``, two one-core workers in their own mount
  namespaces): checkpoint and Delta on a folder both sides see (``--cluster-store shared``,
  outside what the workers hide, as a cluster's HDFS or NFS would be), or on the S3 object
  store (``--cluster-store s3``: the local S3 server of ``scripts/services.sh``).

Each figure is the dump's emitted rows over the time from ``dblog dump`` to its state done
(every chunk in Delta), next to a plain keyset SELECT of the same table with the same client
library (pymysql) and page size, measured in the same run. Memory: peak RSS of the driver's
Python process alone (chunk rows never pass through it) and of its whole process tree, dumping
the table and the 2x table at parallelism 2.

    python benchmarks/bench_dump_executors.py [--rows 200000] [--chunk-size 10000]
        [--parallelism 1,2,4] [--masters local,cluster] [--cluster-store shared|s3]

Needs the local services (scripts/services.sh up; eval "$(scripts/services.sh env)").
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import pymysql
from bench_binlog_reader import write_rows
from bench_stream import plain_select_rows_per_s, process_tree, rss_of_tree, stop

from airflow_dblog.cli import main as dblog
from airflow_dblog.config import load_config
from airflow_dblog.engine.metadata import MetadataStore
from airflow_dblog.sources.mysql.connection import parse_mysql_url

PORT = os.environ.get("DBLOG_MYSQL_PORT", "3306")
SHARED_ROOT = "/var/tmp"  # the cluster's workers hide /tmp and the checkout, not this


def _rss(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/status") as f:
            return next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmRSS"))
    except (OSError, StopIteration):
        return 0


class Peaks(threading.Thread):
    """Peak RSS of the driver's Python process and of its process tree, every 0.25 s."""

    def __init__(self, pid: int) -> None:
        super().__init__(daemon=True)
        self.pid, self.driver, self.tree, self.stop = pid, 0, 0, threading.Event()

    def run(self) -> None:
        while not self.stop.wait(0.25):
            self.driver = max(self.driver, _rss(self.pid))
            self.tree = max(self.tree, rss_of_tree(self.pid))


def run_dump(
    url: str, db: str, table: str, master: str, store_root: str, parallelism: int, chunk: int
) -> dict[str, Any]:
    """Start a stream, dump ``table`` once it runs, stop it: rows/s and peak memory."""
    work = Path(tempfile.mkdtemp(prefix="dblog-bench-exec-"))
    data = f"{store_root.rstrip('/')}/{uuid.uuid4().hex[:8]}"
    config_path = work / "bench.yaml"
    name = f"{db}-{uuid.uuid4().hex[:6]}".replace("_", "-")
    config_path.write_text(
        f"""name: {name}
source: {{type: mysql, url: "{url}/{db}", tables: [{db}.{table}]}}
metadata: {{url: "sqlite:///{work}/meta.db"}}
dump: {{chunk_size: {chunk}, parallelism: {parallelism}}}
sinks:
  delta: {{path: "{data}/delta"}}
checkpoint: "{data}/checkpoint"
spark: {{master: "{master}", conf: {{spark.ui.enabled: false}}}}
"""
    )
    config = load_config(config_path)
    store = MetadataStore(config.metadata_url)
    log = open(work / "stream.log", "wb")  # noqa: SIM115 - closed in finally
    proc = subprocess.Popen(
        [sys.executable, "-m", "airflow_dblog.cli", "stream", "-c", str(config_path)],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    peaks = Peaks(proc.pid)
    try:
        peaks.start()
        state = None
        while state is None or state.position is None:  # a first commit: Spark is up
            assert proc.poll() is None, (work / "stream.log").read_text()[-3000:]
            time.sleep(0.5)
            state = store.stream_state(config.name)
        # one change: Delta's table is created and its first MERGE compiled before the dump,
        # as in production (a stream's tables exist when dumps run)
        conn = pymysql.connect(**parse_mysql_url(url).pymysql_kwargs(), autocommit=True)
        with conn.cursor() as cur:
            cur.execute(f"UPDATE `{db}`.`{table}` SET qty = qty + 1 WHERE id = 0")
        conn.close()
        while (state := store.stream_state(config.name)) is None or not state.last_event_at:
            assert proc.poll() is None, (work / "stream.log").read_text()[-3000:]
            time.sleep(0.5)  # every sink holds the change
        time.sleep(10)
        peaks.driver = peaks.tree = 0
        started = time.perf_counter()
        assert dblog(["dump", "-c", str(config_path), "--table", f"{db}.{table}"]) == 0
        dump_id = max(d.id for d in store.dumps(config.name))
        while store.progress(dump_id).state != "done":
            assert proc.poll() is None, (work / "stream.log").read_text()[-3000:]
            time.sleep(0.2)
        took = time.perf_counter() - started
        emitted = store.progress(dump_id).rows_emitted
        return {
            "rows": emitted,
            "seconds": round(took, 1),
            "rows_per_s": round(emitted / took),
            "driver_python_peak_rss_mb": round(peaks.driver / 2**20),
            "driver_tree_peak_rss_mb": round(peaks.tree / 2**20),
            "processes": len(process_tree(proc.pid)),
        }
    finally:
        peaks.stop.set()
        stop(proc)
        log.close()
        shutil.rmtree(work, ignore_errors=True)
        if not data.startswith("s3a://"):
            shutil.rmtree(data, ignore_errors=True)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--chunk-size", type=int, default=10_000)
    parser.add_argument("--parallelism", default="1,2,4")
    parser.add_argument("--masters", default="local,cluster")
    parser.add_argument("--cluster-store", choices=("shared", "s3"), default="shared")
    args = parser.parse_args(argv)
    url = f"mysql://dblog:dblog@127.0.0.1:{PORT}"
    db = f"benchx_{uuid.uuid4().hex[:8]}"
    conn = pymysql.connect(**parse_mysql_url(url).pymysql_kwargs(), autocommit=True)
    with conn.cursor() as cur:
        cur.execute(f"CREATE DATABASE `{db}`")
    write_rows(conn, db, args.rows, 5000)  # table `bench`
    with conn.cursor() as cur:  # the 2x table
        cur.execute(f"CREATE TABLE `{db}`.big LIKE `{db}`.bench")
        cur.execute(f"INSERT INTO `{db}`.big SELECT * FROM `{db}`.bench")
        cur.execute(
            f"INSERT INTO `{db}`.big SELECT id + {args.rows}, name, amount, created, qty, note"
            f" FROM `{db}`.bench"
        )
    masters = {
        "local": ("local[2]", tempfile.gettempdir()),
        "cluster": (
            os.environ.get("DBLOG_SPARK_MASTER", "spark://127.0.0.1:7077"),
            "s3a://dblog/bench" if args.cluster_store == "s3" else SHARED_ROOT,
        ),
    }
    result: dict[str, Any] = {
        "benchmark": "dump_executors_mariadb",
        "rows": args.rows,
        "chunk_size": args.chunk_size,
        "cluster_store": args.cluster_store,
    }
    try:
        select = plain_select_rows_per_s(url, db, "bench", args.chunk_size)
        result["plain_select_rows_per_s"] = round(select)
        for master_name in args.masters.split(","):
            master, root = masters[master_name]
            runs: dict[str, Any] = {}
            for p in (int(x) for x in args.parallelism.split(",")):
                run = run_dump(url, db, "bench", master, root, p, args.chunk_size)
                run["vs_select"] = round(run["rows_per_s"] / select, 3)
                runs[f"p{p}"] = run
                print(master_name, p, json.dumps(run), file=sys.stderr, flush=True)
            big = run_dump(url, db, "big", master, root, 2, args.chunk_size)
            runs["p2_2x_table"] = big
            print(master_name, "2x", json.dumps(big), file=sys.stderr, flush=True)
            result[master_name] = runs
        result["plain_select_rows_per_s_after"] = round(
            plain_select_rows_per_s(url, db, "bench", args.chunk_size)
        )
    finally:
        with conn.cursor() as cur:
            cur.execute(f"DROP DATABASE IF EXISTS `{db}`")
        conn.close()
    print(json.dumps(result))
    return result


if __name__ == "__main__":
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    main()
