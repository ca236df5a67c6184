"""Peer benchmark on MariaDB: Debezium Server's incremental snapshot vs ``dblog dump``, to Kafka.

One run, one JSON object. Both tools read the same MariaDB table (``write_rows``: ROWS rows)
and write to the same Kafka broker, one after the other (never at the same time):

- Debezium Server (MariaDB connector, Kafka sink, JSON without schemas, ``snapshot.mode=no_data``
  so it only streams), once with ``incremental.snapshot.chunk.size`` 1024 and once with 10000:
  from the INSERT of an ``execute-snapshot`` signal into the signal table to the first snapshot
  row (op ``r``) on the table's topic, and to all ROWS distinct keys there;
- ``dblog stream`` with the Kafka sink alone (``--dblog-delta``: Delta too, local[2]), dump chunk
  size 10000 and 1024 (``dblog set``), parallelism 1 (``--dblog-parallelism``), the first dump 5 s
  after the stream runs (``--dblog-settle-s``): from ``dblog dump --table`` to the first
  dumped row on the topic, to the dump's state ``done`` in the metadata store, and to all ROWS
  distinct keys on the topic (``read_committed``);
- the baseline in the same run: a plain keyset ``SELECT`` of the table through the driver dblog's
  chunks use (mysqlclient when installed, else PyMySQL), one page
  per chunk size;
- CPU seconds each tool's process tree, MariaDB and the machine used per dump or snapshot, and
  the rows/s the two cores would give if they ran nothing else (where the time goes);
- startup: from each process's start to the first change of a probe table on Kafka (a row is
  inserted every 0.5 s until one arrives), and for dblog to its stream state row existing.

Topics are created empty (one partition) before each process starts and read by assignment
from offset 0, so no consumer-group rebalance is timed. Debezium Server
(``io.debezium:debezium-server-dist:VERSION:tar.gz``) is downloaded from Maven Central once
into ``${DBLOG_CACHE_DIR:-~/.cache/airflow-dblog}/debezium-server-VERSION/``.

    cd benchmarks && python bench_debezium.py [--rows 200000] [--debezium-version 3.6.3.Final]
                                              [--dblog-chunk-sizes 10000,1024] [--dblog-delta]
                                              [--dblog-parallelism 1] [--dblog-settle-s 5]
                                              [--keep-logs DIR]

Needs the local services (scripts/services.sh up) and Java 21+ (``--java``, or the first found
on PATH or under /usr/lib/jvm). Leaves nothing behind but its JSON (and the cached download):
the database, the topics, the processes and the temporary directory are removed even when a step
fails.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import pymysql
from bench_binlog_reader import write_rows
from bench_stream import (
    chunk_connection,
    cpu_seconds,
    machine_busy_seconds,
    pids_named,
    plain_select_rows_per_s,
    process_name,
    process_tree,
    select_page,
    stop,
)

from airflow_dblog.cli import main as dblog
from airflow_dblog.config import load_config
from airflow_dblog.engine.metadata import MetadataStore
from airflow_dblog.sources.mysql.c_rows import AVAILABLE as MYSQLCLIENT
from airflow_dblog.sources.mysql.connection import parse_mysql_url

PORT = int(os.environ.get("DBLOG_MYSQL_PORT", "3306"))
KAFKA = f"127.0.0.1:{os.environ.get('DBLOG_KAFKA_PORT', '9092')}"
MAVEN = "https://repo1.maven.org/maven2/io/debezium/debezium-server-dist"
TIMEOUT_S = 1800.0  # for any one phase: a run that is stuck fails instead of hanging


def cache_dir() -> Path:
    """The download cache scripts/services.sh uses."""
    return Path(os.environ.get("DBLOG_CACHE_DIR") or Path.home() / ".cache" / "airflow-dblog")


def debezium_server(version: str) -> Path:
    """Debezium Server's unpacked distribution; downloaded and unpacked on first use only.

    The download goes to ``*.part`` (resumed if interrupted) and is renamed when complete; the
    unpacked directory appears by one rename, so an interrupted run never leaves half of one.
    """
    cache = cache_dir()
    home = cache / f"debezium-server-{version}"
    if (home / "lib").is_dir():
        return home
    cache.mkdir(parents=True, exist_ok=True)
    archive = cache / f"debezium-server-dist-{version}.tar.gz"
    if not archive.exists():
        part = archive.with_name(archive.name + ".part")
        url = f"{MAVEN}/{version}/debezium-server-dist-{version}.tar.gz"
        print(f"downloading {url}", file=sys.stderr)
        done = subprocess.run(
            ["curl", "-fsSL", "--retry", "3", "-C", "-", "-o", str(part), url],
            capture_output=True,
            text=True,
        )
        # 416: the range after a complete .part is empty (a run stopped before the rename)
        if done.returncode != 0 and not (part.exists() and "416" in done.stderr):
            raise RuntimeError(f"downloading {url} failed: {done.stderr.strip()}")
        part.rename(archive)
    unpack = Path(tempfile.mkdtemp(prefix=".debezium-server-", dir=cache))
    try:
        done = subprocess.run(
            ["tar", "xzf", str(archive), "-C", str(unpack)], capture_output=True, text=True
        )
        if done.returncode != 0:
            archive.unlink()  # corrupt: the next run downloads it again
            raise RuntimeError(f"unpacking {archive} failed: {done.stderr.strip()}")
        (unpack / "debezium-server").rename(home)
    finally:
        shutil.rmtree(unpack, ignore_errors=True)
    archive.unlink()
    return home


def java_version(java: str) -> str:
    out = subprocess.run([java, "-version"], capture_output=True, text=True).stderr
    return out.split('"')[1] if '"' in out else out.strip()


def find_java() -> str:
    """The first Java 21+ (Debezium Server 3.6 is built for 21): ``java``, then /usr/lib/jvm."""
    jvms = sorted(Path("/usr/lib/jvm").glob("*/bin/java"))
    candidates = [shutil.which("java") or "java", *map(str, jvms)]
    for java in candidates:
        try:
            if int(java_version(java).split(".")[0]) >= 21:
                return java
        except (OSError, ValueError):
            continue
    raise RuntimeError(f"no Java 21 or later among {candidates}: install one or pass --java")


class TopicWatch(threading.Thread):
    """Reads partition 0 of each topic from offset 0 (``read_committed``) and records when the
    first message arrived, when the first snapshot row (op ``r``) arrived, and when the number
    of distinct snapshot-row keys reached ``target[topic]``."""

    def __init__(self, topics: list[str]) -> None:
        super().__init__(daemon=True)
        self.topics = topics
        self.first_at: dict[str, float] = {}
        self.first_read_at: dict[str, float] = {}
        self.keys: dict[str, set[bytes]] = {t: set() for t in topics}
        self.target: dict[str, int] = {}
        self.reached_at: dict[str, float] = {}
        self.stop = threading.Event()
        self.ready = threading.Event()

    def run(self) -> None:
        from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

        consumer = Consumer(
            {
                "bootstrap.servers": KAFKA,
                "group.id": f"bench-{uuid.uuid4().hex}",
                "enable.auto.commit": False,
                "isolation.level": "read_committed",
            }
        )
        consumer.assign([TopicPartition(t, 0, OFFSET_BEGINNING) for t in self.topics])
        self.ready.set()
        try:
            while not self.stop.is_set():
                for msg in consumer.consume(1000, 0.05):
                    now = time.monotonic()
                    if msg.error() or msg.value() is None:
                        continue
                    topic = msg.topic()
                    self.first_at.setdefault(topic, now)
                    if json.loads(msg.value()).get("op") != "r":
                        continue
                    self.first_read_at.setdefault(topic, now)
                    keys = self.keys[topic]
                    keys.add(msg.key())
                    if len(keys) == self.target.get(topic) and topic not in self.reached_at:
                        self.reached_at[topic] = now
        finally:
            consumer.close()


def create_topics(topics: list[str]) -> None:
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": KAFKA})
    for future in admin.create_topics([NewTopic(t, 1, 1) for t in topics]).values():
        future.result(30)


def delete_topics(prefixes: list[str]) -> None:
    """Every topic named ``<prefix>`` or ``<prefix>.*`` for one of ``prefixes``."""
    from confluent_kafka.admin import AdminClient

    admin = AdminClient({"bootstrap.servers": KAFKA})
    names = [
        t
        for t in admin.list_topics(timeout=30).topics
        if any(t == p or t.startswith(p + ".") for p in prefixes)
    ]
    if names:
        for future in admin.delete_topics(names, request_timeout=30).values():
            try:
                future.result(30)
            except Exception as err:  # cleanup goes on with the others
                print(f"could not delete a topic: {err}", file=sys.stderr)


def select_to_kafka_rows_per_s(url: str, db: str, page: int) -> float:
    """The Kafka path's floor: the plain keyset SELECT (:func:`plain_select_rows_per_s`'s
    driver), each row as JSON (``default=str``) produced with dblog's producer settings less
    its transactions, until the broker acknowledged every row."""
    from confluent_kafka import Producer

    topic = f"floor{page}_{db}"
    create_topics([topic])
    conn = chunk_connection(url)
    producer = Producer(
        {
            "bootstrap.servers": KAFKA,
            "enable.idempotence": True,
            "linger.ms": 20,
            "compression.type": "lz4",
        }
    )
    started, last, rows = time.perf_counter(), -1, 0
    sql = f"SELECT * FROM `{db}`.`bench` WHERE id > %s ORDER BY id LIMIT %s"
    while True:
        names, batch = select_page(conn, sql, [last, page])
        if not batch:
            break
        for row in batch:
            value = json.dumps(dict(zip(names, row, strict=True)), default=str)
            while True:
                try:
                    producer.produce(topic, value, json.dumps([row[0]]))
                    break
                except BufferError:  # the local queue is full: let the broker catch up
                    producer.poll(0.01)
            producer.poll(0)
        rows += len(batch)
        last = batch[-1][0]
    if producer.flush(60):
        raise RuntimeError("the floor's producer did not deliver every row in 60 s")
    elapsed = time.perf_counter() - started
    conn.close()
    return rows / elapsed


def wait_for(
    what: str, done: Any, proc: subprocess.Popen[bytes], log: Path, every: float = 0.01
) -> None:
    """Poll ``done()`` every ``every`` s; fail if ``proc`` exits or TIMEOUT_S passes."""
    deadline = time.monotonic() + TIMEOUT_S
    while not done():
        if proc.poll() is not None:
            raise RuntimeError(f"{what}: the process exited ({proc.returncode}); see {log}")
        if time.monotonic() > deadline:
            raise RuntimeError(f"{what}: not after {TIMEOUT_S:.0f} s; see {log}")
        time.sleep(every)


def probe_until_seen(
    conn: Any, db: str, watch: TopicWatch, topic: str, proc: subprocess.Popen[bytes], log: Path
) -> None:
    """Insert a row into ``db.probe`` every 0.5 s until one reaches ``topic``."""
    next_at = 0.0

    def seen() -> bool:
        nonlocal next_at
        if time.monotonic() >= next_at:
            with conn.cursor() as cur:
                cur.execute(f"INSERT INTO `{db}`.probe VALUES (NULL)")
            next_at = time.monotonic() + 0.5
        return topic in watch.first_at

    wait_for(f"a probe row on {topic}", seen, proc, log)


def debezium_properties(
    work: Path, db: str, prefix: str, chunk_size: int, server_id: int, extra: list[str]
) -> str:
    """application.properties: ``extra`` lines (``--debezium-property``) come last and win."""
    source = {
        "connector.class": "io.debezium.connector.mariadb.MariaDbConnector",
        "database.hostname": "127.0.0.1",
        "database.port": PORT,
        "database.user": "dblog",
        "database.password": "dblog",
        "database.server.id": server_id,
        "topic.prefix": prefix,
        "database.include.list": db,
        "table.include.list": f"{db}.bench,{db}.probe,{db}.debezium_signal",
        "snapshot.mode": "no_data",
        "snapshot.locking.mode": "none",
        "offset.storage": "org.apache.kafka.connect.storage.FileOffsetBackingStore",
        "offset.storage.file.filename": work / "offsets.dat",
        "offset.flush.interval.ms": 0,
        "schema.history.internal": "io.debezium.storage.file.history.FileSchemaHistory",
        "schema.history.internal.file.filename": work / "schema-history.dat",
        "schema.history.internal.store.only.captured.tables.ddl": "true",
        "signal.enabled.channels": "source",
        "signal.data.collection": f"{db}.debezium_signal",
        "incremental.snapshot.chunk.size": chunk_size,
    }
    lines = [f"debezium.source.{k}={v}" for k, v in source.items()]
    lines += [
        "debezium.sink.type=kafka",
        f"debezium.sink.kafka.producer.bootstrap.servers={KAFKA}",
        "debezium.sink.kafka.producer.key.serializer="
        "org.apache.kafka.common.serialization.StringSerializer",
        "debezium.sink.kafka.producer.value.serializer="
        "org.apache.kafka.common.serialization.StringSerializer",
        "debezium.format.key=json",
        "debezium.format.key.schemas.enable=false",
        "debezium.format.value=json",
        "debezium.format.value.schemas.enable=false",
        "quarkus.http.host=127.0.0.1",
        "quarkus.http.port=0",  # any free port: nothing here uses its HTTP endpoints
        "quarkus.log.console.json.enabled=false",  # plain text lines in the log
    ]
    return "\n".join([*lines, *extra]) + "\n"


def run_debezium(
    home: Path,
    java: str,
    work: Path,
    conn: Any,
    db: str,
    rows: int,
    chunk_size: int,
    extra: list[str],
) -> dict[str, Any]:
    """One Debezium Server process: start, wait for streaming, signal, time the snapshot."""
    prefix = f"dbz{chunk_size}_{db}"
    run_dir = work / f"debezium-{chunk_size}"
    (run_dir / "config").mkdir(parents=True)
    (run_dir / "config" / "application.properties").write_text(
        debezium_properties(
            run_dir, db, prefix, chunk_size, random.randint(1 << 20, 1 << 30), extra
        )
    )
    bench, probe = f"{prefix}.{db}.bench", f"{prefix}.{db}.probe"
    create_topics([bench, probe])
    watch = TopicWatch([bench, probe])
    watch.target[bench] = rows
    watch.start()
    watch.ready.wait(30)
    runner = next(home.glob("debezium-server-*runner.jar"))
    classpath = os.pathsep.join([str(runner), str(home / "config" / "lib"), str(home / "lib/*")])
    log = run_dir / f"debezium-{chunk_size}.log"
    # the option: Quarkus's thread pool on Java 24+ (else an error at shutdown)
    command = [java, "--add-opens=java.base/java.lang=ALL-UNNAMED", "-cp", classpath]
    with open(log, "wb") as out:
        started = time.monotonic()
        proc = subprocess.Popen(
            [*command, "io.debezium.server.Main"],
            cwd=run_dir,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        probe_until_seen(conn, db, watch, probe, proc, log)
        startup = watch.first_at[probe] - started
        time.sleep(5)  # settle: not measured
        payload = json.dumps({"data-collections": [f"{db}.bench"], "type": "incremental"})
        cpu = CpuMeter(proc.pid)
        signalled = time.monotonic()
        with conn.cursor() as cur:
            cur.execute(
                f"INSERT INTO `{db}`.debezium_signal VALUES (%s, 'execute-snapshot', %s)",
                (uuid.uuid4().hex, payload),
            )
        wait_for(f"{rows} snapshot rows on {bench}", lambda: bench in watch.reached_at, proc, log)
        elapsed = watch.reached_at[bench] - signalled
        return {
            "startup_to_first_change_s": round(startup, 2),
            "signal_to_first_row_s": round(watch.first_read_at[bench] - signalled, 3),
            "signal_to_all_rows_s": round(elapsed, 2),
            "rows_per_s": round(rows / elapsed),
            "cpu_s": cpu.used(rows),
        }
    finally:
        watch.stop.set()
        stop(proc)
        watch.join(30)


def run_dblog(
    work: Path,
    conn: Any,
    url: str,
    db: str,
    rows: int,
    chunk_sizes: list[int],
    delta: bool,
    parallelism: int = 1,
    settle_s: float = 5.0,
    spark_conf: dict[str, str] | None = None,
) -> dict[str, Any]:
    """One ``dblog stream`` process (Kafka, and Delta with ``delta``); one ``dblog dump`` per
    chunk size, the first ``settle_s`` after the stream runs."""
    prefix = f"dblog_{db}"
    conf = json.dumps({"spark.ui.enabled": False, **(spark_conf or {})})  # JSON is YAML
    delta_yaml = f"  delta: {{path: {work}/delta}}\n" if delta else ""
    config_path = work / "dblog.yaml"
    config_path.write_text(
        f"""name: {db.replace("_", "-")}
