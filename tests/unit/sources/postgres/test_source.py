"""PostgresSource without a server: URLs, snapshot visibility, value coercion
(tests/integration/sources/postgres/test_source.py runs it on the real PostgreSQL)."""

from __future__ import annotations

import datetime as dt
import decimal
import uuid
from typing import Any

import pytest

from airflow_dblog.core.position import Position, lsn_to_int
from airflow_dblog.errors import SourceError
from airflow_dblog.sources.postgres.connection import parse_postgres_url
from airflow_dblog.sources.postgres.key_values import coerce_value
from airflow_dblog.sources.postgres.schema import ColumnInfo
from airflow_dblog.sources.postgres.source import SnapshotInfo
from tests.support.source_dbs import visible


def test_parse_url_variants_and_repr_hides_password() -> None:
    s = parse_postgres_url("postgres+psycopg2://u:s3cret@db.example:6543/app?sslmode=disable")
    assert (s.host, s.port, s.user, s.database) == ("db.example", 6543, "u", "app")
    assert "s3cret" not in repr(s)
    assert parse_postgres_url("postgresql://u@h/app").port == 5432
    with pytest.raises(SourceError, match="not postgres"):
        parse_postgres_url("mysql://u:p@h/app")


def test_snapshot_info_visibility_and_close_position() -> None:
    info = SnapshotInfo.parse("100:105:101,103", 0x1_0000_0010)
    assert visible(info, 99) and visible(info, 102) and visible(info, 104)
    assert not visible(info, 101) and not visible(info, 103) and not visible(info, 105)
    assert info.close_position == Position.postgres(0x1_0000_0010, 0)
    assert info.close_lsn == lsn_to_int("1/10")


def _col(base: str, **kw: Any) -> ColumnInfo:
    return ColumnInfo(
        "k", kw.pop("type", base), False, 0, base, kw.pop("category", "N"), None, **kw
    )


def test_coerce_value_types() -> None:
    assert coerce_value(_col("int4"), 5) == 5
    assert coerce_value(_col("int8"), "42") == 42
    assert coerce_value(_col("numeric", scale=2), 1.5) == decimal.Decimal("1.50")
    assert str(coerce_value(_col("numeric", scale=2), "1.5")) == "1.50"
    assert coerce_value(_col("numeric"), "12345678901234567890.5") == decimal.Decimal(
        "12345678901234567890.5"
    )
    u = uuid.uuid4()
    assert coerce_value(_col("uuid"), str(u).upper()) == str(u)
    assert coerce_value(_col("date"), "2024-02-29") == dt.date(2024, 2, 29)
    assert coerce_value(_col("timestamp"), "2024-02-29T10:11:12.5") == dt.datetime(
        2024, 2, 29, 10, 11, 12, 500000
    )
    assert coerce_value(_col("timestamptz"), "2024-02-29 12:11:12+02:00") == dt.datetime(
        2024, 2, 29, 10, 11, 12, tzinfo=dt.timezone.utc
    )
    assert coerce_value(_col("timestamptz"), "2024-02-29 10:11:12") == dt.datetime(
        2024, 2, 29, 10, 11, 12, tzinfo=dt.timezone.utc
    )
    assert coerce_value(_col("bytea"), "\\x00ff") == b"\x00\xff"
    assert coerce_value(_col("text", category="S"), "x") == "x"
    for base, bad in [
        ("int4", True),
        ("int4", "x"),
        ("int2", 40000),
        ("int4", 1.5),
        ("numeric", "abc"),
        ("uuid", "not-a-uuid"),
        ("date", "2024-13-01"),
        ("timestamp", "2024-01-01T00:00:00+01:00"),
        ("bytea", "zz"),
        ("text", 5),
        ("int4", None),
    ]:
        with pytest.raises((ValueError, TypeError)):
            coerce_value(_col(base, category="S" if base == "text" else "N"), bad)
