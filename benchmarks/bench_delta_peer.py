"""The Delta path against the pipeline users build: Debezium -> Kafka -> a Spark MERGE job, and
against Spark's own JDBC copy, on MariaDB.

One run, one JSON object. The same MariaDB table (``write_rows``: ROWS rows) and the same Kafka
broker; the pipelines run one after another, never at the same time, each into a Delta table of
its own with deletion vectors and the change data feed on:

- ``dblog``: ``dblog stream`` (Delta + Kafka, ``local[2]``, dump chunk size ``--chunk-size``,
  parallelism 1), timed from ``dblog dump --table`` on a running stream;
- ``peer``: Debezium Server (as in bench_debezium: MariaDB connector, Kafka sink, JSON without
  schemas, ``snapshot.mode=no_data``, decimals as text) with an incremental snapshot of chunk
  ``--chunk-size`` requested by an ``execute-snapshot`` row in its signal table, and a PySpark
  Structured Streaming job of this file (``--peer-job``, the same session builder, Spark, Delta
  and jars as dblog, ``local[2]``) reading the topic with Spark's Kafka source, trigger 1 s, whose
  ``foreachBatch`` does the upsert pattern of Delta's documentation: the newest change per key in
  the batch (sequence: the Kafka offset), one MERGE with a sequence guard, delete on ``op = d``,
  insert when not matched; timed from the signal row's INSERT;
- ``floor`` (quiet only): ``spark.read.jdbc`` of the table (MariaDB's JDBC driver, one
  partition) appended to a Delta table in a child process (``--floor-job``, ``local[2]``), timed
  from the read, after the session is up.

``--loads`` (``quiet,300,2000``): ``quiet`` writes nothing; ``N`` runs writers that update random
existing rows at N updates/s in all from 2 s before the request until Delta holds every key (no
inserts or deletes: the table keeps ROWS keys). For each pipeline and load:

- ``holds_all_s``: from the request to the Delta commit after which the table holds ROWS rows,
  read from the table's log alone (add and remove actions, their row counts and deletion-vector
  cardinalities; the same reader for every table, no Spark, so polling costs the pipelines
  nothing); ``rows_per_s`` = ROWS / ``holds_all_s``;
- ``equal_after_writes_s``: from the writers' stop (quiet: right after ``holds_all``) to the
  Delta commit that holds a marker row's new value (one row updated right after the writers
  stop; both pipelines apply changes in log order, so every earlier change is in too), checked
  in the parquet files that commit added;
- ``lag_under_load_s`` (``--lag-probes N``, under load): with the writers still running after
  ``holds_all`` (dblog: after the dump is done), N markers one after another, 0 to 5 s apart at
  random, each timed from its UPDATE to the Delta commit holding it: how far Delta trails the
  source at a random point of the pipeline's batches rather than at the dump's end; the
  writers stop after the last;
- ``read_back``: at the end, every Delta table is read with Spark and compared value by value
  with the source as it was when its run ended;
- ``cpu_s``: CPU seconds of the pipeline's whole process trees from the request to
  ``holds_all`` (dblog: driver, JVM, Python workers; peer: Debezium's JVM and the Spark job's
  tree), sampled every 0.25 s per process; ``peak_rss_bytes``: the trees' summed RSS, sampled.

    cd benchmarks && python bench_delta_peer.py [--rows 200000] [--loads quiet,300,2000]
                                                [--chunk-size 10000] [--timeout 900]
                                                [--debezium-version 3.6.3.Final]
                                                [--jdbc-version 3.5.11] [--keep-logs DIR]
                                                [--lag-probes 0]

Needs the local services (scripts/services.sh up) and Java 21+ for Debezium Server. Debezium
Server and the MariaDB JDBC driver are downloaded from Maven Central once into
``${DBLOG_CACHE_DIR:-~/.cache/airflow-dblog}``. Leaves nothing behind but its JSON: the database,
the topics, the processes and the temporary directory are removed even when a step fails.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import random
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import unquote

import pymysql
from bench_debezium import (
    KAFKA,
    PORT,
    LoadSampler,
    TopicWatch,
    cache_dir,
    create_source,
    create_topics,
    debezium_properties,
    debezium_server,
    delete_topics,
    find_java,
    java_version,
    probe_until_seen,
)
from bench_stream import Writer, cpu_seconds, process_tree, rss_of_tree, stop

from airflow_dblog.cli import main as dblog
from airflow_dblog.config import load_config
from airflow_dblog.engine.metadata import MetadataStore
from airflow_dblog.sources.base import Column
from airflow_dblog.sources.mysql.connection import parse_mysql_url

SEQ = "_seq"  # the peer's sequence column: the change's Kafka offset
MAVEN_JDBC = "https://repo1.maven.org/maven2/org/mariadb/jdbc/mariadb-java-client"
SETTLE_S = 5.0  # from a pipeline's readiness to its request: not measured
WRITERS_LEAD_S = 2.0  # writers start this long before the request: a steady load at the start
WARMED_UP = (b" running: ", b"chunk jobs warmed up", b"Delta warmed up")  # the stream's start
WRITES_PER_WRITER = 500  # updates/s one writer thread is asked for


def mariadb_jdbc_jar(version: str) -> Path:
    """MariaDB's JDBC driver, downloaded from Maven Central into the cache on first use."""
    jar = cache_dir() / f"mariadb-java-client-{version}.jar"
    if jar.exists():
        return jar
    jar.parent.mkdir(parents=True, exist_ok=True)
    part = jar.with_name(jar.name + ".part")
    url = f"{MAVEN_JDBC}/{version}/mariadb-java-client-{version}.jar"
    print(f"downloading {url}", file=sys.stderr)
    done = subprocess.run(
        ["curl", "-fsSL", "--retry", "3", "-o", str(part), url], capture_output=True, text=True
    )
    if done.returncode != 0:
        part.unlink(missing_ok=True)
        raise RuntimeError(f"downloading {url} failed: {done.stderr.strip()}")
    part.rename(jar)
    return jar


