"""Delta Lake sink: the current state of every source table, one Delta table each.

Each micro-batch is applied with one MERGE per table: the batch keeps the latest position per
key, and a row is updated only if the incoming ``_dblog_position`` is newer than the stored
one, so a replayed or late event can never move a key back; a dumped row equal to the live row
Delta holds is not written again, so a re-dump changes only what differs; a batch of dumped
rows alone is bounded by its key range. A delete becomes a tombstone row
(``_dblog_deleted = true``, key columns kept, the rest null), which keeps the guard working for
that key; tombstones older than ``tombstone_retention_hours`` are removed. Every MERGE carries
Delta's idempotent-write transaction id (the stream, the leader's lease token and the batch's
last spool segment): a replayed batch commits nothing, and neither does a deposed leader once
the new one has fenced the table (:meth:`DeltaSink.fence`). Tables are created with the
change data feed on (users read it) and deletion vectors on (``deletion_vectors``): an update
then marks its old row instead of rewriting the row's whole file, which keeps a MERGE of a few
thousand random updates from rewriting the table (figures in benchmarks/README.md);
`dblog optimize` compacts what updates leave.

Column types follow the source's declared types (:func:`stored_type`); log events arrive as
the spool's plain JSON and are cast on the executors, dumped rows as their chunk files' typed
columns where those hold the table's columns as Delta stores them now, else as JSON too.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field, replace
from functools import reduce
from typing import TYPE_CHECKING, Any

from airflow_dblog.config import DeltaSinkConfig
from airflow_dblog.core.events import TableId
from airflow_dblog.engine.chunk_file import POSITION_DIGITS, ChunkFiles, ChunkRef, typed_name
from airflow_dblog.engine.chunk_file import SPARK_DDL as CHUNK_DDL
from airflow_dblog.engine.dump_keys import SPARK_DDL as DUMP_KEYS_DDL
from airflow_dblog.engine.event_text import encode_json
from airflow_dblog.engine.spool import DumpSpan
from airflow_dblog.engine.typed_values import decimal_digits, stored_columns, stored_type
from airflow_dblog.errors import DblogError, FencedError
from airflow_dblog.sinks.base import Comparison, ExtraKeys
from airflow_dblog.sinks.delta_appends import append_once
from airflow_dblog.sinks.hadoop_folders import remove_unless_holding
from airflow_dblog.sources.base import Column, TableSchema

if TYPE_CHECKING:
    from pyspark.sql import Column as SparkColumn
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.types import DataType

log = logging.getLogger(__name__)

META_COLUMNS = ("_dblog_position", "_dblog_op", "_dblog_deleted", "_dblog_ts")
_TXN_APP = "spark.databricks.delta.write.txnAppId"
_TXN_VERSION = "spark.databricks.delta.write.txnVersion"
_PURGE_EVERY_S = 3600.0
_PURGE_FIRST_S = 600.0  # not in a (re)started stream's first batches, its slowest (a cold JVM)
MERGE_ATTEMPTS = 5
_WRITTEN_RANGES = 64  # first-key ranges kept per table this process created (DeltaSink._wrote)
SEGMENT_BITS = 32  # a transaction version is (lease token << SEGMENT_BITS) | spool segment

_VERSION_FILE = re.compile(r"^\d{20}\.")  # a commit or a checkpoint in _delta_log


def spark_type(column: Column) -> DataType:
    """The Spark type a source column is stored as in Delta (:func:`stored_type`)."""
    from pyspark.sql import types as T

    stored = stored_type(column)
    if digits := decimal_digits(stored):
        return T.DecimalType(*digits)
    return {
        "bigint": T.LongType(),
        "double": T.DoubleType(),
        "boolean": T.BooleanType(),
        "date": T.DateType(),
        "timestamp": T.TimestampType(),
        "binary": T.BinaryType(),
        "string": T.StringType(),
    }[stored]


def _typed(target: DataType, value: SparkColumn) -> SparkColumn:
    """A plain JSON value (text) as the column's Spark type: bytes arrive base64-encoded; a
    float's NaN or Infinity, not JSON numbers, come out of ``from_json`` quoted."""
    from pyspark.sql import functions as F
    from pyspark.sql import types as T

    if isinstance(target, T.BinaryType):
        return F.unbase64(value)
    if isinstance(target, T.DoubleType):
        return F.translate(value, '"', "").cast(target)
    return value.cast(target)


def _concurrent_commit_errors() -> tuple[type[Exception], ...]:
    from delta.exceptions import (
        ConcurrentAppendException,
        ConcurrentDeleteDeleteException,
        ConcurrentDeleteReadException,
    )

    return ConcurrentAppendException, ConcurrentDeleteReadException, ConcurrentDeleteDeleteException


def _fenced(table: TableId, write: str) -> FencedError:
    """A deposed leader's write under way failed Delta's conflict check: the new one fenced."""
    return FencedError(
        f"another leader fenced the Delta table of {table} during this process's {write};"
        " nothing of it was committed",
        "nothing to do: this process was deposed and the new leader continues",
    )


def key_types(schema: TableSchema) -> list[DataType]:
    """The Spark types of the table's key columns, in key order."""
    columns = {c.name: c for c in schema.columns}
    return [spark_type(columns[k]) for k in schema.key]


def ordered_key(schema: TableSchema) -> bool:
    """Whether Spark orders the table's key as the source does, so that a chunk's key range
    means the same keys in Delta: integers, decimals and dates. Text sorts by the column's
    collation at the source and bytewise in Spark; floats, times and other types are left out
    too (a key range of those is not checked for keys the source lacks)."""
    from pyspark.sql import types as T

    return all(isinstance(t, (T.LongType, T.DecimalType, T.DateType)) for t in key_types(schema))


def usable_bounds(schema: TableSchema, bounds: tuple[Any, Any] | None) -> tuple[Any, Any] | None:
    """``bounds`` of the first key column if Spark compares its values as Python did when it
    found them (integers on a numeric column, text on a text column), else None: a range
    compared otherwise (``"10" < "9"``) could leave out keys Delta holds."""
    from pyspark.sql import types as T

    if bounds is None:
        return None
    target = key_types(schema)[0]
    given = [b for b in bounds if b is not None]  # None: open at that end
    if all(type(b) is int for b in given) and isinstance(target, T.NumericType):
        return bounds
    if all(type(b) is str for b in given) and isinstance(target, T.StringType):
        return bounds
    return bounds if not given else None


