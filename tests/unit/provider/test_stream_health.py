"""Keeping the stream running from Airflow: the ensure operator, and the stream trigger's
serialization and errors (tests/integration/provider/test_stream_health.py runs the sensor and
the trigger against real MariaDB)."""

from __future__ import annotations

import asyncio
import os
import signal
from pathlib import Path

from airflow_dblog.config import load_config
from airflow_dblog.engine.launcher import Launch, alive, pid_path, read_record
from airflow_dblog.provider.operators.dblog import DblogEnsureStreamOperator
from airflow_dblog.provider.triggers.dblog import DblogStreamTrigger
from tests.support import fake_stream
from tests.support.trigger_loop import collect


def test_trigger_serialize_round_trip() -> None:
    trigger = DblogStreamTrigger("conn", "/x.yaml", 30, 1000, 5.0, 2.0, 15.0)
    path, kwargs = trigger.serialize()
    assert path == "airflow_dblog.provider.triggers.dblog.DblogStreamTrigger"
    assert DblogStreamTrigger(**kwargs).serialize() == (path, kwargs)
    assert kwargs["config_path"] == "/x.yaml" and kwargs["dblog_conn_id"] == "conn"


def test_trigger_reports_an_unreadable_config(tmp_path: Path) -> None:
    events, _ = asyncio.run(collect(DblogStreamTrigger(config_path=str(tmp_path / "no.yaml"))))
    assert events[0]["status"] == "error" and "cannot read config file" in events[0]["reason"]


def test_ensure_operator_starts_once_then_leaves_it_alone(tmp_path: Path) -> None:
    config = tmp_path / "dblog.yaml"
    config.write_text(
        f"""
name: op
source: {{type: mysql, url: "mysql://u:pw@127.0.0.1:1/app", tables: [app.t]}}
metadata: {{url: "sqlite:///{tmp_path}/meta.db"}}
sinks: {{delta: {{path: {tmp_path}/delta}}}}
checkpoint: {tmp_path}/cp
"""
    )
    op = DblogEnsureStreamOperator(
        task_id="ensure",
        config_path=str(config),
        python=fake_stream.fake_python(tmp_path),
        log_path=str(tmp_path / "stream.log"),
        timeout_s="20",  # templated fields arrive as text
        poll_s=0.1,
    )
    assert "config_path" in op.template_fields and "timeout_s" in op.template_fields
    try:
        first = op.execute({})
        assert first["started"] and first["log_path"] == str(tmp_path / "stream.log")
        second = op.execute({})
        assert second == {"started": False, "pid": first["pid"], "log_path": first["log_path"]}
    finally:
        record = read_record(pid_path(load_config(config), Launch()))
        if record is not None and alive(record):
            os.killpg(record.pid, signal.SIGKILL)
