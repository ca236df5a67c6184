"""A source database in memory, behind the engine's own protocols, for unit tests of the planner,
the chunk executor and the capture loop without a server.

:class:`FakeDatabase` holds tables (rows by primary key) and one log in commit order: every
write appends its change, and a watermark write appends a
:class:`~airflow_dblog.core.events.WatermarkEvent`, as a MySQL binlog with
``binlog_order_commits`` does. :class:`FakeSource` implements
:class:`~airflow_dblog.sources.base.Source` over it (keyset pages, key bounds, key coercion,
watermark writes) and :class:`FakeChangelogReader` implements
:class:`~airflow_dblog.sources.base.ChangelogReader` (offsets, heartbeats, acknowledgements).

The engine finds a source by ``source.type`` and URL (chunk SELECTs open their own source where
they run), so :data:`FAKE_KIND` is a :class:`~airflow_dblog.sources.registry.SourceKind` that a
test registers (``registered_fake_kind``) and a database is found again by its URL. Its watermark
mode ``table`` is MySQL's own strategy: a window between two watermark writes in the log.
"""

from __future__ import annotations

import dataclasses
import itertools
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from airflow_dblog.config import Config, parse_config
from airflow_dblog.core.events import ChangeEvent, Heartbeat, LogItem, Row, TableId, WatermarkEvent
from airflow_dblog.core.position import Position
from airflow_dblog.errors import InputError, SourceError
from airflow_dblog.sources import registry
from airflow_dblog.sources.base import Closeable, Column, Key, Offset, TableSchema, Wake
from airflow_dblog.sources.mysql.watermarks import MysqlTableWatermarks
from airflow_dblog.sources.registry import ReaderSettings, SourceKind
from airflow_dblog.sources.watermark import WatermarkStrategy

_DATABASES: dict[str, FakeDatabase] = {}
_names = itertools.count(1)

STRATEGIES: dict[str, type[WatermarkStrategy[Any]]] = {"table": MysqlTableWatermarks}
"""The watermark modes of the fake kind: MySQL's ``table`` strategy, which the fake log obeys."""

FAKE_KIND = SourceKind(
    name="fake",
    product="FakeDB",
    url_schemes=("fake",),
    url_scheme="fake",
    default_port=1,
    watermark_modes=tuple(STRATEGIES),
    takes_slot=False,
    debezium_connector="fake",
    envelope_db_field="database",
    lineage_database=None,
    source_class=f"{__name__}:FakeSource",
    reader_opener=f"{__name__}:open_fake_reader",
    strategies=f"{__name__}:STRATEGIES",
)

_TYPES: dict[str, tuple[type, str]] = {"int": (int, "an integer"), "text": (str, "a string")}


@dataclasses.dataclass
class _Table:
    schema: TableSchema
    rows: dict[Key, Row]


