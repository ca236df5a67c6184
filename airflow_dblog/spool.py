"""The durable changelog between the capture thread and Spark: numbered JSON-lines segments.

The capture thread writes each merged batch as one segment ``<seq>.jsonl`` under
``<checkpoint>/spool``: one line per change event, then a footer line with the reader offset
after the batch and the chunks the batch closed. A segment appears atomically (written to a
temporary name, fsynced, renamed), so Spark's source sees whole segments only and a batch it
planned before a crash reads back byte for byte the same after a restart. Spark's offsets are
segment numbers; segments are deleted once Spark has committed the batch that read them.

Values are written as plain JSON a consumer can use without this package: decimals, UUIDs and
times as text, bytes as base64, JSON columns as their text.
"""

from __future__ import annotations

import base64
import datetime as dt
import decimal
import errno
import json
import os
import uuid
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from airflow_dblog.errors import DblogError
from airflow_dblog.events import ChangeEvent, Row
from airflow_dblog.merge import ClosedChunk

_SUFFIX = ".jsonl"
_WIDTH = 12


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


def event_record(event: ChangeEvent) -> dict[str, Any]:
    """One event as the spool (and the Spark frame built from it) carries it."""
    source: dict[str, Any] = {}
    if event.gtid is not None:
        source["gtid"] = event.gtid
    if event.xid is not None:
        source["xid"] = event.xid
    source.update({k: v for k, v in event.extra.items() if k != "unavailable_columns"})
    return {
        "table": str(event.table),
        "op": event.op,
        "key": _encode([plain_value(v) for v in event.key]),
        "position": str(event.position),
        "before": plain_row(event.before),
        "after": plain_row(event.after),
        "ts_ms": event.ts_ms,
        "dump_id": event.dump_id,
        "chunk_id": event.chunk_id,
        "unavailable": event.extra.get("unavailable_columns") or [],
        "source": source,
    }


def closed_record(chunk: ClosedChunk) -> dict[str, Any]:
    return {
        "chunk_id": chunk.chunk_id,
        "selected": chunk.selected,
        "dropped": chunk.dropped,
        "emitted": chunk.emitted,
    }


class Spool:
    def __init__(self, directory: str | os.PathLike[str]) -> None:
        self.dir = Path(directory)
        self.dir.mkdir(parents=True, exist_ok=True)

    def path(self, seq: int) -> Path:
        return self.dir / f"{seq:0{_WIDTH}d}{_SUFFIX}"

    def segments(self) -> list[int]:
        """Sequence numbers of the complete segments, ascending."""
        return sorted(
            int(p.name[: -len(_SUFFIX)])
            for p in self.dir.glob(f"*{_SUFFIX}")
            if p.name[: -len(_SUFFIX)].isdigit()
        )

    def size(self, seq: int) -> int:
        """The segment's bytes."""
        return self.path(seq).stat().st_size

    def end(self) -> int:
        """One past the last segment: the next segment's number."""
        seqs = self.segments()
        return seqs[-1] + 1 if seqs else 0

    def append(self, events: Sequence[ChangeEvent], footer: dict[str, Any]) -> int:
        seq = self.end()
        tmp = self.dir / f".{seq}.{os.getpid()}.tmp"
        try:
            self._write(tmp, seq, events, footer)
        except OSError as err:
            tmp.unlink(missing_ok=True)
            if err.errno in (errno.ENOSPC, errno.EDQUOT):
                raise DblogError(
                    f"the checkpoint disk is full: no space for spool segment {seq} in {self.dir}",
                    "free space or move checkpoint to a larger disk, then start the stream"
                    " again: it resumes where it stopped",
                ) from None
            raise DblogError(
                f"cannot write spool segment {seq} in {self.dir}: {err.strerror}",
                "check the checkpoint directory's permissions and disk",
            ) from None
        try:  # link, not replace: a segment is never overwritten, even by a second writer
            os.link(tmp, self.path(seq))
        except FileExistsError:
            raise DblogError(
                f"spool segment {seq} in {self.dir} was written by another process",
                "run one stream process per checkpoint directory (standbys need ha.zookeeper)",
            ) from None
        finally:
            tmp.unlink()
        _fsync_dir(self.dir)
        return seq

    @staticmethod
    def _write(tmp: Path, seq: int, events: Sequence[ChangeEvent], footer: dict[str, Any]) -> None:
        tables: set[str] = set()
        logged: set[str] = set()
        dumped: dict[str, list[Any] | None] = {}  # table -> first key column's [lowest, highest]
        with open(tmp, "w", encoding="utf-8") as out:
            for event in events:
                out.write(_encode(event_record(event)))
                out.write("\n")
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
            out.write(json.dumps({"footer": {**footer, **summary}}))
            out.write("\n")
            out.flush()
            os.fsync(out.fileno())

    def lines(self, seq: int) -> Iterator[str]:
        """The segment's raw lines: events, then the footer last."""
        with open(self.path(seq), encoding="utf-8") as src:
            for line in src:
                yield line.rstrip("\n")

    def footer(self, seq: int) -> dict[str, Any]:
        last = ""
        for last in self.lines(seq):  # noqa: B007 - only the last line is the footer
            pass
        return dict(json.loads(last)["footer"])

    def drop_before(self, seq: int) -> int:
        """Delete segments numbered below ``seq`` (Spark committed the batches that read them)."""
        dropped = 0
        for old in self.segments():
            if old >= seq:
                break
            self.path(old).unlink(missing_ok=True)
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
    """Tables whose events in these segments are all dumped rows, with their first key's range.

    A segment from before footers said so counts as having log events.
    """
    logged = {t for f in footers for t in f.get("logged", f["tables"])}
    spans: dict[str, list[Any] | None] = {}
    for footer in footers:
        for table, span in footer.get("dump_keys", {}).items():
            if table not in logged:
                for value in span or [None]:  # None: this table's keys have no usable order
                    spans[table] = _span(spans.get(table, []), value)
    return {table: (span[0], span[1]) for table, span in spans.items() if span}


def is_footer(line: str) -> bool:
    return line.startswith('{"footer"')


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
