"""A trigger that follows a dump in the triggerer without blocking its event loop."""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any

from airflow_dblog.engine.metadata import MetadataStore
from airflow_dblog.engine.metadata.dumps import DumpProgress
from airflow_dblog.provider.compat import BaseTrigger, TriggerEvent
from airflow_dblog.provider.verify import RepairsProgress, repairs_progress

FINAL = ("done", "failed", "cancelled")


class DblogDumpTrigger(BaseTrigger):
    """Polls the metadata store in a worker thread; fires once the dump ends or stalls.

    Progress lines go to the log every ``log_interval_s``; a dump whose chunks and rows have
    not moved for ``stall_timeout_s`` while it is not paused fires ``stalled``: the stream is
    probably not running, and waiting forever would hide that.

    With ``repairs`` (the follow-up dumps of verify dump ``dump_id``, known once it is done) it
    follows those instead, as one dump (``provider/verify.py``): the sensor's second wait.
    """

    def __init__(
        self,
        metadata_url: str,
        dump_id: int,
        poll_interval_s: float = 5.0,
        log_interval_s: float = 30.0,
        stall_timeout_s: float = 1800.0,
        repairs: Sequence[int] | None = None,
    ) -> None:
        super().__init__()
        self.metadata_url, self.dump_id = metadata_url, dump_id
        self.poll_interval_s, self.log_interval_s = poll_interval_s, log_interval_s
        self.stall_timeout_s = stall_timeout_s
        self.repairs = None if repairs is None else [int(i) for i in repairs]

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (
            f"{type(self).__module__}.{type(self).__qualname__}",
            {
                "metadata_url": self.metadata_url,
                "dump_id": self.dump_id,
                "poll_interval_s": self.poll_interval_s,
                "log_interval_s": self.log_interval_s,
                "stall_timeout_s": self.stall_timeout_s,
                "repairs": self.repairs,
            },
        )

    async def run(self) -> AsyncIterator[TriggerEvent]:
        store = await asyncio.to_thread(MetadataStore, self.metadata_url, upgrade=False)
        look: Callable[[], DumpProgress | RepairsProgress] = (
            functools.partial(store.progress, self.dump_id)
            if self.repairs is None
            else functools.partial(repairs_progress, store, self.dump_id, self.repairs)
        )
        try:
            marker: tuple[Any, ...] | None = None
            moved_at = logged_at = time.monotonic()
            logged_at -= self.log_interval_s
            while True:
                progress = await asyncio.to_thread(look)
                now = time.monotonic()
                if now - logged_at >= self.log_interval_s or progress.state in FINAL:
                    self.log.info("%s", progress.line())
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


class DblogStreamTrigger(BaseTrigger):
    """Checks the stream's state and lag in a worker thread; fires ``ok``, ``down`` or
    ``lagging``.

    ``down`` (not running, or its lag unknown) fires at once; ``lagging`` once the lag has been
    past ``max_lag_s`` or ``max_lag_bytes`` for ``grace_s`` (0: at the first look), so a stream
    the keep-alive DAG just restarted can catch up first. Every look is logged as one line.
    The config comes from ``config_path`` or the ``dblog_conn_id`` connection, read in the
    triggerer: nothing secret is serialized.
    """

    def __init__(
        self,
        dblog_conn_id: str = "dblog_default",
        config_path: str | None = None,
        max_lag_s: float = 300.0,
        max_lag_bytes: int = 1 << 30,
        grace_s: float = 0.0,
        poll_interval_s: float = 10.0,
        stale_after_s: float = 60.0,
    ) -> None:
        super().__init__()
        self.dblog_conn_id, self.config_path = dblog_conn_id, config_path
        self.max_lag_s, self.max_lag_bytes = max_lag_s, max_lag_bytes
        self.grace_s, self.poll_interval_s = grace_s, poll_interval_s
        self.stale_after_s = stale_after_s

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (
            f"{type(self).__module__}.{type(self).__qualname__}",
            {
                "dblog_conn_id": self.dblog_conn_id,
                "config_path": self.config_path,
                "max_lag_s": self.max_lag_s,
                "max_lag_bytes": self.max_lag_bytes,
                "grace_s": self.grace_s,
                "poll_interval_s": self.poll_interval_s,
                "stale_after_s": self.stale_after_s,
            },
        )

    def _status(self, hook: Any) -> Any:
        return hook.stream_status(stale_after_s=self.stale_after_s)

    async def run(self) -> AsyncIterator[TriggerEvent]:
        from airflow_dblog.errors import DblogError
        from airflow_dblog.provider.hooks.dblog import DblogHook

        hook = DblogHook(self.dblog_conn_id, self.config_path)
        try:
            try:
                await asyncio.to_thread(lambda: hook.store)  # reads the config, opens the store
            except DblogError as err:
                yield TriggerEvent({"status": "error", "reason": str(err), "stream": None})
                return
            lagging_since: float | None = None
            while True:
                status = await asyncio.to_thread(self._status, hook)
                self.log.info("%s", stream_line(status))
                problem = status.problem(self.max_lag_s, self.max_lag_bytes)
                now = time.monotonic()
                if problem is None:
                    yield TriggerEvent({"status": "ok", "reason": None, "stream": status.as_dict()})
                    return
                down = status.state != "running" or status.lag_s is None
                lagging_since = now if lagging_since is None else lagging_since
                if down or now - lagging_since >= self.grace_s:
                    yield TriggerEvent(
                        {
                            "status": "down" if down else "lagging",
                            "reason": problem,
                            "stream": status.as_dict(),
                        }
                    )
                    return
                await asyncio.sleep(self.poll_interval_s)
        finally:
            if "store" in hook.__dict__:
                await asyncio.to_thread(hook.store.engine.dispose)


def stream_line(status: Any) -> str:
    """The sensor's and trigger's log line: state, lag_s, lag_bytes, then the status line."""
    lag_s = "unknown" if status.lag_s is None else f"{status.lag_s:.1f}"
    lag_bytes = "unknown" if status.lag_bytes is None else str(status.lag_bytes)
    return (
        f"stream {status.name}: state={status.state} lag_s={lag_s} lag_bytes={lag_bytes}"
        f" | {status.line()}"
    )
