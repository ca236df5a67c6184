"""The README's demo: a live MariaDB database streamed into Delta, dumped while it changes.

``scripts/demo.sh`` prepares the machine and runs ``python -m airflow_dblog.demo``, which
creates database ``dblog_demo`` (customers, and orders with a composite key), starts a write
load, runs ``dblog stream`` into ``./demo-output/delta``, dumps every table while the load goes
on, prints the dump's progress, then stops the load and compares each Delta table with its
source table. The exit status is 0 only if they are equal.
"""

from __future__ import annotations

import argparse
import decimal
import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pymysql

from airflow_dblog.cli import main as dblog
from airflow_dblog.config import load_config
from airflow_dblog.engine.metadata import MetadataStore

DB = "dblog_demo"
CUSTOMERS, ORDERS = 2_000, 10_000
TABLES = {"customers": ("id",), "orders": ("order_id", "line")}


def _connect(url: str) -> Any:
    from airflow_dblog.sources.mysql.connection import parse_mysql_url

    return pymysql.connect(**parse_mysql_url(url).pymysql_kwargs(), autocommit=True)


def create_database(url: str) -> None:
    conn = _connect(url)
    with conn.cursor() as cur:
        cur.execute(f"DROP DATABASE IF EXISTS {DB}")
        cur.execute(f"CREATE DATABASE {DB}")
        cur.execute(
            f"CREATE TABLE {DB}.customers (id INT PRIMARY KEY, name VARCHAR(40) NOT NULL,"
            " balance DECIMAL(12,2) NOT NULL, visits INT NOT NULL)"
        )
        cur.execute(
            f"CREATE TABLE {DB}.orders (order_id INT, line INT, sku VARCHAR(12) NOT NULL,"
            " qty INT NOT NULL, price DECIMAL(10,2) NOT NULL, PRIMARY KEY (order_id, line))"
        )
        rng = random.Random(7)
        cur.executemany(
            f"INSERT INTO {DB}.customers VALUES (%s, %s, %s, 0)",
            [
                (i, f"customer {i}", decimal.Decimal(rng.randrange(100_000)) / 100)
                for i in range(CUSTOMERS)
            ],
        )
        cur.executemany(
            f"INSERT INTO {DB}.orders VALUES (%s, %s, %s, %s, %s)",
            [
                (
                    i // 4,
                    i % 4,
                    f"sku-{rng.randrange(500)}",
                    rng.randrange(1, 9),
                    rng.randrange(100, 9999) / 100,
                )
                for i in range(ORDERS)
            ],
        )
    conn.close()