class FakeDatabase:
    """Tables and their log; every write is one committed transaction (thread-safe)."""

    def __init__(self) -> None:
        self.url = f"fake://db{next(_names)}"
        self.tables: dict[TableId, _Table] = {}
        self.log: list[LogItem] = []
        self.acknowledged: list[Offset] = []
        self.selects: list[tuple[TableId, Key | None, Key | None, int]] = []  # range pages
        self.down = False  # every query raises SourceError while set
        self._lock = threading.RLock()
        _DATABASES[self.url] = self

    def drop(self) -> None:
        """Forget the database: its URL no longer opens it."""
        _DATABASES.pop(self.url, None)

    # -- the schema and the data ---------------------------------------------------------------

    def create_table(
        self, name: str, columns: dict[str, str], key: Sequence[str] = ("id",)
    ) -> TableId:
        """A table ``db.<name>``; ``columns`` maps each column to "int" or "text"."""
        table = TableId("db", name)
        cols = tuple(Column(c, t, c not in key) for c, t in columns.items())
        with self._lock:
            self.tables[table] = _Table(TableSchema(table, cols, tuple(key)), {})
        return table

    def insert(self, table: TableId, *rows: Row) -> None:
        for row in rows:
            self._commit(table, "c", dict(row))

    def update(self, table: TableId, key: Key, **values: Any) -> None:
        with self._lock:
            before = self.tables[table].rows[key]
            self._commit(table, "u", {**before, **values})

    def delete(self, table: TableId, key: Key) -> None:
        with self._lock:
            self._commit(table, "d", dict(self.tables[table].rows[key]))

    def rows(self, table: TableId) -> dict[Key, Row]:
        """The table as it is now, by key."""
        with self._lock:
            return {k: dict(r) for k, r in self.tables[table].rows.items()}

    def key_of(self, table: TableId, row: Row) -> Key:
        return tuple(row[c] for c in self.tables[table].schema.key)

    def _commit(self, table: TableId, op: str, row: Row) -> None:
        with self._lock:
            rows = self.tables[table].rows
            key = self.key_of(table, row)
            before = rows.get(key)
            if op == "d":
                del rows[key]
            else:
                rows[key] = row
            self.log.append(
                ChangeEvent(
                    table,
                    op,  # type: ignore[arg-type]
                    key,
                    self._next_position(),
                    before=dict(before) if before is not None and op != "c" else None,
                    after=None if op == "d" else dict(row),
                    ts_ms=len(self.log) + 1,
                )
            )

    def write_watermark(self, stream: str, value: str) -> None:
        with self._lock:
            self.log.append(WatermarkEvent(stream, value, self._next_position()))

    def _next_position(self) -> Position:
        return position_at(len(self.log))

    @contextmanager
    def outage(self) -> Iterator[None]:
        """The server stops answering until the block ends."""
        self.down = True
        try:
            yield
        finally:
            self.down = False


def position_at(index: int) -> Position:
    """The position of the log's ``index``-th item; a heartbeat after it sits in between."""
    return Position.mysql(1, 10 * (index + 1))


def opened(url: str) -> FakeDatabase:
    try:
        return _DATABASES[url]
    except KeyError:
        raise SourceError(f"no fake database at {url}") from None


class FakeSource(Closeable):
    """The :class:`~airflow_dblog.sources.base.Source` of a :class:`FakeDatabase`."""

    kind = "fake"

    def __init__(self, url: str) -> None:
        self.db = opened(url)
        self.lineage_epoch = 0
        self.closed = False

    def _table(self, table: TableId) -> _Table:
        self.ping()
        try:
            return self.db.tables[table]
        except KeyError:
            raise InputError(
                f"table {table} does not exist", "create it or remove it from source.tables"
            ) from None

    def describe(self, table: TableId) -> TableSchema:
        return self._table(table).schema

    def _keys(self, table: TableId, after: Key | None, upto: Key | None) -> list[Key]:
        with self.db._lock:
            keys = sorted(self._table(table).rows)
        return [k for k in keys if (after is None or k > after) and (upto is None or k <= upto)]

    def max_key(self, table: TableId) -> Key | None:
        keys = self._keys(table, None, None)
        return keys[-1] if keys else None

    def estimate_rows(self, table: TableId) -> int:
        return len(self._table(table).rows)

    def next_bound(self, table: TableId, after: Key | None, upto: Key, n: int) -> Key | None:
        if n < 1:
            raise InputError(f"chunk size must be >= 1, got {n}", "set dump.chunk_size >= 1")
        keys = self._keys(table, after, upto)
        return keys[n - 1] if len(keys) >= n else None

    def select_range(
        self, table: TableId, lower: Key | None, upper: Key, limit: int
    ) -> list[tuple[Key, Row]]:
        with self.db._lock:
            self.db.selects.append((table, lower, upper, limit))
            rows = self._table(table).rows
            return [(k, dict(rows[k])) for k in self._keys(table, lower, upper)[:limit]]

    def select_keys(self, table: TableId, keys: Sequence[Key]) -> list[tuple[Key, Row]]:
        with self.db._lock:
            rows = self._table(table).rows
            return [(tuple(k), dict(rows[tuple(k)])) for k in keys if tuple(k) in rows]

    def coerce_key(self, table: TableId, key: Sequence[Any]) -> Key:
        schema = self.describe(table)
        values = list(key) if isinstance(key, (list, tuple)) else [key]
        if len(values) != len(schema.key):
            raise InputError(
                f"key {list(values)!r} has {len(values)} value(s) but {table} has the"
                f" {len(schema.key)}-column primary key ({', '.join(schema.key)})"
            )
        types = {c.name: c.type for c in schema.columns}
        for column, value in zip(schema.key, values, strict=True):
            python_type, wanted = _TYPES[types[column]]
            if not isinstance(value, python_type) or isinstance(value, bool):
                raise InputError(
                    f"key column {column} of {table} expects {wanted} ({types[column]}),"
                    f" got {value!r}"
                )
        return tuple(values)

    def ensure_watermark_table(self) -> None:
        self.ping()

    def check_commit_order(self) -> None:
        """The fake log is in commit order, as ``binlog_order_commits`` makes MySQL's."""

    def write_watermark(self, stream: str, value: str) -> None:
        self.ping()
        self.db.write_watermark(stream, value)

    def ping(self) -> None:
        if self.db.down:
            raise SourceError(f"cannot reach {self.db.url}: the fake server is down")

    def log_lag(
        self, position: str | None, offset: Offset | None
    ) -> tuple[str, int | None, str | None]:
        head = str(position_at(len(self.db.log) - 1)) if self.db.log else ""
        behind = len(self.db.log) - int((offset or {}).get("next", 0))
        return head, behind, None

    def close(self) -> None:
        self.closed = True