source: {{type: mysql, url: "{url}/{db}", tables: [{db}.bench, {db}.probe]}}
metadata: {{url: "sqlite:///{work}/meta.db"}}
dump: {{chunk_size: {chunk_sizes[0]}, parallelism: {parallelism}}}
sinks:
{delta_yaml}  kafka: {{bootstrap_servers: "{KAFKA}", topic_prefix: {prefix}}}
checkpoint: {work}/checkpoint
spark: {{master: "local[2]", conf: {conf}}}
"""
    )
    config = load_config(config_path)
    store = MetadataStore(config.metadata_url)
    bench, probe = f"{prefix}.{db}.bench", f"{prefix}.{db}.probe"
    create_topics([bench, probe])
    watch = TopicWatch([bench, probe])
    watch.start()
    watch.ready.wait(30)
    log = work / "dblog-stream.log"
    result: dict[str, Any] = {}
    with open(log, "wb") as out:
        started = time.monotonic()
        proc = subprocess.Popen(
            [sys.executable, "-m", "airflow_dblog.cli", "stream", "-c", str(config_path)],
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        wait_for("the stream state row", lambda: store.stream_state(config.name), proc, log, 0.1)
        result["startup_to_state_row_s"] = round(time.monotonic() - started, 2)
        probe_until_seen(conn, db, watch, probe, proc, log)
        result["startup_to_first_change_s"] = round(watch.first_at[probe] - started, 2)
        # with Delta, Spark starts after Kafka: dumps are timed on a running, warmed-up stream
        ready = [b" running: "] + ([b"Delta warmed up"] if delta else [])
        wait_for(
            "the stream running", lambda: all(s in log.read_bytes() for s in ready), proc, log, 0.2
        )
        time.sleep(settle_s)  # settle: not measured
        for chunk_size in chunk_sizes:
            store.set_controls(config.name, chunk_size=chunk_size)
            # the same topic: the earlier dump's rows were all read, count this one's afresh
            watch.keys[bench].clear()
            watch.first_read_at.pop(bench, None)
            watch.reached_at.pop(bench, None)
            watch.target[bench] = rows
            cpu = CpuMeter(proc.pid)
            requested = time.monotonic()
            with contextlib.redirect_stdout(sys.stderr):  # stdout: the JSON alone
                assert dblog(["dump", "-c", str(config_path), "--table", f"{db}.bench"]) == 0
            dump_id = max(d.id for d in store.dumps(config.name))
            wait_for(
                f"dump {dump_id} done",
                lambda dump_id=dump_id: store.progress(dump_id).state == "done",
                proc,
                log,
                0.1,  # a metadata query per poll: not more often
            )
            done = time.monotonic() - requested
            emitted = store.progress(dump_id).rows_emitted
            wait_for(f"{rows} dumped rows on {bench}", lambda: bench in watch.reached_at, proc, log)
            elapsed = watch.reached_at[bench] - requested
            used = cpu.used(rows)  # to the dump's done and all rows in Kafka
            result[str(chunk_size)] = {
                "dump_to_first_row_s": round(watch.first_read_at[bench] - requested, 3),
                "dump_to_done_s": round(done, 2),
                "done_rows_per_s": round(emitted / done),
                "dump_to_all_rows_s": round(elapsed, 2),
                "rows_per_s": round(rows / elapsed),
                "cpu_s": used,
            }
            time.sleep(5)  # settle between dumps: not measured
    finally:
        watch.stop.set()
        stop(proc)
        watch.join(30)
    return result


class CpuMeter:
    """CPU seconds used from its creation on by a process tree (the tool), MariaDB and the
    whole machine: on 2 cores, rows / (CPU seconds / 2) is the rate if nothing else ran."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.start = self._read()

    def _read(self) -> dict[str, float]:
        tree = process_tree(self.pid)
        jvms = [p for p in tree if process_name(p) == "java"]
        return {
            "tool": cpu_seconds(tree),
            # dblog: the driver's Python (capture, Kafka), its JVM (Spark, Delta), the rest are
            # Spark's Python workers (chunk SELECTs, the spool source); Debezium: one JVM
            "tool_main_process": cpu_seconds([self.pid]),
            "tool_jvms": cpu_seconds(jvms),
            "mariadb": cpu_seconds(pids_named("mariadbd")),
            "machine": machine_busy_seconds(),
        }

    def used(self, rows: int) -> dict[str, float]:
        now = self._read()
        spent = {k: round(now[k] - self.start[k], 2) for k in now}
        tool_and_db = spent["tool"] + spent["mariadb"]
        spent["tool_ms_per_1k_rows"] = round(spent["tool"] * 1e6 / rows, 1)
        spent["rows_per_s_if_alone_on_2_cores"] = (
            round(rows / (tool_and_db / 2)) if tool_and_db else 0
        )
        return spent


