"""The engine's unit tests run against a source database in memory (tests/support/fake_source.py)
and a SQLite metadata store in the test's folder: no server."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from airflow_dblog.engine.metadata import MetadataStore
from tests.support.fake_source import FakeDatabase, registered_fake_kind


@pytest.fixture
def fake_db() -> Iterator[FakeDatabase]:
    """An empty fake database; ``source.type: fake`` is registered while the test runs."""
    with registered_fake_kind():
        db = FakeDatabase()
        yield db
        db.drop()


@pytest.fixture
def meta(tmp_path: Path) -> Iterator[MetadataStore]:
    """The metadata store of the configs ``fake_config(..., tmp_path)`` builds."""
    store = MetadataStore(f"sqlite:///{tmp_path}/meta.db")
    yield store
    store.engine.dispose()