def _overlap(written: tuple[Any, Any], bounds: tuple[Any, Any], above: bool) -> bool:
    """Whether two ranges of the first key column share a value (None: open at that end;
    ``above``: ``bounds`` without its lower end)."""
    low, high = bounds
    if high is not None and written[0] is not None and written[0] > high:
        return False
    if low is None or written[1] is None:
        return True
    return bool(written[1] > low if above else written[1] >= low)


def _integral(target: DataType) -> bool:
    """Whether the Spark type holds whole numbers only (a decimal without scale included)."""
    from pyspark.sql import types as T

    whole_decimal = isinstance(target, T.DecimalType) and not target.scale
    return isinstance(target, T.LongType) or whole_decimal


def _key_value(target: DataType, text: str) -> Any:
    """A key value Spark gave as text, as JSON the source's ``coerce_key`` takes."""
    if _integral(target):
        return int(text)
    return text  # decimals with a scale and dates: their text, as ``to_json`` writes them


def _after(columns: Sequence[SparkColumn], types: Sequence[DataType], key: Sequence[Any]):  # type: ignore[no-untyped-def]
    """``(columns) > (key)`` in the key's order (a row-value comparison, column by column)."""
    from pyspark.sql import functions as F

    greater, equal = F.lit(False), F.lit(True)
    for column, target, value in zip(columns, types, key, strict=True):
        bound = _typed(target, F.lit(str(value)))
        greater = greater | (equal & (column > bound))
        equal = equal & (column == bound)
    return greater


def _extreme(pick: Any, target: DataType, bounds: Sequence[Sequence[Any]]) -> SparkColumn:
    """``pick`` (``least`` or ``greatest``) of the bounds' first values, typed as ``target``."""
    from pyspark.sql import functions as F

    values = [_typed(target, F.lit(str(bound[0]))) for bound in bounds]
    return values[0] if len(values) == 1 else pick(*values)


def same_values(schema: TableSchema, left: str, right: str) -> SparkColumn:
    """Whether two aliased rows hold the same values in every column but the key.

    Both sides are cast from JSON text to the same Spark types, so equal source values compare
    equal whichever spelling they came in. Two spellings are normalised first: JSON documents
    (a binlog's decoded document and a SELECT's text differ in spacing and key order) and
    single-precision floats (the log carries the float's exact value, a SELECT its shortest
    digits)."""
    from pyspark.sql import functions as F

    same = F.lit(True)
    for c in schema.columns:
        if c.name in schema.key:
            continue
        a, b = F.col(f"{left}.{quoted(c.name)}"), F.col(f"{right}.{quoted(c.name)}")
        name = c.type.lower().strip()
        if name in ("json", "jsonb"):
            a, b = (F.to_json(F.try_parse_json(v)) for v in (a, b))
        elif name.startswith("real") or (name.startswith("float") and "(" not in name):
            a, b = a.cast("float"), b.cast("float")
        same = same & a.eqNullSafe(b)
    return same


def _typed_key(types: Sequence[DataType], aliases: Sequence[str]) -> list[SparkColumn]:
    """A ``key`` column of JSON values (chunk files, kept keys) as typed columns ``aliases``.

    A key of integers is split as text: its JSON holds digits, signs, commas, brackets and
    perhaps quotes (a decimal's text), nothing else. Spark's ``from_json`` starts a parser,
    with its own buffer, per row: over a dump's chunk rows the lake check's main cost."""
    from pyspark.sql import functions as F

    if all(_integral(t) for t in types):
        parsed = F.split(F.translate(F.col("key"), '[]"', ""), ",")
    else:
        parsed = F.from_json(F.col("key"), "array<string>")
    return [
        _typed(t, parsed.getItem(i)).alias(a)
        for i, (t, a) in enumerate(zip(types, aliases, strict=True))
    ]


def _text_key(columns: Sequence[str]) -> SparkColumn:
    """Key columns as an array of text, ``key``, which :func:`_json_key` reads back."""
    from pyspark.sql import functions as F

    return F.array(*[F.col(c).cast("string") for c in columns]).alias("key")


def _json_key(types: Sequence[DataType], texts: Sequence[str]) -> list[Any]:
    return [_key_value(t, v) for t, v in zip(types, texts, strict=True)]


def _same_key(schema: TableSchema) -> SparkColumn:
    """The ON clause of target ``t`` and source ``s`` rows of one key."""
    from pyspark.sql import functions as F

    on = F.lit(True)
    for k in schema.key:
        on = on & F.col(f"t.{quoted(k)}").eqNullSafe(F.col(f"s.{quoted(k)}"))
    return on


def _chunk_rows(
    spark: SparkSession, files: ChunkFiles, refs: Sequence[tuple[int, ChunkRef]], ddl: str
) -> DataFrame:
    """The closed chunks' rows (the file's columns ``ddl``), each ref's rows but those its window
    dropped, with their ``position`` and their chunk's ``seq``, ``table``, ``dump_id`` and
    ``ts_ms``, read by the executors from the chunk files; ``refs`` pairs each with its spool
    segment."""
    from pyspark.sql import functions as F

    chunk_ids = [ref.chunk_id for _, ref in refs]
    if len(set(chunk_ids)) != len(chunk_ids):
        raise DblogError(f"a batch refers to one chunk twice: {sorted(chunk_ids)}")
    rows = spark.read.schema(ddl).parquet(*[files.uri(ref.folder) for _, ref in refs])
    meta = spark.createDataFrame(
        [
            (r.chunk_id, seq, r.table, r.position_prefix(), r.first, r.dump_id, r.ts_ms)
            for seq, r in refs
        ],
        "chunk_id BIGINT, seq BIGINT, table STRING, prefix STRING, first BIGINT,"
        " dump_id BIGINT, ts_ms BIGINT",
    )
    rows = rows.join(F.broadcast(meta), "chunk_id")
    drops = [(r.chunk_id, idx) for _, r in refs for idx in r.drops]
    if drops:
        dropped = spark.createDataFrame(drops, "chunk_id BIGINT, idx BIGINT")
        rows = rows.join(F.broadcast(dropped), ["chunk_id", "idx"], "left_anti")
    index = F.lpad((F.col("first") + F.col("idx") + 1).cast("string"), POSITION_DIGITS, "0")
    return rows.withColumn("position", F.concat(F.col("prefix"), index))