class FakeChangelogReader(Closeable):
    """The :class:`~airflow_dblog.sources.base.ChangelogReader` of a :class:`FakeDatabase`'s log:
    its offset is the index of the next item; an idle read returns a heartbeat past the end."""

    def __init__(self, db: FakeDatabase, offset: Offset | None = None) -> None:
        self.db = db
        self.lineage_epoch = 0
        self._next = len(db.log) if offset is None else int(offset["next"])
        self.closed = False

    def read(self, max_items: int, timeout_s: float, wake: Wake | None = None) -> list[LogItem]:
        if self.closed:
            raise SourceError("read from a closed reader")
        if self.db.down:
            raise SourceError(f"cannot reach {self.db.url}: the fake server is down")
        with self.db._lock:
            items = self.db.log[self._next : self._next + max_items]
            end = len(self.db.log)
        if not items:
            return [Heartbeat(Position.mysql(1, 10 * end + 5))]
        self._next += len(items)
        return list(items)

    def offset(self) -> Offset:
        return {"next": self._next}

    def acknowledge(self, offset: Offset) -> None:
        self.db.acknowledged.append(dict(offset))

    def close(self) -> None:
        self.closed = True


def open_fake_reader(url: str, settings: ReaderSettings, offset: Offset | None) -> Any:
    """The fake kind's reader opener (``SourceKind.reader_opener``)."""
    return FakeChangelogReader(opened(url), offset)


@contextmanager
def registered_fake_kind() -> Iterator[SourceKind]:
    """``source.type: fake`` known to the registry while the block runs."""
    registry.KINDS[FAKE_KIND.name] = FAKE_KIND
    try:
        yield FAKE_KIND
    finally:
        registry.KINDS.pop(FAKE_KIND.name, None)


def fake_config(
    db: FakeDatabase,
    tables: Sequence[TableId],
    folder: Path,
    *,
    chunk_size: int = 3,
    parallelism: int = 1,
    name: str = "fake",
) -> Config:
    """A stream config on ``db`` with a SQLite metadata store in ``folder``.

    The config is parsed as a MySQL stream's (the parser knows the real kinds only), then
    pointed at the fake database.
    """
    config = parse_config(
        f"""
name: {name}
source:
  type: mysql
  url: mysql://u:p@127.0.0.1:1/db
  tables: [{", ".join(str(t) for t in tables)}]
metadata: {{url: "sqlite:///{folder}/meta.db"}}
dump: {{chunk_size: {chunk_size}, parallelism: {parallelism}}}
sinks: {{delta: {{path: {folder}/delta}}}}
checkpoint: {folder}/checkpoint
""",
        env={},
    )
    source = dataclasses.replace(config.source, type=FAKE_KIND.name, url=db.url)
    return dataclasses.replace(config, source=source)