# --- the child processes: the peer's Spark job and the floor's copy --------------------------


def _create_table(spark: Any, path: str, columns: list[list[str]], extra: str = "") -> None:
    """A Delta table of ``columns`` ([name, Spark type, kind]), deletion vectors and CDF on."""
    ddl = ", ".join([f"`{name}` {ddl}" for name, ddl, _ in columns] + ([extra] if extra else []))
    spark.sql(
        f"CREATE TABLE IF NOT EXISTS delta.`{path}` ({ddl}) USING delta TBLPROPERTIES"
        " ('delta.enableDeletionVectors' = 'true', 'delta.enableChangeDataFeed' = 'true')"
    )


def peer_job(spec: dict[str, Any]) -> None:
    """Debezium's topic -> Delta: the upsert pattern of Delta's documentation in foreachBatch."""
    from delta.tables import DeltaTable
    from pyspark.sql import Window
    from pyspark.sql import functions as F
    from pyspark.sql import types as T

    from airflow_dblog.spark.session import build_spark_session

    path, columns, key = spec["delta"], spec["columns"], spec["key"]
    spark = build_spark_session(
        "bench-peer", "local[2]", {"spark.ui.enabled": False}, [path, spec["checkpoint"]]
    )
    _create_table(spark, path, columns, f"{SEQ} BIGINT")
    image = T.StructType([T.StructField(name, T.StringType()) for name, _, _ in columns])
    envelope = T.StructType(
        [T.StructField(f, image) for f in ("before", "after")]
        + [T.StructField("op", T.StringType()), T.StructField("ts_ms", T.LongType())]
    )

    def typed(value: Any, ddl: str, kind: str) -> Any:
        """Debezium's JSON value (kept as its text) as the column's type."""
        if kind == "micros":  # DATETIME(4-6): MicroTimestamp
            return F.timestamp_micros(value.cast("bigint"))
        if kind == "millis":  # DATETIME(0-3): Timestamp
            return F.timestamp_millis(value.cast("bigint"))
        if kind == "days":  # DATE: days since the epoch
            return F.date_from_unix_date(value.cast("int"))
        return value.cast(ddl)

    names = [name for name, _, _ in columns] + [SEQ]
    values = {n: f"s.`{n}`" for n in names}
    on = " AND ".join(f"t.`{k}` = s.`{k}`" for k in key)

    def upsert(batch: Any, batch_id: int) -> None:
        change = F.from_json(F.col("value").cast("string"), envelope)
        events = batch.where(F.col("value").isNotNull()).select(
            change.alias("e"), F.col("offset").alias(SEQ)
        )
        row = F.when(F.col("e.op") == "d", F.col("e.before")).otherwise(F.col("e.after"))
        changes = events.select(
            *[typed(row.getField(n), ddl, kind).alias(n) for n, ddl, kind in columns],
            F.col("e.op").alias("_op"),
            F.col(SEQ),
        )
        newest = Window.partitionBy(*key).orderBy(F.col(SEQ).desc())
        latest = changes.withColumn("_n", F.row_number().over(newest)).where("_n = 1")
        (
            DeltaTable.forPath(spark, path)
            .alias("t")
            .merge(latest.alias("s"), on)
            .whenMatchedDelete(f"s._op = 'd' AND s.{SEQ} > t.{SEQ}")
            .whenMatchedUpdate(f"s.{SEQ} > t.{SEQ}", set=values)
            .whenNotMatchedInsert("s._op != 'd'", values=values)
            .execute()
        )

    query = (
        spark.readStream.format("kafka")
        .option("kafka.bootstrap.servers", KAFKA)
        .option("subscribe", spec["topic"])
        .option("startingOffsets", "earliest")
        .load()
        .writeStream.foreachBatch(upsert)
        .option("checkpointLocation", spec["checkpoint"])
        .trigger(processingTime="1 second")
        .start()
    )
    stopping = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stopping.set())
    print("peer job running", flush=True)
    while not stopping.is_set() and not query.awaitTermination(1):
        pass
    query.stop()
    spark.stop()


