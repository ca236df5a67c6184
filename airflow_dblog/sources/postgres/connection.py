"""Where and as whom a PostgreSQL source connects: the URL as a libpq connection string, the
psycopg2 connection with dblog's session settings, and connection errors as one-line
SourceErrors that never show the password."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import psycopg2
import psycopg2.extensions

from airflow_dblog.errors import SourceError
from airflow_dblog.redact import redact

SESSION_OPTIONS = (
    "-c TimeZone=UTC -c DateStyle=ISO -c IntervalStyle=postgres"
    " -c bytea_output=hex -c extra_float_digits=1"
)
"""GUCs of every connection (SELECTs and the walsender), so both sides print values alike."""


@dataclass(frozen=True)
class ConnectionSettings:
    """A libpq connection string plus where it points; ``repr`` never shows the password."""

    dsn: str
    host: str
    port: int
    user: str
    database: str

    def __repr__(self) -> str:
        return (
            f"ConnectionSettings(host={self.host!r}, port={self.port}, user={self.user!r},"
            f" database={self.database!r})"
        )

    @property
    def where(self) -> str:
        return f"{self.host}:{self.port}"


def parse_postgres_url(url: str) -> ConnectionSettings:
    """``postgres://user:password@host:port/db`` (also ``postgresql://``, ``postgres+x://``)."""
    text = url.strip()
    scheme, sep, rest = text.partition("://")
    if sep:
        base = scheme.split("+", 1)[0].lower()
        if base not in ("postgres", "postgresql"):
            raise SourceError(
                f"source.url scheme {scheme!r} is not postgres",
                "write it as postgres://user:password@host:5432/db",
            )
        text = f"postgresql://{rest}"
    try:
        params = psycopg2.extensions.parse_dsn(text)
    except psycopg2.ProgrammingError as err:
        raise SourceError(
            f"source.url is not a valid PostgreSQL URL ({redact(str(err)).strip()})",
            "write it as postgres://user:password@host:5432/db",
        ) from None
    host = params.get("host") or "localhost"
    try:
        port = int(str(params.get("port") or 5432).split(",")[0])
    except ValueError:
        raise SourceError(
            f"source.url has an invalid port {params.get('port')!r}",
            "write it as postgres://user:password@host:5432/db",
        ) from None
    user = params.get("user") or ""
    database = params.get("dbname") or user
    return ConnectionSettings(text, host, port, user, database)


def connect(
    settings: ConnectionSettings, *, connect_timeout: float = 10.0, **extra: Any
) -> psycopg2.extensions.connection:
    """A new connection with dblog's session settings; SourceError naming host:port if it fails."""
    try:
        return psycopg2.connect(
            settings.dsn,
            connect_timeout=max(1, int(connect_timeout)),
            application_name="airflow-dblog",
            options=SESSION_OPTIONS,
            **extra,
        )
    except psycopg2.Error as err:
        raise connect_error(settings, err) from None


def connect_error(settings: ConnectionSettings, err: BaseException) -> SourceError:
    message = " ".join(redact(str(err)).split()) or type(err).__name__
    if "password authentication failed" in message or "authentication" in message:
        fix = "check the user and password in source.url"
    elif "does not exist" in message and "database" in message:
        fix = "create the database or fix its name in source.url"
    elif "replication" in message and "pg_hba" in message:
        fix = "allow replication connections for this user in pg_hba.conf"
    else:
        fix = "check that PostgreSQL is running and that source.url's host and port are right"
    # libpq's text names the host and port but never the password; keep only its first clause
    return SourceError(
        f"cannot connect to PostgreSQL at {settings.where} as {settings.user or '?'}:"
        f" {message[:300]}",
        fix,
    )


def is_connection_lost(err: BaseException, conn: Any) -> bool:
    """True when ``err`` means the connection is gone (worth one reconnect)."""
    if isinstance(err, psycopg2.InterfaceError):
        return True
    if conn is not None and getattr(conn, "closed", 0):
        return True
    return isinstance(err, psycopg2.OperationalError) and getattr(err, "pgcode", None) in (
        None,
        "57P01",  # admin_shutdown / terminated by administrator
        "57P02",
        "57P03",
    )
