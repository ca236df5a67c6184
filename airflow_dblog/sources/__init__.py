"""Source databases, one folder each (``mysql/``, ``postgres/``), chosen by ``source.type``.

:mod:`~airflow_dblog.sources.registry` knows every kind; importing this package imports no
database driver: :func:`source_for` and :func:`open_reader` load the code of the kind asked for.
"""

from __future__ import annotations

from airflow_dblog.sources.base import ChangelogReader, Offset, Source, TableSchema
from airflow_dblog.sources.registry import ReaderSettings, open_reader, source_for

__all__ = [
    "ChangelogReader",
    "Offset",
    "ReaderSettings",
    "Source",
    "TableSchema",
    "open_reader",
    "source_for",
]
