"""The spool on the object store: the same bytes as a local one, read back through the same
layer, planned by the changelog source from its listing; and the tests of
tests/unit/engine/test_spool.py that take ``spool_location``, collected again here on it."""

from __future__ import annotations

import os
import uuid
from pathlib import Path

import pytest

from airflow_dblog.engine.chunk_file import ChunkFiles, ChunkRef, encode_rows
from airflow_dblog.engine.spool import Spool
from airflow_dblog.errors import DblogError
from tests.unit.engine.test_spool import (  # noqa: F401  collected here again
    BASE,
    _event,
    test_a_conversion_interrupted_after_its_write_only_deletes_the_json_lines,
    test_json_lines_segments_of_0_2_are_rewritten_as_parquet,
)

pytest.importorskip("pyarrow")  # segments are Parquet (the [spark] extra)


@pytest.fixture(params=["s3"])
def spool_location(s3_spool_uri: str) -> str:
    return s3_spool_uri


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
    """One PUT per segment (no rename on object stores), read back through the same layer;
    the chunk files beside the spool, deleted with the segments that refer to them."""
    local, remote = Spool(tmp_path / "spool"), Spool(s3_spool_uri)
    assert remote.chunks.location == s3_spool_uri.removesuffix("/spool") + "/chunks"
    arrow, selected = encode_rows(5, [((k,), {"id": k}) for k in (1, 2, 3)])
    folder = ChunkFiles.new_folder(5)
    ref = ChunkRef("db.t", 5, 1, folder, str(BASE), 0, selected.count, (1,), 7, selected.key_span)
    kept = ChunkFiles.new_folder(6)
    later = ChunkRef("db.t", 6, 1, kept, str(BASE), 3, selected.count, (), 7, selected.key_span)
    events = [_event(1), ref, _event(2)]
    for spool in (local, remote):
        spool.chunks.write(folder, arrow)
        spool.chunks.write(kept, arrow)
        assert spool.append(events, {"reader": {"pos": 2}, "closed": []}) == 0
        assert spool.append([], {"reader": {"pos": 3}, "closed": []}) == 1
        assert spool.append([_event(3), later], {"closed": [{"chunk_id": 1}]}) == 2
    assert remote.segments() == [0, 1, 2] and remote.end() == 3
    for seq in (0, 1, 2):
        local_bytes = (tmp_path / "spool" / local.name(seq)).read_bytes()
        assert remote.store.read(remote.name(seq)) == local_bytes
    assert remote.read(0) == local.read(0) == Spool(s3_spool_uri).read(0)
    assert remote.footer(0) == local.footer(0)  # the metadata, read from the object's end
    assert remote.read(0).items[1] == ref and remote.footer(0)["chunk_folders"] == [folder]
    texts = list(ref.texts(remote.chunks))
    assert texts == list(ref.texts(local.chunks))
    assert [(t.key, t.position) for t in texts] == [
        ("[1]", str(BASE.dumped_row(0))),
        ("[3]", str(BASE.dumped_row(2))),
    ]
    assert remote.read(2) == local.read(2) and remote.footer(1) == local.footer(1)
    assert remote.size(0) == local.size(0)
    assert list(remote.entries(after=0)) == list(local.entries(after=0)) == [1, 2]
    assert remote.uri(0) == f"{s3_spool_uri}/{remote.name(0)}"  # what Spark's executors read
    assert remote.footer(1)["events"] == 0 and remote.footer(0)["events"] == 4  # 2 rows dumped
    late = Spool(s3_spool_uri)
    late.end = lambda: 0  # type: ignore[method-assign]  # numbered before the first wrote
    with pytest.raises(DblogError, match=r"segment 0 in s3a://.* was written by another process"):
        late.append([_event(9)], {"closed": []})
    assert remote.store.read(remote.name(0)) == local.store.read(local.name(0))  # untouched
    assert remote.chunks.folders() == sorted([folder, kept])
    assert Spool(s3_spool_uri).drop_before(2) == 2 and remote.segments() == [2]  # a restart's
    assert remote.chunks.folders() == [kept]
    assert remote.drop_before(3) == 1 and remote.chunks.folders() == []


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
