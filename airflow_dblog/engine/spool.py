"""The durable changelog between the capture thread and Spark: numbered Parquet segments.

The capture thread writes each merged batch as one segment ``<seq>.parquet`` under
``<checkpoint>/spool``, wherever the checkpoint is (a local directory or any Hadoop-compatible or
object store, see :mod:`~airflow_dblog.engine.spool_store`): its change events and the
:class:`~airflow_dblog.engine.chunk_file.ChunkRef` of each chunk it closed, in order, and a
footer with the reader offset after the batch and the chunks it closed
(:mod:`~airflow_dblog.engine.segment`). A segment appears whole or not at all (locally:
temporary name, fsync, link; on an object store: one PUT), so Spark sees whole segments only
and a batch it planned before a crash reads back byte for byte the same after a restart.
Spark's offsets are segment numbers; Spark's executors read the segments through Hadoop's
filesystem, never from the driver. Segments, and the chunk files they refer to, are deleted
once every sink holds them.
"""

from __future__ import annotations

import collections
import errno
import json
import os
import threading
from collections.abc import Collection, Mapping, Sequence
from pathlib import Path
from typing import Any, NamedTuple

from airflow_dblog.core.events import ChangeEvent
from airflow_dblog.engine import segment
from airflow_dblog.engine.chunk_file import ChunkFiles, ChunkRef, span
from airflow_dblog.engine.event_text import EventText
from airflow_dblog.engine.segment import Item, Segment
from airflow_dblog.engine.spool_store import Entry, is_uri, open_store
from airflow_dblog.errors import DblogError

_SUFFIX = segment.SUFFIX
_WIDTH = 12


class Outline(NamedTuple):
    """What a batch needs of a segment besides its events."""

    footer: segment.Footer
    refs: list[ChunkRef]


def chunks_beside(spool: str, name: str = "chunks") -> str:
    """``<checkpoint>/<name>`` for the spool ``<checkpoint>/spool``."""
    if is_uri(spool):
        return spool.rstrip("/").rsplit("/", 1)[0] + "/" + name
    return str(Path(spool.removeprefix("file://")).parent / name)


