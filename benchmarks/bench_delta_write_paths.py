"""One batch of random updates into a large Delta table, written two ways, same run, same batches:

- ``merge``: Delta's MERGE with a position guard (update when newer, insert when absent), the
  shape of dblog's sink and of the peer in bench_delta_peer.py;
- ``positional``: the batch's keys joined with the table's rows and their ``_metadata`` file
  path and row index (one scan), the newer rows appended with their change-feed rows
  (``OptimisticTransaction.writeFiles``), the replaced rows marked deleted with deletion vectors
  built from those row indexes (kept inline in the log; Delta's own writes put them in files),
  all in one commit of that transaction. A design measurement for the sink, not its code: it
  tells what a write that does not MERGE would save.

Two tables of ROWS rows (``--files`` files each, deletion vectors and the change data feed on)
get the same ``--rounds`` batches of ``--keys`` random existing keys and ``--inserts`` new ones,
the two writes alternating which goes first. Prints one JSON object: each round's seconds per
path, the positional write's phases (``txn``: the transaction and its files; ``scan``; ``write``:
the new rows and change rows; ``dvs``; ``commit``), medians, ``merge_over_positional`` and
whether both tables and both change feeds ended equal.

    .venv/bin/python benchmarks/bench_delta_write_paths.py [--rows 1000000] [--files 100]
                                                           [--keys 5000] [--inserts 10]
                                                           [--rounds 6]

Needs no service: Spark ``local[2]`` and a temporary directory, removed at the end.
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import statistics
import struct
import sys
import tempfile
import time
from functools import partial
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench_delta_peer import _create_table  # the peer's table properties

TYPES = {
    "id": "INT",
    "name": "STRING",
    "qty": "INT",
    "note": "STRING",
    "_dblog_position": "STRING",
    "_dblog_op": "STRING",
    "_dblog_deleted": "BOOLEAN",
}
COLUMNS = list(TYPES)
_ROARING_ARRAY_MAX = 4096  # a container with more values is a bitmap of 2^16 bits


def portable_bitmap(rows: list[int]) -> bytes:
    """Row indexes (below 2^32) as Delta's deletion vector bitmap, its portable format: the
    RoaringBitmapArray magic and one 32-bit Roaring bitmap in Roaring's portable serialization
    (array and bitmap containers, no run containers)."""
    containers: dict[int, list[int]] = {}
    for row in sorted(set(rows)):
        containers.setdefault(row >> 16, []).append(row & 0xFFFF)
    keys = sorted(containers)
    header = struct.pack("<II", 12346, len(keys))
    header += b"".join(struct.pack("<HH", k, len(containers[k]) - 1) for k in keys)
    bodies = []
    for k in keys:
        low = containers[k]
        if len(low) <= _ROARING_ARRAY_MAX:
            bodies.append(struct.pack(f"<{len(low)}H", *low))
        else:
            words = [0] * 1024
            for v in low:
                words[v >> 6] |= 1 << (v & 63)
            bodies.append(struct.pack("<1024Q", *words))
    offset = len(header) + 4 * len(keys)
    offsets = b""
    for body in bodies:
        offsets += struct.pack("<I", offset)
        offset += len(body)
    return (
        struct.pack("<iq", 1681511377, 1)
        + struct.pack("<i", 0)
        + header
        + offsets
        + b"".join(bodies)
    )


def create(spark: Any, path: str, rows: int, files: int) -> None:
    from pyspark.sql import functions as F

    _create_table(spark, path, [[name, ddl, ""] for name, ddl in TYPES.items()])
    (
        spark.range(0, rows, numPartitions=files)
        .select(
            F.col("id").cast("int").alias("id"),
            F.concat(F.lit("name-"), F.col("id")).alias("name"),
            (F.col("id") % 1000).cast("int").alias("qty"),
            F.expr("repeat('x', int(id % 50))").alias("note"),
            F.format_string("%020d", F.col("id")).alias("_dblog_position"),
            F.lit("r").alias("_dblog_op"),
            F.lit(False).alias("_dblog_deleted"),
        )
        .write.format("delta")
        .mode("append")
        .save(path)
    )


def merge(spark: Any, path: str, batch: Any) -> dict[str, float]:
    from delta.tables import DeltaTable

    started = time.time()
    values = {"qty": "s.qty", "_dblog_position": "s.p", "_dblog_op": "'u'"}
    (
        DeltaTable.forPath(spark, path)
        .alias("t")
        .merge(batch.alias("s"), "t.id = s.id")
        .whenMatchedUpdate("s.p > t._dblog_position", set=values)
        .whenNotMatchedInsert(values={"id": "s.id", **values, "_dblog_deleted": "false"})
        .execute()
    )
    return {"total": time.time() - started}


class Positional:
    """The positional write through Delta's transaction API (py4j)."""

    def __init__(self, spark: Any) -> None:
        jvm = spark._jvm
        self.spark, self.jvm = spark, jvm
        self.none = jvm.scala.Option.empty()
        self.seqs = jvm.scala.jdk.javaapi.CollectionConverters
        hadoop = spark._jsc.hadoopConfiguration()
        self.store = self._object("storage.dv.DeletionVectorStore$").createInstance(hadoop)
        self.stored = self._object("deletionvectors.StoredBitmap$")
        self.operation = self._object("DeltaOperations$ManualUpdate$")
        self.portable = self._object("deletionvectors.RoaringBitmapArrayFormat$").Portable()
        self.bitmaps = jvm.org.apache.spark.sql.delta.deletionvectors.RoaringBitmapArray

    def _object(self, name: str) -> Any:
        """A Scala object of Delta's (``MODULE$`` of its class)."""
        cls = self.jvm.java.lang.Class.forName(f"org.apache.spark.sql.delta.{name}")
        return cls.getField("MODULE$").get(None)

    def write(self, path: str, batch: Any) -> dict[str, float]:
        from pyspark.sql import functions as F

        delta = self.jvm.org.apache.spark.sql.delta
        t0 = time.time()
        log = delta.DeltaLog.forTable(self.spark._jsparkSession, path)
        txn = log.startTransaction(self.none, self.none)
        no_filters = self.seqs.asScala(self.jvm.java.util.ArrayList()).toList()
        files = {a.path(): a for a in self.seqs.asJava(txn.filterFiles(no_filters, True))}
        t1 = time.time()
        table = (
            self.spark.read.format("delta")
            .option("versionAsOf", txn.readVersion())
            .load(path)
            .select(
                *COLUMNS,
                F.col("_metadata.file_path").alias("_file"),
                F.col("_metadata.row_index").alias("_row"),
            )
        )
        source = F.broadcast(batch.withColumnRenamed("qty", "_qty"))
        newer = F.col("_row").isNull() | (F.col("p") > F.col("_dblog_position"))
        changed = table.join(source, "id", "right").where(newer).localCheckpoint()
        replaced = changed.where(F.col("_row").isNotNull())  # the rest are new keys
        t2 = time.time()
        new = {c: F.col(c) for c in COLUMNS}
        new.update(
            qty=F.col("_qty"),
            _dblog_position=F.col("p"),
            _dblog_op=F.lit("u"),
            _dblog_deleted=F.lit(False),
        )
        post = changed.select(
            *[v.alias(c) for c, v in new.items()], F.col("_row").isNull().alias("_new")
        )
        out = (
            post.select(*COLUMNS, F.lit(None).cast("string").alias("_change_type"))
            .unionByName(
                post.select(
                    *COLUMNS,
                    F.when(F.col("_new"), "insert")
                    .otherwise("update_postimage")
                    .alias("_change_type"),
                )
            )
            .unionByName(replaced.select(*COLUMNS, F.lit("update_preimage").alias("_change_type")))
        )
        actions = list(self.seqs.asJava(txn.writeFiles(out._jdf)))
        t3 = time.time()
        by_file: dict[str, list[int]] = {}
        for row in replaced.select("_file", "_row").collect():
            by_file.setdefault(row["_file"], []).append(row["_row"])
        root = log.dataPath()
        for name, rows in by_file.items():
            relative = name.split("/")[-1]  # an unpartitioned table: files at its root
            add = files[relative]
            bitmap = self.bitmaps.readFrom(portable_bitmap(rows))
            if add.deletionVector() is not None:
                bitmap.merge(self.stored.create(add.deletionVector(), root).load(self.store))
            descriptor = delta.actions.DeletionVectorDescriptor.inlineInLog(
                bitmap.serializeAsByteArray(self.portable), bitmap.cardinality()
            )
            pair = add.removeRows(descriptor, True, True)
            actions += [pair._1(), pair._2()]
        t4 = time.time()
        txn.commit(self.seqs.asScala(actions).toList(), self.operation)
        t5 = time.time()
        return {
            "txn": t1 - t0,
            "scan": t2 - t1,
            "write": t3 - t2,
            "dvs": t4 - t3,
            "commit": t5 - t4,
            "total": t5 - t0,
        }


