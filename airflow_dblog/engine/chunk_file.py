"""Chunk files: a dump chunk's rows, written where its SELECT ran, read back by each sink.

A chunk's SELECT runs in a Spark task on an executor (or a driver thread when the stream runs
no Spark); its rows go to a folder of Parquet files under ``<checkpoint>/chunks``, on whatever
store the checkpoint is (local, ``s3a://``, ...), never through the driver. A row is the JSON text
the spool and Kafka use (:mod:`~airflow_dblog.engine.event_text`): ``key`` (the key values as a
JSON array), ``after`` (the row image), plus ``idx`` (its place in the SELECT's key order) and
``mkey`` (:func:`~airflow_dblog.core.keys.match_key`, what the window's changed keys are compared
with), and, when the stream writes to Delta, each source column typed as Delta stores it
(``v0``, ``v1``, ... in the order of :attr:`ChunkRef.typed`; see
:mod:`~airflow_dblog.engine.typed_values`).

When the chunk's window closes, the spool gets a :class:`ChunkRef` in the place its rows belong:
the folder, the position the rows are placed at, and the ``idx`` of the rows to leave out (their
key changed inside the window). Row ``idx`` becomes an ``op="r"`` event at position
``base.dumped_row(first + idx)``; Delta's batch computes that in Spark, the Kafka forwarder in
Python (:meth:`ChunkRef.texts`). A folder is written once and deleted with the last segment
that refers to it, so a batch replayed after a crash reads the same rows.
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
import os
import uuid
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any, NamedTuple

from airflow_dblog.core.keys import match_key, to_json
from airflow_dblog.engine.event_text import EventText, key_text, row_text
from airflow_dblog.engine.spool_store import arrow_filesystem, is_uri, join, task_conf
from airflow_dblog.engine.typed_values import typed_arrays
from airflow_dblog.errors import DblogError

if TYPE_CHECKING:
    import pyarrow as pa

    from airflow_dblog.core.events import Row
    from airflow_dblog.core.merge import Key, Rows

log = logging.getLogger(__name__)

SPARK_DDL = "chunk_id BIGINT, idx BIGINT, key STRING, mkey STRING, after STRING"
POSITION_DIGITS = 20  # one coordinate of a position's text (core/position.py)
_BATCH_ROWS = 8192  # rows per Arrow batch read back on the driver (bounded memory)
_PART = "part-00000.parquet"  # the file of a chunk folder


def arrow_schema() -> pa.Schema:
    import pyarrow as pa

    return pa.schema(
        [
            pa.field("chunk_id", pa.int64(), nullable=False),
            pa.field("idx", pa.int64(), nullable=False),
            pa.field("key", pa.string(), nullable=False),
            pa.field("mkey", pa.string(), nullable=False),
            pa.field("after", pa.string(), nullable=False),
        ]
    )


@dataclass(frozen=True)
class ChunkSelected:
    """What a chunk's SELECT reports to the driver (the rows stay in the chunk file).

    ``last_key``: the last row's key (JSON values), for splitting a page that filled early;
    ``key_span``: the lowest and highest value of the first key column, when those compare in
    Python as in Spark (ints, strings), so Delta can bound its MERGE; ``info``: what the SELECT's
    snapshot saw, for its watermark strategy; ``error``: the one-line error that failed it;
    ``pid``: the process that ran it (the log says where chunks were selected); ``absent``: the
    keys a key-list chunk asked for that the SELECT did not find (typed as asked).
    """

    count: int = 0
    last_key: list[Any] | None = None
    key_span: list[Any] | None = None
    info: Any = None
    error: tuple[str, str] | None = None  # the error's class name and its one line
    pid: int = 0
    absent: tuple[Key, ...] = ()
    typed: tuple[tuple[str, str], ...] = ()


class Covered(NamedTuple):
    """The keys a range chunk's SELECT read all of: ``(lower, upper]`` in the source's order.

    ``lower`` None: from the table's first key (the table's first chunk). ``upper``: the last
    row's key when the page filled before the chunk's bound (the rest became a chunk of its
    own), else the bound. ``last``: the table's last chunk, whose bound is the largest key the
    stream read before the dump began; keys above it count as covered too, with
    ``bound_position`` the log position the bound was read at (None: not recorded).
    """

    lower: list[Any] | None
    upper: list[Any]
    last: bool = False
    bound_position: str | None = None


class ChunkRows(NamedTuple):
    """Where a selected chunk's rows are, as the merge passes them on (``DumpedRows.rows``),
    which keys it covered (a range chunk; None for a key list) and which columns it holds
    typed."""

    folder: str
    key_span: list[Any] | None
    covers: Covered | None = None
    typed: tuple[tuple[str, str], ...] = ()


def span(bounds: list[Any] | None, value: Any) -> list[Any] | None:
    """``[lowest, highest]`` grown by ``value``; None once a value is not an int or a string.

    Only those compare in Python as Spark compares them (decimals and times are text there).
    """
    if bounds is None or type(value) not in (int, str):
        return None
    if not bounds:
        return [value, value]
    if not isinstance(value, type(bounds[0])):
        return None
    return [min(bounds[0], value), max(bounds[1], value)]


def _bounds(values: list[Any]) -> list[Any] | None:
    """``span`` of all ``values`` at once."""
    kinds = set(map(type, values))
    if len(kinds) != 1 or not kinds <= {int, str}:
        return None
    return [min(values), max(values)]


def typed_name(index: int) -> str:
    """The chunk file's column of the ``index``-th typed column."""
    return f"v{index}"


