"""The standalone cluster and object store of ``scripts/services.sh up spark object-store``.

Executors there run in mount namespaces that hide the driver's disk (the checkout, /tmp), so what
passes here does not read the driver's files. One cluster application (tests/support/
cluster_tasks.py, its own process) probes the executors and writes a Delta table to s3a://; the
tests check what it found, and read the table back with another engine (``deltalake``).
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from tests.support.services import cluster_missing, ensure_cluster, s3_storage_options

# the cluster's driver and executors take the machine: one test at a time
pytestmark = [pytest.mark.integration, pytest.mark.alone]

if MISSING := cluster_missing():
    pytest.skip(
        f"{', '.join(MISSING)} not set: run scripts/services.sh up spark object-store and"
        ' eval "$(scripts/services.sh env)" (scripts/test.sh does both)',
        allow_module_level=True,
    )

ROWS = 500
# Run as a script by its path: its functions, defined in __main__, go to the executors by value.
CLUSTER_TASKS = Path(__file__).resolve().parents[2] / "support" / "cluster_tasks.py"


@pytest.fixture(scope="module")
def cluster_run(
    mysql_server: Any, postgres_server: Any, tmp_path_factory: pytest.TempPathFactory
) -> dict[str, Any]:
    """Runs the cluster application once; its JSON findings plus what the tests need."""
    ensure_cluster()
    driver_file = tmp_path_factory.mktemp("driver") / "checkpoint" / "probe.txt"
    path = f"s3a://dblog/tests/{uuid.uuid4().hex}/delta"
    payload = {
        "disk": {
            "driver_file": str(driver_file),
            "repo_file": str(Path(__file__).resolve()),
            "mysql_host": mysql_server.host,
            "mysql_port": mysql_server.port,
            "mysql_user": mysql_server.user,
            "mysql_password": mysql_server.password,
            "postgres_dsn": postgres_server.dsn(),
        },
        "delta": {"path": path, "rows": ROWS},
    }
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, str(CLUSTER_TASKS), json.dumps(payload)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    result["seconds"] = time.monotonic() - started
    result["path"] = path
    result["repo_file"] = payload["disk"]["repo_file"]
    print(f"cluster application: {result['seconds']:.1f} s, phases {result['phases']}")
    return result


def test_executors_cannot_read_the_drivers_disk_but_reach_the_databases(
    cluster_run: dict[str, Any],
) -> None:
    disk = cluster_run["disk"]
    assert disk["executors"] == 2, "both workers should have given the application an executor"
    # the driver wrote the file and can read it: it exists, on the driver's disk
    assert disk["driver_reads"] == "written by the driver"
    assert Path(cluster_run["repo_file"]).is_file()
    assert len(disk["probes"]) == 4
    for probe in disk["probes"]:
        assert probe["mnt_ns"] != disk["driver_mnt_ns"], "a task ran in the driver's namespace"
        assert probe["driver_file"] == "FileNotFoundError", probe
        assert probe["repo_file"] == "FileNotFoundError", probe
        # the package came with the application, not from the (hidden) checkout
        assert "airflow_dblog.zip" in probe["package"], probe
        assert probe["mysql"] == 1
        assert probe["postgres"] == 1


def test_delta_table_on_the_object_store_reads_back_in_another_engine(
    cluster_run: dict[str, Any],
) -> None:
    from deltalake import DeltaTable

    table = DeltaTable(
        cluster_run["path"].replace("s3a://", "s3://", 1),
        storage_options=s3_storage_options(),
    )
    rows = sorted((r["id"], r["v"], r["flag"]) for r in table.to_pyarrow_table().to_pylist())
    assert rows == [tuple(r) for r in cluster_run["delta"]["written"]]
    assert len(rows) == ROWS
    # written by the two executors, not the driver: one file per partition
    assert len(table.file_uris()) == 2
