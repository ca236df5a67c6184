"""The capture engine end to end on real MariaDB and PostgreSQL, for every watermark strategy.

Three writer threads insert, update and delete (reusing deleted keys) in a table with a
composite key while a dump with ~100-row chunks runs. The table is loaded before the reader
starts, so its original rows can reach the output only through the dump. Afterwards replaying
the output gives exactly the source table, and no key's positions ever go backwards.
"""

from __future__ import annotations

import contextlib
import random
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from airflow_dblog.capture import Capture
from airflow_dblog.config import Config, parse_config
from airflow_dblog.events import TableId
from airflow_dblog.metadata import MetadataStore
from airflow_dblog.planner import plan_dump
from airflow_dblog.sinks.memory_sink import MemorySink
from airflow_dblog.sources import open_reader, open_source

pytestmark = [pytest.mark.integration, pytest.mark.slow]

ROWS = 20_000
KEY_SPACE = 24_000  # a > ROWS are free for inserts; deleted keys get reused
WRITERS = 3


@dataclass
class Db:
    """Just enough of a database for the test: a URL, a connection factory, the dialect."""

    kind: str
    url: str
    schema: str
    connect: Callable[[], Any]

    def table(self) -> TableId:
        return TableId(self.schema, "items")

    def quoted(self) -> str:
        return f"`{self.schema}`.`items`" if self.kind == "mysql" else f'"{self.schema}"."items"'


def _execute(db: Db, sql: str, params: list[tuple[Any, ...]] | tuple[Any, ...] = ()) -> None:
    conn = db.connect()
    try:
        with conn.cursor() as cur:
            if params and isinstance(params, list):
                cur.executemany(sql, params)
            else:
                cur.execute(sql, params or None)
        conn.commit()
    finally:
        conn.close()


def _load(db: Db) -> None:
    text = "varchar(16)" if db.kind == "mysql" else "text"
    _execute(
        db,
        f"CREATE TABLE {db.quoted()} (a int NOT NULL, b {text} NOT NULL, v int NOT NULL, "
        f"note {text}, PRIMARY KEY (a, b))",
    )
    if db.kind == "postgres":
        _execute(db, f"ALTER TABLE {db.quoted()} REPLICA IDENTITY FULL")
    rows = [(a, f"k{a % 7}", 0, "seed") for a in range(ROWS)]
    for i in range(0, ROWS, 5000):
        _execute(db, f"INSERT INTO {db.quoted()} VALUES (%s, %s, %s, %s)", rows[i : i + 5000])


def _source_rows(db: Db) -> dict[tuple[Any, ...], dict[str, Any]]:
    conn = db.connect()
    try:
        with conn.cursor() as cur:
            cur.execute(f"SELECT a, b, v, note FROM {db.quoted()}")
            return {
                (a, b): {"a": a, "b": b, "v": v, "note": note} for a, b, v, note in cur.fetchall()
            }
    finally:
        conn.close()


def _writer(db: Db, seed: int, stop: threading.Event, counts: dict[str, int]) -> None:
    """Random single- and multi-statement transactions until told to stop."""
    rng = random.Random(seed)
    conn = db.connect()
    table = db.quoted()
    try:
        while not stop.is_set():
            with conn.cursor() as cur:
                for _ in range(rng.randint(1, 3)):
                    a = rng.randrange(KEY_SPACE)
                    b = f"k{a % 7}"
                    op = rng.random()
                    if op < 0.35:
                        if db.kind == "mysql":
                            cur.execute(
                                f"INSERT INTO {table} VALUES (%s,%s,%s,%s) "
                                "ON DUPLICATE KEY UPDATE v = v + 1",
                                (a, b, seed, "ins"),
                            )
                        else:
                            cur.execute(
                                f"INSERT INTO {table} VALUES (%s,%s,%s,%s) "
                                "ON CONFLICT (a, b) DO UPDATE SET v = items.v + 1",
                                (a, b, seed, "ins"),
                            )
                        counts["insert"] += 1
                    elif op < 0.75:
                        cur.execute(
                            f"UPDATE {table} SET v = v + 1, note = %s WHERE a = %s AND b = %s",
                            (f"w{seed}", a, b),
                        )
                        counts["update"] += 1
                    else:
                        cur.execute(f"DELETE FROM {table} WHERE a = %s AND b = %s", (a, b))
                        counts["delete"] += 1
            conn.commit()
            time.sleep(rng.random() * 0.004)
    finally:
        conn.close()


