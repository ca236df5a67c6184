"""The dblog command line against a real (SQLite) metadata store, run as a subprocess.

Every run is a base install's: Airflow, PySpark and delta-spark cannot be imported in it (the
``[airflow]`` and ``[spark]`` extras), and planning, status and controls still work.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from airflow_dblog.core.position import Position
from airflow_dblog.engine.metadata import MetadataStore
from airflow_dblog.engine.metadata.store import TablePlan, utcnow

CONFIG = """
name: inventory
source:
  type: mysql
  url: mysql://dblog:${DB_PASSWORD}@127.0.0.1:1/app
  tables: [app.orders]
metadata: {url: sqlite:///./meta.db}
sinks: {delta: {path: ./delta}}
checkpoint: ./checkpoint
"""


@pytest.fixture()
def config_file(tmp_path: Path) -> Path:
    file = tmp_path / "dblog.yaml"
    file.write_text(CONFIG)
    return file


# what the extras add, unimportable: the CLI and the engine must not need them
BASE_INSTALL = """
import sys
class Absent:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("airflow", "pyspark", "delta"):
            raise ModuleNotFoundError(f"No module named {name!r}")
sys.meta_path.insert(0, Absent())
from airflow_dblog.cli import main
sys.exit(main(sys.argv[1:]))
"""


def dblog(*args: str, env_password: str = "pw") -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", BASE_INSTALL, *args],
        capture_output=True,
        text=True,
        env={"DB_PASSWORD": env_password, "PATH": "/usr/bin:/bin"},
        timeout=120,
    )


def test_help_lists_every_command() -> None:
    result = dblog("--help")
    assert result.returncode == 0
    for command in ("stream", "dump", "status", "pause", "resume", "cancel", "set", "optimize"):
        assert command in result.stdout
    for command in ("stream", "dump", "status", "pause", "resume", "cancel", "set"):
        assert dblog(command, "--help").returncode == 0


def test_status_pause_resume_cancel_set(config_file: Path, tmp_path: Path) -> None:
    assert dblog("db", "upgrade", "-c", str(config_file)).stdout.strip().endswith("revision 0003")
    store = MetadataStore(f"sqlite:///{tmp_path}/meta.db")
    dump_id = store.create_dump("inventory", "tables", [TablePlan("app.orders", ["id"], 50)])

    status = json.loads(
        dblog("status", "-c", str(config_file), "--dump", str(dump_id), "--json").stdout
    )
    assert status["state"] == "pending"
    assert (status["chunks_total"], status["chunks_done"], status["rows_emitted"]) == (1, 0, 0)

    assert dblog("pause", "-c", str(config_file), "--dump", str(dump_id)).stdout.strip() == (
        f"dump {dump_id} is now paused"
    )
    assert "[paused]" in dblog("status", "-c", str(config_file)).stdout
    assert dblog("resume", "-c", str(config_file), "--dump", str(dump_id)).returncode == 0
    assert dblog("cancel", "-c", str(config_file), "--dump", str(dump_id)).returncode == 0
    again = dblog("cancel", "-c", str(config_file), "--dump", str(dump_id))
    assert again.returncode == 1
    assert again.stderr.strip() == (
        f"dblog: error: cannot cancel dump {dump_id}: it is cancelled; "
        "cancel applies to pending or running or paused dumps"
    )

    result = dblog("set", "-c", str(config_file), "--chunk-size", "500", "--parallelism", "3")
    assert result.stdout.strip() == "stream inventory: chunk_size=500 delay_ms=0 parallelism=3"


def test_status_shows_the_stream_state_and_lag(config_file: Path, tmp_path: Path) -> None:
    never = json.loads(dblog("status", "-c", str(config_file), "--json").stdout)
    assert never == {
        "stream": {
            "name": "inventory",
            "state": "unknown",
            "leader": None,
            "lag_s": None,
            "lag_bytes": None,
            "position": None,
            "head": None,
            "heartbeat_at": None,
            "last_event_at": None,
            "note": "the stream never ran",
        },
        "dumps": [],
    }
    assert dblog("status", "-c", str(config_file)).stdout.splitlines() == [
        "stream inventory [unknown]: lag unknown - the stream never ran",
        "no dumps for stream inventory",
    ]
    store = MetadataStore(f"sqlite:///{tmp_path}/meta.db")
    store.save_stream_state(
        "inventory",
        position=str(Position.mysql(3, 400, 0)),
        source_offset={"reader": {"file": "bin.000003", "pos": 120}},
        heartbeat_at=utcnow(),
        leader="host:42",
    )
    store.create_dump("inventory", "tables", [TablePlan("app.orders", ["id"], 50)])
    # the source (port 1) does not answer: the lag is unknown, the rest is shown
    result = dblog("status", "-c", str(config_file), "--json")
    assert result.returncode == 0, result.stderr
    status = json.loads(result.stdout)
    stream = status["stream"]
    assert (stream["state"], stream["leader"], stream["lag_bytes"]) == ("running", "host:42", None)
    assert stream["note"].startswith("source: cannot reach MySQL at 127.0.0.1:1")
    assert [d["state"] for d in status["dumps"]] == ["pending"]
    lines = dblog("status", "-c", str(config_file)).stdout.splitlines()
    assert lines[0].startswith("stream inventory [running] leader host:42: lag unknown")
    assert "[pending]" in lines[1]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["set", "--delay-ms", "-1"], "delay must be >= 0"),
        (["set"], "nothing to set"),
        (["status", "--dump", "42"], "no dump with id 42"),
        (["optimize", "--table", "app.other"], "--table app.other is not in source.tables"),
    ],
)
def test_bad_input_is_one_line_and_nonzero(
    config_file: Path, args: list[str], message: str
) -> None:
    result = dblog(args[0], "-c", str(config_file), *args[1:])
    assert result.returncode != 0
    assert message in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


def test_malformed_config_and_missing_secret(tmp_path: Path, config_file: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(CONFIG.replace("tables:", "tabels:"))
    result = dblog("status", "-c", str(bad))
    assert result.returncode == 2
    assert "unknown key source.tabels" in result.stderr
    missing = subprocess.run(
        [sys.executable, "-m", "airflow_dblog.cli", "status", "-c", str(config_file)],
        capture_output=True,
        text=True,
        env={"PATH": "/usr/bin:/bin"},
        timeout=120,
    )
    assert missing.returncode == 2
    assert "environment variable DB_PASSWORD is not set" in missing.stderr


@pytest.mark.integration
def test_dump_plans_against_real_mariadb(mysql_db: Any, tmp_path: Path) -> None:
    conn = mysql_db.connect()
    with conn.cursor() as cur:
        cur.execute("CREATE TABLE orders (a INT, b VARCHAR(8), PRIMARY KEY (a, b))")
        cur.executemany("INSERT INTO orders VALUES (%s, %s)", [(i, "x") for i in range(250)])
    conn.close()
    file = tmp_path / "dblog.yaml"
    file.write_text(
        CONFIG.replace("127.0.0.1:1/app", mysql_db.url.rsplit("@", 1)[1])
        .replace("app.orders", f"{mysql_db.name}.orders")
        .replace("sinks:", "dump: {chunk_size: 100}\nsinks:")
    )
    table = f"{mysql_db.name}.orders"
    password = mysql_db.url.split(":")[2].split("@")[0]

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return dblog(*args, env_password=password)

    result = run("dump", "-c", str(file), "--table", table)
    assert result.returncode == 0, result.stderr
    dump_id = int(result.stdout.strip().splitlines()[-1])
    status = json.loads(run("status", "-c", str(file), "--dump", str(dump_id), "--json").stdout)
    assert (status["state"], status["chunks_total"]) == ("pending", 3)
    # a stream that committed the binlog's end a moment ago, before 250 more rows
    from airflow_dblog.sources.mysql import MysqlSource

    with MysqlSource(mysql_db.url) as source:
        committed = source.master_status()
        MetadataStore(f"sqlite:///{tmp_path}/meta.db").save_stream_state(
            "inventory",
            position=str(source.position(*committed)),
            source_offset={"reader": {"server": source.identity()}},
            heartbeat_at=utcnow(),
            source_ts_ms=int(time.time() * 1000) - 5000,
        )
    conn = mysql_db.connect()
    with conn.cursor() as cur:
        cur.executemany("INSERT INTO orders VALUES (%s, %s)", [(i, "y") for i in range(250)])
    conn.close()
    stream = json.loads(run("status", "-c", str(file), "--json").stdout)["stream"]
    assert stream["state"] == "running" and stream["note"] is None, stream
    assert stream["lag_bytes"] > 1000 and stream["lag_s"] >= 5, stream  # 250 rows: ~2 kB

    keys = run(
        "dump", "-c", str(file), "--table", table, "--pk", '[1, "x"]', "--pk", '{"a": 2, "b": "x"}'
    )
    assert keys.returncode == 0, keys.stderr
    for args, message in [
        (["--table", f"{mysql_db.name}.nope"], "is not captured by stream inventory"),
        (["--table", table, "--pk", '["one", "x"]'], "column a"),
        (["--table", table, "--pk", "[1]"], "has 1 value(s)"),
        (["--table", table, "--pk", "{bad json"], "is not valid JSON"),
        (["--table", table, "--pk", "abc"], "key 'abc' for"),  # a bare value is a key
        (["--all", "--pk", "1"], "--pk needs exactly one --table"),
    ]:
        before = len(MetadataStore(f"sqlite:///{tmp_path}/meta.db").dumps("inventory"))
        bad = run("dump", "-c", str(file), *args)
        assert bad.returncode == 2, (args, bad.stderr)
        assert message in bad.stderr and len(bad.stderr.strip().splitlines()) == 1
        assert len(MetadataStore(f"sqlite:///{tmp_path}/meta.db").dumps("inventory")) == before
