"""The streaming job end to end on MariaDB: dump throughput, change throughput, latency, memory.

One run, one JSON object, every figure next to a baseline measured in the same run:

- dump rows/s through ``dblog stream`` into Delta and Kafka (``--sinks delta`` / ``kafka``: one
  sink alone) vs a plain keyset ``SELECT`` of the same table with the same client library
  (pymysql) and page size;
- change events/s through the job (binlog -> Delta + Kafka committed) vs pymysqlreplication
  decoding the same binlog range: live (the job reads while the updates run) and catching up
  (the job is stopped during the updates, then reads the finished binlog as the raw reader does);
- commit-to-sink latency p50/p99 (a probe row's commit to its read_committed Kafka message,
  which the job commits after Delta), with no dump running and during a dump;
- peak RSS of the job (Python driver + JVM) while dumping a table of ROWS and of 2 x ROWS rows;
- the cores the job, MariaDB, the writers and the whole machine used in each phase;
- a dump of the ROWS table again while ``--load-writers`` update its random rows at
  ``--load-rate`` writes/s in all: whether it finishes, its rows/s, the writes the server took,
  and the probe's latency meanwhile (the stream's lag).

    python benchmarks/bench_stream.py [--rows 1000000] [--updates 100000] [--chunk-size 10000]
                                      [--sinks both|delta|kafka] [--only-load]

Needs the local services (scripts/services.sh up). Leaves nothing behind but its JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import pymysql
from bench_binlog_reader import bench_raw, write_rows
from pymysqlreplication.row_event import UpdateRowsEvent

from airflow_dblog.cli import main as dblog
from airflow_dblog.config import load_config
from airflow_dblog.core.position import Position, binlog_file_index
from airflow_dblog.engine.metadata import MetadataStore
from airflow_dblog.sources.mysql.c_rows import AVAILABLE as MYSQLCLIENT
from airflow_dblog.sources.mysql.c_rows import CRows
from airflow_dblog.sources.mysql.connection import connect, parse_mysql_url
from airflow_dblog.sources.mysql.source import SESSION_INIT, MysqlSource
from airflow_dblog.sources.mysql.text_values import CONVERSIONS

PORT = os.environ.get("DBLOG_MYSQL_PORT", "3306")
KAFKA = f"127.0.0.1:{os.environ.get('DBLOG_KAFKA_PORT', '9092')}"


def stop(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM, as a supervisor stops the job; SIGKILL after 60 s."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def process_tree(pid: int) -> list[int]:
    """``pid`` and all its descendants (the driver, its JVM, Python workers), parents first."""
    found, todo = [], [pid]
    while todo:
        p = todo.pop()
        try:
            threads = os.listdir(f"/proc/{p}/task")
        except OSError:
            continue
        found.append(p)
        for tid in threads:  # a child belongs to the thread that forked it (the JVM's: any)
            try:
                with open(f"/proc/{p}/task/{tid}/children") as f:
                    todo.extend(int(c) for c in f.read().split())
            except OSError:
                continue
    return found


def rss_of_tree(pid: int) -> int:
    """Resident bytes of ``pid`` and all its descendants."""
    total = 0
    for p in process_tree(pid):
        try:
            with open(f"/proc/{p}/status") as f:
                total += next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmRSS"))
        except (OSError, StopIteration):
            continue
    return total


def signal_tree(pid: int, sig: int) -> None:
    """Send ``sig`` to ``pid`` and all its descendants."""
    for p in process_tree(pid):
        try:
            os.kill(p, sig)
        except ProcessLookupError:
            continue


def cpu_seconds(pids: list[int]) -> float:
    """User + system CPU seconds the processes have used so far."""
    total = 0
    for p in pids:
        try:
            with open(f"/proc/{p}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            total += int(fields[11]) + int(fields[12])  # utime, stime
        except (OSError, IndexError, ValueError):
            continue
    return total / os.sysconf("SC_CLK_TCK")


def machine_busy_seconds() -> float:
    """CPU seconds all cores spent not idle (nor waiting on I/O) since boot."""
    with open("/proc/stat") as f:
        ticks = [int(v) for v in f.readline().split()[1:]]
    return (sum(ticks) - ticks[3] - ticks[4]) / os.sysconf("SC_CLK_TCK")


def process_name(pid: int) -> str:
    """The process's command name (``/proc/PID/comm``), empty once it is gone."""
    try:
        with open(f"/proc/{pid}/comm") as f:
            return f.read().strip()
    except OSError:
        return ""