class Spool:
    """The segments under one folder of a :mod:`~airflow_dblog.engine.spool_store` store."""

    def __init__(
        self,
        directory: str | os.PathLike[str],
        remember_events: int = 0,
        conf: Mapping[str, str] | None = None,
    ) -> None:
        """``remember_events``: keep the newest segments' events in memory, up to about this
        many, for :meth:`read` (a follower in this process then parses no file). ``conf``: the
        stream's ``spark.conf`` (an object store's endpoint)."""
        self.store = open_store(os.fspath(directory), conf)
        self.location = self.store.location
        self.chunks = ChunkFiles(chunks_beside(self.location), conf)
        # the keys of dumped tables whose key order Spark does not share (engine/dump_keys.py)
        self.dump_keys = ChunkFiles(chunks_beside(self.location, "dump-keys"), conf)
        self._folders: dict[int, list[str]] = {}  # chunk folders each segment refers to
        self.appended = threading.Event()  # set by each append: wakes a follower at once
        self._remember = remember_events
        self._recent: collections.OrderedDict[int, Segment] = collections.OrderedDict()
        self._recent_events = 0
        # the footer and chunk references of each segment this process wrote, until trimmed
        self._outlines: dict[int, Outline] = {}
        self._lock = threading.Lock()
        self._trim_lock = threading.Lock()
        self._next: int | None = None  # the writer's own numbering (see continue_after)

    @staticmethod
    def name(seq: int) -> str:
        return f"{seq:0{_WIDTH}d}{_SUFFIX}"

    def uri(self, seq: int) -> str:
        """The segment as Spark's filesystem layer names it (what executors read)."""
        return self.store.uri(self.name(seq))

    def entries(self, after: int = -1) -> dict[int, Entry]:
        """The complete segments numbered after ``after``: their size and modification time."""
        out = {}
        for entry in self.store.list(_SUFFIX, self.name(after) if after >= 0 else ""):
            stem = entry.name[: -len(_SUFFIX)]
            if stem.isdigit() and not entry.name.startswith("."):
                out[int(stem)] = entry
        return dict(sorted(out.items()))

    def segments(self) -> list[int]:
        """Sequence numbers of the complete segments, ascending."""
        return list(self.entries())

    def size(self, seq: int) -> int:
        """The segment's bytes."""
        return self.entries()[seq].size

    def end(self) -> int:
        """One past the last segment: the next segment's number."""
        seqs = self.segments()
        return seqs[-1] + 1 if seqs else 0

    def continue_after(self, seq: int | None) -> None:
        """Number the next segments from ``seq + 1`` on, whatever appears in the directory.

        The writer resumed after segment ``seq``; a segment that another process adds later
        (a deposed leader that was frozen between its fence check and its write) must stop
        this writer, not be skipped over: its events would reach the sinks twice.
        """
        self._next = 0 if seq is None else seq + 1

    def append(self, items: Sequence[ChangeEvent | ChunkRef], footer: dict[str, Any]) -> int:
        seq = self.end() if self._next is None else self._next
        texts: list[Item] = [i if isinstance(i, ChunkRef) else EventText.of(i) for i in items]
        footer = segment.summarize(seq, texts, footer, _log_keys(items))
        self._write(seq, segment.encode(texts, footer))
        if self._next is not None:
            self._next = seq + 1
        chunks = [i for i in texts if isinstance(i, ChunkRef)]
        refs = [ChunkRef.from_record(json.loads(ref.record())) for ref in chunks]
        outline = Outline(json.loads(json.dumps(footer)), refs)  # as a reader gets them
        with self._lock:
            self._folders[seq] = footer["chunk_folders"]
            self._outlines[seq] = outline
            if self._remember:
                self._recent[seq] = Segment(texts, footer)
                self._recent_events += len(texts)
                while self._recent_events > self._remember and len(self._recent) > 1:
                    self._forget(next(iter(self._recent)))
        self.appended.set()
        return seq

    def _write(self, seq: int, data: bytes) -> None:
        try:  # never overwrites: a segment is written once, by one process
            self.store.create(self.name(seq), data)
        except FileExistsError:
            raise DblogError(
                f"spool segment {seq} in {self.location} was written by another process (a"
                " second stream on this checkpoint, or a deposed leader that woke up after this"
                " one took over)",
                "run one stream process per checkpoint directory (standbys need ha.zookeeper);"
                " a restarted stream continues after that segment",
            ) from None
        except OSError as err:
            if err.errno in (errno.ENOSPC, errno.EDQUOT):
                raise DblogError(
                    f"the checkpoint disk is full: no space for spool segment {seq} in"
                    f" {self.location}",
                    "free space or move checkpoint to a larger disk, then start the stream"
                    " again: it resumes where it stopped",
                ) from None
            reason = err.strerror or str(err).strip().splitlines()[0]
            raise DblogError(
                f"cannot write spool segment {seq} in {self.location}: {reason}",
                self.store.write_hint,
            ) from None

    def convert_legacy(self) -> int:
        """Rewrite the JSON-lines segments of a version before 0.3 as Parquet, same numbers and
        events (the sinks may not hold them yet); returns how many."""
        converted = 0
        for entry in self.store.list(segment.LEGACY_SUFFIX):
            stem = entry.name[: -len(segment.LEGACY_SUFFIX)]
            if not stem.isdigit() or entry.name.startswith("."):
                continue
            seq = int(stem)
            if not self.store.exists(self.name(seq)):  # a crash may come after the write
                old = segment.decode_legacy(self.store.read(entry.name))
                folders = [i.folder for i in old.items if isinstance(i, ChunkRef) and i.folder]
                footer = {**old.footer, "chunk_folders": folders}
                self._write(seq, segment.encode(old.items, footer))
                converted += 1
            self.store.delete(entry.name)
        return converted

    def read(self, seq: int) -> Segment:
        """A segment's events and footer; from memory, once, if this process wrote it lately."""
        with self._lock:
            remembered = self._forget(seq)
        if remembered is not None:
            return remembered
        return segment.decode(self.store.read(self.name(seq)))

    def _forget(self, seq: int) -> Segment | None:
        """Take a remembered segment out of memory (under the lock)."""
        segment = self._recent.pop(seq, None)
        if segment is not None:
            self._recent_events -= len(segment.items)
        return segment

    def outlines(self, seqs: Sequence[int]) -> dict[int, Outline]:
        """The footers and chunk references of those of these segments this process wrote,
        from memory; a Delta batch reads only the others' (an earlier run's) before its rows,
        which saves a read per segment from a slow object store."""
        with self._lock:
            return {seq: self._outlines[seq] for seq in seqs if seq in self._outlines}

    def footer(self, seq: int) -> dict[str, Any]:
        with self._lock:
            outline = self._outlines.get(seq)
        if outline is not None:
            return outline.footer
        with self.store.open(self.name(seq)) as source:
            footer = segment.read_footer(source)
        with self._lock:
            self._folders[seq] = footer.get("chunk_folders", [])
        return footer

    def drop_before(self, seq: int) -> int:
        """Delete segments numbered below ``seq`` (every sink holds the batches that read
        them), and the chunk files they refer to."""
        with self._lock:
            while self._recent and next(iter(self._recent)) < seq:
                self._forget(next(iter(self._recent)))
            for old in [s for s in self._outlines if s < seq]:
                del self._outlines[old]
        dropped = 0
        with self._trim_lock:  # each sink's thread trims: one at a time
            for old in self.segments():
                if old >= seq:
                    break
                with self._lock:
                    folders = self._folders.pop(old, None)
                if folders is None:  # neither written nor read by this process: its footer says
                    folders = self.footer(old).get("chunk_folders", [])
                    with self._lock:
                        self._folders.pop(old, None)
                for folder in folders:
                    self.chunks.delete(folder)
                self.store.delete(self.name(old))
                dropped += 1
        return dropped