def encode_rows(
    chunk_id: int,
    rows: Rows,
    info: Any = None,
    asked: Sequence[Key] | None = None,
    typed: Sequence[tuple[str, str]] = (),
) -> tuple[pa.Table, ChunkSelected]:
    """The chunk file's table for rows in SELECT order, and what the driver is told of them
    (``asked``: a key-list chunk's keys, of which those not selected are reported absent;
    ``typed``: the columns, name and stored type, to write typed too)."""
    import pyarrow as pa

    keys: list[str] = []
    mkeys: list[str] = []
    afters: list[str] = []
    images: list[Row] = []
    heads: list[Any] = []
    last: Sequence[Any] | None = None
    for key, row in rows:
        head = key[0]
        if len(key) == 1 and type(head) is int:  # the usual key: its match text is its text
            text = mtext = f"[{head}]"
        else:
            text = key_text(key)
            mtext = text if all(type(v) is int for v in key) else match_key(key)
        keys.append(text)
        mkeys.append(mtext)
        afters.append(row_text(row))
        images.append(row)
        heads.append(head)
        last = key
    first = _bounds(heads)
    n = len(keys)
    table = pa.Table.from_arrays(
        [
            pa.array([chunk_id] * n, pa.int64()),
            pa.array(range(n), pa.int64()),
            pa.array(keys, pa.string()),
            pa.array(mkeys, pa.string()),
            pa.array(afters, pa.string()),
        ],
        schema=arrow_schema(),
    )
    arrays = typed_arrays(images, typed) if typed and n else None
    if arrays is not None:
        for index, array in enumerate(arrays):
            table = table.append_column(typed_name(index), array)
    last_key = None if last is None else to_json(last)
    absent: tuple[Key, ...] = ()
    if asked is not None:  # a key-list chunk: a range chunk asks for no keys
        found = set(mkeys)
        absent = tuple(tuple(k) for k in asked if match_key(k) not in found)
    written = tuple(typed) if arrays is not None else ()
    return table, ChunkSelected(
        n, last_key, first or None, info, pid=os.getpid(), absent=absent, typed=written
    )


def parquet_bytes(table: pa.Table) -> bytes:
    import pyarrow.parquet as pq

    out = io.BytesIO()
    # every text is distinct (keys, row images): a dictionary page costs time and bytes
    pq.write_table(table, out, compression="zstd", use_dictionary=False)
    return out.getvalue()


