"""Wait for a dump to finish, logging its progress (a verify dump: judge it, then wait for its
repairs); check the stream's health. Classic or deferrable.

The sensor is the task that sees a dump's tables refreshed, so it announces them: one Asset
event per Delta table and Kafka topic the dump wrote (``provider/assets.py`` names them),
through an :class:`AssetAlias` (``asset_alias``, default ``"dblog"``) because the tables are
known only at run time (the backfill form picks one). A DAG scheduled on such an Asset runs
after every finished dump of its table. With the OpenLineage provider installed, the same
places are the task's lineage: source tables in, Delta tables and topics out.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from airflow_dblog.core.events import TableId
from airflow_dblog.engine.metadata.dumps import DumpProgress
from airflow_dblog.errors import DblogError
from airflow_dblog.provider.assets import openlineage_names, refreshed
from airflow_dblog.provider.compat import (
    Asset,
    AssetAlias,
    BaseSensorOperator,
    Context,
    openlineage_classes,
)
from airflow_dblog.provider.hooks.dblog import DblogHook
from airflow_dblog.provider.triggers.dblog import (
    DblogDumpTrigger,
    DblogStreamTrigger,
    stream_line,
)
from airflow_dblog.provider.verify import RepairsProgress, check_differences, limit


class DumpFailed(DblogError):
    """The dump ended failed or cancelled, or the stream stopped making progress."""


DEFAULT_ASSET_ALIAS = "dblog"


class DblogDumpSensor(BaseSensorOperator):
    """Wait for dump ``dump_id``; on success emit an Asset event per place it refreshed.

    ``asset_alias=None`` emits none. Returns the number of rows the dump emitted.

    A verify dump is judged when it is done: more differences than ``max_differences`` (None:
    no limit) fail the task with the counts and example keys. In repair mode the sensor then
    waits for the follow-up dumps that write the differences, and the Asset events are theirs;
    a dry run writes nothing and emits none. For a verify dump it returns a dict: ``dump_id``,
    ``rows_emitted`` (by the repairs), ``repair_dumps`` and ``verify`` (the report).
    """

    template_fields: Sequence[str] = ("dump_id", "config_path", "max_differences")

    def __init__(
        self,
        *,
        dump_id: int | str,
        dblog_conn_id: str = "dblog_default",
        config_path: str | None = None,
        deferrable: bool = True,
        stall_timeout_s: float = 1800.0,
        log_interval_s: float = 30.0,
        asset_alias: str | None = DEFAULT_ASSET_ALIAS,
        max_differences: int | str | None = None,
        **kwargs: Any,
    ) -> None:
        kwargs.setdefault("poke_interval", 5.0)
        if asset_alias:
            outlets = kwargs.get("outlets") or []
            outlets = list(outlets) if isinstance(outlets, (list, tuple)) else [outlets]
            kwargs["outlets"] = [*outlets, AssetAlias(asset_alias)]
        super().__init__(**kwargs)
        self.asset_alias = asset_alias
        self._refreshed_tables: list[TableId] = []
        self.dump_id, self.dblog_conn_id, self.config_path = dump_id, dblog_conn_id, config_path
        self.deferrable, self.stall_timeout_s = deferrable, stall_timeout_s
        self.log_interval_s = log_interval_s
        self.max_differences = max_differences
        self._marker: tuple[Any, ...] | None = None
        self._moved_at = self._logged_at = 0.0
        self._repairs: list[int] | None = None  # known once the dump is done

    @property
    def hook(self) -> DblogHook:
        return DblogHook(self.dblog_conn_id, self.config_path)

    def execute(self, context: Context) -> Any:
        if not self.deferrable:
            super().execute(context)
            return self._announce(context, int(self.dump_id))
        self._defer(int(self.dump_id), None, "execute_complete")

    def _defer(self, dump_id: int, repairs: list[int] | None, method_name: str) -> None:
        self.defer(
            trigger=DblogDumpTrigger(
                self.hook.config.metadata_url,
                dump_id,
                poll_interval_s=float(self.poke_interval),
                log_interval_s=self.log_interval_s,
                stall_timeout_s=self.stall_timeout_s,
                repairs=repairs,
            ),
            method_name=method_name,
        )

    def poke(self, context: Context) -> bool:
        dump_id = int(self.dump_id)
        if self._repairs is None:
            if not self._follow(self.hook.progress(dump_id)):
                return False
            self._repairs = self._judge(dump_id)
            if not self._repairs:
                return True
            self._marker, self._moved_at, self._logged_at = None, 0.0, 0.0
        return self._follow(self.hook.repairs_progress(dump_id, self._repairs))

    def _follow(self, progress: DumpProgress | RepairsProgress) -> bool:
        """One look at the dump (or at a verify dump's repairs): log, fail, or say if done."""
        now = time.monotonic()
        if now - self._logged_at >= self.log_interval_s or progress.state == "done":
            self.log.info("%s", progress.line())
            self._logged_at = now
        repairs = isinstance(progress, RepairsProgress)
        if progress.state in ("failed", "cancelled"):
            raise _failed(progress.dump_id, progress.state, progress.reason, repairs)
        current = (progress.state, progress.chunks_done, progress.rows_selected)
        if current != self._marker or progress.state == "paused" or not self._moved_at:
            self._marker, self._moved_at = current, now
        elif now - self._moved_at >= self.stall_timeout_s:
            what = "the repairs of dump" if repairs else "dump"
            raise DumpFailed(
                f"{what} {self.dump_id} made no progress for {self.stall_timeout_s:.0f}s",
                "check that the dblog stream is running",
            )
        return progress.state == "done"

    def _judge(self, dump_id: int) -> list[int]:
        """A done dump: fail a verify dump past ``max_differences``; the repairs to wait for."""
        hook = self.hook
        report = hook.progress(dump_id).verify
        if report is None:
            return []
        repairs = hook.repair_dump_ids(dump_id) if report.mode == "repair" else []
        follow = f"; repair dumps {', '.join(map(str, repairs))} follow" if repairs else ""
        self.log.info("dump %s verified: %s%s", dump_id, report.line(), follow)
        check_differences(dump_id, report, limit(self.max_differences, "max_differences"), repairs)
        return repairs

    def execute_complete(self, context: Context, event: dict[str, Any]) -> Any:
        if event["status"] != "done":
            raise _failed(event["dump_id"], event["status"], event["reason"], repairs=False)
        self.log.info(
            "dump %s done: %s chunks, %s rows emitted, %s dropped as conflicting",
            event["dump_id"],
            event["chunks_done"],
            event["rows_emitted"],
            event["rows_dropped"],
        )
        dump_id = int(event["dump_id"])
        repairs = self._judge(dump_id)
        if repairs:
            self._defer(dump_id, repairs, "execute_repairs_complete")
        return self._announce(context, dump_id)

    def execute_repairs_complete(self, context: Context, event: dict[str, Any]) -> Any:
        """After the second wait: the verify dump's repairs are done (or one failed)."""
        if event["status"] != "done":
            raise _failed(event["dump_id"], event["status"], event["reason"], repairs=True)
        self.log.info(
            "repairs of dump %s done: %s chunks, %s rows emitted",
            event["dump_id"],
            event["chunks_done"],
            event["rows_emitted"],
        )
        return self._announce(context, int(event["dump_id"]))

    def _announce(self, context: Context, dump_id: int) -> Any:
        """The Asset events (via the alias) and lineage of what the dump, or a verify dump's
        repairs, wrote; the rows emitted, or for a verify dump a dict with its report."""
        hook = self.hook
        report = hook.progress(dump_id).verify
        if report is None:
            rows = hook.rows_by_table(dump_id)
            self._emit(context, dump_id, rows, {})
            return sum(rows.values())
        repairs = hook.repair_dump_ids(dump_id) if report.mode == "repair" else []
        rows = {}
        for repair in repairs:
            for table, n in hook.rows_by_table(repair).items():
                rows[table] = rows.get(table, 0) + n
        self._emit(context, dump_id, rows, {"verify": report.mode, "repair_dumps": repairs})
        return {
            "dump_id": dump_id,
            "rows_emitted": sum(rows.values()),
            "repair_dumps": repairs,
            "verify": report.as_dict(),
        }

    def _emit(
        self, context: Context, dump_id: int, rows: dict[str, int], more: dict[str, Any]
    ) -> None:
        hook = self.hook
        self._refreshed_tables = [TableId.parse(t) for t in rows]
        events = context.get("outlet_events") if self.asset_alias else None
        if events is None:
            return
        alias = events[AssetAlias(self.asset_alias)]
        for place in refreshed(hook.config, self._refreshed_tables):
            extra = {
                "stream": hook.config.name,
                "dump_id": dump_id,
                "table": str(place.table),
                "sink": place.sink,
                "rows_emitted": rows[str(place.table)],
                **more,
            }
            alias.add(Asset(place.uri), extra=extra)
            self.log.info("refreshed %s (%s rows)", place.uri, extra["rows_emitted"])

    def get_openlineage_facets_on_complete(self, task_instance: Any) -> Any:
        """Source tables in, Delta tables and Kafka topics out; None without the provider."""
        classes = openlineage_classes()
        if classes is None or not self._refreshed_tables:
            return None
        operator_lineage, dataset = classes
        config = self.hook.source_config
        inputs, outputs = openlineage_names(config, self._refreshed_tables, config.source.url)
        return operator_lineage(
            inputs=[dataset(namespace=ns, name=name) for ns, name in inputs],
            outputs=[dataset(namespace=ns, name=name) for ns, name in outputs],
        )


def _failed(dump_id: Any, state: str, reason: str | None, repairs: bool) -> DumpFailed:
    if repairs:  # the verify dump itself is done: name what did not finish
        return DumpFailed(
            f"verify dump {dump_id} is done, but a repair did not finish ({state}): {reason}",
            "see dblog status -c FILE, then verify again",
        )
    return DumpFailed(f"dump {dump_id} {state}: {reason}")


class StreamUnhealthy(DblogError):
    """The stream is not running, its lag is unknown, or it is too far behind its source."""


class DblogStreamSensor(BaseSensorOperator):
    """Succeed when the stream runs within ``max_lag_s`` and ``max_lag_bytes`` of its source.

    Fails when the stream is not running (no commit for ``stale_after_s``), when its lag cannot
    be read (the source unreachable, its binlog purged), or when the lag stays past a limit for
    ``grace_s`` (0: at the first look; more lets a just restarted stream catch up). Logs one
    line per look: ``state=... lag_s=... lag_bytes=...``. Returns the status as a dict (XCom).
    """

    template_fields: Sequence[str] = ("config_path", "max_lag_s", "max_lag_bytes", "grace_s")

    def __init__(
        self,
        *,
        dblog_conn_id: str = "dblog_default",
        config_path: str | None = None,
        max_lag_s: float = 300.0,
        max_lag_bytes: int = 1 << 30,
        grace_s: float = 0.0,
        stale_after_s: float = 60.0,
        deferrable: bool = True,
        **kwargs: Any,
    ) -> None:
        kwargs.setdefault("poke_interval", 10.0)
        super().__init__(**kwargs)
        self.dblog_conn_id, self.config_path = dblog_conn_id, config_path
        self.max_lag_s, self.max_lag_bytes = max_lag_s, max_lag_bytes
        self.grace_s, self.stale_after_s = grace_s, stale_after_s
        self.deferrable = deferrable
        self._lagging_since: float | None = None
        self._status: dict[str, Any] | None = None

    def execute(self, context: Context) -> Any:
        if not self.deferrable:
            super().execute(context)
            return self._status
        self.defer(
            trigger=DblogStreamTrigger(
                dblog_conn_id=self.dblog_conn_id,
                config_path=self.config_path,
                max_lag_s=float(self.max_lag_s),
                max_lag_bytes=int(self.max_lag_bytes),
                grace_s=float(self.grace_s),
                poll_interval_s=float(self.poke_interval),
                stale_after_s=self.stale_after_s,
            ),
            method_name="execute_complete",
        )

    def poke(self, context: Context) -> bool:
        status = DblogHook(self.dblog_conn_id, self.config_path).stream_status(
            stale_after_s=self.stale_after_s
        )
        self.log.info("%s", stream_line(status))
        problem = status.problem(float(self.max_lag_s), int(self.max_lag_bytes))
        if problem is None:
            self._status = status.as_dict()
            return True
        now = time.monotonic()
        self._lagging_since = self._lagging_since or now
        down = status.state != "running" or status.lag_s is None
        if down or now - self._lagging_since >= float(self.grace_s):
            raise StreamUnhealthy(problem, "check the dblog stream job: dblog status -c FILE")
        return False

    def execute_complete(self, context: Context, event: dict[str, Any]) -> dict[str, Any]:
        if event["status"] != "ok":
            raise StreamUnhealthy(
                f"{event['reason']}", "check the dblog stream job: dblog status -c FILE"
            )
        stream = event["stream"]
        self.log.info(
            "stream %s: state=%s lag_s=%s lag_bytes=%s",
            stream["name"],
            stream["state"],
            stream["lag_s"],
            stream["lag_bytes"],
        )
        return stream