def pids_named(name: str) -> list[int]:
    return [int(p) for p in os.listdir("/proc") if p.isdigit() and process_name(int(p)) == name]


class Sampler(threading.Thread):
    """Peak RSS of the job per phase, sampled every 0.25 s, and the cores each party used:
    the job (driver, JVM, Python workers), MariaDB, this process (the writers and the probe)
    and the whole machine -- on 2 cores, what the job got is what the others left."""

    def __init__(self, pid: int) -> None:
        super().__init__(daemon=True)
        self.pid, self.phase, self.peaks, self.stop = pid, "start", {}, threading.Event()
        self.cpu: dict[str, dict[str, float]] = {}
        self.mariadb = pids_named("mariadbd")

    def _usage(self) -> dict[str, float]:
        return {
            "job": cpu_seconds(process_tree(self.pid)),
            "mariadb": cpu_seconds(self.mariadb),
            "writers_and_probe": cpu_seconds([os.getpid()]),
            "machine": machine_busy_seconds(),
            "wall": time.monotonic(),
        }

    def run(self) -> None:
        last = self._usage()
        while not self.stop.wait(0.25):
            rss = rss_of_tree(self.pid)
            self.peaks[self.phase] = max(self.peaks.get(self.phase, 0), rss)
            now = self._usage()
            spent = self.cpu.setdefault(self.phase, dict.fromkeys(now, 0.0))
            for k, v in now.items():
                spent[k] += max(0.0, v - last[k])  # a process that exited is not negative
            last = now

    def cores(self) -> dict[str, dict[str, float]]:
        """Cores used per phase by each party (CPU seconds / wall seconds)."""
        return {
            phase: {k: round(v / spent["wall"], 2) for k, v in spent.items() if k != "wall"}
            for phase, spent in self.cpu.items()
            if spent["wall"] > 0
        }


class LatencyProbe(threading.Thread):
    """Inserts a timestamped row every 0.2 s and times its arrival on the Kafka topic."""

    def __init__(self, url: str, db: str, topic: str) -> None:
        super().__init__(daemon=True)
        self.url, self.db, self.topic = url, db, topic
        self.phase, self.samples, self.stop = "warmup", {}, threading.Event()

    def run(self) -> None:
        from confluent_kafka import Consumer

        consumer = Consumer(
            {
                "bootstrap.servers": KAFKA,
                "group.id": f"bench-{uuid.uuid4().hex}",
                "auto.offset.reset": "latest",
                "isolation.level": "read_committed",
            }
        )
        consumer.subscribe([self.topic])
        conn = pymysql.connect(**parse_mysql_url(self.url).pymysql_kwargs(), autocommit=True)
        sent: dict[int, tuple[float, str]] = {}
        next_at, seq = time.monotonic(), 0
        while not self.stop.is_set():
            if time.monotonic() >= next_at:
                seq += 1
                with conn.cursor() as cur:
                    cur.execute(f"INSERT INTO `{self.db}`.probe VALUES (%s)", (seq,))
                sent[seq] = (time.monotonic(), self.phase)
                next_at += 0.2
            msg = consumer.poll(0.02)
            if msg is None or msg.error() or msg.value() is None:
                continue
            value = json.loads(msg.value())
            key = (value.get("after") or {}).get("id")
            if key in sent:
                t0, phase = sent.pop(key)
                self.samples.setdefault(phase, []).append(time.monotonic() - t0)
        conn.close()
        consumer.close()

    def summary(self) -> dict[str, Any]:
        out = {}
        for phase, values in self.samples.items():
            if phase in ("warmup", "paused"):
                continue
            values = sorted(values)
            out[phase] = {
                "n": len(values),
                "p50_ms": round(statistics.median(values) * 1000),
                "p99_ms": round(values[min(len(values) - 1, int(len(values) * 0.99))] * 1000),
                "max_ms": round(values[-1] * 1000),
            }
        return out


