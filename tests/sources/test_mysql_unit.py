"""MySQL source pieces that need no server: URL parsing, quoting, keyset SQL, key coercion,
binlog variable validation, offsets."""

from __future__ import annotations

import datetime as dt
import decimal

import pytest

from airflow_dblog.errors import SourceError
from airflow_dblog.position import Position
from airflow_dblog.sources.binlog_reader import (
    _enum_values,
    _reset_since,
    _same_history,
    server_id_for,
)
from airflow_dblog.sources.mysql import (
    ColumnInfo,
    _keyset_after,
    _keyset_upto,
    coerce_value,
    connect,
    parse_mysql_url,
    quote_ident,
    validate_binlog_variables,
)


def col(data_type: str, column_type: str | None = None, **kw: object) -> ColumnInfo:
    base = dict(
        name="c",
        data_type=data_type,
        column_type=column_type or data_type,
        nullable=False,
        unsigned="unsigned" in (column_type or ""),
        charset=None,
        char_length=None,
        scale=None,
    )
    base.update(kw)
    return ColumnInfo(**base)  # type: ignore[arg-type]


def test_url_parsing_keeps_password_out_of_repr() -> None:
    s = parse_mysql_url("mysql://dblog:s%40cret@db.example:3307/app")
    assert (s.host, s.port, s.user, s.password, s.database) == (
        "db.example",
        3307,
        "dblog",
        "s@cret",
        "app",
    )
    assert "s@cret" not in repr(s)
    assert parse_mysql_url("mariadb://u@h").port == 3306
    with pytest.raises(SourceError, match="scheme"):
        parse_mysql_url("postgres://u@h/db")


def test_quote_ident_escapes_backticks() -> None:
    assert quote_ident("a`b") == "`a``b`"
    assert quote_ident("x; DROP TABLE t") == "`x; DROP TABLE t`"


@pytest.mark.parametrize(
    ("variables", "match"),
    [
        ({"log_bin": "OFF", "binlog_format": "ROW", "binlog_row_image": "FULL"}, "log_bin is OFF"),
        (
            {"log_bin": "ON", "binlog_format": "STATEMENT", "binlog_row_image": "FULL"},
            "binlog_format is STATEMENT; dblog needs ROW: SET GLOBAL binlog_format=ROW",
        ),
        (
            {"log_bin": "ON", "binlog_format": "MIXED", "binlog_row_image": "FULL"},
            "binlog_format is MIXED",
        ),
        (
            {"log_bin": "ON", "binlog_format": "ROW", "binlog_row_image": "MINIMAL"},
            "binlog_row_image is MINIMAL; dblog needs FULL: SET GLOBAL binlog_row_image=FULL",
        ),
        (
            {"log_bin": "ON", "binlog_format": "ROW", "binlog_row_image": "NOBLOB"},
            "binlog_row_image is NOBLOB",
        ),
    ],
)
def test_binlog_variables_refused(variables: dict[str, str], match: str) -> None:
    with pytest.raises(SourceError, match=match) as err:
        validate_binlog_variables(variables)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("name", ["binlog_transaction_compression", "log_bin_compress"])
def test_compressed_binlog_refused(name: str) -> None:
    ok = {"log_bin": "ON", "binlog_format": "ROW", "binlog_row_image": "FULL"}
    with pytest.raises(SourceError, match=f"^{name} is ON; dblog cannot decode compressed"):
        validate_binlog_variables({**ok, name: "ON"})
    validate_binlog_variables({**ok, name: "OFF"})


def test_binlog_variables_accepted() -> None:
    validate_binlog_variables({"LOG_BIN": "ON", "BINLOG_FORMAT": "row", "binlog_row_image": "FULL"})


def test_keyset_sql_is_expanded_and_parameterised() -> None:
    sql, params = _keyset_after(["a", "b"], [1, "x"])
    assert sql == "(`a` >= %s AND ((`a` > %s) OR (`a` = %s AND `b` > %s)))"
    assert params == [1, 1, 1, "x"]
    sql, params = _keyset_upto(["a", "b", "c"], [1, 2, 3])
    assert sql == (
        "(`a` <= %s AND ((`a` < %s) OR (`a` = %s AND `b` < %s)"
        " OR (`a` = %s AND `b` = %s AND `c` <= %s)))"
    )
    assert params == [1, 1, 1, 2, 1, 2, 3]
    assert _keyset_after(["id"], [5]) == ("`id` > %s", [5])


