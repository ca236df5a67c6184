"""Source URLs from Airflow connections (MySQL, Postgres or the ``dblog`` type)."""

from __future__ import annotations

from urllib.parse import quote

from airflow_dblog.errors import ConfigError

_SCHEMES = {"mysql": "mysql", "postgres": "postgresql"}


def url_from_airflow_connection(conn_id: str, kind: str) -> str:
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
    return f"{_SCHEMES[kind]}://{auth}@{host}{port}/{conn.schema or ''}"
