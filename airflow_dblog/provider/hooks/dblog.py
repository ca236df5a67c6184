"""The hook that owns a stream's config, its metadata store and its controls.

A ``dblog`` Airflow connection holds the stream's config: a file on the workers ("Config file",
extra ``config``) or the YAML itself ("Config (YAML)", extra ``config_yaml``), plus the
passwords it interpolates (see ``provider/connections.py``; the form is declared in the
provider info). The source itself comes from the URL or Airflow connection id inside the
config: :attr:`DblogHook.source_config` resolves a connection id, once, for what reaches the
source. Operators and sensors are thin: they call these methods.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from functools import cached_property
from pathlib import Path
from typing import Any

from airflow_dblog.config import Config, load_config
from airflow_dblog.engine.lag import STALE_AFTER_S, StreamStatus, stream_status
from airflow_dblog.engine.metadata import MetadataStore
from airflow_dblog.engine.metadata.dumps import DumpProgress
from airflow_dblog.engine.planner import plan_dump
from airflow_dblog.errors import DblogError
from airflow_dblog.provider.compat import BaseHook
from airflow_dblog.provider.connections import (
    config_from_extra,
    config_text_or_path,
    resolved,
    secret_env,
)
from airflow_dblog.provider.verify import RepairsProgress, repair_dump_ids, repairs_progress
from airflow_dblog.redact import redact


class DblogHook(BaseHook):
    conn_name_attr = "dblog_conn_id"
    default_conn_name = "dblog_default"
    conn_type = "dblog"
    hook_name = "DBLog change data capture"

    def __init__(self, dblog_conn_id: str = default_conn_name, config_path: str | None = None):
        super().__init__()
        self.dblog_conn_id = dblog_conn_id
        self._config_path = config_path

    @cached_property
    def config(self) -> Config:
        if self._config_path is not None:
            return load_config(self._config_path)
        extra = self.get_connection(self.dblog_conn_id).extra_dejson
        return config_from_extra(extra, self.dblog_conn_id)

    @cached_property
    def source_config(self) -> Config:
        """:attr:`config` with an Airflow connection id in ``source.url`` resolved to its URL:
        for what reaches the source (plans, lag, the stream's start); looked up on first use."""
        return resolved(self.config)

    @cached_property
    def store(self) -> MetadataStore:
        return MetadataStore(self.config.metadata_url)

    def plan_dump(
        self,
        tables: Sequence[str] | None = None,
        keys: Sequence[Any] | None = None,
        requested_by: str = "airflow",
        verify: str | None = None,
    ) -> int:
        """The new dump's id; ``verify`` (``repair`` or ``dry-run``) plans a verify dump."""
        return plan_dump(self.source_config, self.store, tables, keys, requested_by, verify)

    def progress(self, dump_id: int) -> DumpProgress:
        return self.store.progress(dump_id)

    def repair_dump_ids(self, dump_id: int) -> list[int]:
        """The dumps writing what verify dump ``dump_id`` found (all known once it is done)."""
        return repair_dump_ids(self.store, dump_id)

    def repairs_progress(self, dump_id: int, repair_ids: Sequence[int]) -> RepairsProgress:
        return repairs_progress(self.store, dump_id, repair_ids)

    def rows_by_table(self, dump_id: int) -> dict[str, int]:
        """Rows a dump emitted per table (``db.table``), every table of the dump listed."""
        rows = {t.table_name: 0 for t in self.store.dump_tables(dump_id)}
        for chunk in self.store.chunks(dump_id):
            if chunk.state == "done":
                rows[chunk.table_name] = rows.get(chunk.table_name, 0) + chunk.rows_emitted
        return rows

    def control(self, dump_id: int, action: str) -> str:
        return self.store.apply(dump_id, action).state

    def set_controls(self, **settings: int | None) -> None:
        self.store.set_controls(self.config.name, **settings)

    def stream_status(self, stale_after_s: float = STALE_AFTER_S) -> StreamStatus:
        """The stream's state (running, stopped, unknown), leader, and bytes and seconds behind
        its source (``engine/lag.py``); asks the source for its head."""
        return stream_status(self.source_config, self.store, stale_after_s=stale_after_s)

    def stream_lag_s(self) -> float | None:
        """Seconds the stream is behind its source (0 when caught up); None if unknown."""
        return self.stream_status().lag_s

    def config_file(self, folder: Path) -> tuple[str, dict[str, str]]:
        """A config file a separate process (the stream) can read, and the environment its
        ``${VAR}`` need: ``config_path``, the connection's file, or its inline YAML written to
        ``<folder>/config.yaml`` (owner-only; the passwords stay in the environment)."""
        if self._config_path is not None:
            return self._config_path, {}
        extra = self.get_connection(self.dblog_conn_id).extra_dejson
        self.config  # noqa: B018 - validates the connection's config first
        path, text = config_text_or_path(extra)
        if path is None:
            folder.mkdir(parents=True, exist_ok=True)
            file = folder / "config.yaml"
            fd = os.open(file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "w") as out:
                out.write(str(text))
            path = str(file)
        return str(path), secret_env(extra)

    def test_connection(self) -> tuple[bool, str]:
        try:
            config = self.source_config
            self.store.revision()
            from airflow_dblog.engine.configured_source import open_source

            source = open_source(config)
            for table in config.source.tables:
                source.describe(table)
            source.close()
        except DblogError as err:
            return False, redact(str(err))
        return True, f"stream {config.name}: metadata and {len(config.source.tables)} tables OK"
