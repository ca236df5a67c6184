"""Airflow finds the provider through its entry point, and everything it names imports."""

from __future__ import annotations

import importlib
import json
from importlib.metadata import entry_points
from pathlib import Path

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


def test_connection_form_is_declared_for_airflow_3() -> None:
    """``conn-fields`` valid by the installed Airflow's provider.yaml schema; no FAB methods."""
    import airflow
    import jsonschema

    from airflow_dblog.provider.hooks.dblog import DblogHook

    schema_file = Path(airflow.__file__).parent / "provider.yaml.schema.json"
    schema = json.loads(schema_file.read_text())["properties"]["connection-types"]
    (conn,) = get_provider_info()["connection-types"]
    jsonschema.validate([conn], schema)
    fields = conn["conn-fields"]
    assert {"config", "config_yaml", "source_password", "metadata_password"} <= set(fields)
    secret = {name for name, f in fields.items() if f["schema"].get("format") == "password"}
    assert secret == {"source_password", "metadata_password"}
    # Airflow masks extra values by key name ("password" is one of its sensitive names):
    # the REST API and task logs hide these, test_browser_e2e checks it on a real server.
    assert all("password" in name for name in secret)
    for legacy in ("get_connection_form_widgets", "get_ui_field_behaviour"):
        assert legacy not in DblogHook.__dict__
