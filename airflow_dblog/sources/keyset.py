"""The keyset SQL of every SQL source, written once; a :class:`Dialect` spells what differs.

A chunk is ``lower < key <= upper ORDER BY key LIMIT n``; a chunk bound is the n-th key after
``lower`` read from the key index alone; the largest key is the first one in descending key
order; a key list is ``key IN (...)``. What a database spells its own way is small: how it
quotes an identifier, how it compares a key with a row of values so that the comparison becomes
an index range, whether it needs an index hint, and how it matches a list of keys.

Identifiers are always quoted and values are always bound parameters (``%s``, the format
parameter style of both PyMySQL and psycopg2): nothing a user types is spliced into SQL.
Because every statement here is executed with parameters, a ``%`` inside a quoted identifier
is written ``%%`` so that the driver's formatting gives it back as one ``%``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from airflow_dblog.core.events import TableId
from airflow_dblog.core.keys import check_arity
from airflow_dblog.errors import InputError

Statement = tuple[str, list[Any]]  # SQL text and its parameters


class Dialect:
    """How one database spells the parts of keyset SQL; the defaults are standard SQL.

    Subclasses set ``quote_char`` and override what their server plans differently.
    """

    quote_char = '"'
    index_hint = ""  # after the table name, e.g. `` FORCE INDEX (PRIMARY)``
    placeholder = "%s"

    def quote(self, name: str) -> str:
        """An identifier in quotes, embedded quote characters doubled."""
        if "\x00" in name:
            raise InputError(f"identifier {name!r} contains a NUL character", "fix the table name")
        q = self.quote_char
        return q + name.replace(q, q + q) + q

    def table(self, table: TableId) -> str:
        return f"{self.quote(table.db)}.{self.quote(table.table)}"

    def compare(self, columns: Sequence[str], op: str, values: Sequence[Any]) -> Statement:
        """``(columns) op (values)`` for ``op`` ``>`` or ``<=`` (``columns`` quoted already):
        a row-value comparison, which the server turns into a range of the key index."""
        row = ", ".join(columns)
        marks = ", ".join([self.placeholder] * len(columns))
        return f"({row}) {op} ({marks})", list(values)

    def keys_match(self, columns: Sequence[str], count: int) -> str:
        """The condition matching ``count`` keys (``columns`` quoted already), their values
        bound in key order."""
        marks = "(" + ", ".join([self.placeholder] * len(columns)) + ")"
        return f"({', '.join(columns)}) IN ({', '.join([marks] * count)})"


def _quoted(dialect: Dialect, name: str) -> str:
    return dialect.quote(name).replace("%", "%%")


def range_sql(
    dialect: Dialect,
    table: TableId,
    key: Sequence[str],
    columns: Sequence[str] | None,
    lower: Sequence[Any] | None,
    upper: Sequence[Any] | None,
    *,
    limit: int,
    offset: int = 0,
    descending: bool = False,
) -> Statement:
    """``SELECT cols FROM t WHERE key > lower AND key <= upper ORDER BY key LIMIT n OFFSET m``.

    ``columns`` None selects ``*``: a chunk SELECT must not name a column an ALTER just
    dropped. ``lower``/``upper`` None leave that side open.
    """
    q = [_quoted(dialect, c) for c in key]
    where: list[str] = []
    params: list[Any] = []
    for bound, op in ((lower, ">"), (upper, "<=")):
        if bound is not None:
            sql, values = dialect.compare(q, op, check_arity(table, key, bound))
            where.append(sql)
            params.extend(values)
    select = "*" if columns is None else ", ".join(_quoted(dialect, c) for c in columns)
    text = f"SELECT {select} FROM {_quoted_table(dialect, table)}{dialect.index_hint}"
    if where:
        text += " WHERE " + " AND ".join(where)
    direction = " DESC" if descending else ""
    text += " ORDER BY " + ", ".join(c + direction for c in q)
    text += f" LIMIT {dialect.placeholder}"
    params.append(int(limit))
    if offset:
        text += f" OFFSET {dialect.placeholder}"
        params.append(int(offset))
    return text, params


def keys_sql(
    dialect: Dialect, table: TableId, key: Sequence[str], keys: Sequence[Sequence[Any]]
) -> Statement:
    """``SELECT * FROM t WHERE key IN (...) ORDER BY key``: the rows of the given keys."""
    q = [_quoted(dialect, c) for c in key]
    params: list[Any] = []
    for k in keys:
        params.extend(check_arity(table, key, k))
    text = (
        f"SELECT * FROM {_quoted_table(dialect, table)}{dialect.index_hint}"
        f" WHERE {dialect.keys_match(q, len(keys))} ORDER BY {', '.join(q)}"
    )
    return text, params


def _quoted_table(dialect: Dialect, table: TableId) -> str:
    return dialect.table(table).replace("%", "%%")