def dumped_rows(
    spark: SparkSession,
    files: ChunkFiles,
    refs: Sequence[tuple[int, ChunkRef]],
    columns: Sequence[str],
) -> DataFrame:
    """The closed chunks' rows as events (``columns`` of ``segment.EVENT_COLUMNS``, ``seq``
    and ``chunk_id``) at their positions, the row images as JSON text."""
    from pyspark.sql import functions as F

    computed = {
        "op": F.lit("r"),
        "before": F.lit(None).cast("string"),
        "unavailable": F.array().cast("array<string>"),
        "source": F.lit("{}"),
    }
    rows = _chunk_rows(spark, files, refs, CHUNK_DDL)
    return rows.select(*[computed.get(c, F.col(c)).alias(c) for c in columns])


def typed_dumped_rows(
    spark: SparkSession,
    files: ChunkFiles,
    refs: Sequence[tuple[int, ChunkRef]],
    schema: TableSchema,
    *kept: str,
) -> DataFrame:
    """The closed chunks' rows as the table's rows (as :meth:`DeltaSink._typed_rows` gives
    them, ``kept`` of ``key``, ``chunk_id`` and ``_unavailable``), from the typed columns of
    chunk files that hold the table's columns typed as Delta stores them."""
    from pyspark.sql import functions as F

    stored = stored_columns(schema.columns)
    typed = ", ".join(f"{typed_name(i)} {kind}" for i, (_, kind) in enumerate(stored))
    rows = _chunk_rows(spark, files, refs, f"chunk_id BIGINT, idx BIGINT, key STRING, {typed}")
    helpers = {
        "key": F.col("key"),
        "chunk_id": F.col("chunk_id"),
        "_unavailable": F.array().cast("array<string>"),
    }
    return rows.select(
        *[F.col(typed_name(i)).alias(name) for i, (name, _) in enumerate(stored)],
        F.col("position").alias("_dblog_position"),
        F.lit("r").alias("_dblog_op"),
        F.lit(False).alias("_dblog_deleted"),
        F.timestamp_millis(F.col("ts_ms")).alias("_dblog_ts"),
        *[helpers[k].alias(k) for k in kept],
    )


def table_path(config: DeltaSinkConfig, table: TableId) -> str:
    """Where the sink keeps a source table: ``<sinks.delta.path>/<db>/<table>``."""
    return f"{config.path.rstrip('/')}/{table.db}/{table.table}"


def optimize(spark: SparkSession, path: str, key: str) -> dict[str, int]:
    """Compact a table's small files and sort them by its first key column (Z-order on one column).

    A MERGE rewrites the files it touches, so updates leave many small files with keys from
    everywhere; sorted files let a dump's key-bounded MERGE skip all but a few. Safe while the
    stream runs: a MERGE that loses the race to this commit is run again.
    """
    metrics = spark.sql(f"OPTIMIZE delta.{quoted(path)} ZORDER BY ({quoted(key)})").collect()[0]
    found = metrics["metrics"]
    return {"files_removed": found["numFilesRemoved"], "files_added": found["numFilesAdded"]}


def quoted(name: str) -> str:
    return "`" + name.replace("`", "``") + "`"


@dataclass(frozen=True)
class FrameBatch:
    """A batch as Delta's query has it: the spool's events (``segment.EVENT_COLUMNS`` and each
    event's segment in ``seq``), the ``db.table`` names with events, the range of the first key
    column of each table's dumped rows, the tables with log events, and the range of the first
    key column of all the rows of each table with log events (``spool.row_bounds``), the
    tables whose rows are one dump's range chunks alone (``spool.sole_dump_spans``), and the
    chunks whose rows the batch holds, each with its segment, in ``files``."""

    events: DataFrame
    tables: Collection[str]
    dump_bounds: Mapping[str, tuple[Any, Any]] = field(default_factory=dict)
    logged: Collection[str] = ()
    row_bounds: Mapping[str, tuple[Any, Any]] = field(default_factory=dict)
    sole_dumps: Mapping[str, DumpSpan] = field(default_factory=dict)
    chunks: Sequence[tuple[int, ChunkRef]] = ()
    files: ChunkFiles | None = None


