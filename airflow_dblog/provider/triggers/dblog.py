"""A trigger that follows a dump in the triggerer without blocking its event loop."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

from airflow_dblog.engine.metadata import MetadataStore
from airflow_dblog.engine.progress import progress_line
from airflow_dblog.provider.compat import BaseTrigger, TriggerEvent

FINAL = ("done", "failed", "cancelled")


class DblogDumpTrigger(BaseTrigger):
    """Polls the metadata store in a worker thread; fires once the dump ends or stalls.

    Progress lines go to the log every ``log_interval_s``; a dump whose chunks and rows have
    not moved for ``stall_timeout_s`` while it is not paused fires ``stalled``: the stream is
    probably not running, and waiting forever would hide that.
    """

    def __init__(
        self,
        metadata_url: str,
        dump_id: int,
        poll_interval_s: float = 5.0,
        log_interval_s: float = 30.0,
        stall_timeout_s: float = 1800.0,
    ) -> None:
        super().__init__()
        self.metadata_url, self.dump_id = metadata_url, dump_id
        self.poll_interval_s, self.log_interval_s = poll_interval_s, log_interval_s
        self.stall_timeout_s = stall_timeout_s

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (
            f"{type(self).__module__}.{type(self).__qualname__}",
            {
                "metadata_url": self.metadata_url,
                "dump_id": self.dump_id,
                "poll_interval_s": self.poll_interval_s,
                "log_interval_s": self.log_interval_s,
                "stall_timeout_s": self.stall_timeout_s,
            },
        )

    async def run(self) -> AsyncIterator[TriggerEvent]:
        store = await asyncio.to_thread(MetadataStore, self.metadata_url, upgrade=False)
        try:
            marker: tuple[Any, ...] | None = None
            moved_at = logged_at = time.monotonic()
            logged_at -= self.log_interval_s
            while True:
                progress = await asyncio.to_thread(store.progress, self.dump_id)
                now = time.monotonic()
                if now - logged_at >= self.log_interval_s or progress.state in FINAL:
                    self.log.info("%s", progress_line(progress))
                    logged_at = now
                if progress.state in FINAL:
                    yield TriggerEvent(
                        {"status": progress.state, "reason": progress.reason, **_counts(progress)}
                    )
                    return
                current = (progress.state, progress.chunks_done, progress.rows_selected)
                if current != marker or progress.state == "paused":
                    marker, moved_at = current, now
                elif now - moved_at >= self.stall_timeout_s:
                    yield TriggerEvent(
                        {
                            "status": "stalled",
                            "reason": f"no progress for {self.stall_timeout_s:.0f}s: "
                            "is the dblog stream running?",
                            **_counts(progress),
                        }
                    )
                    return
                await asyncio.sleep(self.poll_interval_s)
        finally:
            await asyncio.to_thread(store.engine.dispose)


def _counts(progress: Any) -> dict[str, Any]:
    return {
        "dump_id": progress.dump_id,
        "chunks_done": progress.chunks_done,
        "chunks_total": progress.chunks_total,
        "rows_emitted": progress.rows_emitted,
        "rows_dropped": progress.rows_dropped,
    }