@dataclass(frozen=True)
class ChunkRef:
    """A closed chunk as the spool holds it, in the place its rows belong among the events."""

    table: str
    chunk_id: int
    dump_id: int
    folder: str  # under <checkpoint>/chunks
    position: str  # the base: row idx goes at Position(base).dumped_row(first + idx)
    first: int
    selected: int
    drops: tuple[int, ...]  # idx of rows whose key changed inside the window
    ts_ms: int
    key_span: list[Any] | None = None
    extra: dict[str, Any] = field(default_factory=dict, compare=False)
    deleted: int = 0  # keys asked for and not found: deletes right after the chunk's rows
    # a range chunk: where its window began (position text), the keys it covered as
    # [lower or None, upper] (JSON values, see Covered) and, for a table's last chunk, the
    # position below which a key above ``upper`` the lake holds was not in the source either.
    # Empty/None in key-list chunks and in records written before these fields existed.
    low: str = ""
    covers: list[Any] | None = None
    beyond: str = ""
    # a verify dump's chunk (its mode): its rows are compared with the lake, not written, and
    # the keys it asked for that the source lacks (``absent``, JSON values) are not deleted
    verify: str = ""
    absent: list[list[Any]] = field(default_factory=list)
    # the columns (name, stored type) its file holds typed, as ``v0``, ``v1``, ...; empty: the
    # rows' JSON alone (a stream without Delta, a value with no typed form, an older record)
    typed: list[list[str]] = field(default_factory=list)

    @property
    def checks_extras(self) -> bool:
        """Whether the lake's keys in this chunk's range can be compared with its rows: a range
        chunk whose window's beginning is known."""
        return self.covers is not None and bool(self.low)

    @property
    def compared(self) -> int:
        """The chunk's rows that stand for the source as of its window: all but those whose key
        the log changed inside it."""
        return self.selected - len(self.drops)

    @property
    def emitted(self) -> int:
        """The chunk's rows in the output (its deletes are events of their own in the spool)."""
        return 0 if self.verify else self.compared

    def record(self) -> str:
        """As the spool stores it (JSON)."""
        record = asdict(self)
        record.pop("extra")
        record["drops"] = list(self.drops)
        return json.dumps(record, separators=(",", ":"))

    @classmethod
    def from_record(cls, record: dict[str, Any]) -> ChunkRef:
        return cls(**{**record, "drops": tuple(record["drops"])})

    def position_prefix(self) -> str:
        """A dumped row's position text is this prefix and its 20-digit last coordinate."""
        return self.position[:-POSITION_DIGITS]

    def row_position(self, idx: int) -> str:
        return f"{self.position_prefix()}{1 + self.first + idx:0{POSITION_DIGITS}d}"

    def closed_record(self) -> dict[str, Any]:
        """What the stream records of the chunk once every sink holds it."""
        return {
            "chunk_id": self.chunk_id,
            "selected": self.selected,
            "dropped": len(self.drops),
            "emitted": self.emitted + self.deleted,
        }

    def texts(self, files: ChunkFiles) -> Iterator[EventText]:
        """The chunk's ``op="r"`` events, read from its folder in batches (Kafka's forwarder)."""
        drops = set(self.drops)
        ts_ms, dump_id, chunk_id = str(self.ts_ms), str(self.dump_id), str(self.chunk_id)
        for batch in files.batches(self.folder, ("idx", "key", "after")):
            idxs, keys, afters = (batch.column(i).to_pylist() for i in range(3))
            for idx, key, after in zip(idxs, keys, afters, strict=True):
                if idx in drops:
                    continue
                yield EventText(
                    self.table, "r", key, self.row_position(idx), "null", after, ts_ms,
                    dump_id, chunk_id, "[]", "{}",
                )  # fmt: skip