def floor_job(spec: dict[str, Any]) -> None:
    """``spark.read.jdbc`` of the table appended to Delta; prints when it started and its CPU."""
    from pyspark.sql import functions as F

    from airflow_dblog.spark.session import build_spark_session

    path, columns = spec["delta"], spec["columns"]
    conf = {"spark.ui.enabled": False, "spark.driver.extraClassPath": spec["jar"]}
    spark = build_spark_session("bench-floor", "local[2]", conf, [path])
    _create_table(spark, path, columns)
    cpu = cpu_seconds(process_tree(os.getpid()))
    started = time.time()
    rows = spark.read.jdbc(
        spec["url"],
        spec["table"],
        properties={"user": "dblog", "password": "dblog", "driver": "org.mariadb.jdbc.Driver"},
    )
    typed = rows.select(*[F.col(f"`{n}`").cast(ddl).alias(n) for n, ddl, _ in columns])
    typed.write.format("delta").mode("append").save(path)
    took = time.time() - started
    used = cpu_seconds(process_tree(os.getpid())) - cpu
    print(json.dumps({"started_at": started, "seconds": took, "cpu_s": used}), flush=True)
    spark.stop()


# --- measuring ---------------------------------------------------------------------------------


@dataclass
class Commit:
    version: int
    at: float  # epoch seconds (the commit's timestamp)
    live_rows: int  # rows in the table after it
    added: list[str]  # data files it wrote, relative to the table


class DeltaLog:
    """A Delta table's live rows from its log alone: the add and remove actions, each file's
    ``numRecords`` less its deletion vector's cardinality. Reads each commit once."""

    def __init__(self, table: Path) -> None:
        self.table = table
        self.version = 0
        self.files: dict[tuple[str, str], int] = {}

    @staticmethod
    def _file(action: dict[str, Any]) -> tuple[str, str]:
        dv = action.get("deletionVector") or {}
        return action[
            "path"
        ], f"{dv.get('storageType')}{dv.get('pathOrInlineDv')}@{dv.get('offset')}"

    def poll(self) -> list[Commit]:
        """The commits written since the last call."""
        new = []
        while True:
            try:
                text = (self.table / "_delta_log" / f"{self.version:020d}.json").read_text()
                actions = [json.loads(line) for line in text.splitlines() if line]
            except (FileNotFoundError, json.JSONDecodeError):
                return new
            at, added = 0.0, []
            for action in actions:
                if add := action.get("add"):
                    dv = add.get("deletionVector") or {}
                    rows = json.loads(add["stats"])["numRecords"] - dv.get("cardinality", 0)
                    self.files[self._file(add)] = rows
                    if not dv:  # a new file (a re-added one only has a new deletion vector)
                        added.append(add["path"])
                elif remove := action.get("remove"):
                    self.files.pop(self._file(remove), None)
                elif info := action.get("commitInfo"):
                    at = (info.get("inCommitTimestamp") or info["timestamp"]) / 1000
            new.append(Commit(self.version, at, sum(self.files.values()), added))
            self.version += 1

    def holds(self, commit: Commit, key: str, value: int, column: str, wanted: str) -> bool:
        """Whether ``commit`` added the row ``key = value`` with ``column = wanted``."""
        import pyarrow.parquet as pq

        for name in commit.added:
            rows = pq.read_table(
                self.table / unquote(name), columns=[column], filters=[(key, "=", value)]
            )
            if wanted in rows.column(column).to_pylist():
                return True
        return False


class TreeMeter(threading.Thread):
    """CPU seconds and summed RSS of process trees, sampled every 0.25 s. Each process's CPU is
    its last sample, so a process that exits (a Python worker) keeps what it used."""

    def __init__(self, roots: list[int]) -> None:
        super().__init__(daemon=True)
        self.roots = roots
        self.cpu: dict[int, float] = {}
        self.kind: dict[int, str] = {}  # pid -> its kind of process: what the CPU went to
        self.peak_rss = 0
        self.lock = threading.Lock()
        self.stop = threading.Event()

    def sample(self) -> float:
        """CPU seconds so far (and the RSS peak updated)."""
        with self.lock:
            for root in self.roots:
                for pid in process_tree(root):
                    self.cpu[pid] = max(self.cpu.get(pid, 0.0), cpu_seconds([pid]))
                    kind = process_kind(pid)  # asked again: a shell may exec a JVM
                    self.kind[pid] = f"{kind} (root)" if pid == root else kind
            self.peak_rss = max(self.peak_rss, sum(rss_of_tree(root) for root in self.roots))
            return sum(self.cpu.values())

    def by_kind(self) -> dict[str, float]:
        """CPU seconds so far by kind of process: the roots (dblog's driver; the peer's Debezium
        and its Spark job's driver), their JVMs and Python workers."""
        with self.lock:
            out: dict[str, float] = {}
            for pid, cpu in self.cpu.items():  # sample() names each pid it measures
                out[self.kind[pid]] = round(out.get(self.kind[pid], 0.0) + cpu, 2)
            return out

    def add(self, pid: int) -> None:
        with self.lock:
            self.roots.append(pid)

    def run(self) -> None:
        while not self.stop.wait(0.25):
            self.sample()