def feed_counts(spark: Any, path: str) -> dict[str, int]:
    feed = spark.read.format("delta").option("readChangeFeed", "true").option("startingVersion", 2)
    rows = feed.load(path).groupBy("_change_type").count().collect()
    return {r["_change_type"]: r["count"] for r in rows}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--files", type=int, default=100)
    parser.add_argument("--keys", type=int, default=5000)
    parser.add_argument("--inserts", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=6)
    args = parser.parse_args(argv)

    from airflow_dblog.spark.session import build_spark_session

    work = Path(tempfile.mkdtemp(prefix="bench-write-paths-"))
    paths = {"merge": str(work / "merge"), "positional": str(work / "positional")}
    spark = build_spark_session("bench-write-paths", "local[2]", {"spark.ui.enabled": False})
    try:
        for path in paths.values():
            create(spark, path, args.rows, args.files)
        positional = Positional(spark)
        writers = {"merge": partial(merge, spark), "positional": positional.write}
        rng = random.Random(13)
        rounds: list[dict[str, Any]] = []
        for n in range(args.rounds):
            first_new = args.rows + n * args.inserts
            keys = rng.sample(range(args.rows), args.keys)
            keys += range(first_new, first_new + args.inserts)
            position = f"{10**15 + n:020d}"
            data = [(k, rng.randrange(1000), position) for k in keys]
            batch = spark.createDataFrame(data, "id int, qty int, p string")
            order = ["merge", "positional"] if n % 2 == 0 else ["positional", "merge"]
            took = {name: writers[name](paths[name], batch) for name in order}
            rounds.append(
                {name: {k: round(v, 2) for k, v in t.items()} for name, t in took.items()}
            )
            print(json.dumps({"round": n, **rounds[-1]}), file=sys.stderr, flush=True)
        tables = {name: spark.read.format("delta").load(p) for name, p in paths.items()}
        same = (
            tables["merge"].exceptAll(tables["positional"]).count() == 0
            and tables["positional"].exceptAll(tables["merge"]).count() == 0
        )
        feeds = {name: feed_counts(spark, p) for name, p in paths.items()}
        warm = rounds[1:] or rounds  # the first round of each path warms its JVM code
        median = {name: statistics.median(r[name]["total"] for r in warm) for name in writers}
        result = {
            "rows": args.rows,
            "files": args.files,
            "keys": args.keys,
            "inserts": args.inserts,
            "rounds": rounds,
            "median_s_after_first": {k: round(v, 2) for k, v in median.items()},
            "positional_phases_median_s": {
                phase: round(statistics.median(r["positional"][phase] for r in warm), 2)
                for phase in ("txn", "scan", "write", "dvs", "commit")
            },
            "merge_over_positional": round(median["merge"] / median["positional"], 2),
            "tables_equal": same,
            "change_feeds": feeds,
            "change_feeds_equal": feeds["merge"] == feeds["positional"],
        }
        print(json.dumps(result, indent=2))
        return result
    finally:
        spark.stop()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