def _log_keys(items: Sequence[ChangeEvent | ChunkRef]) -> dict[str, list[Any] | None]:
    """Per table, the first key column's [lowest, highest] of its log events (None where Python
    and Spark may order the values differently)."""
    spans: dict[str, list[Any] | None] = {}
    for item in items:
        if isinstance(item, ChangeEvent):
            name = str(item.table)
            spans[name] = span(spans.get(name, []), item.key[0] if item.key else None)
    return spans


def dump_bounds(footers: Sequence[dict[str, Any]]) -> dict[str, tuple[Any, Any]]:
    """Tables with dumped rows in these segments, with the range of those rows' first key.

    A table whose dumped keys have no order Python and Spark agree on is left out.
    """
    return _bounds(footers, ("dump_keys",))


def row_bounds(footers: Sequence[dict[str, Any]]) -> dict[str, tuple[Any, Any]]:
    """Tables with log events in these segments, with the range of the first key of all their
    rows there, logged and dumped: what a MERGE of them may be bounded by. Left out as in
    :func:`dump_bounds`, and where a footer does not say its log events' range (one written
    before footers did)."""
    logged = logged_tables(footers)
    found = _bounds(footers, ("log_keys", "dump_keys"), unsaid="log_keys")
    return {table: bounds for table, bounds in found.items() if table in logged}


def _bounds(
    footers: Sequence[dict[str, Any]], names: Sequence[str], unsaid: str | None = None
) -> dict[str, tuple[Any, Any]]:
    spans: dict[str, list[Any] | None] = {}
    for footer in footers:
        if unsaid is not None and unsaid not in footer:
            spans.update(dict.fromkeys(logged_tables([footer])))  # no usable order
        for name in names:
            for table, bounds in footer.get(name, {}).items():
                for value in bounds or [None]:  # None: this table's keys have no usable order
                    spans[table] = span(spans.get(table, []), value)
    return {table: (b[0], b[1]) for table, b in spans.items() if b}


class DumpSpan(NamedTuple):
    """One dump's range chunks, alone in a batch's rows of their table: their ids and the range
    of the first key column they cover (None: open at that end)."""

    chunk_ids: frozenset[int]
    low: Any
    high: Any


def sole_dump_spans(refs: Sequence[ChunkRef], logged: Collection[str]) -> dict[str, DumpSpan]:
    """Tables whose rows in a batch are range chunks of one dump and nothing else: no log
    event, no key-list or verify chunk. One dump's chunks cover disjoint ranges (each is cut
    from where the last ended), so where the sink held no row in a table's span before the
    batch, the chunks' rows are all it holds there after it. Left out where a bound of the
    first key column is not an int or a string (see :func:`span`)."""
    by_table: dict[str, list[ChunkRef]] = {}
    for ref in refs:
        by_table.setdefault(ref.table, []).append(ref)
    return {
        table: found
        for table, mine in by_table.items()
        if table not in logged
        and len({r.dump_id for r in mine}) == 1
        and (found := _covered(mine)) is not None
    }


def _covered(chunks: Sequence[ChunkRef]) -> DumpSpan | None:
    """The span of range chunks (None if one is not a range chunk, or a bound has no order
    Python and Spark share)."""
    lows: list[Any] = []
    highs: list[Any] = []
    for r in chunks:
        if r.covers is None or r.verify or r.deleted:
            return None
        lower, upper = r.covers
        lows.append(lower[0] if lower else None)
        highs.append(None if r.beyond or not upper else upper[0])
    bounds: list[Any] | None = []
    for value in lows + highs:
        if value is not None:
            bounds = span(bounds, value)
    if bounds is None:
        return None
    low = None if None in lows or not bounds else bounds[0]
    high = None if None in highs or not bounds else bounds[1]
    return DumpSpan(frozenset(r.chunk_id for r in chunks), low, high)


def logged_tables(footers: Sequence[dict[str, Any]]) -> set[str]:
    """Tables with log events in these segments (a segment from before footers said which
    counts every table it holds)."""
    return {t for f in footers for t in f.get("logged", f["tables"])}
