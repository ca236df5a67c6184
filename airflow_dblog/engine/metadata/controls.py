"""A stream's runtime controls (chunk size, delay, parallelism set while it runs) and its saved
state (reader position, heartbeat, leader)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from sqlalchemy.orm import Session

from airflow_dblog.config import DumpSettings
from airflow_dblog.engine.metadata.database import MetadataDatabase, locked_stream_row, utcnow
from airflow_dblog.engine.metadata.models import Control, StreamState
from airflow_dblog.errors import MetadataError


class ControlsAndStreamState(MetadataDatabase):
    """The stream's settings as changed at runtime, and the state it commits."""

    def controls(self, stream: str, defaults: DumpSettings) -> DumpSettings:
        """The stream's settings now: values set at runtime override the config file's."""
        with self.session(writes=False) as s:
            row = s.get(Control, stream)
        if row is None:
            return defaults
        return DumpSettings(
            chunk_size=row.chunk_size or defaults.chunk_size,
            delay_ms=defaults.delay_ms if row.delay_ms is None else row.delay_ms,
            parallelism=row.parallelism or defaults.parallelism,
        )

    def set_controls(
        self,
        stream: str,
        chunk_size: int | None = None,
        delay_ms: int | None = None,
        parallelism: int | None = None,
    ) -> None:
        for name, value, low in (
            ("chunk size", chunk_size, 1),
            ("delay", delay_ms, 0),
            ("parallelism", parallelism, 1),
        ):
            if value is not None and value < low:
                raise MetadataError(f"{name} must be >= {low}, got {value}")
        with self.session() as s:
            row = s.get(Control, stream, with_for_update=True)
            if row is None:
                row = Control(stream=stream, updated_at=utcnow())
                s.add(row)
            if chunk_size is not None:
                row.chunk_size = chunk_size
            if delay_ms is not None:
                row.delay_ms = delay_ms
            if parallelism is not None:
                row.parallelism = parallelism
            row.updated_at = utcnow()

    def stream_state(self, stream: str) -> StreamState | None:
        with self.session(writes=False) as s:
            return s.get(StreamState, stream)

    def save_stream_state(self, stream: str, **values: Any) -> None:
        with self.session() as s:
            self._save_state(s, stream, values)

    @staticmethod
    def _save_state(s: Session, stream: str, values: Mapping[str, Any]) -> None:
        row = locked_stream_row(s, stream)
        for key, value in values.items():
            setattr(row, key, value)
