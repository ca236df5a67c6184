"""Airflow connections: source URLs from MySQL/Postgres connections, and the ``dblog`` type.

A ``dblog`` connection holds a stream's config, as a path on the workers or as inline YAML,
and the passwords the config should not spell out. Its form is declared in the provider info
(``conn-fields``, Airflow 3.2+), so the UI needs neither the hook nor Flask-AppBuilder; the UI
stores each field in the connection's extra under the field's name.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from typing import Any
from urllib.parse import quote

from airflow_dblog.config import Config, load_config, parse_config
from airflow_dblog.errors import ConfigError
from airflow_dblog.sources.registry import source_kind

CONN_TYPE = "dblog"
#: secret field -> the ``${VAR}`` it fills in the config (URL-encoded: it goes into a URL)
SECRET_VARIABLES = {
    "source_password": "DBLOG_SOURCE_PASSWORD",
    "metadata_password": "DBLOG_METADATA_PASSWORD",
}

CONN_FIELDS: dict[str, dict[str, Any]] = {
    "config": {
        "label": "Config file",
        "description": "Path of the stream's YAML config on the workers, e.g. "
        "/opt/dblog/inventory.yaml. Leave empty to give the config below instead.",
        "schema": {"type": ["string", "null"]},
    },
    "config_yaml": {
        "label": "Config (YAML)",
        "description": "The stream's config itself, when the workers have no file of it. "
        "Use absolute paths; write ${DBLOG_SOURCE_PASSWORD} and ${DBLOG_METADATA_PASSWORD} "
        "where the passwords go.",
        "schema": {"type": ["string", "null"], "format": "multiline"},
    },
    "source_password": {
        "label": "Source password",
        "description": "Fills ${DBLOG_SOURCE_PASSWORD} in the config (URL-encoded), "
        "e.g. in source.url: mysql://dblog:${DBLOG_SOURCE_PASSWORD}@db:3306/app",
        "schema": {"type": ["string", "null"], "format": "password"},
    },
    "metadata_password": {
        "label": "Metadata password",
        "description": "Fills ${DBLOG_METADATA_PASSWORD} in the config (URL-encoded), "
        "e.g. in metadata.url",
        "schema": {"type": ["string", "null"], "format": "password"},
    },
}

#: the standard fields a dblog connection does not use
HIDDEN_FIELDS = ["host", "schema", "login", "password", "port"]


def _field(extra: Mapping[str, Any], name: str) -> Any:
    """A field as the Airflow 3 UI stores it (bare name) or as Airflow 2's form did."""
    value = extra.get(name)
    if value in (None, ""):
        value = extra.get(f"extra__{CONN_TYPE}__{name}")
    return None if value in (None, "") else value


def secret_env(extra: Mapping[str, Any]) -> dict[str, str]:
    """The ``${VAR}`` values the connection's secret fields give (URL-encoded), for a process
    that reads the config itself (the stream the launcher starts)."""
    return {
        variable: quote(str(secret), safe="")
        for field, variable in SECRET_VARIABLES.items()
        if (secret := _field(extra, field)) is not None
    }


def config_text_or_path(extra: Mapping[str, Any]) -> tuple[str | None, str | None]:
    """The connection's config file path and inline YAML (at most one is set)."""
    return _field(extra, "config"), _field(extra, "config_yaml")


def config_from_extra(
    extra: Mapping[str, Any], conn_id: str, env: Mapping[str, str] | None = None
) -> Config:
    """The config a ``dblog`` connection's extra holds: a file or inline YAML, never both.

    The secret fields join the environment (``env``, default ``os.environ``) for ``${VAR}``
    interpolation and win over it.
    """
    variables = dict(os.environ if env is None else env)
    for field, variable in SECRET_VARIABLES.items():
        if (secret := _field(extra, field)) is not None:
            variables[variable] = quote(str(secret), safe="")
    path, text = _field(extra, "config"), _field(extra, "config_yaml")
    if path is not None and text is not None:
        raise ConfigError(
            f"Airflow connection {conn_id!r} has both a config file and inline YAML",
            "empty one of the two fields",
        )
    if path is not None:
        return load_config(str(path), env=variables)
    if text is not None:
        return parse_config(str(text), env=variables)
    raise ConfigError(
        f"Airflow connection {conn_id!r} names no config",
        'fill its "Config file" or "Config (YAML)" field (extra "config" or "config_yaml")',
    )


def resolved(config: Config) -> Config:
    """``config`` with a URL in ``source.url``: the same config when it holds one already, else
    a copy whose ``source.url`` is the URL of the Airflow connection it names (looked up only
    then: Airflow is imported only then). Resolved once, where a config is loaded; every layer
    below sees a URL."""
    if not config.source.is_airflow_conn:
        return config
    url = url_from_airflow_connection(config.source.url, config.source.type)
    return dataclasses.replace(config, source=dataclasses.replace(config.source, url=url))


def url_from_airflow_connection(conn_id: str, kind: str) -> str:
    """The source URL of Airflow connection ``conn_id`` (its host, port, login, password and
    schema), in the URL scheme of source kind ``kind``."""
    from airflow_dblog.provider.compat import BaseHook

    try:
        conn = BaseHook.get_connection(conn_id)
    except Exception as err:  # Airflow raises its own not-found type per version
        raise ConfigError(
            f"Airflow connection {conn_id!r} cannot be read ({type(err).__name__})",
            "create it in Airflow or put a URL in source.url",
        ) from None
    auth = quote(conn.login or "", safe="")
    if conn.password:
        auth += ":" + quote(conn.password, safe="")
    host = conn.host or "127.0.0.1"
    port = f":{conn.port}" if conn.port else ""
    return f"{source_kind(kind).url_scheme}://{auth}@{host}{port}/{conn.schema or ''}"