class Writer(threading.Thread):
    """Single-row UPDATEs of random keys at ``rate`` per second (as far as the server keeps up)."""

    def __init__(self, url: str, db: str, rows: int, rate: float, seed: int) -> None:
        super().__init__(daemon=True)
        self.url, self.db, self.rows, self.rate, self.seed = url, db, rows, rate, seed
        self.writes, self.stop = 0, threading.Event()

    def run(self) -> None:
        import random

        rng = random.Random(self.seed)
        conn = pymysql.connect(**parse_mysql_url(self.url).pymysql_kwargs(), autocommit=True)
        started = time.monotonic()
        with conn.cursor() as cur:
            while not self.stop.is_set():
                due = started + self.writes / self.rate
                if (wait := due - time.monotonic()) > 0:
                    time.sleep(wait)
                cur.execute(
                    f"UPDATE `{self.db}`.bench SET qty = qty + 1 WHERE id = %s",
                    (rng.randrange(self.rows),),
                )
                self.writes += 1
        conn.close()


def chunk_connection(url: str, mysqlclient: bool = MYSQLCLIENT) -> Any:
    """A connection like the one dblog's chunk SELECTs run on, converting values alike:
    mysqlclient's when installed (and ``mysqlclient``), else PyMySQL's."""
    settings = parse_mysql_url(url)
    if mysqlclient and MYSQLCLIENT:
        return CRows(settings, None, SESSION_INIT).connection()
    return connect(settings, autocommit=True, init_command=SESSION_INIT, conv=CONVERSIONS)


def select_page(conn: Any, sql: str, params: list[Any]) -> tuple[list[str], list[Any]]:
    """(column names, rows) of one SELECT."""
    with conn.cursor() as cur:
        cur.execute(sql, params)
        return [d[0] for d in cur.description], list(cur.fetchall())


