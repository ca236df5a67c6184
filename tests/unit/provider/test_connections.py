"""The ``dblog`` connection: config from a file or inline YAML, passwords from secret fields."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from airflow_dblog.errors import ConfigError
from airflow_dblog.provider.connections import config_from_extra
from airflow_dblog.provider.hooks.dblog import DblogHook

YAML = """
name: inventory
source: {type: mysql, url: "mysql://dblog:${DBLOG_SOURCE_PASSWORD}@db:3306/app", tables: [app.t]}
metadata: {url: "postgresql://meta:${DBLOG_METADATA_PASSWORD}@pg/meta"}
sinks: {delta: {path: /data/delta}}
checkpoint: /data/cp
"""
SECRETS = {"source_password": "p@ss:w/rd", "metadata_password": "m3ta-secret"}


def test_inline_yaml_with_secrets_url_encoded() -> None:
    config = config_from_extra({"config_yaml": YAML, **SECRETS}, "c", env={})
    assert config.source.url == "mysql://dblog:p%40ss%3Aw%2Frd@db:3306/app"
    assert config.metadata_url == "postgresql://meta:m3ta-secret@pg/meta"


def test_file_and_airflow2_prefixed_keys(tmp_path: Path) -> None:
    file = tmp_path / "dblog.yaml"
    file.write_text(YAML)
    extra = {"extra__dblog__config": str(file), "extra__dblog__source_password": "s3cret"}
    config = config_from_extra(extra, "c", env={"DBLOG_METADATA_PASSWORD": "from-env"})
    assert config.source.url == "mysql://dblog:s3cret@db:3306/app"
    assert config.metadata_url == "postgresql://meta:from-env@pg/meta"  # environment fills gaps


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ({}, "names no config"),
        ({"config": "", "config_yaml": None}, "names no config"),
        ({"config": "/x.yaml", "config_yaml": YAML}, "both a config file and inline YAML"),
        ({"config_yaml": YAML}, "DBLOG_SOURCE_PASSWORD is not set"),
        ({"config": "/nonexistent/dblog.yaml"}, "cannot read config file"),
    ],
)
def test_bad_connections_fail_with_one_line(extra: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigError) as info:
        config_from_extra(extra, "c", env={})
    assert message in str(info.value) and "\n" not in str(info.value)


def test_hook_reads_the_connection(monkeypatch: pytest.MonkeyPatch) -> None:
    """Through Airflow's own connection lookup (an ``AIRFLOW_CONN_`` variable here)."""
    conn = {"conn_type": "dblog", "extra": {"config_yaml": YAML, **SECRETS}}
    monkeypatch.setenv("AIRFLOW_CONN_DBLOG_INLINE", json.dumps(conn))
    config = DblogHook("dblog_inline").config
    assert config.name == "inventory" and config.source.url.endswith("@db:3306/app")


def test_hook_hands_a_process_the_inline_config_without_its_passwords(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """What the ensure operator gives the stream it starts: a file (owner-only) of the YAML as
    typed, ``${VAR}`` and all, and the passwords in the environment."""
    conn = {"conn_type": "dblog", "extra": {"config_yaml": YAML, **SECRETS}}
    monkeypatch.setenv("AIRFLOW_CONN_DBLOG_INLINE", json.dumps(conn))
    path, env = DblogHook("dblog_inline").config_file(tmp_path / "run")
    file = Path(path)
    assert file == tmp_path / "run" / "config.yaml" and file.read_text() == YAML
    assert file.stat().st_mode & 0o777 == 0o600
    assert env == {
        "DBLOG_SOURCE_PASSWORD": "p%40ss%3Aw%2Frd",
        "DBLOG_METADATA_PASSWORD": "m3ta-secret",
    }
    named = tmp_path / "dblog.yaml"
    named.write_text(YAML)
    assert DblogHook(config_path=str(named)).config_file(tmp_path / "x") == (str(named), {})
