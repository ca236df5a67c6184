"""The spool's segment files: atomic appends, footers, plain JSON values, garbage collection."""

from __future__ import annotations

import datetime as dt
import decimal
import json
import os
import uuid
from pathlib import Path

import pytest

from airflow_dblog.core.events import ChangeEvent, TableId
from airflow_dblog.core.position import Position
from airflow_dblog.engine.spool import Spool, dump_bounds, is_footer, logged_tables, plain_value
from airflow_dblog.errors import DblogError

TABLE = TableId("db", "t")


def _event(offset: int) -> ChangeEvent:
    return ChangeEvent(TABLE, "c", (offset,), Position.mysql(1, offset), after={"id": offset})


def test_segments_are_numbered_whole_files_with_the_footer_last(tmp_path: Path) -> None:
    spool = Spool(tmp_path)
    assert spool.end() == 0
    assert spool.append([_event(1), _event(2)], {"reader": {"pos": 2}, "closed": []}) == 0
    assert spool.append([], {"reader": {"pos": 3}, "closed": [{"chunk_id": 7}]}) == 1
    assert spool.segments() == [0, 1] and spool.end() == 2
    lines = list(spool.lines(0))
    assert [is_footer(line) for line in lines] == [False, False, True]
    assert json.loads(lines[0])["position"] == str(Position.mysql(1, 1))
    assert spool.footer(0) == {
        "reader": {"pos": 2},
        "closed": [],
        "seq": 0,
        "events": 2,
        "tables": ["db.t"],
        "logged": ["db.t"],
        "dump_keys": {},
    }
    assert spool.footer(1)["closed"] == [{"chunk_id": 7}]
    assert not list(tmp_path.glob(".*.tmp"))  # nothing half-written is left behind


def test_a_half_written_segment_is_invisible(tmp_path: Path) -> None:
    spool = Spool(tmp_path)
    spool.append([_event(1)], {"closed": []})
    (tmp_path / ".1.tmp").write_text('{"table": "db.t"')  # a crash in the middle of append
    assert spool.segments() == [0]
    assert spool.append([_event(2)], {"closed": []}) == 1


