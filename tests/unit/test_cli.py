"""The dblog command line against a real (SQLite) metadata store, run as a subprocess.

Every run is a base install's: Airflow, PySpark and delta-spark cannot be imported in it (the
``[airflow]`` and ``[spark]`` extras), and planning, status and controls still work.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from airflow_dblog.core.position import Position
from airflow_dblog.engine.metadata import MetadataStore
from airflow_dblog.engine.metadata.database import utcnow
from airflow_dblog.engine.metadata.dumps import TablePlan

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
    assert dblog("db", "upgrade", "-c", str(config_file)).stdout.strip().endswith("revision 0005")
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


def test_status_shows_what_a_verify_dump_found_in_text_and_json(
    config_file: Path, tmp_path: Path
) -> None:
    from airflow_dblog.core.verify import ChunkVerdict

    store = MetadataStore(f"sqlite:///{tmp_path}/meta.db")
    plan = TablePlan("app.orders", ["id"], 3, [[[1], [2], [3]]])
    dump_id = store.create_dump("inventory", "keys", [plan], verify="dry-run")
    (chunk,) = store.chunks(dump_id)
    found = ChunkVerdict(3, missing=1, extra=1, examples=(("missing", (2,)), ("extra", (3,))))
    assert store.record_verdict(chunk.id, found)
    store.complete_chunk(chunk.id, 3, 0, 0)

    args = ("status", "-c", str(config_file), "--dump", str(dump_id))
    verify = json.loads(dblog(*args, "--json").stdout)["verify"]
    assert (verify["mode"], verify["checked"], verify["missing"], verify["extra"]) == (
        "dry-run", 3, 1, 1,
    )  # fmt: skip
    assert verify["examples"] == {
        "app.orders": [{"found": "missing", "key": [2]}, {"found": "extra", "key": [3]}]
    }
    lines = dblog(*args).stdout.splitlines()
    assert lines[1:] == [
        "  verify (dry-run): 3 rows checked, 1 missing in the lake, 1 extra, 0 different,"
        " 0 repaired",
        "  examples: app.orders: missing [2], extra [3]",
    ]


def test_verify_without_a_delta_sink_is_refused_before_anything_is_planned(
    tmp_path: Path,
) -> None:
    file = tmp_path / "kafka.yaml"
    kafka = "{kafka: {bootstrap_servers: 'k:9092', topic_prefix: inv}}"
    file.write_text(CONFIG.replace("{delta: {path: ./delta}}", kafka))
    result = dblog("verify", "-c", str(file), "--all", "--dry-run")
    assert result.returncode == 2
    assert result.stderr.strip().startswith("dblog: error: verify compares the source with")
    assert len(result.stderr.strip().splitlines()) == 1
    assert MetadataStore(f"sqlite:///{tmp_path}/meta.db").dumps("inventory") == []
