"""Turn a dump request into metadata rows, after validating it against the source.

Nothing is written unless every table exists, is captured by the stream, has a primary key and
every given key matches that key's columns and types.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from airflow_dblog.config import Config
from airflow_dblog.core.events import TableId
from airflow_dblog.core.keys import MAX_KEYS_PER_CHUNK, to_json
from airflow_dblog.engine.configured_source import open_source
from airflow_dblog.engine.metadata import MetadataStore
from airflow_dblog.engine.metadata.dumps import TablePlan
from airflow_dblog.errors import InputError
from airflow_dblog.sources import Source

MAX_KEYS = 1_000_000


def resolve_tables(config: Config, tables: Sequence[str] | None) -> list[TableId]:
    """``None`` means every table of the stream; names must be among ``source.tables``."""
    if tables is None:
        return list(config.source.tables)
    captured = {str(t): t for t in config.source.tables}
    resolved = []
    for name in tables:
        if name not in captured:
            raise InputError(
                f"table {name!r} is not captured by stream {config.name}",
                f"choose one of {', '.join(captured)} or add it to source.tables",
            )
        resolved.append(captured[name])
    return resolved


def plan_tables(
    source: Source,
    tables: Sequence[TableId],
    keys: Sequence[Any] | None,
    chunk_size: int,
) -> list[TablePlan]:
    plans = []
    for table in tables:
        schema = source.describe(table)
        if keys is None:
            # no upper bound here: the stream reads it once its log position is durable, so a
            # row inserted between this request and the stream's start is in one or the other
            plans.append(
                TablePlan(
                    table=str(table),
                    key_columns=list(schema.key),
                    estimated_rows=source.estimate_rows(table),
                )
            )
            continue
        if len(keys) > MAX_KEYS:
            raise InputError(
                f"{len(keys)} keys in one request", f"split it into requests of <= {MAX_KEYS}"
            )
        unique: dict[tuple[Any, ...], None] = {}
        for value in keys:
            unique[tuple(source.coerce_key(table, value))] = None
        encoded = [to_json(k) for k in unique]
        per_chunk = min(chunk_size, MAX_KEYS_PER_CHUNK)  # what one chunk's SELECT accepts
        starts = range(0, len(encoded), per_chunk)
        plans.append(
            TablePlan(
                table=str(table),
                key_columns=list(schema.key),
                estimated_rows=len(encoded),
                key_chunks=[encoded[i : i + per_chunk] for i in starts],
            )
        )
    return plans


def plan_dump(
    config: Config,
    store: MetadataStore,
    tables: Sequence[str] | None = None,
    keys: Sequence[Any] | None = None,
    requested_by: str = "",
    verify: str | None = None,
) -> int:
    """Validate and record a dump of ``tables`` (all when None), or of ``keys`` of one table;
    ``verify``: a verify dump in that mode (``repair`` or ``dry-run``)."""
    if verify is not None and config.delta is None:
        raise InputError(
            "verify compares the source with the Delta tables, and this stream has no sinks.delta",
            "configure sinks.delta, or run an ordinary dump (Kafka receives every row)",
        )
    targets = resolve_tables(config, tables)
    if keys is not None and len(targets) != 1:
        raise InputError("primary keys were given for several tables", "name exactly one table")
    settings = store.controls(config.name, config.dump)
    source = open_source(config)
    try:
        plans = plan_tables(source, targets, keys, settings.chunk_size)
    finally:
        source.close()
    kind = "keys" if keys is not None else ("all" if tables is None else "tables")
    return store.create_dump(
        config.name, kind, plans, requested_by, settings.chunk_size, verify=verify
    )