@contextmanager
def write_load(url: str, per_second: float = 40) -> Iterator[dict[str, int]]:
    """Random inserts, updates and deletes on both tables until the block ends."""
    stop, counts = threading.Event(), {"insert": 0, "update": 0, "delete": 0}

    def run() -> None:
        rng, conn = random.Random(11), _connect(url)
        with conn.cursor() as cur:
            while not stop.is_set():
                op, order = rng.random(), rng.randrange(ORDERS // 4 + 500)
                if op < 0.4:
                    cur.execute(
                        f"INSERT INTO {DB}.orders VALUES (%s, %s, 'sku-new', 1, 1.00)"
                        " ON DUPLICATE KEY UPDATE qty = qty + 1",
                        (order, rng.randrange(4)),
                    )
                    counts["insert"] += 1
                elif op < 0.8:
                    cur.execute(
                        f"UPDATE {DB}.customers SET visits = visits + 1, balance = balance + 1"
                        " WHERE id = %s",
                        (rng.randrange(CUSTOMERS),),
                    )
                    counts["update"] += 1
                else:
                    cur.execute(f"DELETE FROM {DB}.orders WHERE order_id = %s", (order,))
                    counts["delete"] += 1
                time.sleep(rng.random() * 2 / per_second)
        conn.close()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    try:
        yield counts
    finally:
        stop.set()
        thread.join(10)


def write_config(out: Path, url: str) -> Path:
    path = out / "dblog.yaml"
    path.write_text(
        f"""name: demo
source:
  type: mysql
  url: {url}
  tables: [{DB}.customers, {DB}.orders]
metadata: {{url: "sqlite:///{out}/metadata.db"}}
dump: {{chunk_size: 1000, parallelism: 2, delay_ms: 200}}
sinks:
  delta: {{path: {out}/delta}}
checkpoint: {out}/checkpoint
spark: {{master: "local[2]", conf: {{spark.ui.enabled: false}}}}
"""
    )
    return path


def source_rows(url: str, table: str) -> dict[tuple[Any, ...], dict[str, str]]:
    conn = _connect(url)
    with conn.cursor(pymysql.cursors.DictCursor) as cur:
        cur.execute(f"SELECT * FROM {DB}.{table}")
        rows = cur.fetchall()
    conn.close()
    return {tuple(r[k] for k in TABLES[table]): _text(r) for r in rows}


def delta_rows(spark: Any, path: str, table: str) -> dict[tuple[Any, ...], dict[str, str]]:
    df = spark.read.format("delta").load(path).where("NOT _dblog_deleted")
    rows = df.drop(*[c for c in df.columns if c.startswith("_dblog_")]).collect()
    return {tuple(r[k] for k in TABLES[table]): _text(r.asDict()) for r in rows}


def _text(row: dict[str, Any]) -> dict[str, str]:
    return {k: str(v) for k, v in row.items()}


def compare(url: str, spark: Any, delta_path: str) -> list[str]:
    """One line per table: equal, or how many keys are missing, extra or different."""
    lines = []
    for table in TABLES:
        want = source_rows(url, table)
        have = delta_rows(spark, f"{delta_path}/{DB}/{table}", table)
        missing, extra = want.keys() - have.keys(), have.keys() - want.keys()
        differ = [k for k in want.keys() & have.keys() if want[k] != have[k]]
        if missing or extra or differ:
            lines.append(
                f"{DB}.{table}: DIFFERENT ({len(missing)} missing, {len(extra)} extra,"
                f" {len(differ)} different of {len(want)} rows)"
            )
        else:
            lines.append(f"{DB}.{table}: equal ({len(want)} rows)")
    return lines


def start_stream(config_path: Path, log_path: Path) -> subprocess.Popen[bytes]:
    """``dblog stream -c config_path`` as a child process, its output in ``log_path``."""
    with open(log_path, "w") as log:
        return subprocess.Popen(
            [sys.executable, "-m", "airflow_dblog.cli", "stream", "-c", str(config_path)],
            stdout=log,
            stderr=subprocess.STDOUT,
        )


def stop_stream(stream: subprocess.Popen[bytes]) -> None:
    stream.send_signal(signal.SIGTERM)
    try:
        stream.wait(60)
    except subprocess.TimeoutExpired:
        stream.kill()


def wait_until_equal(url: str, delta_path: str, timeout_s: float = 120) -> list[str]:
    """:func:`compare` until every table is equal or ``timeout_s`` passed: the last result."""
    from airflow_dblog.spark.session import build_spark_session

    spark = build_spark_session("dblog-demo-verify", "local[1]", {"spark.ui.enabled": False})
    spark.sparkContext.setLogLevel("ERROR")
    deadline = time.monotonic() + timeout_s
    while True:
        result = compare(url, spark, delta_path)
        if all(": equal" in line for line in result) or time.monotonic() > deadline:
            return result
        time.sleep(3)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m airflow_dblog.demo")
    parser.add_argument("--output", default="demo-output", help="where Delta, logs, state go")
    args = parser.parse_args(argv)
    out = Path(args.output).resolve()
    out.mkdir(parents=True, exist_ok=True)
    port = os.environ.get("DBLOG_MYSQL_PORT", "3306")
    url = f"mysql://dblog:dblog@127.0.0.1:{port}/{DB}"
    for stale in ("checkpoint", "delta", "metadata.db"):
        subprocess.run(["rm", "-rf", str(out / stale)], check=True)

    print(f"[demo] creating {DB}: {CUSTOMERS} customers, {ORDERS} order lines")
    create_database(url)
    config_path = write_config(out, url)
    config = load_config(config_path)
    store = MetadataStore(config.metadata_url)
    log_path = out / "stream.log"
    print(f"[demo] starting dblog stream -c {config_path} (log: {log_path})")
    stream = start_stream(config_path, log_path)
    try:
        with write_load(url) as counts:
            while store.stream_state(config.name) is None:
                if stream.poll() is not None:
                    print(f"[demo] the stream exited ({stream.returncode}); see {log_path}")
                    return 1
                time.sleep(1)
            print("[demo] stream is live; dumping all tables while the write load runs")
            dblog(["dump", "-c", str(config_path), "--all"])
            dump_id = max(d.id for d in store.dumps(config.name))
            while (progress := store.progress(dump_id)).state not in (
                "done",
                "failed",
                "cancelled",
            ):
                print(f"[demo] {progress.line()}")
                time.sleep(3)
            print(f"[demo] {progress.line()}")
            print(f"[demo] write load: {counts}")
        print("[demo] write load stopped; waiting for the stream to catch up")
        result = wait_until_equal(url, str(out / "delta"))
        for line in result:
            print(f"[demo] Delta vs source: {line}")
        ok = all(": equal" in line for line in result)
        print(f"[demo] {'the Delta tables equal the source tables' if ok else 'DIFFERENCES found'}")
        print(f"[demo] Delta tables under {out / 'delta'}; read them with any Spark + Delta")
        return 0 if ok else 1
    finally:
        stop_stream(stream)


if __name__ == "__main__":
    sys.exit(main())
