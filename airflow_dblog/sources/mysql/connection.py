"""Where and as whom a MySQL/MariaDB source connects: the URL, the PyMySQL connection, and
connection errors as one-line SourceErrors that never show the password."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

import pymysql

from airflow_dblog.errors import SourceError
from airflow_dblog.redact import redact

# Client-side codes PyMySQL raises when the connection is gone (worth one reconnect).
CONNECTION_LOST = {0, 1927, 2006, 2013, 2014, 2045, 2055, 4031}
UNREACHABLE = {2002, 2003, 2005}


@dataclass(frozen=True)
class ConnectionSettings:
    """Where and as whom to connect; ``repr`` and ``where`` never show the password."""

    host: str
    port: int
    user: str
    password: str
    database: str | None = None
    unix_socket: str | None = None
    connect_timeout: float = 10.0

    def __repr__(self) -> str:
        return f"ConnectionSettings(host={self.host!r}, port={self.port}, user={self.user!r})"

    @property
    def where(self) -> str:
        return f"{self.host}:{self.port}"

    def pymysql_kwargs(self) -> dict[str, Any]:
        kwargs: dict[str, Any] = {
            "host": self.host,
            "port": self.port,
            "user": self.user,
            "password": self.password,
            "charset": "utf8mb4",
            "connect_timeout": self.connect_timeout,
        }
        if self.unix_socket:
            kwargs["unix_socket"] = self.unix_socket
        return kwargs


def parse_mysql_url(url: str) -> ConnectionSettings:
    """``mysql://user:password@host:port/db`` (also ``mariadb://``, ``mysql+pymysql://``)."""
    try:
        parts = urlsplit(url)
        port = parts.port or 3306
    except ValueError as err:
        raise SourceError(
            f"source.url is not a valid MySQL URL ({redact(str(err))})",
            "write it as mysql://user:password@host:3306/db",
        ) from None
    scheme = parts.scheme.split("+", 1)[0]
    if scheme not in ("mysql", "mariadb"):
        raise SourceError(
            f"source.url scheme {parts.scheme!r} is not mysql",
            "write it as mysql://user:password@host:3306/db",
        )
    query = {k: v[-1] for k, v in parse_qs(parts.query).items()}
    timeout = float(query.get("connect_timeout", 10))
    return ConnectionSettings(
        host=parts.hostname or "127.0.0.1",
        port=port,
        user=unquote(parts.username or ""),
        password=unquote(parts.password or ""),
        database=unquote(parts.path.lstrip("/")) or None,
        unix_socket=query.get("unix_socket"),
        connect_timeout=timeout,
    )


def connect(settings: ConnectionSettings, **extra: Any) -> pymysql.connections.Connection:
    """A PyMySQL connection, or a SourceError naming host:port (never the password)."""
    kwargs = settings.pymysql_kwargs()
    kwargs.update(extra)
    try:
        return pymysql.connect(**kwargs)
    except pymysql.MySQLError as err:
        raise connect_error(settings, err) from None


# access denied for a statement / a table / a database: a grant is missing
DENIED = (1227, 1142, 1044)


def connect_error(settings: ConnectionSettings, err: BaseException) -> SourceError:
    code = err.args[0] if err.args and isinstance(err.args[0], int) else None
    text = redact(str(err.args[1] if len(err.args) > 1 else err))
    if settings.password:
        text = text.replace(settings.password, "***")
    if code == 1045:
        return SourceError(
            f"MySQL at {settings.where} refused user {settings.user!r}: {text}",
            "check the user and password in source.url",
        )
    if code in DENIED:
        return SourceError(
            f"MySQL at {settings.where} denied user {settings.user!r} a privilege: {text}",
            f"GRANT REPLICATION SLAVE, REPLICATION CLIENT ON *.* and SELECT on the captured"
            f" tables to {settings.user!r} (README: least privilege)",
        )
    return SourceError(
        f"cannot reach MySQL at {settings.where}: {text}",
        "check that the server is running and that source.url names the right host and port",
    )