def plain_select_rows_per_s(
    url: str, db: str, table: str, page: int, mysqlclient: bool = MYSQLCLIENT
) -> float:
    """A keyset scan of the table through a driver dblog's chunk SELECTs use, converting values
    alike (by default the one they use: mysqlclient when installed): the floor a chunk can reach."""
    conn = chunk_connection(url, mysqlclient)
    started, last, rows = time.perf_counter(), -1, 0
    sql = f"SELECT * FROM `{db}`.`{table}` WHERE id > %s ORDER BY id LIMIT %s"
    while batch := select_page(conn, sql, [last, page])[1]:
        rows += len(batch)
        last = batch[-1][0]
    conn.close()
    return rows / (time.perf_counter() - started)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--updates", type=int, default=100_000)
    parser.add_argument("--chunk-size", type=int, default=10_000)
    parser.add_argument("--keep-log", metavar="PATH", help="copy the job's log here at the end")
    parser.add_argument(
        "--load-writers", type=int, default=4, help="writers during the dump under load"
    )
    parser.add_argument(
        "--load-rate", type=float, default=2000, help="their target writes/s, all together"
    )
    parser.add_argument(
        "--load-timeout", type=float, default=900, help="seconds the dump under load may take"
    )
    parser.add_argument(
        "--sinks",
        choices=("both", "delta", "kafka"),
        default="both",
        help="the job's sinks (latency needs Kafka: it is not measured with delta alone)",
    )
    parser.add_argument(
        "--only-load",
        action="store_true",
        help="only the first dump and the dump under load (an A/B of the sinks in ~9 min)",
    )
    args = parser.parse_args(argv)
    url = f"mysql://dblog:dblog@127.0.0.1:{PORT}"
    db = f"bench_{uuid.uuid4().hex[:8]}"
    conn = pymysql.connect(**parse_mysql_url(url).pymysql_kwargs(), autocommit=True)
    source = MysqlSource(url)
    work = Path(tempfile.mkdtemp(prefix="dblog-bench-"))
    with conn.cursor() as cur:
        cur.execute(f"CREATE DATABASE `{db}`")
        cur.execute(f"CREATE TABLE `{db}`.probe (id INT PRIMARY KEY)")
    write_rows(conn, db, args.rows, 5000)  # table `bench`
    with conn.cursor() as cur:  # the 2x table: the same rows twice over
        cur.execute(f"CREATE TABLE `{db}`.big LIKE `{db}`.bench")
        cur.execute(f"INSERT INTO `{db}`.big SELECT * FROM `{db}`.bench")
        cur.execute(
            f"INSERT INTO `{db}`.big SELECT id + {args.rows}, name, amount, created, qty, note"
            f" FROM `{db}`.bench"
        )
    select_rps = plain_select_rows_per_s(url, db, "bench", args.chunk_size)

    sink_yaml = {
        "delta": f"  delta: {{path: {work}/delta}}\n",
        "kafka": f'  kafka: {{bootstrap_servers: "{KAFKA}", topic_prefix: {db}}}\n',
    }
    sinks = "".join(v for k, v in sink_yaml.items() if args.sinks in ("both", k))
    config_path = work / "bench.yaml"
    config_path.write_text(
        f"""name: {db.replace("_", "-")}
source: {{type: mysql, url: "{url}/{db}", tables: [{db}.bench, {db}.big, {db}.probe]}}
metadata: {{url: "sqlite:///{work}/meta.db"}}
dump: {{chunk_size: {args.chunk_size}, parallelism: 1}}
sinks:
{sinks}checkpoint: {work}/checkpoint
spark: {{master: "local[2]", conf: {{spark.ui.enabled: false}}}}
"""
    )
    config = load_config(config_path)
    store = MetadataStore(config.metadata_url)
    with open(work / "stream.log", "wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "airflow_dblog.cli", "stream", "-c", str(config_path)],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    sampler = Sampler(proc.pid)
    probe = LatencyProbe(url, db, f"{db}.{db}.probe")
    result: dict[str, Any] = {"benchmark": "stream_mariadb", "rows": args.rows, "sinks": args.sinks}
    try:
        sampler.start()
        while store.stream_state(config.name) is None:
            assert proc.poll() is None, f"the stream exited; see {work / 'stream.log'}"
            time.sleep(0.5)
        if args.sinks != "delta":
            probe.start()
        with conn.cursor() as cur:  # one change per table: its Delta table is created now
            for table in ("bench", "big"):
                cur.execute(f"UPDATE `{db}`.`{table}` SET qty = qty + 1 WHERE id = 0")
        time.sleep(30)  # Spark's first batches compile and create the tables: not measured
        probe.phase = sampler.phase = "idle"
        time.sleep(30)

        def update_all() -> str:
            """``--updates`` row updates of table bench; the position of the last one."""
            with conn.cursor() as cur:
                for first in range(0, args.updates, 10_000):
                    cur.execute(
                        f"UPDATE `{db}`.bench SET qty = qty + 1 WHERE id >= %s AND id < %s",
                        (first, min(first + 10_000, args.updates)),
                    )
            end_file, end_pos = source.master_status()
            return str(Position.mysql(binlog_file_index(end_file), end_pos - 1))

        def until_committed(target: str) -> None:
            while (state := store.stream_state(config.name)) is None or (
                state.position or ""
            ) < target:
                assert proc.poll() is None, f"the stream exited; see {work / 'stream.log'}"
                time.sleep(0.2)

        if not args.only_load:
            # live: the job reads while MariaDB executes the updates (they share the 2 cores)
            probe.phase = sampler.phase = "changes"
            file, pos = source.master_status()
            started = time.perf_counter()
            until_committed(update_all())
            job_eps = args.updates / (time.perf_counter() - started)
            raw_eps = args.updates / bench_raw(url, db, file, pos, args.updates, UpdateRowsEvent)
            # catch-up: the job is stopped while the updates run, then reads the finished binlog
            # like the raw reader does
            probe.phase, sampler.phase = "paused", "catch_up"
            signal_tree(proc.pid, signal.SIGSTOP)
            try:
                target = update_all()
            finally:
                signal_tree(proc.pid, signal.SIGCONT)
            started = time.perf_counter()
            until_committed(target)
            catch_up_eps = args.updates / (time.perf_counter() - started)

        # the table is dumped once before the load (so the load's dump is a re-dump, as in
        # production); the 2x table shows whether memory grows with the table
        dumps = (("bench", "dump"),) if args.only_load else (("bench", "dump"), ("big", "dump_2x"))
        for table, phase in dumps:
            probe.phase = sampler.phase = phase
            started = time.perf_counter()
            assert dblog(["dump", "-c", str(config_path), "--table", f"{db}.{table}"]) == 0
            dump_id = max(d.id for d in store.dumps(config.name))
            while store.progress(dump_id).state != "done":
                assert proc.poll() is None, f"the stream exited; see {work / 'stream.log'}"
                time.sleep(0.5)
            result[f"{phase}_rows_per_s"] = round(
                store.progress(dump_id).rows_emitted / (time.perf_counter() - started)
            )
        # under load: writers update random rows of the table while it is dumped again
        probe.phase = sampler.phase = "dump_under_load"
        load = [
            Writer(url, db, args.rows, args.load_rate / args.load_writers, seed)
            for seed in range(args.load_writers)
        ]
        for writer in load:
            writer.start()
        started = time.perf_counter()
        assert dblog(["dump", "-c", str(config_path), "--table", f"{db}.bench"]) == 0
        dump_id = max(d.id for d in store.dumps(config.name))
        while store.progress(dump_id).state != "done":
            assert proc.poll() is None, f"the stream exited; see {work / 'stream.log'}"
            if time.perf_counter() - started > args.load_timeout:
                break
            time.sleep(0.5)
        took = time.perf_counter() - started
        for writer in load:
            writer.stop.set()
        for writer in load:
            writer.join(10)
        progress = store.progress(dump_id)
        result["dump_under_load"] = {
            "writers": args.load_writers,
            "target_writes_per_s": args.load_rate,
            "achieved_writes_per_s": round(sum(w.writes for w in load) / took),
            "dump_done": progress.state == "done",
            "dump_percent": progress.percent,
            "dump_rows_per_s": round(progress.rows_emitted / took),
            "seconds": round(took),
        }
        probe.stop.set()
        if probe.is_alive():
            probe.join(10)
        result["plain_select_rows_per_s"] = round(select_rps)
        result["dump_vs_select_ratio"] = round(result["dump_rows_per_s"] / select_rps, 3)
        if not args.only_load:
            result.update(
                {
                    "job_change_events_per_s": round(job_eps),
                    "raw_reader_events_per_s": round(raw_eps),
                    "job_vs_raw_reader_ratio": round(job_eps / raw_eps, 3),
                    "job_catch_up_events_per_s": round(catch_up_eps),
                    "job_catch_up_vs_raw_reader_ratio": round(catch_up_eps / raw_eps, 3),
                }
            )
        result["latency"] = probe.summary() if args.sinks != "delta" else None
        result["peak_rss_mb"] = {k: round(v / 2**20) for k, v in sampler.peaks.items()}
        result["cores_used"] = sampler.cores()
    finally:
        sampler.stop.set()
        probe.stop.set()
        stop(proc)
        with conn.cursor() as cur:
            cur.execute(f"DROP DATABASE IF EXISTS `{db}`")
        conn.close()
        source.close()
        if args.keep_log:
            shutil.copy(work / "stream.log", args.keep_log)
        subprocess.run(["rm", "-rf", str(work)], check=False)
    print(json.dumps(result))
    return result


if __name__ == "__main__":
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    main()
