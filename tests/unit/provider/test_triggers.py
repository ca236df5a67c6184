"""The dump trigger's async loop against a real (SQLite) metadata store."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from airflow_dblog.engine.metadata import MetadataStore
from airflow_dblog.engine.metadata.dumps import TablePlan
from airflow_dblog.provider.triggers.dblog import DblogDumpTrigger
from tests.support.trigger_loop import collect


def _store(tmp_path: Path) -> tuple[str, MetadataStore, int]:
    url = f"sqlite:///{tmp_path}/meta.db"
    store = MetadataStore(url)
    plan = TablePlan("app.t", ["id"], 3, key_chunks=[[[1]], [[2]], [[3]]])
    return url, store, store.create_dump("s", "keys", [plan])


def _complete_chunks(store: MetadataStore, dump_id: int) -> None:
    while (chunk := store.claim_pending_chunk(dump_id, "w")) is not None:
        time.sleep(0.05)
        store.complete_chunk(chunk.id, 1, 0, 1)


def test_fires_done_with_counts_and_logs_progress(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    url, store, dump_id = _store(tmp_path)
    trigger = DblogDumpTrigger(url, dump_id, poll_interval_s=0.02, log_interval_s=0.0)

    async def scenario() -> tuple[list, float]:
        worker = asyncio.create_task(asyncio.to_thread(_complete_chunks, store, dump_id))
        result = await collect(trigger)
        await worker
        return result

    events, max_gap = asyncio.run(scenario())
    assert events == [
        {
            "status": "done",
            "reason": None,
            "dump_id": dump_id,
            "chunks_done": 3,
            "chunks_total": 3,
            "rows_emitted": 3,
            "rows_dropped": 0,
        }
    ]
    assert max_gap < 0.5  # store reads never block the event loop
    # Airflow's structured logging writes to stdout
    lines = [line for line in capsys.readouterr().out.splitlines() if f"dump {dump_id} [" in line]
    assert f"dump {dump_id} [done] chunks 3/3 (100.0%), rows emitted 3" in lines[-1]
    assert any("[running]" in line or "[pending]" in line for line in lines)


def test_fires_cancelled_with_reason(tmp_path: Path) -> None:
    url, store, dump_id = _store(tmp_path)
    store.apply(dump_id, "cancel", reason="operator said so")
    events, _ = asyncio.run(collect(DblogDumpTrigger(url, dump_id, poll_interval_s=0.02)))
    assert events[0]["status"] == "cancelled" and events[0]["reason"] == "operator said so"


def test_fires_stalled_when_nothing_moves(tmp_path: Path) -> None:
    url, _, dump_id = _store(tmp_path)
    trigger = DblogDumpTrigger(url, dump_id, poll_interval_s=0.02, stall_timeout_s=0.3)
    events, _ = asyncio.run(collect(trigger))
    assert events[0]["status"] == "stalled"
    assert "is the dblog stream running?" in events[0]["reason"]


def test_serialize_round_trip(tmp_path: Path) -> None:
    trigger = DblogDumpTrigger("sqlite:///x.db", 7, poll_interval_s=1.5, stall_timeout_s=60)
    path, kwargs = trigger.serialize()
    assert path == "airflow_dblog.provider.triggers.dblog.DblogDumpTrigger"
    again = DblogDumpTrigger(**kwargs)
    assert again.serialize() == (path, kwargs)