def test_coerce_values() -> None:
    assert coerce_value(col("int", "int(11)"), "42") == 42
    assert coerce_value(col("bigint", "bigint(20) unsigned"), 2**64 - 1) == 2**64 - 1
    with pytest.raises(ValueError, match="out of range"):
        coerce_value(col("bigint", "bigint(20) unsigned"), -1)
    with pytest.raises(ValueError):
        coerce_value(col("int"), True)
    with pytest.raises(ValueError):
        coerce_value(col("int"), "4x")
    assert coerce_value(col("decimal", "decimal(10,2)", scale=2), "1.5") == decimal.Decimal("1.50")
    assert str(coerce_value(col("decimal", "decimal(10,2)", scale=2), 3)) == "3.00"
    with pytest.raises(ValueError, match="decimals"):
        coerce_value(col("decimal", "decimal(10,2)", scale=2), "1.234")
    assert coerce_value(col("date"), "2024-02-29") == dt.date(2024, 2, 29)
    assert coerce_value(col("datetime"), "2024-02-29T10:11:12.5") == dt.datetime(
        2024, 2, 29, 10, 11, 12, 500000
    )
    assert coerce_value(col("timestamp"), "2024-02-29T10:11:12+02:00") == dt.datetime(
        2024, 2, 29, 8, 11, 12
    )
    assert coerce_value(col("timestamp"), "2024-02-29T10:11:12Z") == dt.datetime(
        2024, 2, 29, 10, 11, 12
    )
    assert coerce_value(col("time"), "-01:02:03.5") == -dt.timedelta(
        hours=1, minutes=2, seconds=3, microseconds=500000
    )
    assert coerce_value(col("time"), 90.0) == dt.timedelta(seconds=90)
    u = "1b4e28ba-2fa1-11d2-883f-0016d3cca427"
    assert coerce_value(col("char", "char(36)", char_length=36), u) == u
    assert coerce_value(col("binary", "binary(16)", char_length=16), u) == bytes.fromhex(
        u.replace("-", "")
    )
    assert coerce_value(col("binary", "binary(4)", char_length=4), "0x0102") == b"\x01\x02\x00\x00"
    assert coerce_value(col("varbinary", "varbinary(8)", char_length=8), b"ab") == b"ab"
    with pytest.raises(ValueError):
        coerce_value(col("varchar", "varchar(3)", char_length=3), "abcd")
    with pytest.raises(ValueError):
        coerce_value(col("varchar", "varchar(3)", char_length=3), 12)
    with pytest.raises(ValueError):
        coerce_value(col("date"), "yesterday")
    with pytest.raises(ValueError):
        coerce_value(col("int"), None)


def test_enum_values_parsing() -> None:
    assert _enum_values("enum('a','b''c','d,e')") == ["a", "b'c", "d,e"]
    assert _enum_values("set('x')") == ["x"]


def test_server_id_is_stable_and_in_range() -> None:
    assert server_id_for("inventory") == server_id_for("inventory")
    assert 1 <= server_id_for("x") < 2**31


def test_unreachable_server_error_names_host_not_password() -> None:
    settings = parse_mysql_url("mysql://dblog:topsecretpw@127.0.0.1:1/app?connect_timeout=2")
    with pytest.raises(SourceError) as err:
        connect(settings)
    text = str(err.value)
    assert "127.0.0.1:1" in text
    assert "topsecretpw" not in text
    assert "\n" not in text


def test_a_new_lineage_epoch_sorts_after_every_position_of_the_old_one() -> None:
    old = Position.mysql(999_999, 1 << 40, 7, 3)
    new = Position.mysql(1, 4, epoch=1)
    assert new > old and str(new) > str(old) and (old.epoch, new.epoch) == (0, 1)
    assert str(Position.mysql(3, 120)) == str(Position.parse(str(Position.mysql(3, 120))))


@pytest.mark.parametrize(
    ("ours", "theirs", "same"),
    [
        ("0-1-500", "0-1-500", True),
        ("0-1-500", "0-1-500,1-2-7", True),  # a domain the stream never saw
        ("0-1-500,1-2-7", "0-1-500,1-2-8", False),
        ("0-1-500", "0-2-500", False),  # same number, another server's transaction
        ("0-1-500", "", False),
    ],
)
def test_same_history_compares_every_domain_the_stream_saw(
    ours: str, theirs: str, same: bool
) -> None:
    assert _same_history(ours, theirs) is same


@pytest.mark.parametrize(
    ("read", "head", "reset"),
    [
        (["0-1-500", "0-1-501"], "0-1-900", False),
        (["0-1-500", None], "0-1-500", False),
        (["0-1-500", "0-1-501"], "0-1-500", True),  # the transaction read is gone
        (["0-1-500"], "0-1-3", True),  # numbered from 1 again
        (["0-1-500"], "", True),
        (["0-1-500"], "0-2-600", False),  # a failover inside the domain: numbers go on
    ],
)
def test_reset_since_means_a_sequence_number_went_back(
    read: list[str | None], head: str, reset: bool
) -> None:
    assert _reset_since(read, head) is reset
