"""A seeded random write load on a table with a composite key, shared by the end-to-end tests.

``load`` creates ``items (a, b, v, note)`` with ROWS seed rows; ``writers`` runs WRITERS threads of
random single- and multi-statement transactions (inserts that reuse deleted keys, updates,
deletes) until the block ends; ``source_rows`` reads the table back for comparison.
"""

from __future__ import annotations

import contextlib
import dataclasses
import random
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote, urlsplit, urlunsplit

import pytest

from airflow_dblog.events import TableId

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


def execute(db: Db, sql: str, params: list[tuple[Any, ...]] | tuple[Any, ...] = ()) -> None:
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


def load(db: Db, rows: int = ROWS) -> None:
    text = "varchar(16)" if db.kind == "mysql" else "text"
    execute(
        db,
        f"CREATE TABLE {db.quoted()} (a int NOT NULL, b {text} NOT NULL, v int NOT NULL, "
        f"note {text}, PRIMARY KEY (a, b))",
    )
    if db.kind == "postgres":
        execute(db, f"ALTER TABLE {db.quoted()} REPLICA IDENTITY FULL")
    seed = [(a, f"k{a % 7}", 0, "seed") for a in range(rows)]
    for i in range(0, rows, 5000):
        execute(db, f"INSERT INTO {db.quoted()} VALUES (%s, %s, %s, %s)", seed[i : i + 5000])


def source_rows(
    db: Db, columns: Sequence[str] = ("a", "b", "v", "note")
) -> dict[tuple[Any, ...], dict[str, Any]]:
    conn = db.connect()
    try:
        with conn.cursor() as cur:
            cur.execute(f"SELECT {', '.join(columns)} FROM {db.quoted()}")
            rows = [dict(zip(columns, values, strict=True)) for values in cur.fetchall()]
            return {(row["a"], row["b"]): row for row in rows}
    finally:
        conn.close()


def _writer(
    db: Db, seed: int, stop: threading.Event, counts: dict[str, int], pause_s: float
) -> None:
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
                                f"INSERT INTO {table} (a, b, v, note) VALUES (%s,%s,%s,%s) "
                                "ON DUPLICATE KEY UPDATE v = v + 1",
                                (a, b, seed, "ins"),
                            )
                        else:
                            cur.execute(
                                f"INSERT INTO {table} (a, b, v, note) VALUES (%s,%s,%s,%s) "
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
            time.sleep(rng.random() * pause_s)
    finally:
        conn.close()


@contextlib.contextmanager
def writers(db: Db, pause_s: float = 0.004) -> Iterator[Counter[str]]:
    """``pause_s``: the longest random pause between a writer's transactions."""
    stop, counts = threading.Event(), Counter[str]()
    threads = [
        threading.Thread(target=_writer, args=(db, seed, stop, counts, pause_s), daemon=True)
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


def db_for(request: pytest.FixtureRequest, kind: str) -> Db:
    if kind == "mysql":
        mysql = request.getfixturevalue("mysql_db")
        return Db("mysql", mysql.url, mysql.name, mysql.connect)
    pg = request.getfixturevalue("postgres_db")
    return Db("postgres", pg.url, "public", pg.connect)


@contextlib.contextmanager
def restricted_user(db: Db, grants: list[str], password: str) -> Iterator[Db]:
    """A user with exactly ``grants`` (``{db}``, ``{user}`` filled in); ``db`` through it."""
    name = f"dblog_lp_{uuid.uuid4().hex[:8]}"
    admin = db.connect()
    with admin.cursor() as cur:
        if db.kind == "mysql":
            user = f"'{name}'@'%'"
            cur.execute(f"CREATE USER '{name}'@'%%' IDENTIFIED BY %s", (password,))
        else:
            user = name
            cur.execute(f"CREATE ROLE {name} LOGIN REPLICATION PASSWORD %s", (password,))
        for grant in grants:
            cur.execute(grant.format(db=db.schema, user=user))
    admin.commit()
    parts = urlsplit(db.url)
    netloc = f"{name}:{quote(password, safe='')}@{parts.hostname}:{parts.port}"
    try:
        yield dataclasses.replace(db, url=urlunsplit(parts._replace(netloc=netloc)))
    finally:
        with admin.cursor() as cur:
            if db.kind == "mysql":
                cur.execute(f"DROP USER {user}")
            else:
                cur.execute(f"DROP OWNED BY {name}")
                cur.execute(f"DROP ROLE {name}")
        admin.commit()
        admin.close()
