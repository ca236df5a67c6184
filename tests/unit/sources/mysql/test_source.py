"""MySQL source pieces that need no server: URL parsing, quoting, keyset SQL, key coercion,
binlog variable validation, offsets, and MySQL's GTID-set resume (MySQL is not installable here:
the reader runs on pymysqlreplication's own event classes, filled in by hand)."""

from __future__ import annotations

import datetime as dt
import decimal
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest
from pymysqlreplication.event import GtidEvent, HeartbeatLogEvent, RotateEvent, XidEvent

from airflow_dblog.core.events import ChangeEvent, TableId
from airflow_dblog.core.position import Position
from airflow_dblog.errors import SourceError
from airflow_dblog.sources.mysql import binlog_reader
from airflow_dblog.sources.mysql.binlog_codecs import _enum_values
from airflow_dblog.sources.mysql.binlog_reader import (
    BinlogReader,
    _reset_since,
    _same_history,
    server_id_for,
)
from airflow_dblog.sources.mysql.binlog_stream import RowsData, _record
from airflow_dblog.sources.mysql.connection import connect, parse_mysql_url
from airflow_dblog.sources.mysql.dialect import DIALECT, quote_ident
from airflow_dblog.sources.mysql.key_values import coerce_value
from airflow_dblog.sources.mysql.schema import ColumnInfo
from airflow_dblog.sources.mysql.source import mysql_gtids_before, validate_binlog_variables

A = "3e11fa47-71ca-11e1-9e33-c80aa9429562"
B = "4f22ab58-82db-22f2-af44-d91bba53a673"


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
    sql, params = DIALECT.compare(["`a`", "`b`"], ">", [1, "x"])
    assert sql == "(`a` >= %s AND ((`a` > %s) OR (`a` = %s AND `b` > %s)))"
    assert params == [1, 1, 1, "x"]
    sql, params = DIALECT.compare(["`a`", "`b`", "`c`"], "<=", [1, 2, 3])
    assert sql == (
        "(`a` <= %s AND ((`a` < %s) OR (`a` = %s AND `b` < %s)"
        " OR (`a` = %s AND `b` = %s AND `c` <= %s)))"
    )
    assert params == [1, 1, 1, 2, 1, 2, 3]
    assert DIALECT.compare(["`id`"], ">", [5]) == ("`id` > %s", [5])


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
    assert (old.binlog_file_index, new.binlog_file_index) == (999_999, 1)
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
        ([f"{A}:1-500", f"{A}:501"], f"{A}:1-900,{B}:1-3", False),  # MySQL: sets
        ([f"{A}:1-500", None], f"{A}:1-500", False),
        ([f"{A}:1-500", f"{A}:501"], f"{A}:1-500", True),
        ([f"{A}:1-500"], f"{A}:1-3", True),  # RESET MASTER, then three transactions
        ([f"{A}:1-500"], "", True),
    ],
)
def test_reset_since_means_a_sequence_number_went_back(
    read: list[str | None], head: str, reset: bool
) -> None:
    assert _reset_since(read, head) is reset


def test_the_gtid_set_at_a_mysql_binlog_offset_is_previous_gtids_plus_the_transactions_before() -> (
    None
):
    def gtid(pos: int, n: int) -> tuple[Any, ...]:
        return ("binlog.000002", pos, "Gtid", 1, pos + 79, f"SET @@SESSION.GTID_NEXT= '{A}:{n}'")

    events = [
        ("binlog.000002", 4, "Format_desc", 1, 126, "Server ver: 8.4.3, Binlog ver: 4"),
        ("binlog.000002", 126, "Previous_gtids", 1, 197, f"{A}:1-7,\n{B}:1-2"),
        gtid(197, 8),
        ("binlog.000002", 276, "Query", 1, 351, "BEGIN"),
        ("binlog.000002", 351, "Xid", 1, 382, "COMMIT /* xid=9 */"),
        gtid(382, 9),
    ]
    assert mysql_gtids_before(events, 4) == f"{A}:1-7,{B}:1-2"
    assert mysql_gtids_before(events, 382) == f"{A}:1-8,{B}:1-2"
    assert mysql_gtids_before(events, 10_000) == f"{A}:1-9,{B}:1-2"
    assert mysql_gtids_before(events[:1], 4) is None  # no Previous_gtids: not a MySQL binlog


class Mysql8:
    """What the reader asks a MySQL 8 server with gtid_mode=ON, answered from its fields."""

    flavor = "mysql"
    lineage_epoch = 0

    def __init__(self) -> None:
        self.server = f"1/{A}"
        self.logs = ["binlog.000001", "binlog.000002"]
        self.status = ("binlog.000002", 900)
        self.executed = f"{A}:1-100"
        self.previous = ""  # Previous_gtids of the first binlog (gtid_at(logs[0], 4))

    def check_binlog(self) -> None: ...

    def close(self) -> None: ...

    def forget(self, table: TableId) -> None: ...

    def identity(self) -> str:
        return self.server

    def start_point(self) -> tuple[str, int, str]:
        return (*self.status, self.executed)

    def binary_logs(self) -> list[str]:
        return self.logs

    def gtid_executed(self) -> str:
        return self.executed

    def gtid_at(self, file: str, offset: int) -> str:
        assert (file, offset) == (self.logs[0], 4)
        return self.previous


