"""How MySQL and MariaDB spell keyset SQL: backtick quoting, an expanded row comparison, and
``FORCE INDEX (PRIMARY)`` (see :mod:`airflow_dblog.sources.keyset`)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from airflow_dblog.core.events import TableId
from airflow_dblog.sources.keyset import Dialect, Statement


class MysqlDialect(Dialect):
    """Row comparisons are expanded (MariaDB makes no index range of a row constructor) and
    key lists are ORs of equalities; every SELECT names the primary key index."""

    quote_char = "`"
    index_hint = " FORCE INDEX (PRIMARY)"

    def compare(self, columns: Sequence[str], op: str, values: Sequence[Any]) -> Statement:
        return _expanded(columns, values, op)

    def keys_match(self, columns: Sequence[str], count: int) -> str:
        if len(columns) == 1:
            return f"{columns[0]} IN ({', '.join(['%s'] * count)})"
        one = "(" + " AND ".join(f"{c} = %s" for c in columns) + ")"
        return " OR ".join([one] * count)


DIALECT = MysqlDialect()


def quote_ident(name: str) -> str:
    """A MySQL identifier in backticks, embedded backticks doubled."""
    return DIALECT.quote(name)


def quote_table(table: TableId) -> str:
    return DIALECT.table(table)


def _expanded(q: Sequence[str], values: Sequence[Any], op: str) -> Statement:
    """``(q) op (values)`` for quoted columns ``q``, spelled so the range optimizer uses the key
    index: ``c0 >= v0 AND (c0 > v0 OR (c0 = v0 AND c1 > v1) OR ...)`` for ``>``. MariaDB does not
    turn a row constructor comparison into an index range, but it does turn this."""
    if len(q) == 1:
        return f"{q[0]} {op} %s", [values[0]]
    strict = op[0]  # ">" or "<"
    last = op
    disjuncts: list[str] = []
    params: list[Any] = []
    for i in range(len(q)):
        terms = [f"{q[j]} = %s" for j in range(i)]
        params.extend(values[:i])
        terms.append(f"{q[i]} {last if i == len(q) - 1 else strict} %s")
        params.append(values[i])
        disjuncts.append(" AND ".join(terms))
    bound = f"{q[0]} {strict}= %s"
    sql = f"({bound} AND ({' OR '.join(f'({d})' for d in disjuncts)}))"
    return sql, [values[0], *params]
