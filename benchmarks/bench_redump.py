"""Re-dumps on MariaDB: what a second full dump of a table the lake already holds costs.

One run, one JSON object. ``dblog stream`` (Delta + Kafka, or one of them) dumps table
``bench`` three times: into an empty Delta table (``first``), again unchanged (``again``), and
again after 1% of its rows changed where the binlog does not see it (``sql_log_bin = 0``:
``drift``); then, after another 1% drifted the same way, ``dblog verify --dry-run``
(``verify_dry``) and ``dblog verify`` (``verify_repair``: the verify dump and the follow-up dump
that writes the differences). For each: seconds until the dump is done (every sink holds its
rows), rows/s, CPU seconds of the job's process tree (driver, JVM, Python workers) and per 1,000
rows, and the rows Delta wrote (from its commits' metrics), next to a plain keyset SELECT of the
same table in the same run.

    python benchmarks/bench_redump.py [--rows 200000] [--chunk-size 10000] [--sinks both]

Needs the local services (scripts/services.sh up). Leaves nothing behind but its JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import pymysql
from bench_binlog_reader import write_rows
from bench_stream import KAFKA, PORT, cpu_seconds, plain_select_rows_per_s, process_tree, stop

from airflow_dblog.cli import main as dblog
from airflow_dblog.config import load_config
from airflow_dblog.engine.metadata import MetadataStore
from airflow_dblog.sources.mysql.connection import parse_mysql_url

WRITES = ("numTargetRowsInserted", "numTargetRowsUpdated", "numTargetRowsDeleted")


def delta_rows_written(table_path: Path, after_version: int) -> int:
    """Rows Delta's commits after ``after_version`` inserted, updated or deleted (MERGE) or
    appended (WRITE), from the commit metrics in ``_delta_log``."""
    written = 0
    for commit in sorted((table_path / "_delta_log").glob("*.json")):
        if not commit.stem.isdigit() or int(commit.stem) <= after_version:
            continue
        for line in commit.read_text().splitlines():
            info = json.loads(line).get("commitInfo")
            if not info:
                continue
            metrics = info.get("operationMetrics", {})
            if info.get("operation") == "WRITE":
                written += int(metrics.get("numOutputRows", 0))
            else:
                written += sum(int(metrics.get(name, 0)) for name in WRITES)
    return written


def delta_version(table_path: Path) -> int:
    log = table_path / "_delta_log"
    return max((int(p.stem) for p in log.glob("*.json") if p.stem.isdigit()), default=-1)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--chunk-size", type=int, default=10_000)
    parser.add_argument("--drift", type=float, default=0.01, help="share of rows changed")
    parser.add_argument("--sinks", choices=("both", "delta"), default="both")
    args = parser.parse_args(argv)
    url = f"mysql://dblog:dblog@127.0.0.1:{PORT}"
    db = f"bench_{uuid.uuid4().hex[:8]}"
    conn = pymysql.connect(**parse_mysql_url(url).pymysql_kwargs(), autocommit=True)
    work = Path(tempfile.mkdtemp(prefix="dblog-bench-"))
    with conn.cursor() as cur:
        cur.execute(f"CREATE DATABASE `{db}`")
    write_rows(conn, db, args.rows, 5000)  # table `bench`
    select_rps = plain_select_rows_per_s(url, db, "bench", args.chunk_size)
    kafka = f'  kafka: {{bootstrap_servers: "{KAFKA}", topic_prefix: {db}}}\n'
    config_path = work / "bench.yaml"
    config_path.write_text(
        f"""name: {db.replace("_", "-")}
source: {{type: mysql, url: "{url}/{db}", tables: [{db}.bench]}}
metadata: {{url: "sqlite:///{work}/meta.db"}}
dump: {{chunk_size: {args.chunk_size}, parallelism: 1}}
sinks:
  delta: {{path: {work}/delta}}
{kafka if args.sinks == "both" else ""}checkpoint: {work}/checkpoint
spark: {{master: "local[2]", conf: {{spark.ui.enabled: false}}}}
"""
    )
    config = load_config(config_path)
    store = MetadataStore(config.metadata_url)
    table_path = work / "delta" / db / "bench"
    result: dict[str, Any] = {"benchmark": "redump_mariadb", "rows": args.rows, "sinks": args.sinks}
    with open(work / "stream.log", "wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "airflow_dblog.cli", "stream", "-c", str(config_path)],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    try:
        while store.stream_state(config.name) is None:
            assert proc.poll() is None, f"the stream exited; see {work / 'stream.log'}"
            time.sleep(0.5)
        with conn.cursor() as cur:  # Spark's first batches compile and create the table
            cur.execute(f"UPDATE `{db}`.bench SET qty = qty + 1 WHERE id = 0")
        while delta_version(table_path) < 0:
            time.sleep(0.5)
        time.sleep(20)

        def dump(phase: str, command: str = "dump", *options: str) -> None:
            """One dump (or verify) of the table, until it and any follow-up are done."""
            version = delta_version(table_path)
            cpu = cpu_seconds(process_tree(proc.pid))
            started = time.perf_counter()
            assert dblog([command, "-c", str(config_path), "--table", f"{db}.bench", *options]) == 0
            dump_id = max(d.id for d in store.dumps(config.name))
            while any(
                store.progress(d.id).state != "done"
                for d in store.dumps(config.name)
                if d.id >= dump_id
            ):
                assert proc.poll() is None, f"the stream exited; see {work / 'stream.log'}"
                time.sleep(0.2)
            took = time.perf_counter() - started
            cpu = cpu_seconds(process_tree(proc.pid)) - cpu
            progress = store.progress(dump_id)
            rows = progress.rows_emitted if progress.verify is None else progress.rows_selected
            result[phase] = {
                "seconds": round(took, 1),
                "rows_per_s": round(rows / took),
                "vs_select": round(rows / took / select_rps, 3),
                "job_cpu_s": round(cpu, 1),
                "cpu_ms_per_1000_rows": round(cpu * 1e6 / rows),
                "delta_rows_written": delta_rows_written(table_path, version),
            }
            if progress.verify is not None:
                found = progress.verify.as_dict()
                result[phase]["found"] = {
                    k: found[k] for k in ("checked", "missing", "extra", "different", "repaired")
                }

        def drift(seed: int) -> int:
            changed = random.Random(seed).sample(range(args.rows), int(args.rows * args.drift))
            with conn.cursor() as cur:
                cur.execute("SET SESSION sql_log_bin = 0")
                for i in range(0, len(changed), 1000):
                    ids = changed[i : i + 1000]
                    marks = ", ".join(["%s"] * len(ids))
                    update = f"UPDATE `{db}`.bench SET qty = qty + 7 WHERE id IN ({marks})"
                    cur.execute(update, ids)
                cur.execute("SET SESSION sql_log_bin = 1")
            return len(changed)

        dump("first")
        dump("again")
        result["drifted_rows"] = drift(1)
        dump("drift")
        result["drifted_again"] = drift(2)
        dump("verify_dry", "verify", "--dry-run")
        dump("verify_repair", "verify")
        result["plain_select_rows_per_s"] = round(select_rps)
        result["again_vs_first_cpu"] = round(
            result["again"]["job_cpu_s"] / result["first"]["job_cpu_s"], 2
        )
    finally:
        stop(proc)
        with conn.cursor() as cur:
            cur.execute(f"DROP DATABASE IF EXISTS `{db}`")
        conn.close()
        subprocess.run(["rm", "-rf", str(work)], check=False)
    print(json.dumps(result))
    return result


if __name__ == "__main__":
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    main()