class LoadSampler(threading.Thread):
    """The 1-minute load average every 5 s (the machine may be shared)."""

    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.samples: list[float] = []
        self.stop = threading.Event()

    def run(self) -> None:
        while True:
            self.samples.append(os.getloadavg()[0])
            if self.stop.wait(5):
                return

    def summary(self) -> dict[str, float]:
        samples = self.samples
        return {
            "first": samples[0],
            "max": max(samples),
            "mean": round(sum(samples) / len(samples), 2),
        }


def create_source(conn: Any, db: str, rows: int) -> None:
    """Database ``db`` with ``rows`` rows in table ``bench``, a ``probe`` table for startup
    probes and Debezium's signal table."""
    with conn.cursor() as cur:
        cur.execute(f"CREATE DATABASE `{db}`")
        cur.execute(f"CREATE TABLE `{db}`.probe (id INT AUTO_INCREMENT PRIMARY KEY)")
        cur.execute(
            f"CREATE TABLE `{db}`.debezium_signal (id VARCHAR(42) PRIMARY KEY,"
            " type VARCHAR(32) NOT NULL, data VARCHAR(2048))"
        )
    write_rows(conn, db, rows, 5000)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--debezium-version", default="3.6.3.Final")
    parser.add_argument(
        "--debezium-chunk-sizes", default="1024,10000", help="incremental.snapshot.chunk.size"
    )
    parser.add_argument("--dblog-chunk-sizes", default="10000,1024", help="dump chunk sizes")
    parser.add_argument(
        "--debezium-property",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="an extra application.properties line (repeatable; the defaults are kept otherwise)",
    )
    parser.add_argument(
        "--dblog-delta", action="store_true", help="dblog's stream writes Delta too (local[2])"
    )
    parser.add_argument("--dblog-parallelism", type=int, default=1, help="dump.parallelism")
    parser.add_argument(
        "--dblog-settle-s",
        type=float,
        default=5.0,
        help="seconds from the stream's running line to its first dump (an idle stream's dump)",
    )
    parser.add_argument(
        "--dblog-spark-conf",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="an extra spark.conf of dblog's stream (repeatable), e.g. spark.eventLog.enabled=true",
    )
    parser.add_argument("--java", help="Debezium Server's java (default: the first 21+ found)")
    parser.add_argument("--keep-logs", metavar="DIR", help="copy the processes' logs here")
    args = parser.parse_args(argv)
    dbz_sizes = [int(s) for s in args.debezium_chunk_sizes.split(",") if s]
    dblog_sizes = [int(s) for s in args.dblog_chunk_sizes.split(",") if s]
    java = args.java or find_java()
    home = debezium_server(args.debezium_version)

    url = f"mysql://dblog:dblog@127.0.0.1:{PORT}"
    db = f"bench_{uuid.uuid4().hex[:8]}"
    work = Path(tempfile.mkdtemp(prefix="dblog-bench-debezium-"))
    load = LoadSampler()
    load.start()
    conn = pymysql.connect(**parse_mysql_url(url).pymysql_kwargs(), autocommit=True)
    result: dict[str, Any] = {
        "benchmark": "debezium_vs_dblog_mariadb",
        "rows": args.rows,
        "debezium_server": args.debezium_version,
        "java": java_version(java),
        "debezium_extra_properties": args.debezium_property,
        "dblog_sinks": "delta+kafka" if args.dblog_delta else "kafka",
        "dblog_parallelism": args.dblog_parallelism,
        "dblog_settle_s": args.dblog_settle_s,
    }
    try:
        create_source(conn, db, args.rows)
        select = {
            size: plain_select_rows_per_s(url, db, "bench", size)
            for size in sorted(set(dbz_sizes + dblog_sizes))
        }
        result["plain_select_rows_per_s"] = {str(k): round(v) for k, v in select.items()}
        result["chunk_driver"] = "mysqlclient" if MYSQLCLIENT else "pymysql"
        pymysql_select = {  # the baseline before chunks could run on mysqlclient
            size: plain_select_rows_per_s(url, db, "bench", size, mysqlclient=False)
            for size in select
        }
        result["pymysql_select_rows_per_s"] = {str(k): round(v) for k, v in pymysql_select.items()}
        floor = {size: select_to_kafka_rows_per_s(url, db, size) for size in select}
        result["select_to_kafka_rows_per_s"] = {str(k): round(v) for k, v in floor.items()}
        result["debezium"] = {
            str(size): run_debezium(
                home, java, work, conn, db, args.rows, size, args.debezium_property
            )
            for size in dbz_sizes
        }
        result["dblog"] = (
            run_dblog(
                work,
                conn,
                url,
                db,
                args.rows,
                dblog_sizes,
                args.dblog_delta,
                args.dblog_parallelism,
                args.dblog_settle_s,
                dict(kv.split("=", 1) for kv in args.dblog_spark_conf),
            )
            if dblog_sizes
            else {}
        )
        ratios: dict[str, dict[str, float]] = {
            "dblog_vs_debezium": {},
            "dblog_vs_select": {},
            "dblog_vs_pymysql_select": {},
            "dblog_vs_select_to_kafka": {},
            "debezium_vs_select": {},
        }
        for size in sorted(set(dbz_sizes + dblog_sizes)):
            key = str(size)
            dbz, ours = result["debezium"].get(key), result["dblog"].get(key)
            if dbz and ours:
                ratios["dblog_vs_debezium"][key] = round(ours["rows_per_s"] / dbz["rows_per_s"], 3)
            if ours:
                ratios["dblog_vs_select"][key] = round(ours["rows_per_s"] / select[size], 3)
                ratios["dblog_vs_select_to_kafka"][key] = round(ours["rows_per_s"] / floor[size], 3)
                ratios["dblog_vs_pymysql_select"][key] = round(
                    ours["rows_per_s"] / pymysql_select[size], 3
                )
            if dbz:
                ratios["debezium_vs_select"][key] = round(dbz["rows_per_s"] / select[size], 3)
        result["ratios"] = ratios
    finally:
        load.stop.set()
        with conn.cursor() as cur:
            cur.execute(f"DROP DATABASE IF EXISTS `{db}`")
        conn.close()
        delete_topics(
            [f"dbz{s}_{db}" for s in dbz_sizes]
            + [f"dblog_{db}"]
            + [f"floor{s}_{db}" for s in sorted(set(dbz_sizes + dblog_sizes))]
        )
        if args.keep_logs:
            Path(args.keep_logs).mkdir(parents=True, exist_ok=True)
            for log in work.rglob("*.log"):
                shutil.copy(log, Path(args.keep_logs) / log.name)
        shutil.rmtree(work, ignore_errors=True)
    result["load_avg_1m"] = load.summary()
    print(json.dumps(result))
    return result


if __name__ == "__main__":
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    main()
