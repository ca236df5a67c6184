"""How a dump's progress reads in a task log: one line, the same for sensor and trigger."""

from __future__ import annotations

from datetime import datetime, timezone

from airflow_dblog.engine.metadata.store import Progress


def rows_per_second(progress: Progress, now: datetime | None = None) -> float:
    if progress.started_at is None:
        return 0.0
    end = progress.finished_at or (now or datetime.now(timezone.utc)).replace(tzinfo=None)
    seconds = (end - progress.started_at).total_seconds()
    return progress.rows_emitted / seconds if seconds > 0 else 0.0


def progress_line(progress: Progress, now: datetime | None = None) -> str:
    rate = rows_per_second(progress, now)
    eta = "unknown"
    if progress.state == "done":
        eta = "0s"
    elif progress.chunks_done and progress.started_at is not None and rate > 0:
        per_chunk = progress.rows_selected / progress.chunks_done
        remaining_rows = per_chunk * max(progress.chunks_total - progress.chunks_done, 0)
        eta = f"{remaining_rows / rate:.0f}s"
    current = ", ".join(progress.current_chunks) or "-"
    return (
        f"dump {progress.dump_id} [{progress.state}] chunks {progress.chunks_done}/"
        f"{progress.chunks_total} ({progress.percent:.1f}%), rows emitted {progress.rows_emitted}, "
        f"dropped as conflicting {progress.rows_dropped}, {rate:.0f} rows/s, ETA {eta}, "
        f"working on {current}"
    )