def test_a_segment_is_never_overwritten_by_a_second_writer(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    spool = Spool(tmp_path)
    spool.append([_event(1)], {"closed": []})
    before = (tmp_path / spool.name(0)).read_bytes()
    late = Spool(tmp_path)
    monkeypatch.setattr(late, "end", lambda: 0)  # it numbered its segment before the first wrote
    with pytest.raises(DblogError, match=r"segment 0 in .* was written by another process"):
        late.append([_event(2)], {"closed": []})
    assert (tmp_path / spool.name(0)).read_bytes() == before
    assert not list(tmp_path.glob(".*.tmp"))


def test_a_segment_a_deposed_leader_adds_after_the_takeover_stops_the_new_one(
    tmp_path: Path,
) -> None:
    """The new leader resumed after segment 0; the old one, frozen between its fence check and
    its write, then adds segment 1 with the events the new leader reads again. Numbering on past
    it would send those events twice; the new leader stops instead (a restart continues after
    segment 1), and whichever of the two writes second is refused."""
    old = Spool(tmp_path)
    old.append([_event(1)], {"closed": []})
    new = Spool(tmp_path)
    new.continue_after(new.segments()[-1])
    old.append([_event(2)], {"closed": []})  # the deposed leader wakes up and writes
    with pytest.raises(DblogError, match=r"segment 1 in .* deposed leader"):
        new.append([_event(2)], {"closed": []})
    assert new.segments() == [0, 1]
    new.continue_after(0)
    with pytest.raises(DblogError, match="written by another process"):
        new.append([_event(2)], {"closed": []})
    newest = Spool(tmp_path)
    newest.continue_after(1)
    assert newest.append([_event(3)], {"closed": []}) == 2 and newest.append([], {}) == 3


def test_a_full_disk_is_one_clear_error_and_leaves_nothing_half_written(tmp_path: Path) -> None:
    spool = Spool(tmp_path)
    spool.append([_event(1)], {"closed": []})
    # the kernel's own "no space left": the next segment's temporary file is /dev/full
    (tmp_path / f".1.{os.getpid()}.tmp").symlink_to("/dev/full")
    with pytest.raises(DblogError, match=r"checkpoint disk is full: no space for spool segment 1"):
        spool.append([_event(2)] * 1000, {"closed": []})
    assert spool.segments() == [0] and not list(tmp_path.glob(".*"))
    assert spool.append([_event(2)], {"closed": []}) == 1  # space again: it carries on


def test_drop_before_deletes_only_older_segments(tmp_path: Path) -> None:
    spool = Spool(tmp_path)
    for i in range(4):
        spool.append([_event(i)], {"closed": []})
    assert spool.drop_before(2) == 2
    assert spool.segments() == [2, 3] and spool.end() == 4


def test_footers_say_which_tables_hold_only_dumped_rows_and_their_key_range(
    tmp_path: Path,
) -> None:
    spool = Spool(tmp_path)
    other = TableId("db", "u")

    def dumped(table: TableId, key: object) -> ChangeEvent:
        return ChangeEvent(table, "r", (key,), Position.mysql(1, 9), chunk_id=1, dump_id=1)

    spool.append([dumped(TABLE, 5), dumped(TABLE, 3), dumped(other, "b")], {"closed": []})
    spool.append([dumped(TABLE, 8), dumped(other, "a"), _event(1)], {"closed": []})
    spool.append([dumped(other, decimal.Decimal("1.5"))], {"closed": []})
    footers = [spool.footer(seq) for seq in spool.segments()]
    assert dump_bounds(footers[:1]) == {"db.t": (3, 5), "db.u": ("b", "b")}
    assert dump_bounds(footers[:2]) == {"db.t": (3, 8), "db.u": ("a", "b")}
    assert logged_tables(footers[:2]) == {"db.t"}  # db.t has a log event too
    assert dump_bounds(footers) == {"db.t": (3, 8)}  # decimals are text here: no order to trust


def test_a_backlog_is_read_in_bites_of_bounded_size(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("pyspark")
    from airflow_dblog.spark import changelog_source

    spool = Spool(tmp_path)
    for i in range(10):
        spool.append([_event(i)] * 50, {"closed": []})
    monkeypatch.setattr(changelog_source, "MAX_BATCH_BYTES", 3 * spool.size(0))
    reader = changelog_source.ChangelogStreamReader(str(tmp_path))
    assert reader.latestOffset(None) == {"segment": 10}  # the first call: where the spool ends
    assert reader.latestOffset({"segment": 0}) == {"segment": 3}
    assert reader.latestOffset({"segment": 9}) == {"segment": 10}
    monkeypatch.setattr(changelog_source, "MAX_BATCH_BYTES", 1)
    assert reader.latestOffset({"segment": 4}) == {"segment": 5}  # one segment, however big
    assert len(reader.partitions({"segment": 0}, {"segment": 10})) == 1  # small: one task


def test_heartbeats_alone_wait_for_a_batch_until_they_are_old(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An idle log writes a segment a second; Delta pays a Spark batch for each otherwise."""
    pytest.importorskip("pyspark")
    from airflow_dblog.spark import changelog_source

    spool = Spool(tmp_path)
    spool.append([], {"closed": []})
    spool.append([], {"closed": []})
    reader = changelog_source.ChangelogStreamReader(str(tmp_path))
    assert reader.latestOffset({"segment": 0}) == {"segment": 0}
    spool.append([], {"closed": [{"chunk_id": 1}]})  # a chunk closed with no rows left
    assert reader.latestOffset({"segment": 0}) == {"segment": 3}
    spool.append([], {"closed": []})
    assert reader.latestOffset({"segment": 3}) == {"segment": 3}
    monkeypatch.setattr(changelog_source, "IDLE_BATCH_S", 0.0)
    assert reader.latestOffset({"segment": 3}) == {"segment": 4}


def test_a_segment_read_from_memory_equals_the_one_read_from_disk(tmp_path: Path) -> None:
    """The Kafka forwarder takes recent segments from memory; after a restart, from the file."""
    events = [
        _event(1),
        ChangeEvent(
            TABLE,
            "u",
            ('ü"k', 2),
            Position.mysql(1, 7),
            before={"a": decimal.Decimal("1.50"), "b": None},
            after={"a": dt.date(2024, 1, 2), "b": b"\x00"},
            gtid="0-1-9",
            extra={"unavailable_columns": ["c"]},
        ),
    ]
    memory = Spool(tmp_path, remember_events=10)
    seq = memory.append(events, {"closed": []})
    from_memory = memory.read(seq)
    from_disk = Spool(tmp_path).read(seq)
    assert from_memory == from_disk
    assert [json.loads(e.line()) for e in from_disk.events] == [
        json.loads(line) for line in list(memory.lines(seq))[:-1]
    ]
    assert json.loads(from_disk.events[1].before) == {"a": "1.50", "b": None}
    assert memory.read(seq) == from_disk  # taken once from memory, then from the file


def test_plain_values_are_what_consumers_can_read() -> None:
    assert plain_value(decimal.Decimal("1.10")) == "1.10"
    assert plain_value(dt.datetime(2024, 1, 2, 3, 4, 5)) == "2024-01-02T03:04:05"
    assert plain_value(dt.date(2024, 1, 2)) == "2024-01-02"
    assert plain_value(b"\x00\xff") == "AP8="
    assert plain_value(uuid.UUID(int=1)) == "00000000-0000-0000-0000-000000000001"
    assert plain_value({"a": [1, decimal.Decimal("2")]}) == '{"a":[1,"2"]}'
    assert plain_value(dt.timedelta(minutes=1)) == 60.0


@pytest.fixture
def s3_spool_uri() -> str:
    """A fresh folder on the object store of ``scripts/services.sh up object-store``."""
    if not os.environ.get("DBLOG_S3_ENDPOINT") or not os.environ.get("AWS_ACCESS_KEY_ID"):
        pytest.skip('DBLOG_S3_ENDPOINT not set: eval "$(scripts/services.sh env)"')
    pytest.importorskip("pyarrow")
    return f"s3a://dblog/tests/{uuid.uuid4().hex}/cp/spool"


@pytest.mark.integration
def test_an_object_store_spool_holds_the_same_bytes_as_a_local_one(
    tmp_path: Path, s3_spool_uri: str
) -> None:
    """One PUT per segment (no rename on object stores), read back through the same layer."""
    events = [_event(1), _event(2)]
    local, remote = Spool(tmp_path), Spool(s3_spool_uri)
    for spool in (local, remote):
        assert spool.append(events, {"reader": {"pos": 2}, "closed": []}) == 0
        assert spool.append([], {"reader": {"pos": 3}, "closed": []}) == 1
        assert spool.append([_event(3)], {"closed": [{"chunk_id": 1}]}) == 2
    assert remote.segments() == [0, 1, 2] and remote.end() == 3
    assert list(remote.lines(0)) == list(local.lines(0))
    assert remote.store.read(remote.name(0)) == (tmp_path / local.name(0)).read_bytes()
    assert remote.read(2) == local.read(2) and remote.footer(1) == local.footer(1)
    assert remote.size(0) == local.size(0)
    assert remote.uri(0) == f"{s3_spool_uri}/{remote.name(0)}"  # what Spark's executors read
    assert remote.heartbeat_only(1) and not remote.heartbeat_only(0)
    late = Spool(s3_spool_uri)
    late.end = lambda: 0  # type: ignore[method-assign]  # numbered before the first wrote
    with pytest.raises(DblogError, match=r"segment 0 in s3a://.* was written by another process"):
        late.append([_event(9)], {"closed": []})
    assert list(remote.lines(0)) == list(local.lines(0))
    assert remote.drop_before(2) == 2 and remote.segments() == [2]


@pytest.mark.integration
def test_the_changelog_source_plans_an_object_store_spool_from_its_listing(
    s3_spool_uri: str,
) -> None:
    pytest.importorskip("pyspark")
    from airflow_dblog.spark import changelog_source

    spool = Spool(s3_spool_uri)
    for i in range(3):
        spool.append([_event(i)] * 5, {"closed": []})
    reader = changelog_source.ChangelogStreamReader(s3_spool_uri, {})
    assert reader.latestOffset(None) == {"segment": 3}
    assert reader.latestOffset({"segment": 1}) == {"segment": 3}
    (partition,) = reader.partitions({"segment": 1}, {"segment": 3})
    assert list(reader.read(partition)) == [(1,), (2,)]  # numbers only: no file on executors
