"""The launcher counts a stream another host runs as running: the lease check on ZooKeeper."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest

from airflow_dblog.config import load_config
from airflow_dblog.engine.launcher import Launch, LaunchError, ensure_stream
from tests.unit.engine.test_launcher import CONFIG


@pytest.fixture
def config_path(tmp_path: Path) -> str:
    file = tmp_path / "dblog.yaml"
    file.write_text(CONFIG.format(dir=tmp_path))
    return str(file)


@pytest.mark.integration
def test_a_holder_of_the_lease_counts_as_running(
    config_path: str, zookeeper_server: Any, zk_path: str
) -> None:
    from airflow_dblog.config import HaConfig
    from airflow_dblog.engine.leader import LeaderLease

    hosts = zookeeper_server.connect_string(zk_path)
    Path(config_path).write_text(
        Path(config_path).read_text() + f"ha: {{zookeeper: '{hosts}', session_timeout_s: 4}}\n"
    )
    config = load_config(config_path)
    lease = LeaderLease(HaConfig(hosts, 4), config.name, "other-host:4242")
    assert lease.acquire(threading.Event()) is not None
    try:
        ensured = ensure_stream(config_path, config, Launch(python="/nonexistent/python"))
    finally:
        lease.close()
    assert not ensured.started
    assert ensured.reason == (
        "stream launched is running: other-host:4242 holds the leader lease (1 queued)"
    )
    with pytest.raises(LaunchError, match="cannot run /nonexistent/python"):
        ensure_stream(config_path, config, Launch(python="/nonexistent/python"))
