"""Chunk files on the object store: the tests of tests/unit/engine/test_chunk_file.py that take
the ``files`` fixture, collected again here with an ``s3a://`` folder."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator

import pytest

from airflow_dblog.engine.chunk_file import ChunkFiles, encode_rows
from tests.unit.engine.test_chunk_file import (  # noqa: F401  collected here again
    test_a_missing_folder_is_a_clear_error,
    test_a_staged_file_is_rows_only_once_published,
    test_a_written_folder_reads_back_row_for_row,
    test_delete_and_delete_except_leave_what_is_kept,
    test_dropped_matches_changed_keys_as_python_compares_them,
    test_dropped_matches_whole_composite_keys,
    test_dropped_reads_nothing_when_no_key_changed,
    test_several_files_of_a_folder_are_read_in_name_order,
    test_spark_markers_and_hidden_files_are_not_rows,
    test_texts_are_the_events_the_window_emits_with_drops_left_out,
    test_uri_is_what_spark_reads_and_writes,
)


@pytest.fixture(params=["s3"])
def files() -> Iterator[ChunkFiles]:
    if not os.environ.get("DBLOG_S3_ENDPOINT") or not os.environ.get("AWS_ACCESS_KEY_ID"):
        pytest.skip('DBLOG_S3_ENDPOINT not set: eval "$(scripts/services.sh env)"')
    remote = ChunkFiles(f"s3a://dblog/tests/{uuid.uuid4().hex}/chunks/")
    yield remote
    remote.delete_except(())


def test_a_tasks_files_reach_the_store_from_an_environment_without_its_credentials(
    files: ChunkFiles, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Executors need not have the driver's environment (the cluster's workers have no AWS_*
    variables): a task opens the store with the endpoint and credentials the driver used."""
    in_task = files.for_tasks()
    assert files.folders() == []  # the driver's own filesystem, opened with its environment
    for variable in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "DBLOG_S3_ENDPOINT"):
        monkeypatch.delenv(variable)
    folder = files.new_folder(3)
    table = encode_rows(3, [((7,), {"id": 7})])[0]
    in_task.publish(folder, in_task.stage(folder, table))
    assert [b.to_pylist() for b in files.batches(folder, ("key",))] == [[{"key": "[7]"}]]
