"""PostgreSQL WAL decoding: raw psycopg2 + wal2json vs dblog's Wal2jsonReader.

Creates a fresh database and two logical replication slots in it (before anything is written,
so both see the same changes), writes N rows in batched multi-row INSERTs, then decodes the same
WAL twice: (a) psycopg2's LogicalReplicationConnection consuming wal2json messages and
``json.loads``-ing each one (the same plugin options the reader uses); (b)
``Wal2jsonReader.read()`` producing ChangeEvents. Prints one JSON object; drops the slots and
the database afterwards.

    python benchmarks/bench_wal2json_reader.py [--rows 50000] [--batch 1000]
        [--url postgres://dblog:dblog@127.0.0.1:5432/dblog]

The URL (any database the user may CREATE DATABASE from) defaults to $DBLOG_PG_URL or the local
services' PostgreSQL.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import select
import sys
import time
import uuid
from typing import Any

import psycopg2
import psycopg2.extras

from airflow_dblog.core.events import ChangeEvent, TableId
from airflow_dblog.sources.postgres.connection import SESSION_OPTIONS, parse_postgres_url
from airflow_dblog.sources.postgres.source import PostgresSource
from airflow_dblog.sources.postgres.wal2json_reader import Wal2jsonReader

TABLE = TableId("public", "bench")


def _default_url() -> str:
    port = os.environ.get("DBLOG_PG_PORT", "5432")
    return os.environ.get("DBLOG_PG_URL", f"postgres://dblog:dblog@127.0.0.1:{port}/dblog")


def _with_database(url: str, name: str) -> str:
    head, _, _ = parse_postgres_url(url).dsn.rpartition("/")
    return f"{head}/{name}"


def write_rows(conn: Any, rows: int, batch: int) -> None:
    rng = random.Random(7)
    with conn.cursor() as cur:
        for start in range(0, rows, batch):
            values = [
                (
                    i,
                    f"name-{i}",
                    f"{rng.randint(0, 10**8) / 100:.2f}",
                    f"2024-01-01 00:00:{i % 60:02d}.{i % 1000000:06d}+00",
                    rng.randint(0, 1000),
                    "x" * (i % 50),
                )
                for i in range(start, min(rows, start + batch))
            ]
            psycopg2.extras.execute_values(
                cur, "INSERT INTO public.bench VALUES %s", values, page_size=batch
            )
            conn.commit()


def raw_decode(url: str, slot: str, options: dict[str, str], rows: int) -> tuple[int, float]:
    """Changes per second of psycopg2 + json.loads alone."""
    conn = psycopg2.connect(
        parse_postgres_url(url).dsn,
        connection_factory=psycopg2.extras.LogicalReplicationConnection,
        options=SESSION_OPTIONS,
    )
    try:
        cur = conn.cursor()
        started = time.perf_counter()
        cur.start_replication(slot_name=slot, decode=True, options=options)
        seen = 0
        while seen < rows:
            msg = cur.read_message()
            if msg is None:
                select.select([cur], [], [], 1.0)
                continue
            data = json.loads(msg.payload)
            if data["action"] == "I":
                seen += 1
        return seen, time.perf_counter() - started
    finally:
        conn.close()


def reader_decode(url: str, slot: str, rows: int) -> tuple[int, float]:
    """Changes per second of Wal2jsonReader.read()."""
    reader = Wal2jsonReader(url, [TABLE], slot=slot, before_images="ignore")
    try:
        started = time.perf_counter()
        seen = 0
        while seen < rows:
            seen += sum(1 for i in reader.read(5000, 1.0) if isinstance(i, ChangeEvent))
        return seen, time.perf_counter() - started
    finally:
        reader.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=50_000)
    parser.add_argument("--batch", type=int, default=1000)
    parser.add_argument("--url", default=_default_url())
    args = parser.parse_args(argv)

    admin = psycopg2.connect(parse_postgres_url(args.url).dsn)
    admin.autocommit = True
    dbname = f"bench_w2j_{uuid.uuid4().hex[:10]}"
    admin.cursor().execute(f'CREATE DATABASE "{dbname}"')
    url = _with_database(args.url, dbname)
    source = PostgresSource(url)
    slots = [f"bench_raw_{uuid.uuid4().hex[:8]}", f"bench_reader_{uuid.uuid4().hex[:8]}"]
    try:
        source.query(
            "CREATE TABLE public.bench (id int PRIMARY KEY, name varchar(40), amount"
            " numeric(12,2), created timestamptz, qty int, note varchar(100))"
        )
        for slot in slots:
            source.create_replication_slot(slot)
        conn = psycopg2.connect(parse_postgres_url(url).dsn)
        started = time.perf_counter()
        write_rows(conn, args.rows, args.batch)
        write_s = time.perf_counter() - started
        conn.close()

        # the reader's own plugin options, for a like-for-like raw baseline
        options = Wal2jsonReader._options(_OptionsOnly([TABLE]))  # type: ignore[arg-type]
        raw_n, raw_s = raw_decode(url, slots[0], options, args.rows)
        reader_n, reader_s = reader_decode(url, slots[1], args.rows)
        result = {
            "rows": args.rows,
            "batch": args.batch,
            "write_s": round(write_s, 3),
            "raw_psycopg2_wal2json": {
                "events": raw_n,
                "seconds": round(raw_s, 3),
                "events_per_s": round(raw_n / raw_s),
            },
            "wal2json_reader": {
                "events": reader_n,
                "seconds": round(reader_s, 3),
                "events_per_s": round(reader_n / reader_s),
            },
            "reader_vs_raw": round((reader_n / reader_s) / (raw_n / raw_s), 3),
        }
        print(json.dumps(result, indent=2))
    finally:
        for slot in slots:
            for _ in range(50):
                try:
                    source.query(
                        "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots"
                        " WHERE slot_name = %s",
                        (slot,),
                    )
                    break
                except Exception:
                    time.sleep(0.1)
        source.close()
        with contextlib.suppress(Exception):
            admin.cursor().execute(f'DROP DATABASE IF EXISTS "{dbname}" WITH (FORCE)')
        admin.close()
    return 0


class _OptionsOnly:
    """Just enough of a reader for ``Wal2jsonReader._options``."""

    def __init__(self, tables: list[TableId]) -> None:
        self.tables = tuple(tables)


if __name__ == "__main__":
    sys.exit(main())
