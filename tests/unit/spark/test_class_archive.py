"""The JVM class archive: the driver options that put it on a local session's class path
(tests/integration/spark/test_class_archive.py starts JVMs with it)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from airflow_dblog.spark import class_archive
from airflow_dblog.spark.session import _local_driver_conf

JARS = {"spark.jars": "/jars/delta.jar,/jars/kafka.jar"}


def test_local_sessions_put_the_jars_first_on_the_class_path_and_map_the_archive(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DBLOG_CACHE_DIR", str(tmp_path))
    user = {"spark.driver.extraClassPath": "/mine.jar", "spark.driver.extraJavaOptions": "-Da=1"}
    without = _local_driver_conf(JARS, user, class_archive=True)
    assert without == {
        "spark.driver.extraClassPath": "/jars/delta.jar:/jars/kafka.jar:/mine.jar",
        "spark.driver.extraJavaOptions": "-Da=1",
    }
    archive = class_archive.archive_path("/jars/delta.jar:/jars/kafka.jar")
    archive.parent.mkdir(parents=True)
    archive.write_bytes(b"")
    options = _local_driver_conf(JARS, user, class_archive=True)["spark.driver.extraJavaOptions"]
    assert options == f"-Da=1 -XX:SharedArchiveFile={archive}"
    assert "spark.driver.extraJavaOptions" not in _local_driver_conf(JARS, {}, class_archive=False)


def test_a_jar_written_again_at_the_same_path_keys_a_new_archive(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DBLOG_CACHE_DIR", str(tmp_path))
    jar = tmp_path / "delta.jar"
    jar.write_bytes(b"classes")
    before = class_archive.archive_path(str(jar))
    assert class_archive.archive_path(str(jar)) == before
    os.utime(jar, ns=(jar.stat().st_atime_ns, jar.stat().st_mtime_ns + 1_000_000_000))
    assert class_archive.archive_path(str(jar)) != before
