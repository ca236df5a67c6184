"""A JVM class-data-sharing archive for local-mode Spark: the job's start without class loading.

A local stream's JVM loads many thousands of classes (Spark, Delta, Hadoop, Janino) before its
first commit; on a small machine that is most of the session's start and of its first Delta
write. The JVM can map them from an archive instead (CDS, ``-XX:SharedArchiveFile``), which
shortens both (figures in benchmarks/README.md).

``python -m airflow_dblog.spark.class_archive`` makes the archive once per machine (or image):
a short Delta workload in a JVM started with ``-XX:ArchiveClassesAtExit``, written to a
temporary file and renamed into place. :func:`~airflow_dblog.spark.session.java_options`
returns the flag that uses it, for sessions whose JVM PySpark starts (``local[...]`` masters),
with the connector jars on the JVM's own class path (CDS maps only what the built-in class
loaders load, not ``spark.jars``).
The archive is keyed by the Java binary and the class path; the JVM itself checks it against
the jars (sizes and times) and ignores a stale one, so the worst case is today's start.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

from airflow_dblog.engine.connector_jars import jar_conf, local_classpath
from airflow_dblog.errors import DblogError
from airflow_dblog.spark.session import archive_path, build_spark_session


def _workload(folder: str, archive: str) -> None:
    """What a stream's JVM loads before its first batches commit: Delta (change data feed and
    deletion vectors on) created, appended, merged, its change feed and Parquet read back; the
    JVM writes ``archive`` as it exits, which this waits for."""
    from delta.tables import DeltaTable
    from pyspark import SparkContext
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    spark = build_spark_session(
        "airflow-dblog-class-archive",
        "local[2]",
        {
            "spark.ui.enabled": "false",
            "spark.driver.extraJavaOptions": f"-XX:ArchiveClassesAtExit={archive}",
        },
        class_archive=False,
    )
    path = f"{folder}/delta"
    rows = spark.range(0, 1000).select(
        F.col("id").alias("k"), F.lit("x").alias("v"), F.format_string("%09d", "id").alias("p")
    )
    (
        DeltaTable.createIfNotExists(spark)
        .location(path)
        .addColumns(rows.schema)
        .property("delta.enableChangeDataFeed", "true")
        .property("delta.enableDeletionVectors", "true")
        .execute()
    )
    rows.write.format("delta").mode("append").save(path)
    rows.write.parquet(f"{folder}/parquet")
    source = spark.read.parquet(f"{folder}/parquet").where("k % 3 = 0")
    newest = Window.partitionBy("k").orderBy(F.desc("p"))
    source = source.withColumn("_rn", F.row_number().over(newest)).where("_rn = 1").drop("_rn")
    source = source.select("k", F.lit("y").alias("v"), F.concat("p", F.lit("z")).alias("p"))
    (
        DeltaTable.forPath(spark, path)
        .alias("t")
        .merge(source.alias("s"), "t.k = s.k")
        .whenMatchedUpdate(condition="s.p > t.p", set={"v": "s.v", "p": "s.p"})
        .whenNotMatchedInsertAll()
        .execute()
    )
    spark.read.format("delta").option("readChangeFeed", "true").option("startingVersion", 0).load(
        path
    ).collect()
    spark.stop()
    jvm = SparkContext._gateway.proc  # type: ignore[union-attr]
    jvm.stdin.close()  # PySpark's gateway exits on EOF, writing the archive first
    jvm.wait(timeout=300)


def _current() -> Path:
    """The archive path for the cached connector jars and this Java."""
    return archive_path(local_classpath(jar_conf()))


def built() -> bool:
    return _current().is_file()


def make(force: bool = False) -> Path:
    """Build the archive unless it exists; returns its path."""
    path = _current()
    if path.is_file() and not force:
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=path.parent, prefix=".archive-") as work:
        partial = Path(work) / path.name
        code = (
            "from airflow_dblog.spark.class_archive import _workload;"
            f" _workload({work!r}, {str(partial)!r})"
        )
        # the JVM lists every class it cannot archive (signed jars, generated ones): kept quiet
        done = subprocess.run(
            [sys.executable, "-c", code], check=False, capture_output=True, text=True
        )
        if done.returncode or not partial.is_file():
            sys.stderr.write(done.stderr[-5000:])
            raise DblogError(
                f"could not write the JVM class archive {path} (exit {done.returncode})",
                "run `python -m airflow_dblog.spark.class_archive` again; the job runs without it",
            )
        os.replace(partial, path)
    for old in path.parent.glob("spark-*.jsa"):  # large files, for jars or a JDK gone since
        if old != path:
            old.unlink(missing_ok=True)
    return path


if __name__ == "__main__":
    print(make(force="--force" in sys.argv[1:]))
