"""The durable changelog between the capture thread and Spark: numbered JSON-lines segments.

The capture thread writes each merged batch as one segment ``<seq>.jsonl`` under
``<checkpoint>/spool``, wherever the checkpoint is (a local directory or any Hadoop-compatible or
object store, see :mod:`~airflow_dblog.engine.spool_store`): one line per change event, then a
footer line with the reader offset after the batch and the chunks the batch closed. A segment
appears whole or not at all (locally: temporary name, fsync, link; on an object store: one PUT),
so Spark sees whole segments only and a batch it planned before a crash reads back byte for byte
the same after a restart. Spark's offsets are segment numbers; Spark's executors read the
segments through Hadoop's filesystem, never from the driver. Segments are deleted once every
sink holds them.

Values are written as plain JSON a consumer can use without this package: decimals, UUIDs and
times as text, bytes as base64, JSON columns as their text.
"""

from __future__ import annotations

import base64
import collections
import datetime as dt
import decimal
import errno
import json
import os
import threading
import uuid
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, NamedTuple

from airflow_dblog.core.events import ChangeEvent, Row
from airflow_dblog.core.merge import ClosedChunk
from airflow_dblog.engine.spool_store import Entry, open_store
from airflow_dblog.errors import DblogError

_SUFFIX = ".jsonl"
_WIDTH = 12
_HEAD_BYTES = 4096  # a heartbeat segment (its footer alone) fits in this


def plain_value(value: Any) -> Any:
    """A column value as plain JSON (what Delta and Kafka consumers receive)."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, (decimal.Decimal, uuid.UUID)):
        return str(value)
    if isinstance(value, (dt.datetime, dt.date, dt.time)):
        return value.isoformat()
    if isinstance(value, dt.timedelta):
        return value.total_seconds()
    if isinstance(value, (bytes, bytearray, memoryview)):
        return base64.b64encode(bytes(value)).decode("ascii")
    if isinstance(value, (dict, list, tuple)):
        return json.dumps(value, default=plain_value, separators=(",", ":"))
    return str(value)


_PLAIN_TYPES = frozenset({str, int, float, bool, type(None)})
_encode = json.JSONEncoder(separators=(",", ":")).encode  # one encoder, not one per call


def plain_row(row: Row | None) -> dict[str, Any] | None:
    if row is None:
        return None
    return {k: v if type(v) in _PLAIN_TYPES else plain_value(v) for k, v in row.items()}


def _int_text(value: int | None) -> str:
    return "null" if value is None else str(int(value))


class EventText(NamedTuple):
    """One event with each field already JSON text: the spool line and the Kafka message are
    both concatenated from it, so a row image is encoded once for both."""

    table: str
    op: str
    key: str  # the key values as a JSON array
    position: str
    before: str  # a JSON object, or null
    after: str
    ts_ms: str
    dump_id: str
    chunk_id: str
    unavailable: str
    source: str  # the reader's own fields (gtid, xid, pk_change) as a JSON object

    @classmethod
    def of(cls, event: ChangeEvent) -> EventText:
        extra = event.extra
        if event.gtid is None and event.xid is None and not extra:
            source = "{}"  # dumped rows, and most log events of a reader without extras
        else:
            fields: dict[str, Any] = {}
            if event.gtid is not None:
                fields["gtid"] = event.gtid
            if event.xid is not None:
                fields["xid"] = event.xid
            fields.update({k: v for k, v in extra.items() if k != "unavailable_columns"})
            source = _encode(fields)
        unavailable = extra.get("unavailable_columns") if extra else None
        return cls(
            str(event.table),
            event.op,
            _encode([plain_value(v) for v in event.key]),
            str(event.position),
            "null" if event.before is None else _encode(plain_row(event.before)),
            "null" if event.after is None else _encode(plain_row(event.after)),
            _int_text(event.ts_ms),
            _int_text(event.dump_id),
            _int_text(event.chunk_id),
            _encode(unavailable) if unavailable else "[]",
            source,
        )

    @classmethod
    def parse(cls, line: str) -> EventText:
        """From a spool line (a restart: the segment is no longer in memory)."""
        record = json.loads(line)
        return cls(
            record["table"],
            record["op"],
            record["key"],
            record["position"],
            *(
                _encode(record[field])
                for field in ("before", "after", "ts_ms", "dump_id", "chunk_id", "unavailable")
            ),
            _encode(record["source"]),
        )

    def line(self) -> str:
        """The spool's line: a flat JSON object, the key array as a string."""
        return "".join(
            (
                '{"table":',
                _encode(self.table),
                ',"op":"',
                self.op,
                '","key":',
                _encode(self.key),
                ',"position":',
                _encode(self.position),
                ',"before":',
                self.before,
                ',"after":',
                self.after,
                ',"ts_ms":',
                self.ts_ms,
                ',"dump_id":',
                self.dump_id,
                ',"chunk_id":',
                self.chunk_id,
                ',"unavailable":',
                self.unavailable,
                ',"source":',
                self.source,
                "}",
            )
        )


def closed_record(chunk: ClosedChunk) -> dict[str, Any]:
    return {
        "chunk_id": chunk.chunk_id,
        "selected": chunk.selected,
        "dropped": chunk.dropped,
        "emitted": chunk.emitted,
    }


