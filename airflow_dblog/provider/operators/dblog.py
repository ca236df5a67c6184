"""Thin operators over DblogHook: keep the stream running, plan dumps, backfills and verify
dumps, control them, tune the stream."""

from __future__ import annotations

import dataclasses
import shlex
from collections.abc import Sequence
from typing import Any

from airflow_dblog.core.keys import parse_keys
from airflow_dblog.engine.lag import STALE_AFTER_S
from airflow_dblog.engine.launcher import Launch, ensure_stream, run_dir
from airflow_dblog.errors import InputError
from airflow_dblog.provider.compat import BaseOperator, Context
from airflow_dblog.provider.hooks.dblog import DblogHook
from airflow_dblog.provider.verify import verify_mode
from airflow_dblog.redact import redact


class _DblogOperator(BaseOperator):
    def __init__(
        self, *, dblog_conn_id: str = "dblog_default", config_path: str | None = None, **kwargs: Any
    ) -> None:
        super().__init__(**kwargs)
        self.dblog_conn_id, self.config_path = dblog_conn_id, config_path

    @property
    def hook(self) -> DblogHook:
        return DblogHook(self.dblog_conn_id, self.config_path)


class DblogEnsureStreamOperator(_DblogOperator):
    """Start the streaming job unless it runs; then wait until it commits (``engine/launcher.py``).

    Already running (a live process started here before, a holder of the ``ha`` lease, or
    without ``ha`` a commit within ``stale_after_s``, and when the process started here died,
    another commit within ``probe_s``): logs why and does nothing. Else starts
    ``dblog stream -c FILE`` (``mode="local"``) or ``spark-submit <spark_args>
    airflow_dblog/cli/spark_submit.py -c FILE`` (``mode="spark-submit"``; ``application``
    names another file) detached from the task, its
    output in ``log_path`` (default ``<checkpoint>/launcher/stream.log``), and fails with one
    line naming that log if the process exits or the stream does not commit within
    ``timeout_s``. Returns ``{"started", "pid", "log_path"}`` (XCom).
    """

    template_fields: Sequence[str] = (
        "config_path",
        "mode",
        "log_path",
        "run_dir",
        "application",
        "spark_args",
        "timeout_s",
    )

    def __init__(
        self,
        *,
        mode: str = "local",
        log_path: str | None = None,
        run_dir: str | None = None,
        python: str | None = None,
        spark_submit: str = "spark-submit",
        application: str | None = None,
        spark_args: Sequence[str] = (),
        timeout_s: float | str = 120.0,
        poll_s: float = 2.0,
        stale_after_s: float = STALE_AFTER_S,
        probe_s: float = 5.0,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.probe_s = probe_s
        self.mode, self.log_path, self.run_dir = mode, log_path, run_dir
        self.python, self.spark_submit, self.application = python, spark_submit, application
        self.spark_args, self.timeout_s, self.poll_s = spark_args, timeout_s, poll_s
        self.stale_after_s = stale_after_s

    def execute(self, context: Context) -> dict[str, Any]:
        hook = self.hook
        launch = Launch(
            mode=self.mode,
            log_path=self.log_path or None,
            run_dir=self.run_dir or None,
            spark_submit=self.spark_submit,
            application=self.application or None,
            spark_args=_args(self.spark_args),
            timeout_s=float(self.timeout_s),
            poll_s=self.poll_s,
            stale_after_s=self.stale_after_s,
            probe_s=self.probe_s,
            **({"python": self.python} if self.python else {}),
        )
        path, env = hook.config_file(run_dir(hook.config, launch))
        launch = dataclasses.replace(launch, env=env)
        ensured = ensure_stream(path, hook.source_config, launch, hook.store)
        self.log.info("%s", redact(ensured.reason))
        return {"started": ensured.started, "pid": ensured.pid, "log_path": ensured.log_path}


class DblogDumpOperator(_DblogOperator):
    """Plan a dump of all tables (``tables=None``) or of some; returns the dump id (XCom).

    ``verify=True`` plans a verify dump: the stream compares each chunk with the Delta tables
    instead of writing it, and follow-up dumps write only what differs; with ``dry_run=True``
    nothing is written, the counts and example keys are the whole result. The dump sensor
    waits for the follow-ups too, and fails past its ``max_differences``.
    """

    template_fields: Sequence[str] = ("tables", "config_path", "verify", "dry_run")

    def __init__(
        self,
        *,
        tables: Sequence[str] | str | None = None,
        verify: bool | str = False,
        dry_run: bool | str = False,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.tables, self.verify, self.dry_run = tables, verify, dry_run
        _check_mode(verify, dry_run)

    def execute(self, context: Context) -> int:
        tables = [self.tables] if isinstance(self.tables, str) else self.tables
        mode = verify_mode(self.verify, self.dry_run)
        dump_id = self.hook.plan_dump(tables, None, requested_by=_who(context), verify=mode)
        what = "dump" if mode is None else f"verify ({mode}) dump"
        self.log.info("planned %s %s of %s", what, dump_id, ", ".join(tables or ["all tables"]))
        return dump_id


class DblogBackfillOperator(_DblogOperator):
    """Plan a dump of specific primary keys of one table; returns the dump id (XCom).

    ``keys`` is a list of keys, or text with one key per line: a bare value for one-column
    keys, JSON (a list in key order or an object by column) for composite keys. ``verify`` and
    ``dry_run`` as for :class:`DblogDumpOperator`: a look at just those rows.
    """

    template_fields: Sequence[str] = ("table", "keys", "config_path", "verify", "dry_run")

    def __init__(
        self,
        *,
        table: str,
        keys: Sequence[Any] | str,
        verify: bool | str = False,
        dry_run: bool | str = False,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.table, self.keys, self.verify, self.dry_run = table, keys, verify, dry_run
        _check_mode(verify, dry_run)

    def execute(self, context: Context) -> int:
        keys = parse_keys(self.keys) if isinstance(self.keys, str) else list(self.keys)
        if not keys:
            raise InputError("no primary keys given", "enter at least one key, one per line")
        mode = verify_mode(self.verify, self.dry_run)
        dump_id = self.hook.plan_dump([self.table], keys, requested_by=_who(context), verify=mode)
        what = "backfill dump" if mode is None else f"verify ({mode}) dump"
        self.log.info("planned %s %s: %d keys of %s", what, dump_id, len(keys), self.table)
        return dump_id


class DblogControlOperator(_DblogOperator):
    """pause, resume or cancel a dump."""

    template_fields: Sequence[str] = ("dump_id", "action", "config_path")

    def __init__(self, *, dump_id: int | str, action: str, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        if action not in ("pause", "resume", "cancel"):
            raise ValueError(f"action must be pause, resume or cancel, got {action!r}")
        self.dump_id, self.action = dump_id, action

    def execute(self, context: Context) -> str:
        state = self.hook.control(int(self.dump_id), self.action)
        self.log.info("dump %s is now %s", self.dump_id, state)
        return state


class DblogSetOperator(_DblogOperator):
    """Change chunk size, delay or parallelism of the running stream."""

    template_fields: Sequence[str] = ("chunk_size", "delay_ms", "parallelism", "config_path")

    def __init__(
        self,
        *,
        chunk_size: int | None = None,
        delay_ms: int | None = None,
        parallelism: int | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.chunk_size, self.delay_ms, self.parallelism = chunk_size, delay_ms, parallelism

    def execute(self, context: Context) -> None:
        self.hook.set_controls(
            chunk_size=_int(self.chunk_size),
            delay_ms=_int(self.delay_ms),
            parallelism=_int(self.parallelism),
        )


def _check_mode(verify: bool | str, dry_run: bool | str) -> None:
    """Options that cannot work fail the DAG's import, not its first run (templates wait)."""
    if not isinstance(verify, str) and not isinstance(dry_run, str):
        verify_mode(verify, dry_run)


def _args(value: Sequence[str] | str | None) -> list[str]:
    """spark-submit arguments as a list; a (templated) string is split like a shell would."""
    return shlex.split(value) if isinstance(value, str) else list(value or ())


def _int(value: int | str | None) -> int | None:
    return None if value in (None, "") else int(value)  # type: ignore[arg-type]


def _who(context: Context) -> str:
    dag_run = context.get("dag_run")
    run_id = getattr(dag_run, "run_id", "?")
    ti = context.get("ti")
    return f"airflow:{getattr(ti, 'dag_id', '?')}/{run_id}"