def process_kind(pid: int) -> str:
    try:
        name = Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return "other"
    return "java" if name == "java" else "python" if name.startswith("python") else name


def wait_until(what: str, done: Any, procs: list[tuple[Any, Path]], timeout: float) -> bool:
    """Poll ``done()`` every 0.2 s; False after ``timeout`` s; fail if a process exits."""
    deadline = time.monotonic() + timeout
    while not done():
        for proc, log in procs:
            if proc.poll() is not None:
                raise RuntimeError(f"{what}: a process exited ({proc.returncode}); see {log}")
        if time.monotonic() > deadline:
            return False
        time.sleep(0.2)
    return True


def stop_all(procs: list[tuple[Any, Path]]) -> None:
    """SIGTERM each process (SIGKILL after 60 s), then SIGKILL what is left of its tree."""
    for proc, _ in procs:
        tree = process_tree(proc.pid)
        stop(proc)
        for pid in tree[1:]:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def source_rows(
    conn: Any, db: str, names: list[str], key: str, timestamps: set[str]
) -> dict[str, int]:
    """The source table as ``{key as text: hash of the row's values as text}``."""
    at = names.index(key)

    def text(name: str, value: Any) -> str | None:
        if value is None:
            return None
        if name in timestamps:
            return value.strftime("%Y-%m-%d %H:%M:%S.%f")
        return str(value)

    cols = ", ".join(f"`{n}`" for n in names)
    with conn.cursor() as cur:
        cur.execute(f"SELECT {cols} FROM `{db}`.bench")
        return {
            str(row[at]): hash(tuple(text(n, v) for n, v in zip(names, row, strict=True)))
            for row in cur.fetchall()
        }