class DeltaSink:
    name = "delta"

    def __init__(
        self,
        spark: SparkSession,
        config: DeltaSinkConfig,
        schemas: Mapping[TableId, TableSchema],
        app_id: str,
        describe: Callable[[TableId], TableSchema] | None = None,
        lease_token: int = 0,
    ) -> None:
        self.spark, self.config, self.schemas, self.app_id = spark, config, dict(schemas), app_id
        self.describe = describe
        self.lease_token = lease_token  # 0 without ha
        self._first_purge_at = time.monotonic() + _PURGE_FIRST_S
        self._purge_due: dict[TableId, float] = {}  # after a table's first purge
        self._holding: set[TableId] = set()  # tables known to hold rows: no emptiness check
        # tables this process created: the ranges of the first key column it wrote into each,
        # outside which such a table holds nothing (no Spark job to ask)
        self._written: dict[TableId, list[tuple[Any, Any]]] = {}
        # chunks appended alone into a span Delta held no row of: no key there can be extra
        self._unheld_chunks: set[int] = set()

    def table_path(self, table: TableId) -> str:
        return table_path(self.config, table)

    def create_tables(self) -> None:
        """Create the captured tables Delta lacks, when the stream starts: a table exists
        (empty) once the stream runs, and its first dump's batch does not pay for creating it."""
        for table in self.schemas:
            self._table(table)

    def txn_version(self, segment: int) -> int:
        """The batch's idempotence id: above every version a leader of an older token wrote."""
        if not 0 <= segment < 1 << SEGMENT_BITS:
            raise ValueError(f"spool segment {segment} out of range")
        return self.lease_token << SEGMENT_BITS | segment

    def fence(self) -> None:
        """Make every table refuse a deposed leader's commits (run by a new leader first).

        An empty commit records version ``(token << SEGMENT_BITS) - 1`` under each of the
        stream's app ids, above every version of an older token: an older leader's MERGE
        already running fails Delta's conflict check (a concurrent commit of the same app
        id), and any later one is skipped as already applied. The lease check before each
        batch narrows the window; this closes it, since the fence takes part in Delta's own
        commit.
        """
        from delta.exceptions import ConcurrentTransactionException

        if not self.lease_token:
            return
        fence = (self.lease_token << SEGMENT_BITS) - 1
        for table in self.schemas:
            empty, path = self._table(table).toDF().limit(0), self.table_path(table)
            for app_id in (self.app_id, self._dump_app_id):
                for attempt in range(1, MERGE_ATTEMPTS + 1):
                    try:
                        append_once(self.spark, path, empty, app_id, fence)  # skipped if newer
                        break
                    except ConcurrentTransactionException:
                        # an older leader woke up and fenced (or committed) first: again
                        if attempt == MERGE_ATTEMPTS:
                            raise

    def write(self, segment: int, batch: FrameBatch) -> None:
        """Apply one batch to every table it touches (the :class:`~airflow_dblog.sinks.base.Sink`
        contract: ``segment`` is the batch's last spool segment).

        A table's log rows, and its dumped rows where Delta holds keys in their range, go in
        one MERGE bounded by the first key column's range of both (Delta reads only the files
        that can match): one commit, one pass over the table; into a table that holds nothing
        yet, an append of the newest row of each key. Dumped rows into a range Delta holds none
        of, in a table holding rows elsewhere, are appended first, under the dump's own
        transaction app id, then the log rows merged: a crash between the two replays only the
        second, whose position guard keeps the newest row of each key either way. One dump's
        range chunks alone, into the span they cover where Delta held no row, are appended and
        remembered: after the append Delta holds their rows alone there, so :meth:`extra_keys`
        has nothing to look for.
        """
        version = self.txn_version(segment)
        for name in batch.tables:
            table = TableId.parse(name)
            self._follow_schema(table)
            schema = self.schemas[table]
            rows = self._batch_rows(schema, batch)
            dump = usable_bounds(schema, batch.dump_bounds.get(name))
            both = usable_bounds(schema, batch.row_bounds.get(name))
            target = self._table(table)  # one lookup of the table's log per MERGE
            sole = batch.sole_dumps.get(name)
            covered = None if sole is None else usable_bounds(schema, (sole.low, sole.high))
            if sole is not None and covered is not None:
                # a one-column key's lower bound is the last chunk's upper: not in the span
                if self._holds_in(table, target, covered, len(schema.key) == 1):
                    self._merge(self._dump_app_id, version, table, rows, dump, target)
                else:  # disjoint ranges, each key selected once: no newest-per-key to find
                    self._merge(
                        self._dump_app_id, version, table, rows, dump, target, append=True,
                        one_per_key=True,
                    )  # fmt: skip
                    self._unheld_chunks.update(sole.chunk_ids)
            elif name not in batch.logged:
                self._merge(self._dump_app_id, version, table, rows, dump, target, probe=True)
            elif dump is not None and not self._holds_in(table, target, None):
                # holds nothing: one append of both (asked once, not again in the MERGE)
                self._merge(self.app_id, version, table, rows, both, target, append=True)
            elif dump is None or self._holds_in(table, target, dump):
                self._merge(self.app_id, version, table, rows, both, target)
            else:
                dumped = rows.where(rows["chunk_id"].isNotNull())
                self._merge(self._dump_app_id, version, table, dumped, dump, target, append=True)
                self._merge(  # after the append's commit: the table looked up again
                    self.app_id, version, table, rows.where(rows["chunk_id"].isNull()), both
                )
        for table in self.schemas:
            self._purge_tombstones(table)

    def _batch_rows(self, schema: TableSchema, batch: FrameBatch) -> DataFrame:
        """The batch's rows of one table, typed (``_typed_rows``, keeping ``key``, ``chunk_id``
        and ``_unavailable``): its events, and its chunks' rows, read typed from chunk files
        that hold its columns as the table now stores them, else parsed from their JSON."""
        name, events = str(schema.table), batch.events
        kept = ("key", "chunk_id", "_unavailable")
        parts = [
            self._typed_rows(
                schema,
                events.where(events["table"] == name).withColumnRenamed("unavailable", kept[2]),
                *kept,
            )
        ]
        refs = [(seq, ref) for seq, ref in batch.chunks if ref.table == name]
        if refs:
            assert batch.files is not None
            parts.append(self.dumped(schema, refs, batch.files, *kept))
        return reduce(lambda a, b: a.unionByName(b), parts)

    def dumped(
        self,
        schema: TableSchema,
        refs: Sequence[tuple[int, ChunkRef]],
        files: ChunkFiles,
        *kept: str,
    ) -> DataFrame:
        """Chunks' rows of one table as its rows (``_typed_rows`` and ``kept``): typed where
        their files hold the columns as the table stores them now, in the session time zone the
        typed timestamps assume (UTC), else parsed from their JSON."""
        stored = [list(c) for c in stored_columns(schema.columns)]
        utc = self.spark.conf.get("spark.sql.session.timeZone") in ("UTC", "Etc/UTC", "Z")
        typed: list[tuple[int, ChunkRef]] = []
        parsed: list[tuple[int, ChunkRef]] = []
        for seq, ref in refs:
            (typed if utc and ref.typed == stored else parsed).append((seq, ref))
        parts = [typed_dumped_rows(self.spark, files, typed, schema, *kept)] if typed else []
        if parsed:
            columns = ["op", "position", "before", "after", "ts_ms", "key", "chunk_id"]
            events = dumped_rows(self.spark, files, parsed, [*columns, "unavailable"])
            events = events.withColumnRenamed("unavailable", "_unavailable")
            parts.append(self._typed_rows(schema, events, *kept))
        return reduce(lambda a, b: a.unionByName(b), parts)

    @property
    def _dump_app_id(self) -> str:
        return f"{self.app_id}/dump"

    def _follow_schema(self, table: TableId) -> None:
        """Add the columns an ALTER TABLE added at the source; refuse a changed primary key.

        The source is described at every batch that touches the table (a few catalog queries
        next to a MERGE of seconds), so a key change stops the stream at the first batch after
        it, before rows keyed the new way reach a table keyed the old way. Dropped columns stay
        in Delta (later rows leave them null): Delta keeps history, and dropping would need
        column mapping on every reader.
        """
        schema = self.schemas[table]
        if self.describe is None:
            return
        current = self.describe(table)
        if current.key != schema.key:
            raise DblogError(
                f"the primary key of {table} changed from ({', '.join(schema.key)}) to"
                f" ({', '.join(current.key)}) while streaming; Delta rows are keyed by the old one",
                "stop the stream, point sinks.delta.path elsewhere and run a full dump",
            )
        known = {c.name for c in schema.columns}
        added = [c for c in current.columns if c.name not in known]
        if not added:
            return
        from delta.tables import DeltaTable

        path = self.table_path(table)
        if DeltaTable.isDeltaTable(self.spark, path):
            ddl = ", ".join(f"{quoted(c.name)} {spark_type(c).simpleString()}" for c in added)
            self.spark.sql(f"ALTER TABLE delta.{quoted(path)} ADD COLUMNS ({ddl})")
            log.info("%s: source added columns %s; added to Delta", table, [c.name for c in added])
        now = {c.name for c in current.columns}
        kept = [c for c in schema.columns if c.name not in now]
        self.schemas[table] = replace(current, columns=(*current.columns, *kept))

    def _merge(
        self,
        app_id: str,
        version: int,
        table: TableId,
        events: DataFrame,
        bounds: tuple[Any, Any] | None = None,
        target: Any = None,
        *,
        probe: bool = False,
        append: bool = False,
        one_per_key: bool = False,
    ) -> None:
        """One guarded MERGE of the newest event of each key (``events``: the table's rows of the
        batch, as :meth:`_batch_rows` gives them).

        ``bounds``: the events' first key column spans ``bounds``: the ON clause says so, and
        Delta reads only the files overlapping that range (dumps arrive in key order) instead
        of joining against the whole table. Into a table without files (a new one), where
        Delta holds no row in ``bounds`` (``probe``: looked for first, as in a first dump), or
        with ``append`` (the caller looked) the rows are appended: nothing there to match, so
        that is the MERGE's result, at a fraction of its cost. ``target``: the table as the
        caller looked it up (else it is looked up here). ``one_per_key``: the caller knows no
        key comes twice (one dump's range chunks), so the newest-per-key pass, a shuffle and a
        sort of the batch, is left out.
        """
        from pyspark.sql import functions as F

        schema = self.schemas[table]
        rows = (events if one_per_key else self._latest(events)).drop("key", "chunk_id")
        target = self._table(table) if target is None else target
        if append or not self._holds_in(table, target, bounds if probe else None):
            # nothing there to match (a new table, a first dump): an append is the MERGE's result
            self._append(app_id, version, rows.drop("_unavailable"), table, bounds)
            return
        on = _same_key(schema)
        if bounds is not None:
            on = on & self._first_key_in(schema, bounds, "t.")
        keep_unavailable = {
            c.name: F.when(
                F.array_contains(F.col("s._unavailable"), c.name), F.col(f"t.{quoted(c.name)}")
            ).otherwise(F.col(f"s.{quoted(c.name)}"))
            for c in schema.columns
            if c.name not in schema.key
        }
        values = {quoted(c): F.col(f"s.{quoted(c)}") for c in [*schema.key, *META_COLUMNS]}
        update = {**values, **{quoted(k): v for k, v in keep_unavailable.items()}}
        insert = {
            **values,
            **{quoted(c.name): F.col(f"s.{quoted(c.name)}") for c in schema.columns},
        }
        merge = (
            target.alias("t")
            .merge(rows.alias("s"), on)
            .whenMatchedUpdate(condition=self._changes_the_row(schema), set=update)
            .whenNotMatchedInsert(values=insert)
        )
        conf = self.spark.conf
        conf.set(_TXN_APP, app_id)
        conf.set(_TXN_VERSION, str(version))
        from delta.exceptions import ConcurrentTransactionException

        try:
            for attempt in range(1, MERGE_ATTEMPTS + 1):
                try:
                    merge.execute()
                    self._wrote(table, bounds)
                    return
                except ConcurrentTransactionException:
                    raise _fenced(table, "MERGE") from None
                except _concurrent_commit_errors() as err:
                    # `dblog optimize` committed first: nothing of ours was, so run it again
                    if attempt == MERGE_ATTEMPTS:
                        raise
                    log.info(
                        "%s: a concurrent commit (%s); merging again", table, type(err).__name__
                    )
        finally:
            conf.unset(_TXN_APP)
            conf.unset(_TXN_VERSION)

    def _holds_in(
        self, table: TableId, target: Any, bounds: tuple[Any, Any] | None, above: bool = False
    ) -> bool:
        """Whether Delta (``target``) holds a row of ``table`` (with its first key column in
        ``bounds``; ``above``: above the lower bound, not at it): in a table this process
        created, from the ranges it wrote there; in another, from the table (a Spark job)."""
        if table in self._written:
            written = self._written[table]
            return any(bounds is None or _overlap(r, bounds, above) for r in written)
        if table not in self._holding:
            if not target.detail().first()["numFiles"]:
                return False
            self._holding.add(table)
        if bounds is None:
            return True
        inside = self._first_key_in(self.schemas[table], bounds, above=above)
        return bool(target.toDF().where(inside).limit(1).count())

    @staticmethod
    def _first_key_in(
        schema: TableSchema, bounds: tuple[Any, Any], alias: str = "", above: bool = False
    ) -> SparkColumn:
        """The first key column within ``bounds`` (None: open at that end; ``above``: the
        lower one excluded)."""
        from pyspark.sql import functions as F

        first, target = F.col(alias + quoted(schema.key[0])), key_types(schema)[0]
        inside = F.lit(True)
        low, high = bounds
        if low is not None:
            typed = _typed(target, F.lit(str(low)))
            inside = inside & (first > typed if above else first >= typed)
        if high is not None:
            inside = inside & (first <= _typed(target, F.lit(str(high))))
        return inside

    @staticmethod
    def _changes_the_row(schema: TableSchema) -> SparkColumn:
        """When a matched key is updated: the incoming event is newer, and it is not a dumped
        row equal to the live row Delta holds.

        A dump re-reads rows the table mostly holds already; rewriting each one would hand
        change-feed readers an update per row and a deletion vector per file for nothing. Both
        sides hold the same Spark types, cast from the same JSON text or written typed as that
        cast gives them, so equal source values compare equal; values a log and a SELECT spell
        differently (a float's digits, a JSON document's spacing) compare unequal and are
        written, as before.
        """
        from pyspark.sql import functions as F

        same = same_values(schema, "t", "s")
        unchanged_dump = (F.col("s._dblog_op") == "r") & ~F.col("t._dblog_deleted") & same
        newer = F.col("s._dblog_position") > F.col("t._dblog_position")
        return newer & ~unchanged_dump

    def _append(
        self,
        app_id: str,
        version: int,
        rows: DataFrame,
        table: TableId,
        bounds: tuple[Any, Any] | None,
    ) -> None:
        from delta.exceptions import ConcurrentTransactionException

        try:
            append_once(self.spark, self.table_path(table), rows, app_id, version)
        except ConcurrentTransactionException:
            raise _fenced(table, "append") from None
        self._holding.add(table)
        self._wrote(table, bounds)

    def _wrote(self, table: TableId, bounds: tuple[Any, Any] | None) -> None:
        """Note the first key column's range a write covered (None: anywhere) in a table this
        process created. Past ``_WRITTEN_RANGES`` ranges they become their hull: more than
        the table holds, never less."""
        written = self._written.get(table)
        if written is None:
            return
        written.append((None, None) if bounds is None else bounds)
        if len(written) > _WRITTEN_RANGES:
            lows, highs = [r[0] for r in written], [r[1] for r in written]
            low = None if None in lows else min(lows)
            high = None if None in highs else max(highs)
            written[:] = [(low, high)]

    @staticmethod
    def _latest(events: DataFrame) -> DataFrame:
        """The newest event of each key in the batch: a MERGE takes one source row per key."""
        from pyspark.sql import Window
        from pyspark.sql import functions as F

        newest_first = Window.partitionBy("key").orderBy(F.desc("_dblog_position"))
        ranked = events.withColumn("_rn", F.row_number().over(newest_first))
        return ranked.where("_rn = 1").drop("_rn")

    @staticmethod
    def _typed_rows(schema: TableSchema, events: DataFrame, *kept: str) -> DataFrame:
        """Events as the table's rows: typed columns, the meta columns and ``kept`` columns.

        The row image is parsed in a projection of its own. Written into each column's
        expression, Spark parses the JSON once per column: a non-key column reads it inside a
        CASE (null for a delete), which keeps it from being a common subexpression, and the
        projection is not collapsed into the next since that would repeat the parse."""
        from pyspark.sql import functions as F
        from pyspark.sql import types as T

        raw = T.StructType([T.StructField(c.name, T.StringType()) for c in schema.columns])
        deleted = F.col("op") == "d"
        image = F.from_json(F.when(deleted, F.col("before")).otherwise(F.col("after")), raw)
        parsed = events.select(
            image.alias("_dblog_image"),
            deleted.alias("_dblog_deleted"),
            F.col("position").alias("_dblog_position"),
            F.col("op").alias("_dblog_op"),
            F.timestamp_millis(F.col("ts_ms")).alias("_dblog_ts"),
            *kept,
        )
        out = []
        for c in schema.columns:
            target = spark_type(c)
            typed = _typed(target, F.col("_dblog_image").getField(c.name))
            if c.name not in schema.key:
                typed = F.when(F.col("_dblog_deleted"), F.lit(None).cast(target)).otherwise(typed)
            out.append(typed.alias(c.name))
        return parsed.select(*out, *META_COLUMNS, *kept)

    def _table(self, table: TableId):  # type: ignore[no-untyped-def]
        from delta.tables import DeltaTable
        from pyspark.sql import types as T

        path = self.table_path(table)
        if DeltaTable.isDeltaTable(self.spark, path):
            return DeltaTable.forPath(self.spark, path)
        # a kill during the table's creation leaves a log without a commit (Delta 4 makes
        # _staged_commits first), and Delta then neither reads nor creates the table
        remove_unless_holding(
            self.spark, f"{path}/_delta_log", _VERSION_FILE, "a Delta log without commits"
        )
        schema = self.schemas[table]
        columns = [T.StructField(c.name, spark_type(c), nullable=True) for c in schema.columns] + [
            T.StructField("_dblog_position", T.StringType(), False),
            T.StructField("_dblog_op", T.StringType(), False),
            T.StructField("_dblog_deleted", T.BooleanType(), False),
            T.StructField("_dblog_ts", T.TimestampType(), True),
        ]
        log.info("creating Delta table %s at %s", table, path)
        self._written[table] = []
        return (
            DeltaTable.createIfNotExists(self.spark)
            .location(path)
            .addColumns(T.StructType(columns))
            .property("delta.enableChangeDataFeed", "true")
            .property("delta.enableDeletionVectors", str(self.config.deletion_vectors).lower())
            .execute()
        )

    def extra_keys(self, refs: Sequence[ChunkRef], files: ChunkFiles) -> ExtraKeys:
        """The keys Delta holds that closed range chunks found the source lacking, per table and
        chunk (JSON values, as a key-list dump takes them); run once Delta holds every log event
        up to each chunk's window. ``files`` holds each chunk's rows, or its keys alone
        (:mod:`~airflow_dblog.engine.dump_keys`).

        A key counts when Delta holds it live, inside the range the chunk covered, last changed
        before the chunk's window began (a change inside the window or after it is the log's
        word, newer than the SELECT), and it is not among the chunk's rows, those the window
        dropped included. For a table's last chunk, keys above its bound count too if Delta
        last changed them before the bound was read. One job per table and dump keeps the keys
        none of its chunks selected, one more reads the found keys. A false candidate costs a
        re-read only: the follow-up dump reads each key again.
        """
        parts: list[DataFrame] = []
        types: dict[str, list[DataType]] = {}
        by_table: dict[str, list[ChunkRef]] = {}
        for ref in refs:
            if ref.chunk_id in self._unheld_chunks:
                self._unheld_chunks.discard(ref.chunk_id)
            elif ref.checks_extras:
                by_table.setdefault(ref.table, []).append(ref)
        for name, checks in sorted(by_table.items()):
            table = TableId.parse(name)
            schema = self.schemas.get(table)
            if schema is None:
                continue
            if not ordered_key(schema):
                log.info(
                    "%s: its key has no order Spark and the source agree on: keys Delta holds"
                    " that the source lacks are not looked for in chunks %s",
                    table, sorted(r.chunk_id for r in checks),
                )  # fmt: skip
                continue
            types[name] = key_types(schema)
            parts.append(self._extras(name, schema, types[name], checks, files))
        if not parts:
            return {}
        found: ExtraKeys = {}
        for row in reduce(lambda a, b: a.unionByName(b), parts).collect():
            key = _json_key(types[row["table"]], row["key"])
            found.setdefault(row["table"], {}).setdefault(row["chunk_id"], []).append(key)
        return found

    def _extras(
        self,
        name: str,
        schema: TableSchema,
        types: Sequence[DataType],
        checks: Sequence[ChunkRef],
        files: ChunkFiles,
    ) -> DataFrame:
        """One table's candidates: ``table``, ``chunk_id``, ``key`` (the values as text)."""
        from pyspark.sql import functions as F

        dumps = sorted({ref.dump_id for ref in checks})
        if len(dumps) > 1:  # two dumps' chunks may cover the same keys: one look per dump
            parts = [[r for r in checks if r.dump_id == d] for d in dumps]
            looks = [self._extras(name, schema, types, part, files) for part in parts]
            return reduce(lambda a, b: a.unionByName(b), looks)

        keys = [F.col(quoted(k)) for k in schema.key]
        position = F.col("_dblog_position")
        chunk_of: SparkColumn | None = None
        for ref in checks:
            assert ref.covers is not None
            lower, upper = ref.covers
            inside = ~_after(keys, types, upper) & (position < F.lit(ref.low))
            if lower is not None:
                inside = inside & _after(keys, types, lower)
            if ref.beyond:
                inside = inside | (_after(keys, types, upper) & (position < F.lit(ref.beyond)))
            chunk_of = (F.when if chunk_of is None else chunk_of.when)(inside, F.lit(ref.chunk_id))
        assert chunk_of is not None
        # the chunks' span on the first key column, which Delta skips files by; one span, not
        # one per chunk: a table's hundred chunks would make an expression too big for Spark's
        # code generation
        lowers = [r.covers[0] for r in checks if r.covers is not None]
        uppers = [r.covers[1] for r in checks if r.covers is not None]
        skim = position < F.lit(max(max(r.low, r.beyond) for r in checks))
        if all(lower is not None for lower in lowers):
            skim = skim & (keys[0] >= _extreme(F.least, types[0], lowers))
        if not any(r.beyond for r in checks):
            skim = skim & (keys[0] <= _extreme(F.greatest, types[0], uppers))
        names = list(schema.key)
        live = self._table(TableId.parse(name)).toDF().where(~F.col("_dblog_deleted"))
        unselected = live.where(skim).select(position, *keys)
        folders = [files.uri(ref.folder) for ref in checks if ref.folder]
        if folders:
            # one dump's chunks cover disjoint ranges: a key is in one chunk's range at most.
            # The few keys no chunk selected are kept, and only they are held against each
            # chunk's own range and window
            chunk_rows = self.spark.read.schema(DUMP_KEYS_DDL).parquet(*folders)
            selected = chunk_rows.select(*_typed_key(types, names))
            unselected = unselected.join(selected, names, "left_anti").localCheckpoint()
        found = unselected.select(
            F.lit(name).alias("table"),
            chunk_of.cast("bigint").alias("chunk_id"),
            _text_key([quoted(k) for k in names]),
        )
        return found.where(F.col("chunk_id").isNotNull())

    def compare(self, refs: Sequence[ChunkRef], files: ChunkFiles) -> Comparison:
        """What verify chunks found, per chunk: the keys of its rows Delta lacks or holds
        deleted (``missing``) or holds with other values (``different``), and the keys Delta
        holds live that the source lacked (``extra``: in a range chunk's range as
        :meth:`extra_keys` finds them, in a key list among the keys the SELECT did not find;
        None where not looked for). Run after the batch's MERGE, so Delta holds every log event
        up to each chunk's window; a key Delta last changed after the window is the log's word
        and not compared. One Spark job for the whole batch; nothing is written."""
        from pyspark.sql import functions as F

        found: Comparison = {
            r.chunk_id: {"missing": [], "different": [], "extra": []} for r in refs
        }
        parts: list[DataFrame] = []
        types: dict[str, list[DataType]] = {}
        by_table: dict[str, list[ChunkRef]] = {}
        for ref in refs:
            by_table.setdefault(ref.table, []).append(ref)
        for name, checks in sorted(by_table.items()):
            table = TableId.parse(name)
            schema = self.schemas[table]
            types[name] = key_types(schema)
            lake = self._lake(table)
            with_rows = [r for r in checks if r.folder and r.compared]
            if with_rows:
                parts.append(self._differences(name, schema, with_rows, files, lake))
            listed = [r for r in checks if r.absent]
            if listed and lake is not None:
                parts.append(self._absent_live(name, schema, listed, lake))
            ranged = [r for r in checks if r.covers is not None]
            if ranged and lake is not None and ordered_key(schema):
                checked = [r for r in ranged if r.checks_extras]
                if checked:
                    extras = self._extras(name, schema, types[name], checked, files)
                    parts.append(extras.withColumn("found", F.lit("extra")))
            for ref in ranged:
                if lake is not None and not (ordered_key(schema) and ref.checks_extras):
                    found[ref.chunk_id]["extra"] = None
        if not parts:
            return found
        for row in reduce(lambda a, b: a.unionByName(b), parts).collect():
            key = _json_key(types[row["table"]], row["key"])
            keys = found[row["chunk_id"]][row["found"]]
            assert keys is not None
            keys.append(key)
        return found

    def orders_keys(self, table: TableId) -> bool:
        """Whether a chunk's key range means the same keys in Delta as at the source."""
        return ordered_key(self.schemas[table])

    def unlisted_keys(self, table: TableId, listed: Sequence[str], before: str) -> list[list[Any]]:
        """The keys Delta holds live, last changed before ``before``, that none of the ``listed``
        folders (:mod:`~airflow_dblog.engine.dump_keys`) holds: JSON values, as a key-list dump
        takes them."""
        from pyspark.sql import functions as F

        lake = self._lake(table)
        if lake is None:
            return []
        schema = self.schemas[table]
        types = key_types(schema)
        aliases = [f"_k{i}" for i in range(len(types))]
        keys = self.spark.read.schema(DUMP_KEYS_DDL).parquet(*listed)
        live = lake.where(~F.col("_dblog_deleted") & (F.col("_dblog_position") < F.lit(before)))
        unlisted = live.select(
            *[F.col(quoted(k)).alias(a) for k, a in zip(schema.key, aliases, strict=True)]
        ).join(keys.select(*_typed_key(types, aliases)), aliases, "left_anti")
        return [_json_key(types, r["key"]) for r in unlisted.select(_text_key(aliases)).collect()]

    def _lake(self, table: TableId) -> DataFrame | None:
        """The table's rows, None if Delta has no table yet (nothing is created to compare)."""
        from delta.tables import DeltaTable

        path = self.table_path(table)
        if not DeltaTable.isDeltaTable(self.spark, path):
            return None
        return DeltaTable.forPath(self.spark, path).toDF()

    def _differences(
        self,
        name: str,
        schema: TableSchema,
        refs: Sequence[ChunkRef],
        files: ChunkFiles,
        lake: DataFrame | None,
    ) -> DataFrame:
        """``table``, ``chunk_id``, ``found`` (missing or different) and ``key`` (text) of the
        chunks' rows that Delta does not hold as they are."""
        from pyspark.sql import functions as F

        source = self.dumped(schema, [(0, r) for r in refs], files, "chunk_id").alias("s")
        text_key = _text_key([f"s.{quoted(k)}" for k in schema.key])
        out = [F.lit(name).alias("table"), F.col("s.chunk_id").cast("bigint").alias("chunk_id")]
        if lake is None:
            return source.select(*out, F.lit("missing").alias("found"), text_key)
        spans = [r.key_span for r in refs]
        target = lake
        if all(spans):  # the rows' first key column spans these: Delta skips other files
            low = min(s[0] for s in spans if s)
            high = max(s[1] for s in spans if s)
            target = lake.where(self._first_key_in(schema, (low, high)))
        joined = source.join(target.alias("t"), _same_key(schema), "left")
        held, deleted = F.col("t._dblog_position"), F.col("t._dblog_deleted")
        older = held < F.col("s._dblog_position")  # newer: the log changed it after the window
        found = (
            F.when(held.isNull() | (deleted & older), F.lit("missing"))
            .when(~deleted & older & ~same_values(schema, "t", "s"), F.lit("different"))
            .otherwise(F.lit(None))
        )
        return joined.select(*out, found.alias("found"), text_key).where("found IS NOT NULL")

    def _absent_live(
        self, name: str, schema: TableSchema, refs: Sequence[ChunkRef], lake: DataFrame
    ) -> DataFrame:
        """Keys that key-list chunks asked for and the source lacked, which Delta holds live
        and last changed before the chunk's window closed (``extra``)."""
        from pyspark.sql import functions as F

        types = key_types(schema)
        asked = self.spark.createDataFrame(
            [(r.chunk_id, r.row_position(0), encode_json(k)) for r in refs for k in r.absent],
            "chunk_id BIGINT, cutoff STRING, key STRING",
        )
        aliases = [f"_k{i}" for i in range(len(types))]
        asked = asked.select("chunk_id", "cutoff", *_typed_key(types, aliases))
        live = lake.where(~F.col("_dblog_deleted")).select(
            "_dblog_position",
            *[F.col(quoted(k)).alias(a) for k, a in zip(schema.key, aliases, strict=True)],
        )
        return (
            F.broadcast(asked)
            .join(live, aliases)
            .where(F.col("_dblog_position") < F.col("cutoff"))
            .select(
                F.lit(name).alias("table"),
                "chunk_id",
                F.lit("extra").alias("found"),
                _text_key(aliases),
            )
        )

    def _purge_tombstones(self, table: TableId) -> None:
        """Drop tombstones past the retention, hourly per table from ten minutes after start."""
        from delta.tables import DeltaTable
        from pyspark.sql import functions as F

        hours = self.config.tombstone_retention_hours
        now = time.monotonic()
        if not hours or now < self._purge_due.get(table, self._first_purge_at):
            return
        self._purge_due[table] = now + _PURGE_EVERY_S
        path = self.table_path(table)
        if not DeltaTable.isDeltaTable(self.spark, path):
            return
        expired = F.col("_dblog_deleted") & (
            F.col("_dblog_ts") < F.current_timestamp() - F.expr(f"INTERVAL {int(hours)} HOURS")
        )
        delta = DeltaTable.forPath(self.spark, path)
        if delta.toDF().where(expired).limit(1).count():  # no empty DELETE commits
            delta.delete(expired)

    def close(self) -> None:
        pass
