"""A connection id in ``source.url`` is resolved once, at the top, into the connection's URL."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from airflow_dblog.config import parse_config
from airflow_dblog.provider import compat, connections

YAML = """
name: inventory
source: {{type: {kind}, url: "{url}", tables: [app.t]}}
sinks: {{delta: {{path: /data/delta}}}}
checkpoint: /data/cp
"""


def test_a_config_holding_a_url_is_returned_as_it_is(monkeypatch: pytest.MonkeyPatch) -> None:
    config = parse_config(YAML.format(kind="mysql", url="mysql://u:p@db:3306/app"))
    monkeypatch.setattr(connections, "url_from_airflow_connection", pytest.fail)
    assert connections.resolved(config) is config


@pytest.mark.parametrize(
    ("kind", "url"),
    [
        ("mysql", "mysql://dblog:p%40ss@db.example:3307/app"),
        ("postgres", "postgresql://dblog:p%40ss@db.example:3307/app"),
    ],
)
def test_a_connection_id_becomes_the_connections_url_in_a_copy(
    monkeypatch: pytest.MonkeyPatch, kind: str, url: str
) -> None:
    conn = SimpleNamespace(
        login="dblog", password="p@ss", host="db.example", port=3307, schema="app"
    )
    asked: list[str] = []

    def get_connection(conn_id: str) -> Any:
        asked.append(conn_id)
        return conn

    monkeypatch.setattr(compat.BaseHook, "get_connection", staticmethod(get_connection))
    config = parse_config(YAML.format(kind=kind, url="source_db"))
    found = connections.resolved(config)
    assert asked == ["source_db"]
    assert found.source.url == url and not found.source.is_airflow_conn
    assert config.source.url == "source_db"  # the loaded config is left as it was
    assert found.source.tables == config.source.tables and found.name == config.name