@contextlib.contextmanager
def writers(db: Db) -> Iterator[Counter[str]]:
    stop, counts = threading.Event(), Counter[str]()
    threads = [
        threading.Thread(target=_writer, args=(db, seed, stop, counts), daemon=True)
        for seed in range(1, WRITERS + 1)
    ]
    for thread in threads:
        thread.start()
    try:
        yield counts
    finally:
        stop.set()
        for thread in threads:
            thread.join(timeout=30)


def _config(db: Db, watermark: str, tmp_path: Path) -> Config:
    return parse_config(
        f"""
name: cap-{uuid.uuid4().hex[:8]}
source:
  type: {db.kind}
  url: {db.url}
  tables: [{db.table()}]
  watermark: {watermark}
metadata: {{url: "sqlite:///{tmp_path}/meta.db"}}
dump: {{chunk_size: 100, parallelism: 2}}
sinks: {{delta: {{path: {tmp_path}/delta}}}}
checkpoint: {tmp_path}/checkpoint
""",
        env={},
    )


def _open(config: Config, store: MetadataStore, sink: MemorySink) -> Capture:
    state = store.stream_state(config.name)
    saved = (state.source_offset or {}) if state else {}
    reader = open_reader(config, saved.get("reader"))
    return Capture(
        config, store, open_source(config), reader, [sink], batch_id=saved.get("batch_id", 0)
    )


def _run_until(capture: Capture, done: Callable[[], bool], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not done():
        assert time.monotonic() < deadline, "capture did not get there in time"
        capture.step(timeout_s=0.05)


def _drain(capture: Capture, quiet_s: float = 2.0) -> None:
    """Step until the log has been quiet (no change emitted) for ``quiet_s``."""
    quiet_since = time.monotonic()
    deadline = quiet_since + 120
    while time.monotonic() - quiet_since < quiet_s:
        assert time.monotonic() < deadline, "the log never went quiet"
        if capture.step(timeout_s=0.1).emitted:
            quiet_since = time.monotonic()


CASES = [
    ("mysql", "table"),
    ("mysql", "gtid"),
    ("mysql", "snapshot"),
    ("postgres", "table"),
    ("postgres", "snapshot"),
]


@pytest.mark.parametrize("restart", [False, True], ids=["straight", "restart"])
@pytest.mark.parametrize(("kind", "watermark"), CASES, ids=[f"{k}-{w}" for k, w in CASES])
def test_dump_under_concurrent_writes_converges(
    request: pytest.FixtureRequest, tmp_path: Path, kind: str, watermark: str, restart: bool
) -> None:
    db = _db(request, kind)
    _load(db)
    config = _config(db, watermark, tmp_path)
    store = MetadataStore(config.metadata_url)
    sink = MemorySink()
    capture = _open(config, store, sink)  # the log starts here: seed rows come only by dump
    with writers(db) as counts:
        _run_until(capture, lambda: counts.total() > 200, 60)
        dump_id = plan_dump(config, store, requested_by="test")
        if restart:
            _run_until(capture, lambda: store.progress(dump_id).chunks_done >= 60, 300)
            capture.reader.close()  # crash: nothing else is flushed or closed
            capture = _open(config, store, sink)
        _run_until(capture, lambda: store.progress(dump_id).state == "done", 600)
    _drain(capture)
    capture.close()

    progress = store.progress(dump_id)
    assert progress.rows_emitted > 0 and progress.rows_dropped >= 0
    assert counts["insert"] and counts["update"] and counts["delete"]
    table = db.table()
    assert sink.rows(table) == _source_rows(db)

    last: dict[tuple[Any, ...], Any] = {}
    for event in sink.received:
        assert event.table == table
        assert event.key not in last or last[event.key] < event.position, event
        last[event.key] = event.position
    dumped = [e for e in sink.received if e.op == "r"]
    assert len(dumped) == progress.rows_emitted

    attempts = [c.attempts for c in store.chunks(dump_id)]
    assert max(attempts) <= 1 + restart
    assert sum(a - 1 for a in attempts) <= (config.dump.parallelism if restart else 0)


def _db(request: pytest.FixtureRequest, kind: str) -> Db:
    if kind == "mysql":
        mysql = request.getfixturevalue("mysql_db")
        return Db("mysql", mysql.url, mysql.name, mysql.connect)
    pg = request.getfixturevalue("postgres_db")
    return Db("postgres", pg.url, "public", pg.connect)
