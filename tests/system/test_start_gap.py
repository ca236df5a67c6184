"""A dump requested before the stream first runs loses nothing (issue 12, item 1).

The order no other test uses: a fresh config, ``dblog dump`` first, rows written, and only then
``dblog stream``. A table's upper key bound is fixed when the dump is requested and the log is
read from wherever the stream starts, so rows inserted above the bound in between are in neither
the dump nor the log, unless the bound is read after the stream's log position is durable. Two
tables: ``items`` (rows above its max key) and ``empty`` (empty when the dump is requested, so
its dump has no range at all). With ``kill -9`` before the stream's first commit, more rows go
in while it is down: its first log position must have been saved before anything else.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from airflow_dblog.cli import main as dblog
from airflow_dblog.config import load_config
from airflow_dblog.engine.metadata import MetadataStore
from tests.support.oracle import check_outputs, delta_path, delta_version
from tests.support.stream_process import Stream, until, write_config
from tests.support.workload import (
    VERSIONED_COLUMNS,
    create_table,
    db_for,
    insert_rows,
    load_versioned,
)

pytestmark = [pytest.mark.integration, pytest.mark.slow]

ROWS = 2_000


@pytest.mark.parametrize("kind", ["mysql", "postgres"])
def test_rows_written_after_the_dump_request_and_before_the_stream_reach_delta(
    request: pytest.FixtureRequest,
    tmp_path: Path,
    spark: Any,
    stream_factory: Callable[[Path], Stream],
    kind: str,
) -> None:
    """Also killed before its first commit (a run without the kill shows nothing more: the
    rows written before the first start are checked either way)."""
    items = db_for(request, kind)
    empty = dataclasses.replace(items, name="empty")
    load_versioned(items, rows=ROWS)
    create_table(empty, "ver")
    tables = [str(items.table()), str(empty.table())]
    config_path = write_config(items, tmp_path, chunk_size=500, tables=tables)
    config = load_config(config_path)
    store = MetadataStore(config.metadata_url)
    assert dblog(["dump", "-c", str(config_path), *(f"--table={t}" for t in tables)]) == 0
    (dump,) = store.dumps(config.name)

    # keys above the planned max key, and the first rows of the empty table
    insert_rows(items, range(ROWS, ROWS + 20), 1, "before-start")
    insert_rows(empty, range(10), 1, "before-start")
    stream = stream_factory(config_path)
    stream.start()
    stream.wait_running()
    stream.kill()
    # version 0: the table the stream created at its start; a batch would have made it 1
    assert delta_version(delta_path(config, items.table())) <= 0, "killed after a commit"
    insert_rows(items, range(ROWS + 100, ROWS + 120), 1, "while-down")
    insert_rows(empty, range(100, 110), 1, "while-down")
    stream.start()
    until("the dump", lambda: store.progress(dump.id).state == "done", 300, stream)
    check_outputs(spark, config, [items, empty], stream, VERSIONED_COLUMNS, version="ver")
    assert stream.stop() == 0
