"""The system tier's own Spark session, as its streams run (tests/support/spark_session.py)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests.support.spark_session import local_session


@pytest.fixture(scope="session")
def spark(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    session = local_session(tmp_path_factory.mktemp("spark-warehouse"), like_streams=True)
    yield session
    session.stop()