class Segment(NamedTuple):
    events: list[EventText]
    footer: dict[str, Any]


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
        self.appended = threading.Event()  # set by each append: wakes a follower at once
        self._remember = remember_events
        self._recent: collections.OrderedDict[int, Segment] = collections.OrderedDict()
        self._recent_events = 0
        self._lock = threading.Lock()
        self._next: int | None = None  # the writer's own numbering (see continue_after)

    @staticmethod
    def name(seq: int) -> str:
        return f"{seq:0{_WIDTH}d}{_SUFFIX}"

    def uri(self, seq: int) -> str:
        """The segment as Spark's filesystem layer names it (what executors read)."""
        return self.store.uri(self.name(seq))

    def entries(self) -> dict[int, Entry]:
        """The complete segments by number: their size and modification time."""
        out = {}
        for entry in self.store.list(_SUFFIX):
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

    def append(self, events: Sequence[ChangeEvent], footer: dict[str, Any]) -> int:
        seq = self.end() if self._next is None else self._next
        texts = [EventText.of(event) for event in events]
        data, footer = self._encode(seq, events, texts, footer)
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
        if self._next is not None:
            self._next = seq + 1
        if self._remember:
            with self._lock:
                self._recent[seq] = Segment(texts, footer)
                self._recent_events += len(texts)
                while self._recent_events > self._remember and len(self._recent) > 1:
                    self._forget(next(iter(self._recent)))
        self.appended.set()
        return seq

    def read(self, seq: int) -> Segment:
        """A segment's events and footer; from memory, once, if this process wrote it lately."""
        with self._lock:
            segment = self._forget(seq)
        if segment is not None:
            return segment
        events, footer = [], {}
        for line in self.lines(seq):
            if is_footer(line):
                footer = json.loads(line)["footer"]
            else:
                events.append(EventText.parse(line))
        return Segment(events, footer)

    def _forget(self, seq: int) -> Segment | None:
        """Take a remembered segment out of memory (under the lock)."""
        segment = self._recent.pop(seq, None)
        if segment is not None:
            self._recent_events -= len(segment.events)
        return segment

    @staticmethod
    def _encode(
        seq: int,
        events: Sequence[ChangeEvent],
        texts: Sequence[EventText],
        footer: dict[str, Any],
    ) -> tuple[bytes, dict[str, Any]]:
        """The segment's bytes (written in one piece: one PUT on an object store) and its
        footer as written."""
        tables: set[str] = set()
        logged: set[str] = set()
        dumped: dict[str, list[Any] | None] = {}  # table -> first key column's [lowest, highest]
        out: list[str] = []
        for event, text in zip(events, texts, strict=True):
            out.append(text.line())
            table = str(event.table)
            tables.add(table)
            if event.chunk_id is None:
                logged.add(table)
            else:
                dumped[table] = _span(dumped.get(table, []), event.key[0])
        summary = {
            "seq": seq,
            "events": len(events),
            "tables": sorted(tables),
            "logged": sorted(logged),
            "dump_keys": dumped,
        }
        footer = {**footer, **summary}
        out.append(json.dumps({"footer": footer}))
        out.append("")
        return "\n".join(out).encode("utf-8"), footer

    def lines(self, seq: int) -> Iterator[str]:
        """The segment's raw lines: events, then the footer last."""
        text = self.store.read(self.name(seq)).decode("utf-8")
        yield from text.removesuffix("\n").split("\n")

    def footer(self, seq: int) -> dict[str, Any]:
        last = ""
        for last in self.lines(seq):  # noqa: B007 - only the last line is the footer
            pass
        return dict(json.loads(last)["footer"])

    def heartbeat_only(self, seq: int) -> bool:
        """The segment holds no event and closes no chunk: it only moves the reader offset.

        Reads the head only (a segment without events is its footer alone): this runs at
        every Delta trigger, on segments of megabytes.
        """
        head = self.store.head(self.name(seq), _HEAD_BYTES).decode("utf-8", "replace")
        if not is_footer(head):
            return False
        first, newline, _ = head.partition("\n")
        if not newline:  # a footer longer than the head (many chunks closed): read it all
            first = next(iter(self.lines(seq)))
        return not json.loads(first)["footer"]["closed"]

    def drop_before(self, seq: int) -> int:
        """Delete segments numbered below ``seq`` (every sink holds the batches that read them)."""
        with self._lock:
            while self._recent and next(iter(self._recent)) < seq:
                self._forget(next(iter(self._recent)))
        dropped = 0
        for old in self.segments():
            if old >= seq:
                break
            self.store.delete(self.name(old))
            dropped += 1
        return dropped


def _span(bounds: list[Any] | None, value: Any) -> list[Any] | None:
    """``[lowest, highest]`` grown by ``value``; None once a value is not an int or a string.

    Only those compare in Python as Spark compares them (decimals and times are text here).
    """
    if bounds is None or type(value) not in (int, str):
        return None
    if not bounds:
        return [value, value]
    if not isinstance(value, type(bounds[0])):
        return None
    return [min(bounds[0], value), max(bounds[1], value)]


def dump_bounds(footers: Sequence[dict[str, Any]]) -> dict[str, tuple[Any, Any]]:
    """Tables with dumped rows in these segments, with the range of those rows' first key.

    A table whose dumped keys have no order Python and Spark agree on is left out.
    """
    spans: dict[str, list[Any] | None] = {}
    for footer in footers:
        for table, span in footer.get("dump_keys", {}).items():
            for value in span or [None]:  # None: this table's keys have no usable order
                spans[table] = _span(spans.get(table, []), value)
    return {table: (span[0], span[1]) for table, span in spans.items() if span}


def logged_tables(footers: Sequence[dict[str, Any]]) -> set[str]:
    """Tables with log events in these segments (a segment from before footers said which
    counts every table it holds)."""
    return {t for f in footers for t in f.get("logged", f["tables"])}


def is_footer(line: str) -> bool:
    return line.startswith('{"footer"')