class ChunkFiles:
    """The chunk folders under ``<checkpoint>/chunks`` as the driver sees them (``pyarrow.fs``:
    a local directory, S3 with the stream's endpoint and the driver's credentials, ...)."""

    def __init__(self, location: str, conf: Mapping[str, str] | None = None) -> None:
        self.location = location.rstrip("/") if is_uri(location) else location
        self._conf = dict(conf or {})
        self._fs: Any = None
        self._root = ""

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_fs": None}  # another process opens its own filesystem

    @property
    def fs(self) -> Any:
        if self._fs is None:
            self._fs, self._root = arrow_filesystem(self.location, self._conf)
            self._fs.create_dir(self._root, recursive=True)
        return self._fs

    def _path(self, *parts: str) -> str:
        _ = self.fs
        return "/".join([self._root, *parts])

    @staticmethod
    def new_folder(chunk_id: int) -> str:
        """A folder name for one SELECT of a chunk (a chunk selected again gets another)."""
        return f"{chunk_id:012d}-{uuid.uuid4().hex[:12]}"

    @staticmethod
    def chunk_of(folder: str) -> int | None:
        head = folder.partition("-")[0]
        return int(head) if head.isdigit() else None

    def uri(self, folder: str) -> str:
        """The folder as Spark's filesystem layer names it (what executors read and write)."""
        if is_uri(self.location):
            return join(self.location, folder)
        from pathlib import Path

        return Path(join(self.location, folder)).resolve().as_uri()

    def for_tasks(self) -> ChunkFiles:
        """These folders as a Spark task on another machine opens them: with the store's
        endpoint and credentials the driver uses (:func:`task_conf`), nothing else of its conf."""
        return ChunkFiles(self.location, task_conf(self._conf))

    def write(self, folder: str, table: pa.Table) -> None:
        """One Parquet file, whole or not at all (one PUT on an object store; locally a
        staged file moved into place)."""
        if is_uri(self.location):
            self._put(folder, _PART, table)
        else:
            self.publish(folder, self.stage(folder, table))

    def stage(self, folder: str, table: pa.Table) -> str:
        """Write the table into ``folder`` under a hidden name of its own, which no reader
        reads until :meth:`publish` moves it into place; returns the name.

        A Spark task stages and the driver publishes the attempt whose result it got: an
        attempt Spark gave up on that still runs somewhere writes only a file nobody reads.
        """
        name = f".{uuid.uuid4().hex}.parquet.staged"
        self._put(folder, name, table)
        return name

    def publish(self, folder: str, staged: str) -> None:
        self.fs.move(self._path(folder, staged), self._path(folder, _PART))

    def _put(self, folder: str, name: str, table: pa.Table) -> None:
        self.fs.create_dir(self._path(folder), recursive=True)
        with self.fs.open_output_stream(self._path(folder, name)) as out:
            out.write(parquet_bytes(table))

    def files(self, folder: str) -> list[str]:
        """The folder's Parquet files (Spark's ``_SUCCESS`` and hidden files left out)."""
        from pyarrow import fs

        try:
            infos = self.fs.get_file_info(fs.FileSelector(self._path(folder)))
        except FileNotFoundError:
            raise DblogError(
                f"chunk folder {folder} is missing from {self.location}",
                "the checkpoint lost files the spool still refers to: restore it, or start a"
                " new stream with a full dump",
            ) from None
        return sorted(
            info.path
            for info in infos
            if info.type == fs.FileType.File
            and info.base_name.endswith(".parquet")
            and not info.base_name.startswith(("_", "."))
        )

    def batches(self, folder: str, columns: Sequence[str]) -> Iterator[pa.RecordBatch]:
        import pyarrow.parquet as pq

        for path in self.files(folder):
            with self.fs.open_input_file(path) as src:
                yield from pq.ParquetFile(src).iter_batches(_BATCH_ROWS, columns=list(columns))

    def dropped(self, folder: str, changed: Iterable[Key]) -> tuple[int, ...]:
        """``idx`` of the folder's rows whose key is among ``changed`` (read only if any)."""
        wanted = {match_key(k) for k in changed}
        if not wanted:
            return ()
        out: list[int] = []
        for batch in self.batches(folder, ("idx", "mkey")):
            idxs, mkeys = batch.column(0).to_pylist(), batch.column(1).to_pylist()
            out.extend(i for i, m in zip(idxs, mkeys, strict=True) if m in wanted)
        return tuple(sorted(out))

    def folders(self) -> list[str]:
        from pyarrow import fs

        infos = self.fs.get_file_info(fs.FileSelector(self._root, allow_not_found=True))
        return sorted(i.base_name for i in infos if i.type == fs.FileType.Directory)

    def delete(self, folder: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            self.fs.delete_dir(self._path(folder))

    def delete_except(self, keep: Iterable[str]) -> int:
        """Delete every folder not in ``keep`` (chunks selected before a crash, never closed);
        returns how many went.

        A task of the crashed run may still be writing into its folder (a cluster's executors
        outlive their driver for a while), and a store with real directories then refuses to
        delete it. Such a folder is left for the next start: each selection of a chunk writes
        a folder of its own, so nothing reads it again.
        """
        kept = set(keep)
        deleted = 0
        for folder in (f for f in self.folders() if f not in kept):
            try:
                self.delete(folder)
            except OSError as err:
                log.warning("chunk files %s left for the next start: %s", folder, err)
                continue
            deleted += 1
        return deleted
