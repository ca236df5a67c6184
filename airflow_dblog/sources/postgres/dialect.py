"""How PostgreSQL spells keyset SQL: standard SQL (see :mod:`airflow_dblog.sources.keyset`).

Identifiers in double quotes; keys compared as row values ``(a, b) > (%s, %s)``, which the
planner turns into a range of the primary key index (an Index Cond, not a filter); key lists
as ``(a, b) IN ((%s, %s), ...)``; no index hint.
"""

from __future__ import annotations

from airflow_dblog.sources.keyset import Dialect


class PostgresDialect(Dialect):
    quote_char = '"'


DIALECT = PostgresDialect()
