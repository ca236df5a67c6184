"""Reads and writes of the metadata tables, each in one short transaction.

Airflow and the CLI create dumps and change controls; the streaming job claims and completes
chunks; sensors and ``dblog status`` read progress. Everything goes through this class so the
state machine of a dump lives in one place. Its parts, one concern each:
:mod:`~airflow_dblog.engine.metadata.database` (the database, its locking, migrations and
fencing), :mod:`~airflow_dblog.engine.metadata.dumps` (dumps and chunks) and
:mod:`~airflow_dblog.engine.metadata.controls` (controls and stream state).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from airflow_dblog.engine.metadata.controls import ControlsAndStreamState
from airflow_dblog.engine.metadata.dumps import DumpsAndChunks


class MetadataStore(DumpsAndChunks, ControlsAndStreamState):
    """One metadata database. ``upgrade=True`` applies pending migrations on first use.

    A store with a :class:`~airflow_dblog.engine.metadata.database.Fence` (the leading stream
    process's) checks the token at the start of every transaction, under a share lock on the
    stream's row: a new leader's :meth:`take_lead` waits for those transactions, and every later
    one of the old leader fails.
    """

    def record_commit(self, stream: str, closed: Sequence[Mapping[str, int]], **state: Any) -> None:
        """The sinks hold a batch: where the stream stands and the chunks the batch closed
        (``chunk_id``, ``selected``, ``dropped``, ``emitted``), in one transaction, so a commit
        is one write to the metadata database however many chunks it closed."""
        with self.session() as s:
            self._save_state(s, stream, state)
            self._complete(
                s, [(c["chunk_id"], c["selected"], c["dropped"], c["emitted"]) for c in closed]
            )
