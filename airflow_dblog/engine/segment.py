"""One spool segment: a Parquet file of a merged batch, its events and chunk references in
order, then its footer.

Each row is an event (the :class:`~airflow_dblog.engine.event_text.EventText` fields, typed:
times and ids as integers, an absent image as null), a chunk reference (``record``: a
:class:`~airflow_dblog.engine.chunk_file.ChunkRef`, where the chunk's rows belong), or the
footer (``record``: the reader offset after the batch, the chunks it closed, what it holds),
which is also the file's key-value metadata so the driver reads it without the rows. Spark
reads segments as Parquet on the executors (no JSON to parse but the row images); the Kafka
forwarder reads them with pyarrow. A file is written once and never changed, so a batch read
again after a crash is the same bytes.

Segments of versions before 0.3 were JSON lines (``.jsonl``): :func:`decode_legacy` reads them,
so a stream restarted on an older checkpoint converts what its sinks did not yet hold.
"""

from __future__ import annotations

import io
import json
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, BinaryIO, NamedTuple

from airflow_dblog.engine.chunk_file import ChunkRef, span
from airflow_dblog.engine.event_text import EventText, encode_json

if TYPE_CHECKING:
    import pyarrow as pa

SUFFIX = ".parquet"
LEGACY_SUFFIX = ".jsonl"
FOOTER_KEY = b"dblog.footer"
SPARK_DDL = (
    "kind STRING, table STRING, op STRING, key STRING, position STRING, before STRING,"
    " after STRING, ts_ms BIGINT, dump_id BIGINT, chunk_id BIGINT, unavailable ARRAY<STRING>,"
    " source STRING, record STRING"
)
EVENT_COLUMNS = (
    "table", "op", "key", "position", "before", "after", "ts_ms", "dump_id", "chunk_id",
    "unavailable", "source",
)  # fmt: skip

Item = EventText | ChunkRef
Footer = dict[str, Any]


class Segment(NamedTuple):
    items: list[Item]  # events, and chunk references where their rows belong
    footer: Footer


def arrow_schema() -> pa.Schema:
    import pyarrow as pa

    text, number = pa.string(), pa.int64()
    return pa.schema(
        [
            pa.field("kind", text, nullable=False),  # event, chunk, footer
            *(pa.field(name, text) for name in ("table", "op", "key", "position")),
            pa.field("before", text),
            pa.field("after", text),
            pa.field("ts_ms", number),
            pa.field("dump_id", number),
            pa.field("chunk_id", number),
            pa.field("unavailable", pa.list_(text)),
            pa.field("source", text),
            pa.field("record", text),
        ]
    )


def summarize(
    seq: int,
    items: Sequence[Item],
    footer: Footer,
    log_keys: Mapping[str, list[Any] | None] | None = None,
) -> Footer:
    """The footer as written: the caller's part and what the segment holds (``log_keys``: the
    first key column's [lowest, highest] of each table's log events, None where unordered)."""
    tables: set[str] = set()
    logged: set[str] = set()
    dumped: dict[str, list[Any] | None] = {}  # table -> first key column's [lowest, highest]
    events = dumped_rows = 0
    for item in items:
        if isinstance(item, ChunkRef):
            if item.emitted:
                tables.add(item.table)
                bounds = dumped.get(item.table, [])
                for value in item.key_span or [None]:  # None: no usable order
                    bounds = span(bounds, value)
                dumped[item.table] = bounds
                dumped_rows += item.emitted
        else:
            tables.add(item.table)
            logged.add(item.table)
            events += 1
    return {
        **footer,
        "seq": seq,
        "events": events + dumped_rows,
        "dumped": dumped_rows,
        "tables": sorted(tables),
        "logged": sorted(logged),
        "dump_keys": dumped,
        "log_keys": {t: (log_keys or {}).get(t) for t in sorted(logged)},
        "chunk_folders": [i.folder for i in items if isinstance(i, ChunkRef) and i.folder],
    }


def _number(text: str) -> int | None:
    return None if text == "null" else int(text)


def encode(items: Sequence[Item], footer: Footer) -> bytes:
    """The segment's bytes, written in one piece (one PUT on an object store)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    columns: dict[str, list[Any]] = {name: [] for name in arrow_schema().names}
    record = json.dumps(footer)
    rows: Iterable[Item | None] = [*items, None]  # None: the footer
    for item in rows:
        event = item if isinstance(item, EventText) else None
        columns["kind"].append("event" if event else "chunk" if item else "footer")
        for name in ("table", "op", "key", "position", "source"):
            columns[name].append(getattr(event, name) if event else None)
        for name in ("before", "after"):
            value = getattr(event, name) if event else "null"
            columns[name].append(None if value == "null" else value)
        for name in ("ts_ms", "dump_id", "chunk_id"):
            columns[name].append(_number(getattr(event, name)) if event else None)
        unavailable = event.unavailable if event else "[]"
        columns["unavailable"].append(None if unavailable == "[]" else json.loads(unavailable))
        columns["record"].append(
            None if event else item.record() if isinstance(item, ChunkRef) else record
        )
    table = pa.Table.from_pydict(columns, schema=arrow_schema())
    table = table.replace_schema_metadata({FOOTER_KEY: record.encode("utf-8")})
    out = io.BytesIO()
    pq.write_table(table, out, compression="zstd")
    return out.getvalue()


def decode(source: bytes | BinaryIO) -> Segment:
    import pyarrow.parquet as pq

    data = pq.read_table(io.BytesIO(source) if isinstance(source, bytes) else source)
    columns = {name: data.column(name).to_pylist() for name in data.column_names}
    items: list[Item] = []
    footer: Footer = {}
    for i, kind in enumerate(columns["kind"]):
        if kind == "footer":
            footer = json.loads(columns["record"][i])
        elif kind == "chunk":
            items.append(ChunkRef.from_record(json.loads(columns["record"][i])))
        else:
            unavailable = columns["unavailable"][i]
            items.append(
                EventText(
                    columns["table"][i],
                    columns["op"][i],
                    columns["key"][i],
                    columns["position"][i],
                    columns["before"][i] or "null",
                    columns["after"][i] or "null",
                    *(_text(columns[name][i]) for name in ("ts_ms", "dump_id", "chunk_id")),
                    encode_json(unavailable) if unavailable else "[]",
                    columns["source"][i],
                )
            )
    return Segment(items, footer)


def _text(value: int | None) -> str:
    return "null" if value is None else str(value)


def read_footer(source: BinaryIO) -> Footer:
    """The footer from the file's metadata: its last bytes, not its rows."""
    import pyarrow.parquet as pq

    metadata = pq.read_schema(source).metadata or {}
    footer: Footer = json.loads(metadata[FOOTER_KEY])
    return footer


def decode_legacy(data: bytes) -> Segment:
    """A JSON-lines segment of a version before 0.3: events (dumped rows among them, inline),
    then ``{"footer": ...}``."""
    items: list[Item] = []
    footer: Footer = {}
    for line in data.decode("utf-8").removesuffix("\n").split("\n"):
        if line.startswith('{"footer"'):
            footer = json.loads(line)["footer"]
        elif line.startswith('{"chunk"'):  # development builds between 0.2 and 0.3
            items.append(ChunkRef.from_record(json.loads(line)["chunk"]))
        else:
            items.append(EventText.parse(line))
    return Segment(items, footer)
