"""Wait for a dump to finish, logging its progress; classic or deferrable."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from airflow_dblog.engine.progress import progress_line
from airflow_dblog.errors import DblogError
from airflow_dblog.provider.compat import BaseSensorOperator, Context
from airflow_dblog.provider.hooks.dblog import DblogHook
from airflow_dblog.provider.triggers.dblog import DblogDumpTrigger


class DumpFailed(DblogError):
    """The dump ended failed or cancelled, or the stream stopped making progress."""


class DblogDumpSensor(BaseSensorOperator):
    template_fields: Sequence[str] = ("dump_id", "config_path")

    def __init__(
        self,
        *,
        dump_id: int | str,
        dblog_conn_id: str = "dblog_default",
        config_path: str | None = None,
        deferrable: bool = True,
        stall_timeout_s: float = 1800.0,
        log_interval_s: float = 30.0,
        **kwargs: Any,
    ) -> None:
        kwargs.setdefault("poke_interval", 5.0)
        super().__init__(**kwargs)
        self.dump_id, self.dblog_conn_id, self.config_path = dump_id, dblog_conn_id, config_path
        self.deferrable, self.stall_timeout_s = deferrable, stall_timeout_s
        self.log_interval_s = log_interval_s
        self._marker: tuple[Any, ...] | None = None
        self._moved_at = self._logged_at = 0.0

    @property
    def hook(self) -> DblogHook:
        return DblogHook(self.dblog_conn_id, self.config_path)

    def execute(self, context: Context) -> Any:
        if not self.deferrable:
            return super().execute(context)
        self.defer(
            trigger=DblogDumpTrigger(
                self.hook.config.metadata_url,
                int(self.dump_id),
                poll_interval_s=float(self.poke_interval),
                log_interval_s=self.log_interval_s,
                stall_timeout_s=self.stall_timeout_s,
            ),
            method_name="execute_complete",
        )

    def poke(self, context: Context) -> bool:
        progress = self.hook.progress(int(self.dump_id))
        now = time.monotonic()
        if now - self._logged_at >= self.log_interval_s or progress.state == "done":
            self.log.info("%s", progress_line(progress))
            self._logged_at = now
        if progress.state in ("failed", "cancelled"):
            raise DumpFailed(f"dump {self.dump_id} {progress.state}: {progress.reason}")
        current = (progress.state, progress.chunks_done, progress.rows_selected)
        if current != self._marker or progress.state == "paused" or not self._moved_at:
            self._marker, self._moved_at = current, now
        elif now - self._moved_at >= self.stall_timeout_s:
            raise DumpFailed(
                f"dump {self.dump_id} made no progress for {self.stall_timeout_s:.0f}s",
                "check that the dblog stream is running",
            )
        return progress.state == "done"

    def execute_complete(self, context: Context, event: dict[str, Any]) -> int:
        if event["status"] != "done":
            raise DumpFailed(f"dump {event['dump_id']} {event['status']}: {event['reason']}")
        self.log.info(
            "dump %s done: %s chunks, %s rows emitted, %s dropped as conflicting",
            event["dump_id"],
            event["chunks_done"],
            event["rows_emitted"],
            event["rows_dropped"],
        )
        return int(event["rows_emitted"])
