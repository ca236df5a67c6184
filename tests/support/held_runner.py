"""A chunk runner whose SELECTs never finish, for unit tests of what happens while chunks are in
flight (the parallelism, a cancel, the spool footer's count of chunks being selected)."""

from __future__ import annotations

from concurrent.futures import Future

from airflow_dblog.engine.chunk_file import ChunkSelected
from airflow_dblog.engine.chunk_task import ChunkTask


class HeldRunner:
    """A :class:`~airflow_dblog.engine.chunk_runner.ChunkRunner` that keeps every task it is
    sent and never completes one."""

    ready = True

    def __init__(self) -> None:
        self.tasks: list[ChunkTask] = []

    def submit(self, task: ChunkTask) -> Future[ChunkSelected]:
        self.tasks.append(task)
        return Future()

    def close(self) -> None:
        pass