@dataclass
class Bench:
    url: str
    conn: Any
    db: str
    rows: int
    chunk_size: int
    work: Path
    timeout: float
    columns: list[list[str]]  # [name, Spark type, kind] of the table
    key: str
    lag_probes: int = 0  # markers timed with the writers still running, after the dump
    java: str = ""
    debezium_home: Path | None = None
    prefixes: list[str] = field(default_factory=list)  # topic prefixes to delete
    # (load, pipeline) -> (table, where, snapshot of the source at the run's end)
    finished: dict[tuple[str, str], tuple[Path, str, dict[str, int]]] = field(default_factory=dict)

    def _marker_seen(
        self, pipeline: str, delta: DeltaLog, procs: list[tuple[Any, Path]]
    ) -> float | None:
        """Update row 0's ``note`` to a new marker; when the first Delta commit holding it was
        made (None: not within the timeout). Writers touch ``qty`` alone, so a later image of
        the row still carries the marker."""
        delta.poll()  # what was committed before the marker
        marker = f"marker-{uuid.uuid4().hex}"
        with self.conn.cursor() as cur:
            cur.execute(f"UPDATE `{self.db}`.bench SET note = %s WHERE id = 0", (marker,))
        seen: list[Commit] = []

        def marker_in() -> bool:
            seen.extend(c for c in delta.poll() if delta.holds(c, self.key, 0, "note", marker))
            return bool(seen)

        if wait_until(f"{pipeline}: the marker in Delta", marker_in, procs, self.timeout):
            return seen[0].at
        return None

    def _lag_probes(
        self, pipeline: str, delta: DeltaLog, procs: list[tuple[Any, Path]]
    ) -> dict[str, Any]:
        """With the writers still running after the dump: ``lag_probes`` markers one after
        another, each from its UPDATE to the Delta commit holding it, 0 to 5 s apart at random so
        that they fall anywhere in the pipelines' batches."""
        lags: list[float] = []
        for _ in range(self.lag_probes):
            time.sleep(random.uniform(0, 5))
            written = time.time()
            at = self._marker_seen(pipeline, delta, procs)
            if at is None:
                break
            lags.append(round(at - written, 2))
        return {
            "probes": lags,
            "median": statistics.median(lags) if lags else None,
            "max": max(lags, default=None),
        }

    def measure(
        self,
        load: str,
        pipeline: str,
        table: Path,
        live: str,
        request: Any,
        procs: list[tuple[Any, Path]],
        meter: TreeMeter,
    ) -> dict[str, Any]:
        """Writers (under load), the request, until Delta holds every key, the writers' stop,
        until Delta holds the marker. ``live``: the SQL filter of live rows at the read-back."""
        rate = 0 if load == "quiet" else float(load)
        n = math.ceil(rate / WRITES_PER_WRITER)
        writers = [
            Writer(self.url, self.db, self.rows, rate / n, random.randrange(1 << 30))
            for _ in range(n)
        ]
        for writer in writers:
            writer.start()
        if writers:
            time.sleep(WRITERS_LEAD_S)
        delta = DeltaLog(table)
        result: dict[str, Any] = {}
        try:
            cpu0, writes0 = meter.sample(), sum(w.writes for w in writers)
            split0 = meter.by_kind()
            requested = time.time()
            extra = request()
            holding: list[Commit] = []

            def holds_all() -> bool:
                holding.extend(c for c in delta.poll() if c.live_rows >= self.rows)
                return bool(holding)

            if wait_until(f"{pipeline}: Delta holds every key", holds_all, procs, self.timeout):
                took = holding[0].at - requested
                result.update(
                    holds_all_s=round(took, 2),
                    rows_per_s=round(self.rows / took),
                    delta_commits=holding[0].version + 1,
                )
            else:
                result.update(holds_all_s=None, live_rows_at_timeout=sum(delta.files.values()))
            cpu = meter.sample() - cpu0
            split = meter.by_kind()
            result["cpu_s"] = round(cpu, 2)
            result["cpu_s_by_process"] = {
                k: round(v - split0.get(k, 0.0), 2) for k, v in split.items()
            }
            result["cpu_ms_per_1k_rows"] = round(cpu * 1e6 / self.rows, 1)
            result.update(extra() if extra else {})
            writes = sum(w.writes for w in writers) - writes0
            dumped = time.time()
            if writers and self.lag_probes:
                result["lag_under_load_s"] = self._lag_probes(pipeline, delta, procs)
        finally:
            for writer in writers:
                writer.stop.set()
            for writer in writers:
                writer.join(10)
        stopped = time.time()
        if writers:
            result["writes"] = {
                "target_per_s": rate,
                "writers": len(writers),
                "during_dump": writes,
                "achieved_per_s": round(writes / (dumped - requested)),
            }
        at = self._marker_seen(pipeline, delta, procs)
        result["equal_after_writes_s"] = None if at is None else round(at - stopped, 2)
        result["cpu_s_to_equal"] = round(meter.sample() - cpu0, 2)
        names = [name for name, _, _ in self.columns]
        stamps = {name for name, ddl, _ in self.columns if ddl == "timestamp"}
        self.finished[(load, pipeline)] = (
            table,
            live,
            source_rows(self.conn, self.db, names, self.key, stamps),
        )
        return result

    def run_dblog(self, load: str) -> dict[str, Any]:
        """``dblog stream`` (Delta + Kafka); ``dblog dump --table`` is the request."""
        run = self.work / f"dblog-{load}"
        run.mkdir()
        prefix = f"dblog_{load}_{self.db}"
        self.prefixes.append(prefix)
        create_topics([f"{prefix}.{self.db}.bench"])
        conf = json.dumps({"spark.ui.enabled": False})  # JSON is YAML
        config_path = run / "dblog.yaml"
        config_path.write_text(
            f"""name: {self.db.replace("_", "-")}-{load}
source: {{type: mysql, url: "{self.url}/{self.db}", tables: [{self.db}.bench]}}
metadata: {{url: "sqlite:///{run}/meta.db"}}
dump: {{chunk_size: {self.chunk_size}, parallelism: 1}}
sinks:
  delta: {{path: {run}/delta}}
  kafka: {{bootstrap_servers: "{KAFKA}", topic_prefix: {prefix}}}
checkpoint: {run}/checkpoint
spark: {{master: "local[2]", conf: {conf}}}
"""
        )
        config = load_config(config_path)
        store = MetadataStore(config.metadata_url)
        log = run / "dblog-stream.log"
        with open(log, "wb") as out:
            started = time.monotonic()
            proc = subprocess.Popen(
                [sys.executable, "-m", "airflow_dblog.cli", "stream", "-c", str(config_path)],
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        procs = [(proc, log)]
        meter = TreeMeter([proc.pid])
        meter.start()
        try:
            ready = wait_until(  # its chunk jobs' and Delta's warm-ups are the stream's start
                "dblog: running",
                lambda: all(s in log.read_bytes() for s in WARMED_UP),
                procs,
                self.timeout,
            )
            if not ready:
                raise RuntimeError(f"dblog: not running after {self.timeout:.0f} s; see {log}")
            startup = time.monotonic() - started
            time.sleep(SETTLE_S)

            def request() -> Any:
                requested = time.monotonic()
                with contextlib.redirect_stdout(sys.stderr):  # stdout: the JSON alone
                    assert (
                        dblog(["dump", "-c", str(config_path), "--table", f"{self.db}.bench"]) == 0
                    )
                dump_id = max(d.id for d in store.dumps(config.name))

                def done() -> dict[str, Any]:  # after holds_all: the dump's own "done"
                    finished = wait_until(
                        f"dblog: dump {dump_id} done",
                        lambda: store.progress(dump_id).state == "done",
                        procs,
                        self.timeout,
                    )
                    return {
                        "dump_done_s": round(time.monotonic() - requested, 2) if finished else None
                    }

                return done

            result = self.measure(
                load,
                "dblog",
                run / "delta" / self.db / "bench",
                "NOT _dblog_deleted",
                request,
                procs,
                meter,
            )
            result["startup_s"] = round(startup, 2)
        finally:
            stop_all(procs)
            meter.stop.set()
            meter.join(5)
        result["cpu_s_whole_run"] = round(sum(meter.cpu.values()), 2)
        result["peak_rss_bytes"] = meter.peak_rss
        return result

    def run_peer(self, load: str) -> dict[str, Any]:
        """Debezium Server and the Spark job; the ``execute-snapshot`` signal row is the request."""
        assert self.debezium_home is not None
        run = self.work / f"peer-{load}"
        (run / "config").mkdir(parents=True)
        prefix = f"peer_{load}_{self.db}"
        self.prefixes.append(prefix)
        bench, probe = f"{prefix}.{self.db}.bench", f"{prefix}.{self.db}.probe"
        create_topics([bench, probe])
        (run / "config" / "application.properties").write_text(
            debezium_properties(
                run,
                self.db,
                prefix,
                self.chunk_size,
                random.randint(1 << 20, 1 << 30),
                ["debezium.source.decimal.handling.mode=string"],  # JSON: decimals as text
            )
        )
        table = run / "delta"
        spec = {
            "topic": bench,
            "delta": str(table),
            "checkpoint": str(run / "checkpoint"),
            "columns": self.columns,
            "key": [self.key],
        }
        procs: list[tuple[Any, Path]] = []
        meter = TreeMeter([])
        meter.start()
        watch = TopicWatch([probe])
        watch.start()
        watch.ready.wait(30)
        try:
            job_log = run / "peer-job.log"
            with open(job_log, "wb") as out:
                started = time.monotonic()
                job = subprocess.Popen(
                    [sys.executable, os.path.abspath(__file__), "--peer-job", json.dumps(spec)],
                    stdout=out,
                    stderr=subprocess.STDOUT,
                )
            procs.append((job, job_log))
            meter.add(job.pid)
            ready = wait_until(
                "peer: the Spark job running",
                lambda: b"peer job running" in job_log.read_bytes(),
                procs,
                self.timeout,
            )
            if not ready:
                raise RuntimeError(f"peer: the job not running after {self.timeout:.0f} s")
            runner = next(self.debezium_home.glob("debezium-server-*runner.jar"))
            classpath = os.pathsep.join(
                [
                    str(runner),
                    str(self.debezium_home / "config" / "lib"),
                    str(self.debezium_home / "lib/*"),
                ]
            )
            dbz_log = run / "debezium.log"
            with open(dbz_log, "wb") as out:
                debezium = subprocess.Popen(
                    # the option: Quarkus's thread pool on Java 24+ (else an error at shutdown)
                    [
                        self.java,
                        "--add-opens=java.base/java.lang=ALL-UNNAMED",
                        "-cp",
                        classpath,
                        "io.debezium.server.Main",
                    ],
                    cwd=run,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                )
            procs.append((debezium, dbz_log))
            meter.add(debezium.pid)
            probe_until_seen(self.conn, self.db, watch, probe, debezium, dbz_log)
            startup = time.monotonic() - started
            time.sleep(SETTLE_S)
            payload = json.dumps({"data-collections": [f"{self.db}.bench"], "type": "incremental"})

            def request() -> None:
                with self.conn.cursor() as cur:
                    cur.execute(
                        f"INSERT INTO `{self.db}`.debezium_signal"
                        " VALUES (%s, 'execute-snapshot', %s)",
                        (uuid.uuid4().hex, payload),
                    )

            result = self.measure(load, "peer", table, "true", request, procs, meter)
            result["startup_s"] = round(startup, 2)
        finally:
            watch.stop.set()
            stop_all(procs)
            meter.stop.set()
            meter.join(5)
            watch.join(30)
        result["cpu_s_whole_run"] = round(sum(meter.cpu.values()), 2)
        result["peak_rss_bytes"] = meter.peak_rss
        return result

    def run_floor(self, jar: Path) -> dict[str, Any]:
        """``spark.read.jdbc`` appended to Delta, in a child process."""
        run = self.work / "floor"
        run.mkdir()
        table = run / "delta"
        spec = {
            # the jdbc:mysql scheme picks Spark's MySQL dialect (backquoted names); MariaDB's
            # driver accepts it with permitMysqlScheme
            "url": f"jdbc:mysql://127.0.0.1:{PORT}/{self.db}?permitMysqlScheme",
            "table": "bench",
            "delta": str(table),
            "columns": self.columns,
            "jar": str(jar),
        }
        log = run / "floor.log"
        with open(log, "wb") as err:
            proc = subprocess.Popen(
                [sys.executable, os.path.abspath(__file__), "--floor-job", json.dumps(spec)],
                stdout=subprocess.PIPE,
                stderr=err,
            )
        meter = TreeMeter([proc.pid])
        meter.start()
        try:
            out, _ = proc.communicate(timeout=self.timeout)
        finally:
            stop_all([(proc, log)])
            meter.stop.set()
            meter.join(5)
        if proc.returncode != 0:
            raise RuntimeError(f"floor: the job failed ({proc.returncode}); see {log}")
        copied = json.loads(out.decode().strip().splitlines()[-1])
        commits = DeltaLog(table).poll()
        took = commits[-1].at - copied["started_at"]
        names = [name for name, _, _ in self.columns]
        stamps = {name for name, ddl, _ in self.columns if ddl == "timestamp"}
        self.finished[("quiet", "floor")] = (
            table,
            "true",
            source_rows(self.conn, self.db, names, self.key, stamps),
        )
        return {
            "holds_all_s": round(took, 2),
            "rows_per_s": round(self.rows / took),
            "job_seconds": round(copied["seconds"], 2),
            "live_rows": commits[-1].live_rows,
            "cpu_s": round(copied["cpu_s"], 2),
            "cpu_ms_per_1k_rows": round(copied["cpu_s"] * 1e6 / self.rows, 1),
            "cpu_s_whole_run": round(sum(meter.cpu.values()), 2),
            "peak_rss_bytes": meter.peak_rss,
        }

    def read_back(self) -> dict[tuple[str, str], dict[str, Any]]:
        """Every finished run's Delta table compared with the source as its run left it."""
        from pyspark.sql import functions as F

        from airflow_dblog.spark.session import build_spark_session

        spark = build_spark_session("bench-read-back", "local[2]", {"spark.ui.enabled": False})
        out = {}
        try:
            for (load, pipeline), (table, live, source) in self.finished.items():
                cols = [
                    F.date_format(F.col(n), "yyyy-MM-dd HH:mm:ss.SSSSSS").alias(n)
                    if ddl == "timestamp"
                    else F.col(f"`{n}`").cast("string").alias(n)
                    for n, ddl, _ in self.columns
                ]
                rows = spark.read.format("delta").load(str(table)).where(live).select(*cols)
                at = [n for n, _, _ in self.columns].index(self.key)
                delta: dict[str, int] = {}
                doubled = 0
                for row in rows.toLocalIterator():
                    doubled += row[at] in delta
                    delta[row[at]] = hash(tuple(row))
                differing = sum(1 for k, v in source.items() if k in delta and delta[k] != v)
                missing = sum(1 for k in source if k not in delta)
                out[(load, pipeline)] = {
                    "equal": not (differing or missing or doubled) and len(delta) == len(source),
                    "source_rows": len(source),
                    "delta_rows": len(delta) + doubled,
                    "missing": missing,
                    "extra": sum(1 for k in delta if k not in source),
                    "doubled": doubled,
                    "differing": differing,
                }
        finally:
            spark.stop()
        return out


def table_columns(conn: Any, db: str) -> tuple[list[list[str]], str]:
    """Table bench's columns as [name, Spark type (dblog's Delta type), Debezium kind], and its
    key column."""
    from airflow_dblog.sinks.delta_sink import spark_type

    with conn.cursor() as cur:
        cur.execute(
            "SELECT COLUMN_NAME, COLUMN_TYPE, COLUMN_KEY, DATETIME_PRECISION"
            " FROM information_schema.COLUMNS WHERE TABLE_SCHEMA = %s AND TABLE_NAME = 'bench'"
            " ORDER BY ORDINAL_POSITION",
            (db,),
        )
        found = cur.fetchall()
    columns, key = [], ""
    for name, kind, column_key, precision in found:
        ddl = spark_type(Column(name, kind, True)).simpleString()
        how = "cast"
        if kind.startswith("datetime"):
            how = "micros" if (precision or 0) > 3 else "millis"
        elif kind == "date":
            how = "days"
        columns.append([name, ddl, how])
        key = key or (name if column_key == "PRI" else "")
    return columns, key


def main(argv: list[str] | None = None) -> dict[str, Any] | None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--loads", default="quiet,300,2000", help="quiet and/or updates per second")
    parser.add_argument("--chunk-size", type=int, default=10_000, help="dump and snapshot chunk")
    parser.add_argument("--timeout", type=float, default=900, help="seconds any one wait may take")
    parser.add_argument("--debezium-version", default="3.6.3.Final")
    parser.add_argument("--jdbc-version", default="3.5.11", help="org.mariadb.jdbc driver")
    parser.add_argument("--java", help="Debezium Server's java (default: the first 21+ found)")
    parser.add_argument("--keep-logs", metavar="DIR", help="copy the processes' logs here")
    parser.add_argument(
        "--lag-probes", type=int, default=0, help="markers timed under load after the dump"
    )
    parser.add_argument(
        "--pipelines", default="dblog,peer,floor", help="which of dblog, peer and floor to run"
    )
    parser.add_argument("--peer-job", metavar="JSON", help=argparse.SUPPRESS)
    parser.add_argument("--floor-job", metavar="JSON", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.peer_job:
        peer_job(json.loads(args.peer_job))
        return None
    if args.floor_job:
        floor_job(json.loads(args.floor_job))
        return None
    loads = [s.strip() for s in args.loads.split(",") if s.strip()]
    for load in loads:
        if load != "quiet" and not load.isdigit():
            parser.error(f"--loads: {load!r} is neither quiet nor a number of updates/s")
    pipelines = {s.strip() for s in args.pipelines.split(",") if s.strip()}
    if not pipelines or pipelines - {"dblog", "peer", "floor"}:
        parser.error(f"--pipelines: {args.pipelines!r}: name dblog, peer and/or floor")
    floor = "quiet" in loads and "floor" in pipelines
    # fetch only what the pipelines run: Debezium and a Java 21+ (peer), the JDBC jar (floor)
    java = (args.java or find_java()) if "peer" in pipelines else None
    home = debezium_server(args.debezium_version) if java else None
    jar = mariadb_jdbc_jar(args.jdbc_version) if floor else None

    url = f"mysql://dblog:dblog@127.0.0.1:{PORT}"
    db = f"bench_{uuid.uuid4().hex[:8]}"
    work = Path(tempfile.mkdtemp(prefix="dblog-bench-delta-peer-"))
    sampler = LoadSampler()
    sampler.start()
    conn = pymysql.connect(**parse_mysql_url(url).pymysql_kwargs(), autocommit=True)
    result: dict[str, Any] = {
        "benchmark": "delta_peer_mariadb",
        "rows": args.rows,
        "chunk_size": args.chunk_size,
        "debezium_server": args.debezium_version,
        "java_debezium": java_version(java) if java else None,
        "jdbc_driver": args.jdbc_version,
        "loads": loads,
    }
    bench: Bench | None = None
    try:
        create_source(conn, db, args.rows)
        columns, key = table_columns(conn, db)
        bench = Bench(url, conn, db, args.rows, args.chunk_size, work, args.timeout, columns, key)
        bench.lag_probes = args.lag_probes
        bench.java, bench.debezium_home = java or "", home
        result["floor"] = bench.run_floor(jar) if jar else None
        runs: dict[str, dict[str, Any]] = {}
        for load in loads:
            runs[load] = {
                "dblog": bench.run_dblog(load) if "dblog" in pipelines else {},
                "peer": bench.run_peer(load) if "peer" in pipelines else {},
            }
        for (load, pipeline), checked in bench.read_back().items():
            target = result["floor"] if pipeline == "floor" else runs[load][pipeline]
            target["read_back"] = checked
        result["runs"] = runs
        result["ratios"] = ratios(runs, result["floor"])
    finally:
        sampler.stop.set()
        with conn.cursor() as cur:
            cur.execute(f"DROP DATABASE IF EXISTS `{db}`")
        conn.close()
        if bench is not None:
            delete_topics(bench.prefixes)
        if args.keep_logs:
            Path(args.keep_logs).mkdir(parents=True, exist_ok=True)
            for log in work.rglob("*.log"):
                shutil.copy(log, Path(args.keep_logs) / f"{log.parent.name}-{log.name}")
        shutil.rmtree(work, ignore_errors=True)
    result["load_avg_1m"] = sampler.summary()
    print(json.dumps(result))
    return result


def ratios(runs: dict[str, dict[str, Any]], floor: dict[str, Any] | None) -> dict[str, Any]:
    """Per load: dblog's rows/s, CPU and median lag under load over the peer's, and each one's
    rows/s over the floor's."""

    def over(a: float | None, b: float | None) -> float | None:
        return round(a / b, 3) if a and b else None

    out: dict[str, Any] = {}
    for load, run in runs.items():
        ours, peer = run["dblog"], run["peer"]
        out[load] = {
            "dblog_over_peer_rows_per_s": over(ours.get("rows_per_s"), peer.get("rows_per_s")),
            "dblog_over_peer_cpu_s": over(ours.get("cpu_s"), peer.get("cpu_s")),
            "dblog_over_floor_rows_per_s": over(
                ours.get("rows_per_s"), (floor or {}).get("rows_per_s")
            ),
            "peer_over_floor_rows_per_s": over(
                peer.get("rows_per_s"), (floor or {}).get("rows_per_s")
            ),
            "dblog_over_peer_lag_median": over(
                (ours.get("lag_under_load_s") or {}).get("median"),
                (peer.get("lag_under_load_s") or {}).get("median"),
            ),
        }
    return out


if __name__ == "__main__":
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    main()
