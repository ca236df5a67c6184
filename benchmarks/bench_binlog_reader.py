"""MySQL/MariaDB binlog decoding: raw pymysqlreplication vs dblog's BinlogReader.

Writes N rows in batched multi-row INSERTs into a fresh database (or, with ``--updates M``, then
M single-row UPDATEs of random keys, each its own transaction, as a steady update load writes
them), then decodes that same binlog range twice: (a) pymysqlreplication's BinLogStreamReader,
iterating every row of every rows event; (b) BinlogReader.read() producing ChangeEvents. Prints
one JSON object.

    python benchmarks/bench_binlog_reader.py [--rows 50000] [--batch 1000] [--updates 0]
        [--repeat 3] [--url mysql://dblog:dblog@127.0.0.1:3306]

Each decoder runs ``--repeat`` times, alternating; the best time of each is reported (the
machine is shared, so single runs are noisy).

The URL defaults to $DBLOG_MYSQL_URL or the local services' MariaDB.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time
import uuid
from typing import Any

import pymysql
from pymysqlreplication import BinLogStreamReader
from pymysqlreplication.row_event import UpdateRowsEvent, WriteRowsEvent

from airflow_dblog.core.events import ChangeEvent, TableId
from airflow_dblog.sources.mysql.binlog_reader import BinlogReader
from airflow_dblog.sources.mysql.connection import parse_mysql_url
from airflow_dblog.sources.mysql.source import MysqlSource


def _default_url() -> str:
    port = os.environ.get("DBLOG_MYSQL_PORT", "3306")
    return os.environ.get("DBLOG_MYSQL_URL", f"mysql://dblog:dblog@127.0.0.1:{port}")


def write_rows(conn: Any, db: str, rows: int, batch: int) -> None:
    rng = random.Random(7)
    with conn.cursor() as cur:
        cur.execute(
            f"CREATE TABLE `{db}`.`bench` (id int PRIMARY KEY, name varchar(40), amount"
            " decimal(12,2), created datetime(6), qty int, note varchar(100))"
        )
        for start in range(0, rows, batch):
            values = [
                (
                    i,
                    f"name-{i}",
                    f"{rng.randint(0, 10**8) / 100:.2f}",
                    f"2024-01-01 00:00:{i % 60:02d}.{i % 1000000:06d}",
                    rng.randint(0, 1000),
                    "x" * (i % 50),
                )
                for i in range(start, min(rows, start + batch))
            ]
            marks = ", ".join(["(%s, %s, %s, %s, %s, %s)"] * len(values))
            cur.execute(
                f"INSERT INTO `{db}`.`bench` VALUES {marks}", [v for row in values for v in row]
            )


def update_rows(conn: Any, db: str, rows: int, updates: int) -> None:
    rng = random.Random(11)
    with conn.cursor() as cur:
        for _ in range(updates):
            cur.execute(
                f"UPDATE `{db}`.bench SET qty = qty + 1 WHERE id = %s", (rng.randrange(rows),)
            )


def bench_raw(url: str, db: str, file: str, pos: int, rows: int, event: type) -> float:
    """Seconds pymysqlreplication takes to decode ``rows`` rows of ``event``s of table bench."""
    settings = parse_mysql_url(url).pymysql_kwargs()
    stream = BinLogStreamReader(
        connection_settings=settings,
        server_id=random.randint(1 << 20, (1 << 31) - 1),
        resume_stream=True,
        blocking=True,
        log_file=file,
        log_pos=pos,
        only_events=[event],
        only_schemas=[db],
        only_tables=["bench"],
        enable_logging=False,
    )
    seen = 0
    started = time.perf_counter()
    try:
        for event in stream:
            for _row in event.rows:
                seen += 1
            if seen >= rows:
                break
    finally:
        stream.close()
    elapsed = time.perf_counter() - started
    assert seen == rows, (seen, rows)
    return elapsed


def bench_reader(url: str, db: str, file: str, pos: int, rows: int) -> float:
    reader = BinlogReader(url, [TableId(db, "bench")], offset={"file": file, "pos": pos})
    seen = 0
    started = time.perf_counter()
    try:
        while seen < rows:
            seen += sum(isinstance(i, ChangeEvent) for i in reader.read(5000, 1.0))
    finally:
        reader.close()
    elapsed = time.perf_counter() - started
    assert seen == rows, (seen, rows)
    return elapsed


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=50_000)
    parser.add_argument("--batch", type=int, default=1_000)
    parser.add_argument("--updates", type=int, default=0, help="then decode M single-row UPDATEs")
    parser.add_argument("--repeat", type=int, default=3, help="best of N, alternating")
    parser.add_argument("--url", default=_default_url())
    args = parser.parse_args(argv)
    settings = parse_mysql_url(args.url)
    db = f"bench_{uuid.uuid4().hex[:10]}"
    conn = pymysql.connect(**settings.pymysql_kwargs(), autocommit=True)
    source = MysqlSource(args.url)
    try:
        with conn.cursor() as cur:
            cur.execute(f"CREATE DATABASE `{db}`")
        file, pos = source.master_status()
        t0 = time.perf_counter()
        write_rows(conn, db, args.rows, args.batch)
        event, events = WriteRowsEvent, args.rows
        if args.updates:
            file, pos = source.master_status()
            t0 = time.perf_counter()
            update_rows(conn, db, args.rows, args.updates)
            event, events = UpdateRowsEvent, args.updates
        write_s = time.perf_counter() - t0
        raw_times, reader_times = [], []
        for _ in range(max(1, args.repeat)):
            raw_times.append(bench_raw(args.url, db, file, pos, events, event))
            reader_times.append(bench_reader(args.url, db, file, pos, events))
        raw_s, reader_s = min(raw_times), min(reader_times)
    finally:
        with conn.cursor() as cur:
            cur.execute(f"DROP DATABASE IF EXISTS `{db}`")
        conn.close()
        source.close()
    result = {
        "benchmark": "mysql_binlog_reader",
        "server": source.version,
        "rows": args.rows,
        "batch": args.batch,
        "updates": args.updates,
        "repeat": max(1, args.repeat),
        "write_s": round(write_s, 3),
        "raw_pymysqlreplication_events_per_s": round(events / raw_s),
        "binlog_reader_events_per_s": round(events / reader_s),
        "raw_s": round(raw_s, 3),
        "binlog_reader_s": round(reader_s, 3),
        "reader_vs_raw_ratio": round(raw_s / reader_s, 3),
    }
    print(json.dumps(result))
    return result


if __name__ == "__main__":
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    main()
