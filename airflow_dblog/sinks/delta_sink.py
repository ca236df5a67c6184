"""Delta Lake sink: the current state of every source table, one Delta table each.

Each micro-batch is applied with up to two MERGEs per table (dumped rows, log rows): the batch
keeps the latest position per key, and a row is updated only if the incoming
``_dblog_position`` is newer than the stored one, so a replayed or late event can never move a
key back. A delete becomes a tombstone row
(``_dblog_deleted = true``, key columns kept, the rest null), which keeps the guard working for
that key; tombstones older than ``tombstone_retention_hours`` are removed. Every MERGE carries
Delta's idempotent-write transaction id (stream name and part, the batch's last spool segment):
a replayed batch commits nothing. Tables are created with the change data feed (users read it)
and deletion vectors on: an update marks the old row deleted instead of rewriting its file.

Column types follow the source's declared types; values arrive as the spool's plain JSON and
are cast on the executors.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Callable, Collection, Mapping
from dataclasses import replace
from typing import TYPE_CHECKING

from airflow_dblog.config import DeltaSinkConfig
from airflow_dblog.errors import DblogError
from airflow_dblog.events import TableId
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

_INTEGER = re.compile(r"^(tiny|small|medium|big)?int(eger)?\b|^int[248]\b|^(small|big)?serial")
_DECIMAL = re.compile(r"^(decimal|numeric)\s*\((\d+)(?:\s*,\s*(\d+))?\)")


def spark_type(column: Column) -> DataType:
    """The Spark type a source column is stored as in Delta (text when nothing fits exactly)."""
    from pyspark.sql import types as T

    name = column.type.lower().strip()
    if _INTEGER.match(name):
        if name.startswith("bigint") and "unsigned" in name:
            return T.DecimalType(20, 0)
        return T.LongType()
    if m := _DECIMAL.match(name):
        precision, scale = int(m.group(2)), int(m.group(3) or 0)
        return T.DecimalType(precision, scale) if precision <= 38 else T.StringType()
    if name.startswith(("float", "double", "real")):
        return T.DoubleType()
    if name in ("bool", "boolean"):
        return T.BooleanType()
    if name == "date":
        return T.DateType()
    if name.startswith(("datetime", "timestamp")):
        return T.TimestampType()
    if name == "bytea" or name.endswith("blob") or name.startswith(("binary", "varbinary")):
        return T.BinaryType()
    return T.StringType()


def quoted(name: str) -> str:
    return "`" + name.replace("`", "``") + "`"


class DeltaSink:
    name = "delta"

    def __init__(
        self,
        spark: SparkSession,
        config: DeltaSinkConfig,
        schemas: Mapping[TableId, TableSchema],
        app_id: str,
        describe: Callable[[TableId], TableSchema] | None = None,
    ) -> None:
        self.spark, self.config, self.schemas, self.app_id = spark, config, dict(schemas), app_id
        self.describe = describe
        self._purged_at: dict[TableId, float] = {}

    def table_path(self, table: TableId) -> str:
        return f"{self.config.path.rstrip('/')}/{table.db}/{table.table}"

    def write_frame(self, version: int, events: DataFrame, tables: Collection[str]) -> None:
        """Apply one batch of events (the spool's event frame) to every table it touches."""
        for name in tables:
            table = TableId.parse(name)
            self._follow_schema(table)
            self._merge(version, table, events.where(events["table"] == name))
        for table in self.schemas:
            self._purge_tombstones(table)

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

    def _merge(self, version: int, table: TableId, events: DataFrame) -> None:
        """Upsert the newest event of each key, in up to two MERGEs: dumped rows, log rows.

        Dumped rows arrive in key order, chunk after chunk: their MERGE bounds the target by
        the key range they span, so Delta reads only the files overlapping it (the files
        earlier dump batches wrote) instead of joining against the whole table. Log rows
        touch any key and get the plain MERGE. The two hold different keys (one newest event
        per key), so their order does not matter; each commits under its own transaction app
        id, so a replay skips exactly the parts already committed.
        """
        from pyspark.sql import functions as F

        schema = self.schemas[table]
        first = schema.key[0]
        latest = (
            self._latest(events)
            .select(
                *self._columns(schema, events),
                F.col("unavailable").alias("_unavailable"),
                (F.col("op") == "r").alias("_dumped"),
            )
            .persist()
        )
        try:
            parts = latest.groupBy("_dumped").agg(
                F.min(quoted(first)).alias("low"), F.max(quoted(first)).alias("high")
            )
            for part in parts.collect():
                rows = latest.where(F.col("_dumped") == part["_dumped"])
                if part["_dumped"]:
                    within = (F.col(f"t.{quoted(first)}") >= F.lit(part["low"])) & (
                        F.col(f"t.{quoted(first)}") <= F.lit(part["high"])
                    )
                    self._merge_rows(f"{self.app_id}/dump", version, table, rows, within)
                else:
                    self._merge_rows(f"{self.app_id}/log", version, table, rows, None)
        finally:
            latest.unpersist()

    def _merge_rows(
        self,
        app_id: str,
        version: int,
        table: TableId,
        rows: DataFrame,
        within: SparkColumn | None,
    ) -> None:
        """One guarded MERGE; ``within`` bounds the target rows it can match (file skipping)."""
        from pyspark.sql import functions as F

        schema = self.schemas[table]
        target = self._table(table)
        on = F.lit(True)
        for k in schema.key:
            on = on & F.col(f"t.{quoted(k)}").eqNullSafe(F.col(f"s.{quoted(k)}"))
        if within is not None:
            on = on & within
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
        conf = self.spark.conf
        conf.set(_TXN_APP, app_id)
        conf.set(_TXN_VERSION, str(version))
        try:
            (
                target.alias("t")
                .merge(rows.alias("s"), on)
                .whenMatchedUpdate(condition="s._dblog_position > t._dblog_position", set=update)
                .whenNotMatchedInsert(values=insert)
                .execute()
            )
        finally:
            conf.unset(_TXN_APP)
            conf.unset(_TXN_VERSION)

    @staticmethod
    def _latest(events: DataFrame) -> DataFrame:
        """The newest event of each key in the batch: a MERGE takes one source row per key."""
        from pyspark.sql import Window
        from pyspark.sql import functions as F

        newest_first = Window.partitionBy("key").orderBy(F.desc("position"))
        return events.withColumn("_rn", F.row_number().over(newest_first)).where("_rn = 1")

    def _columns(self, schema: TableSchema, events: DataFrame) -> list[SparkColumn]:
        from pyspark.sql import functions as F
        from pyspark.sql import types as T

        raw = T.StructType([T.StructField(c.name, T.StringType()) for c in schema.columns])
        deleted = F.col("op") == "d"
        image = F.from_json(F.when(deleted, F.col("before")).otherwise(F.col("after")), raw)
        out = []
        for c in schema.columns:
            target = spark_type(c)
            value = image.getField(c.name)
            typed = F.unbase64(value) if isinstance(target, T.BinaryType) else value.cast(target)
            if c.name not in schema.key:
                typed = F.when(deleted, F.lit(None).cast(target)).otherwise(typed)
            out.append(typed.alias(c.name))
        return [
            *out,
            F.col("position").alias("_dblog_position"),
            F.col("op").alias("_dblog_op"),
            deleted.alias("_dblog_deleted"),
            F.timestamp_millis(F.col("ts_ms")).alias("_dblog_ts"),
        ]

    def _table(self, table: TableId):  # type: ignore[no-untyped-def]
        from delta.tables import DeltaTable
        from pyspark.sql import types as T

        path = self.table_path(table)
        if DeltaTable.isDeltaTable(self.spark, path):
            return DeltaTable.forPath(self.spark, path)
        schema = self.schemas[table]
        columns = [T.StructField(c.name, spark_type(c), nullable=True) for c in schema.columns] + [
            T.StructField("_dblog_position", T.StringType(), False),
            T.StructField("_dblog_op", T.StringType(), False),
            T.StructField("_dblog_deleted", T.BooleanType(), False),
            T.StructField("_dblog_ts", T.TimestampType(), True),
        ]
        log.info("creating Delta table %s at %s", table, path)
        return (
            DeltaTable.createIfNotExists(self.spark)
            .location(path)
            .addColumns(T.StructType(columns))
            .property("delta.enableChangeDataFeed", "true")
            .property("delta.enableDeletionVectors", "true")
            .execute()
        )

    def _purge_tombstones(self, table: TableId) -> None:
        """Drop tombstones past the retention, at most hourly per table."""
        from delta.tables import DeltaTable
        from pyspark.sql import functions as F

        hours = self.config.tombstone_retention_hours
        now = time.monotonic()
        if not hours or now - self._purged_at.get(table, -_PURGE_EVERY_S) < _PURGE_EVERY_S:
            return
        self._purged_at[table] = now
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
