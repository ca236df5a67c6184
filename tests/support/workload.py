"""A seeded random write load on a table with a composite key, shared by the end-to-end tests.

``load`` creates ``items (a, b, v, note)`` with ROWS seed rows; ``writers`` runs WRITERS threads of
random single- and multi-statement transactions (inserts that reuse deleted keys, updates,
deletes) until the block ends; ``source_rows`` reads the table back for comparison.

The versioned load (``load_versioned``, ``versioned_writers``) is the staleness oracle's: its
``ver`` column only grows per key, in commit order, also across a delete and a re-insert of the
key. That holds by construction, not by the database: each writer thread owns the keys with
``a % WRITERS == its index`` and counts their versions in Python, so one connection serialises
every write of a key. A row with a smaller ``ver`` than one seen before is stale (see
tests/support/oracle.py).
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

from airflow_dblog.core.events import TableId

# Small enough that a dump is a few Delta batches on two cores (each costs seconds whatever its
# size), with chunks of 200 still ~30 windows; three writers then write each key about twice a
# minute, so windows see their keys change more often than with a larger table.
ROWS = 6_000
KEY_SPACE = 7_200  # a > ROWS are free for inserts; deleted keys get reused
WRITERS = 3


@dataclass
class Db:
    """Just enough of a database for the test: a URL, a connection factory, the dialect."""

    kind: str
    url: str
    schema: str
    connect: Callable[..., Any]
    name: str = "items"  # the table; dataclasses.replace(db, name=...) for another one

    def table(self) -> TableId:
        return TableId(self.schema, self.name)

    def quoted(self) -> str:
        if self.kind == "mysql":
            return f"`{self.schema}`.`{self.name}`"
        return f'"{self.schema}"."{self.name}"'


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


def create_table(db: Db, value_column: str = "v") -> None:
    """``(a int, b text, <value_column> int, note text)``, key (a, b); full before-images."""
    text = "varchar(16)" if db.kind == "mysql" else "text"
    execute(
        db,
        f"CREATE TABLE {db.quoted()} (a int NOT NULL, b {text} NOT NULL, "
        f"{value_column} int NOT NULL, note {text}, PRIMARY KEY (a, b))",
    )
    if db.kind == "postgres":
        execute(db, f"ALTER TABLE {db.quoted()} REPLICA IDENTITY FULL")


def key_of(a: int) -> tuple[int, str]:
    """The composite key the loads use for number ``a``."""
    return a, f"k{a % 7}"


def insert_rows(db: Db, keys: Sequence[int], value: int, note: str) -> None:
    rows = [(*key_of(a), value, note) for a in keys]
    for i in range(0, len(rows), 5000):
        execute(db, f"INSERT INTO {db.quoted()} VALUES (%s, %s, %s, %s)", rows[i : i + 5000])


def load(db: Db, rows: int = ROWS) -> None:
    create_table(db)
    insert_rows(db, range(rows), 0, "seed")


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
    db: Db,
    seed: int,
    stop: threading.Event,
    counts: dict[str, int],
    pause_s: float,
    key_space: int,
) -> None:
    """Random single- and multi-statement transactions until told to stop."""
    rng = random.Random(seed)
    conn = db.connect()
    table = db.quoted()
    try:
        while not stop.is_set():
            with conn.cursor() as cur:
                for _ in range(rng.randint(1, 3)):
                    a = rng.randrange(key_space)
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
def writers(db: Db, pause_s: float = 0.004, key_space: int = KEY_SPACE) -> Iterator[Counter[str]]:
    """``pause_s``: the longest random pause between a writer's transactions; ``key_space``:
    keys are drawn from ``0 .. key_space - 1`` (an update or delete of a key not there is a
    no-op that the log does not carry)."""
    stop, counts = threading.Event(), Counter[str]()
    threads = [
        threading.Thread(
            target=_writer, args=(db, seed, stop, counts, pause_s, key_space), daemon=True
        )
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


# ---------------------------------------------------------------------------------------------
# the versioned load: ``items (a, b, ver, note)``, ``ver`` growing per key in commit order

VERSIONED_ROWS = 5_000
VERSIONED_COLUMNS = ("a", "b", "ver", "note")


def load_versioned(db: Db, rows: int = VERSIONED_ROWS) -> None:
    """``rows`` seed rows ``a = 0 .. rows-1``, all at ``ver`` 1."""
    create_table(db, "ver")
    insert_rows(db, range(rows), 1, "seed")


def _versioned_writer(
    db: Db,
    index: int,
    seed: int,
    rows: int,
    stop: threading.Event,
    counts: Counter[str],
    errors: list[BaseException],
    pause_s: float,
) -> None:
    """Transactions of 1-3 statements on this writer's own keys until told to stop.

    A key that is not there is inserted (a deleted key is reused with a higher ``ver``), one
    that is there is updated (``ver`` + 1) or deleted. Versions are taken in Python only once
    the COMMIT has returned, so a failed transaction changes nothing.
    """
    rng = random.Random(seed)
    mine = range(index, rows + rows // 5, WRITERS)  # a fifth more keys than seed rows
    ver = {a: 1 for a in mine if a < rows}  # last ver written, live or deleted
    live = set(ver)
    table = db.quoted()
    conn = db.connect(autocommit=False)
    try:
        while not stop.is_set():
            pending: dict[int, tuple[int, bool]] = {}  # a -> (ver, live) once committed
            ops: list[str] = []
            with conn.cursor() as cur:
                for _ in range(rng.randint(1, 3)):
                    a = rng.choice(mine)
                    v, alive = pending.get(a, (ver.get(a, 0), a in live))
                    if not alive:
                        op, params = "insert", (*key_of(a), v + 1, f"i{seed}")
                        sql = f"INSERT INTO {table} (a, b, ver, note) VALUES (%s, %s, %s, %s)"
                        pending[a] = (v + 1, True)
                    elif rng.random() < 0.75:
                        op, params = "update", (v + 1, f"u{seed}", *key_of(a))
                        sql = f"UPDATE {table} SET ver = %s, note = %s WHERE a = %s AND b = %s"
                        pending[a] = (v + 1, True)
                    else:
                        op, params = "delete", key_of(a)
                        sql = f"DELETE FROM {table} WHERE a = %s AND b = %s"
                        pending[a] = (v, False)
                    cur.execute(sql, params)
                    assert cur.rowcount == 1, f"writer {index}: {op} of {key_of(a)} hit no row"
                    ops.append(op)
            conn.commit()
            for a, (v, alive) in pending.items():
                ver[a] = v
                (live.add if alive else live.discard)(a)
            counts.update(ops)
            counts["transactions"] += 1
            time.sleep(rng.random() * pause_s)
    except BaseException as err:  # surfaced when the block ends: the load must not go quiet
        errors.append(err)
    finally:
        conn.close()


@contextlib.contextmanager
def versioned_writers(
    db: Db, seed: int, pause_s: float = 0.05, rows: int = VERSIONED_ROWS
) -> Iterator[Counter[str]]:
    """WRITERS threads of the versioned load (writer i seeded ``seed * 100 + i``).

    Raises the first writer's error when the block ends: a writer that died would leave the
    test checking less than it claims.
    """
    stop, counts, errors = threading.Event(), Counter[str](), []
    threads = [
        threading.Thread(
            target=_versioned_writer,
            args=(db, i, seed * 100 + i, rows, stop, counts, errors, pause_s),
            daemon=True,
        )
        for i in range(WRITERS)
    ]
    for thread in threads:
        thread.start()
    try:
        yield counts
    finally:
        stop.set()
        for thread in threads:
            thread.join(timeout=30)
    if errors:
        raise errors[0]
