"""The dblog command line planning dumps against a real MariaDB, run as a subprocess as a base
install's (tests/unit/test_cli.py has the rest of the command line)."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from airflow_dblog.engine.metadata import MetadataStore
from airflow_dblog.engine.metadata.database import utcnow
from tests.unit.test_cli import CONFIG, dblog


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
    from airflow_dblog.sources.mysql.source import MysqlSource

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
