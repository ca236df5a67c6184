"""Soak: ``dblog stream`` for a long time under a steady write load with repeated dumps.

Uses the demo's database and load (``airflow_dblog.demo``), dumps every table every
``--dump-every`` seconds, and every ``--report-every`` seconds prints one line: commit-to-sink
lag of a probe row (p50/max over the interval), the job's RSS (driver + JVM), dumps finished,
rows emitted, writes. At the end the Delta tables are compared with the source tables; the exit
status is 0 only if they are equal, every dump finished and the stream never died.

    python benchmarks/soak.py --minutes 60            # the real soak
    python benchmarks/soak.py --minutes 1 --dump-every 20   # what CI runs

Needs the local services (scripts/services.sh up).
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import threading
import time
from pathlib import Path

import pymysql
from bench_stream import rss_of_tree

from airflow_dblog import demo
from airflow_dblog.cli import main as dblog
from airflow_dblog.config import load_config
from airflow_dblog.core.position import Position, binlog_file_index
from airflow_dblog.engine.metadata import MetadataStore


class LagProbe(threading.Thread):
    """Updates one row twice a second; its lag is commit -> the stream's committed position."""

    def __init__(self, url: str, store: MetadataStore, stream: str) -> None:
        super().__init__(daemon=True)
        self.url, self.store, self.stream = url, store, stream
        self.samples: list[float] = []
        self.pending_since: float | None = None  # the probe waiting for the sink, if any
        self.stop = threading.Event()

    def run(self) -> None:
        conn = demo._connect(self.url)
        n = 0
        while not self.stop.wait(0.5):
            n += 1
            with conn.cursor() as cur:
                cur.execute(f"UPDATE {demo.DB}.customers SET name = %s WHERE id = 0", (f"p{n}",))
                cur.execute("SHOW MASTER STATUS")
                file, pos = cur.fetchone()[:2]
            committed_at = self.pending_since = time.monotonic()
            target = str(Position.mysql(binlog_file_index(file), int(pos)))
            while not self.stop.is_set():
                state = self.store.stream_state(self.stream)
                if state is not None and (state.position or "") >= target:
                    self.samples.append(time.monotonic() - committed_at)
                    self.pending_since = None
                    break
                time.sleep(0.1)
        conn.close()

    def take(self) -> list[float]:
        samples, self.samples = self.samples, []
        return samples


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python benchmarks/soak.py")
    parser.add_argument("--minutes", type=float, default=60)
    parser.add_argument("--dump-every", type=float, default=300, help="seconds between dumps")
    parser.add_argument("--report-every", type=float, default=10, help="seconds between lines")
    parser.add_argument("--writes-per-second", type=float, default=40)
    parser.add_argument("--output", default="soak-output")
    parser.add_argument("--port", default="3306")
    args = parser.parse_args(argv)
    out = Path(args.output).resolve()
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    url = f"mysql://dblog:dblog@127.0.0.1:{args.port}/{demo.DB}"
    demo.create_database(url)
    config_path = demo.write_config(out, url)
    config = load_config(config_path)
    store = MetadataStore(config.metadata_url)
    log_path = out / "stream.log"
    stream = demo.start_stream(config_path, log_path)
    probe = LagProbe(url, store, config.name)
    ok = True
    try:
        while (state := store.stream_state(config.name)) is None or state.heartbeat_at is None:
            if stream.poll() is not None:
                print(f"[soak] the stream exited ({stream.returncode}); see {log_path}")
                return 1
            time.sleep(1)
        probe.start()
        started = time.monotonic()
        end = started + args.minutes * 60
        next_dump, next_report, peak_rss = started, started + args.report_every, 0
        with demo.write_load(url, args.writes_per_second) as counts:
            while time.monotonic() < end:
                if stream.poll() is not None:
                    print(f"[soak] the stream died ({stream.returncode}); see {log_path}")
                    return 1
                if time.monotonic() >= next_dump:
                    dblog(["dump", "-c", str(config_path), "--all"])
                    next_dump += args.dump_every
                peak_rss = max(peak_rss, rss_of_tree(stream.pid))
                if time.monotonic() >= next_report:
                    next_report += args.report_every
                    lags = probe.take()
                    dumps = store.dumps(config.name)
                    done = [d for d in dumps if d.state == "done"]
                    emitted = sum(store.progress(d.id).rows_emitted for d in dumps)
                    writes = sum(counts.values())
                    if lags:
                        lag = f"p50 {statistics.median(lags):.1f} s max {max(lags):.1f} s"
                    else:  # a slow sink: say how long the current probe has waited
                        waited = time.monotonic() - (probe.pending_since or time.monotonic())
                        lag = f">= {waited:.1f} s (probe pending)"
                    print(
                        f"[soak] t={time.monotonic() - started:5.0f} s  lag {lag}  rss"
                        f" {rss_of_tree(stream.pid) / 2**20:,.0f} MB  dumps {len(done)}/"
                        f"{len(dumps)} done  rows emitted {emitted:,}  writes {writes:,}",
                        flush=True,
                    )
        probe.stop.set()
        last = max(d.id for d in store.dumps(config.name))
        deadline = time.monotonic() + 600
        while store.progress(last).state not in ("done", "failed", "cancelled"):
            if time.monotonic() > deadline or stream.poll() is not None:
                break
            time.sleep(2)
        unfinished = [d.id for d in store.dumps(config.name) if d.state != "done"]
        if unfinished:
            print(f"[soak] dumps not done: {unfinished}")
            ok = False
        result = demo.wait_until_equal(url, str(out / "delta"), timeout_s=180)
        for line in result:
            print(f"[soak] Delta vs source: {line}")
        ok = ok and all(": equal" in line for line in result)
        print(f"[soak] peak rss {peak_rss / 2**20:,.0f} MB; {'OK' if ok else 'FAILED'}")
        return 0 if ok else 1
    finally:
        probe.stop.set()
        demo.stop_stream(stream)


if __name__ == "__main__":
    try:
        sys.exit(main())
    except pymysql.MySQLError as err:
        sys.exit(f"[soak] MariaDB: {err}")
