"""GTID sets: MySQL interval sets and MariaDB domain positions."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from airflow_dblog.core.gtid import (
    MariadbGtidSet,
    MysqlGtidSet,
    parse_gtid_set,
    parse_mariadb_gtid,
    parse_mysql_gtid,
)

A = "3e11fa47-71ca-11e1-9e33-c80aa9429562"
B = "aaaaaaaa-bbbb-cccc-dddd-eeeeeeeeeeee"


def m(text: str) -> MysqlGtidSet:
    s = parse_gtid_set(text, "mysql")
    assert isinstance(s, MysqlGtidSet)
    return s


# -------------------------------------------------------------------------------------- MySQL


@pytest.mark.parametrize(
    ("text", "normal"),
    [
        ("", ""),
        (f"{A}:1-5", f"{A}:1-5"),
        (f"{A}:1-5:7", f"{A}:1-5:7"),
        (f"{A}:1-3:4-5", f"{A}:1-5"),  # adjacent intervals merge
        (f"{A}:4-5:1-3", f"{A}:1-5"),  # order does not matter
        (f"{A}:1-5:3-8:10", f"{A}:1-8:10"),  # overlapping ones too
        (f"{A}:7:7:7", f"{A}:7"),
        (f"{A}:5-5", f"{A}:5"),
        (f"{B}:3,{A}:1-2", f"{A}:1-2,{B}:3"),  # servers sorted
        (f"{A.upper()}:1-2", f"{A}:1-2"),  # UUIDs lower-cased
        (f"{A}:1-2,\n{B}:9,\n{A}:3", f"{A}:1-3,{B}:9"),  # server named twice, newlines
        (f"  {A}:1-2 , {B}:1  ", f"{A}:1-2,{B}:1"),
        (f"{A}:1-2:TagX:1-3:abc:5", f"{A}:1-2:abc:5:tagx:1-3"),  # 8.3 tags, lower-cased
        (f"{A}:tag_a:1", f"{A}:tag_a:1"),  # tagged only
    ],
)
def test_mysql_parse_normalises_and_round_trips(text, normal):
    s = m(text)
    assert str(s) == normal
    assert m(str(s)) == s
    assert bool(s) == bool(normal)


@pytest.mark.parametrize(
    "text",
    [
        f"{A}",  # no interval
        f"{A}:",
        f"{A}:0",  # numbers start at 1
        f"{A}:5-3",  # backwards
        f"{A}:1-x",
        f"{A}:1-2-3",
        f"{A}:-3",
        f"{A}:{2**63}",  # beyond MySQL's largest number
        "not-a-uuid:1",
        f"{A[:-1]}:1",
        f"{A}:1,",  # trailing comma
        f"{A}:1,,{B}:2",
        f"{A}:1:tag",  # tag without interval
        f"{A}:tag1:tag2:3",  # first tag without interval
        f"{A}:1:bad-tag:2",
        f"{A}:1:{'t' * 33}:1",  # tags are at most 32 characters
    ],
)
def test_mysql_malformed_sets_are_rejected(text):
    with pytest.raises(ValueError):
        m(text)


def test_mysql_contains_multi_server_with_gaps():
    s = m(f"{A}:1-5:7:10-12,{B}:3")
    inside = [f"{A}:1", f"{A}:5", f"{A}:7", f"{A}:10", f"{A}:12", f"{B}:3", f"{A.upper()}:2"]
    outside = [f"{A}:6", f"{A}:8", f"{A}:9", f"{A}:13", f"{B}:1", f"{B}:4", f"{A}:tag:1"]
    assert all(s.contains(g) for g in inside)
    assert not any(s.contains(g) for g in outside)
    assert f"{A}:7" in s and f"{A}:6" not in s and 7 not in s


def test_mysql_contains_tagged_gtids():
    s = m(f"{A}:1-3:tg:5-6")
    assert s.contains(f"{A}:TG:5") and s.contains(f"{A}:2")
    assert not s.contains(f"{A}:5") and not s.contains(f"{A}:tg:2")


@pytest.mark.parametrize("gtid", [A, f"{A}:", f"{A}:0", f"{A}:x", f"{A}:1:2:3", "x:1", f"{A}:-:1"])
def test_mysql_malformed_single_gtids_are_rejected(gtid):
    with pytest.raises(ValueError):
        parse_mysql_gtid(gtid)


def test_mysql_subtract_splits_and_trims_intervals():
    s = m(f"{A}:1-20,{B}:1-5")
    assert str(s.subtract(m(f"{A}:5-7:10"))) == f"{A}:1-4:8-9:11-20,{B}:1-5"
    assert str(s.subtract(m(f"{A}:1-3:18-30"))) == f"{A}:4-17,{B}:1-5"
    assert str(s.subtract(m(f"{B}:1-5"))) == f"{A}:1-20"  # a server vanishes entirely
    assert s.subtract(s).is_empty()
    assert s.subtract(m("")) == s
    assert str(m(f"{A}:1-3:7-9").subtract(m(f"{A}:2-8"))) == f"{A}:1:9"


def test_mysql_union_add_and_issubset():
    low = m(f"{A}:1-5")
    high = m(f"{A}:1-7,{B}:1")
    assert low.issubset(high) and low <= high and not high.issubset(low)
    assert str(low.union(m(f"{A}:6-8:10"))) == f"{A}:1-8:10"
    assert (low | high) == high
    assert str(low.add(f"{A}:6")) == f"{A}:1-6"  # adjacent: merged
    assert str(low.add(f"{A}:9").add(f"{B}:2")) == f"{A}:1-5:9,{B}:2"
    assert low.add(f"{A}:3") == low
    assert m("").issubset(low) and m("").union(low) == low
    assert not m(f"{A}:1-5:7").issubset(m(f"{A}:1-6"))
    assert m(f"{A}:1-5").count() == 5 and high.count() == 8


def test_mysql_from_intervals():
    s = MysqlGtidSet.from_intervals({A: [(4, 5), (1, 3)], (B, "Tg"): [(2, 2)]})
    assert str(s) == f"{A}:1-5,{B}:tg:2"
    with pytest.raises(ValueError):
        MysqlGtidSet.from_intervals({A: [(3, 1)]})


# Model check: on one server and small numbers, the interval set behaves like a Python set.
numbers = st.frozensets(st.integers(1, 40), max_size=25)


def as_set(values: frozenset[int], uuid: str = A) -> MysqlGtidSet:
    text = ":".join(str(v) for v in sorted(values))
    return m(f"{uuid}:{text}" if values else "")


def members(s: MysqlGtidSet) -> set[int]:
    return {n for n in range(1, 45) if s.contains(f"{A}:{n}")}


@settings(max_examples=200, deadline=None)
@given(numbers, numbers)
def test_mysql_set_algebra_matches_python_sets(a, b):
    sa, sb = as_set(a), as_set(b)
    assert members(sa) == set(a)
    assert members(sa.union(sb)) == a | b  # type: ignore[arg-type]
    assert members(sa.subtract(sb)) == a - b
    assert sa.issubset(sb) == (a <= b)
    assert m(str(sa)) == sa
    assert sa.union(sb) == as_set(a | b)  # normal form is unique
    assert sa.count() == len(a)


# ------------------------------------------------------------------------------------ MariaDB


def test_mariadb_parse_and_format():
    s = parse_gtid_set("1-2-5, 0-1-100")
    assert isinstance(s, MariadbGtidSet)
    assert str(s) == "0-1-100,1-2-5"
    assert parse_gtid_set(str(s)) == s
    assert str(parse_gtid_set("0-1-100,0-2-90,0-3-120")) == "0-3-120"  # highest seq per domain
    assert parse_gtid_set("", "mariadb").is_empty()


@pytest.mark.parametrize(
    "text", ["0-1", "0-1-2-3", "a-1-2", "0-1-", "-1-2", "0-1-2,", f"0-{2**32}-1", "0--1-2"]
)
def test_mariadb_malformed_positions_are_rejected(text):
    with pytest.raises(ValueError):
        parse_gtid_set(text, "mariadb")


def test_mariadb_contains_means_seq_at_most_the_domains():
    s = parse_gtid_set("0-1-100,1-2-5")
    assert s.contains("0-1-100") and s.contains("0-1-1") and s.contains("0-7-50")
    assert not s.contains("0-1-101") and not s.contains("1-2-6") and not s.contains("2-1-1")
    with pytest.raises(ValueError):
        s.contains(f"{A}:1")


def test_mariadb_union_add_and_issubset():
    low = parse_gtid_set("0-1-100")
    high = parse_gtid_set("0-1-105,1-1-3")
    assert low.issubset(high) and not high.issubset(low)
    assert str(low.union(high)) == "0-1-105,1-1-3"
    assert str(low.add("0-2-101")) == "0-2-101"
    assert str(low.add("0-2-50")) == "0-1-100"  # older: the position does not move back
    assert str(low.add("3-1-1")) == "0-1-100,3-1-1"
    assert parse_mariadb_gtid("0-1-18446744073709551615")[2] == 2**64 - 1


def test_flavors_do_not_mix_except_through_the_empty_set():
    my, maria = m(f"{A}:1"), parse_gtid_set("0-1-1")
    with pytest.raises(TypeError):
        my.union(maria)
    with pytest.raises(TypeError):
        maria.issubset(my)
    assert m("").union(maria) == maria
    assert parse_gtid_set("", "mariadb").issubset(my)


def test_parse_gtid_set_tells_flavors_apart():
    assert parse_gtid_set(f"{A}:1").flavor == "mysql"
    assert parse_gtid_set("0-1-1").flavor == "mariadb"
    assert parse_gtid_set("").flavor == "mysql"
    with pytest.raises(ValueError):
        parse_gtid_set("0-1-1", "oracle")  # type: ignore[arg-type]
