"""The keyset SQL is written once; each database's dialect spells quoting and row comparison."""

from __future__ import annotations

import pytest

from airflow_dblog.core.events import TableId
from airflow_dblog.errors import InputError
from airflow_dblog.sources.keyset import keys_sql, range_sql
from airflow_dblog.sources.mysql.dialect import DIALECT as MYSQL
from airflow_dblog.sources.postgres.dialect import DIALECT as POSTGRES

T = TableId("shop", "items")


def test_a_postgres_chunk_compares_row_values_and_binds_every_value() -> None:
    sql, params = range_sql(POSTGRES, T, ("a", "b"), None, (1, "x"), (9, "z"), limit=100)
    assert sql == (
        'SELECT * FROM "shop"."items" WHERE ("a", "b") > (%s, %s) AND ("a", "b") <= (%s, %s)'
        ' ORDER BY "a", "b" LIMIT %s'
    )
    assert params == [1, "x", 9, "z", 100]


def test_a_mysql_chunk_expands_the_row_comparison_and_forces_the_primary_index() -> None:
    sql, params = range_sql(MYSQL, T, ("a", "b"), None, (1, "x"), (9, "z"), limit=100)
    assert sql == (
        "SELECT * FROM `shop`.`items` FORCE INDEX (PRIMARY)"
        " WHERE (`a` >= %s AND ((`a` > %s) OR (`a` = %s AND `b` > %s)))"
        " AND (`a` <= %s AND ((`a` < %s) OR (`a` = %s AND `b` <= %s)))"
        " ORDER BY `a`, `b` LIMIT %s"
    )
    assert params == [1, 1, 1, "x", 9, 9, 9, "z", 100]


@pytest.mark.parametrize(
    ("dialect", "expected"),
    [
        (POSTGRES, 'SELECT * FROM "shop"."items" WHERE ("id") <= (%s) ORDER BY "id" LIMIT %s'),
        (
            MYSQL,
            "SELECT * FROM `shop`.`items` FORCE INDEX (PRIMARY) WHERE `id` <= %s"
            " ORDER BY `id` LIMIT %s",
        ),
    ],
)
def test_a_first_chunk_with_no_lower_bound_starts_at_the_table_start(
    dialect: object, expected: str
) -> None:
    sql, params = range_sql(dialect, T, ("id",), None, None, (5,), limit=10)  # type: ignore[arg-type]
    assert (sql, params) == (expected, [5, 10])


@pytest.mark.parametrize("dialect", [POSTGRES, MYSQL], ids=["postgres", "mysql"])
def test_a_chunk_bound_reads_only_key_columns_with_an_offset(dialect: object) -> None:
    sql, params = range_sql(
        dialect,  # type: ignore[arg-type]
        T,
        ("id",),
        ("id",),
        (3,),
        (90,),
        limit=1,
        offset=49,
    )
    q = dialect.quote("id")  # type: ignore[attr-defined]
    assert sql.startswith(f"SELECT {q} FROM ")
    assert sql.endswith(f" ORDER BY {q} LIMIT %s OFFSET %s")
    assert params[-2:] == [1, 49]


@pytest.mark.parametrize("dialect", [POSTGRES, MYSQL], ids=["postgres", "mysql"])
def test_the_largest_key_is_the_first_in_descending_key_order(dialect: object) -> None:
    sql, params = range_sql(
        dialect,  # type: ignore[arg-type]
        T,
        ("a", "b"),
        ("a", "b"),
        None,
        None,
        limit=1,
        descending=True,
    )
    a, b = dialect.quote("a"), dialect.quote("b")  # type: ignore[attr-defined]
    assert " WHERE " not in sql
    assert sql.endswith(f" ORDER BY {a} DESC, {b} DESC LIMIT %s")
    assert params == [1]


def test_key_lists_are_row_value_lists_on_postgres_and_ors_on_mysql() -> None:
    keys = [(1, "x"), (2, "y")]
    sql, params = keys_sql(POSTGRES, T, ("a", "b"), keys)
    assert sql == (
        'SELECT * FROM "shop"."items" WHERE ("a", "b") IN ((%s, %s), (%s, %s)) ORDER BY "a", "b"'
    )
    assert params == [1, "x", 2, "y"]
    sql, params = keys_sql(MYSQL, T, ("a", "b"), keys)
    assert sql == (
        "SELECT * FROM `shop`.`items` FORCE INDEX (PRIMARY)"
        " WHERE (`a` = %s AND `b` = %s) OR (`a` = %s AND `b` = %s) ORDER BY `a`, `b`"
    )
    assert params == [1, "x", 2, "y"]
    sql, params = keys_sql(MYSQL, T, ("id",), [(1,), (2,), (3,)])
    assert "WHERE `id` IN (%s, %s, %s) ORDER BY `id`" in sql
    assert params == [1, 2, 3]


def test_odd_identifiers_are_quoted_and_never_read_as_parameters() -> None:
    odd = TableId('My "Schema"', "x`; DROP TABLE t; --")
    sql, params = range_sql(POSTGRES, odd, ('Key "Col"', "100%"), None, None, (1, 2), limit=5)
    assert sql.startswith('SELECT * FROM "My ""Schema"""."x`; DROP TABLE t; --" WHERE')
    assert '("Key ""Col""", "100%%") <= (%s, %s)' in sql
    assert params == [1, 2, 5]
    sql, _ = range_sql(MYSQL, odd, ("a`b",), None, None, (1,), limit=5)
    assert sql.startswith('SELECT * FROM `My "Schema"`.`x``; DROP TABLE t; --` FORCE INDEX')
    assert "`a``b` <= %s" in sql
    with pytest.raises(InputError, match="NUL"):
        range_sql(POSTGRES, TableId("s", "t\x00"), ("id",), None, None, (1,), limit=5)


@pytest.mark.parametrize("dialect", [POSTGRES, MYSQL], ids=["postgres", "mysql"])
def test_a_bound_of_the_wrong_arity_is_one_line_input_error(dialect: object) -> None:
    with pytest.raises(InputError, match="2-column primary key") as err:
        range_sql(dialect, T, ("a", "b"), None, (1,), (2, "z"), limit=5)  # type: ignore[arg-type]
    assert "\n" not in str(err.value)