TABLE = TableId("shop", "orders")


def _packet(end: int, size: int = 31) -> SimpleNamespace:
    return SimpleNamespace(log_pos=end, event_size=size)


def _event(cls: type, end: int, **fields: Any) -> Any:
    event = cls.__new__(cls)
    event.packet = _packet(end)
    event.__dict__.update(fields)
    return event


def _trx(gtid: str, start: int, ids: list[int]) -> list[Any]:
    """One transaction: its GTID event, one row event inserting ``ids`` (its images standing
    in for its bytes), its XID event."""
    uuid, gno = gtid.split(":")
    begin = _event(GtidEvent, start + 79, sid=bytes.fromhex(uuid.replace("-", "")), gno=int(gno))
    begin.packet = _packet(start + 79, 79)
    images: Any = [{"id": i} for i in ids]
    rows = RowsData("c", 5, 1_700_000_000, start + 200, images, 0, 0, ())
    return [begin, rows, _event(XidEvent, start + 231)]


def _reader(monkeypatch: pytest.MonkeyPatch, server: Mysql8, offset: Any = None) -> BinlogReader:
    monkeypatch.setattr(binlog_reader, "MysqlSource", lambda settings: server)
    return BinlogReader("mysql://u:p@127.0.0.1:3306/shop", [], offset=offset, server_id=7)


def _read(reader: BinlogReader, events: list[Any], max_items: int) -> list[Any]:
    """``reader.read`` over ``events`` (then the server is idle), as the stream would call it."""
    feed: Iterator[Any] = iter(events)
    idle = _event(HeartbeatLogEvent, 0)
    reader._fetch = lambda: _record(next(feed, idle))  # type: ignore[method-assign]
    images = lambda rows: rows.data  # noqa: E731
    reader._codecs[5] = binlog_reader._TableCodec(TABLE, ("id",), images, watermark=False)
    return reader.read(max_items, 0.5)


def test_a_mysql_stream_resumes_on_a_promoted_replica_by_its_gtid_set(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The offset carries the executed GTID set at its resume point (SHOW MASTER STATUS's at
    the start, plus each committed transaction); pointed at another server, the reader asks it
    for every transaction outside that set (COM_BINLOG_DUMP_GTID) on the next lineage epoch and
    skips the items of the first one it had already returned."""
    primary = Mysql8()
    reader = _reader(monkeypatch, primary)
    items = _read(reader, [*_trx(f"{A}:101", 900, [1]), *_trx(f"{A}:102", 1131, [2, 3])], 2)
    assert [i.key for i in items] == [(1,), (2,)]
    offset = reader.offset()
    assert offset == {
        "file": "binlog.000002",
        "pos": 1131,  # the start of A:102, of which one item was returned
        "after": str(items[-1].position),
        "server": f"1/{A}",
        "gtid": f"{A}:1-101",
        "trx_gtid": f"{A}:102",
        "trx_items": 1,
        "epoch": 0,
    }

    replica = Mysql8()
    replica.server, replica.executed = f"2/{B}", f"{A}:1-102,{B}:1"
    resumed = _reader(monkeypatch, replica, offset)
    assert resumed.lineage_epoch == 1
    stream = binlog_reader.BinlogReader._open(resumed)
    assert (stream.auto_position, stream.is_mariadb) == (f"{A}:1-101", False)
    rotate = _event(RotateEvent, 0, next_binlog="binlog.000007", position=4)
    # what the new primary has outside the set: the rest of A:102, then its own first write
    items = _read(resumed, [rotate, *_trx(f"{A}:102", 300, [2, 3]), *_trx(f"{B}:1", 531, [4])], 9)
    assert [(i.key, i.gtid) for i in items] == [((3,), f"{A}:102"), ((4,), f"{B}:1")]
    assert all(isinstance(i, ChangeEvent) and i.position.epoch == 1 for i in items)
    assert resumed.offset() | {"after": None} == {
        "file": "binlog.000007",
        "pos": 531,
        "after": None,
        "server": f"2/{B}",
        "gtid": f"{A}:1-102",
        "trx_gtid": f"{B}:1",
        "trx_items": 1,
        "epoch": 1,
    }


def test_a_mysql_binlog_reset_since_the_offset_restarts_from_its_first_file(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """RESET MASTER on the same server: its executed set no longer holds the offset's."""
    offset = {"file": "binlog.000002", "pos": 1131, "gtid": f"{A}:1-101", "server": f"1/{A}"}
    server = Mysql8()
    server.logs, server.executed = ["binlog.000001"], f"{A}:1-3"
    reader = _reader(monkeypatch, server, offset)
    assert (reader.lineage_epoch, reader.offset()["file"], reader.offset()["pos"]) == (
        1,
        "binlog.000001",
        4,
    )
    server.logs, server.executed = Mysql8().logs, f"{A}:1-120"  # not reset: resumes there
    assert _reader(monkeypatch, server, offset).offset()["pos"] == 1131


def test_a_mysql_offset_without_gtids_cannot_move_to_another_server(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    server = Mysql8()
    server.server = f"2/{B}"
    offset = {"file": "binlog.000002", "pos": 1131, "gtid": None, "server": f"1/{A}"}
    with pytest.raises(SourceError, match=r"another server.*no GTIDs.*gtid_mode was OFF"):
        _reader(monkeypatch, server, offset)
