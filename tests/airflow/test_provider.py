"""Airflow finds the provider through its entry point, and everything it names imports."""

from __future__ import annotations

import importlib
from importlib.metadata import entry_points

from airflow_dblog.provider import get_provider_info


def test_entry_point_and_named_modules_import() -> None:
    (ep,) = [
        e
        for e in entry_points(group="apache_airflow_provider")
        if e.value.startswith("airflow_dblog")
    ]
    info = ep.load()()
    assert info == get_provider_info()
    assert info["package-name"] == "airflow-dblog"
    for kind in ("hooks", "operators", "sensors", "triggers"):
        for entry in info[kind]:
            for module in entry["python-modules"]:
                importlib.import_module(module)
    (conn,) = info["connection-types"]
    module, _, name = conn["hook-class-name"].rpartition(".")
    hook = getattr(importlib.import_module(module), name)
    assert hook.conn_type == conn["connection-type"] == "dblog"
