"""The JVM class archive: local sessions map Spark's and the connectors' classes from it, and a
stale or broken one costs nothing but the time it would have saved."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from airflow_dblog.engine.connector_jars import spark_jars_dir
from airflow_dblog.spark import class_archive
from airflow_dblog.spark.session import java_binary


@pytest.mark.integration
def test_the_test_sessions_jvm_maps_its_classes_from_the_archive(spark: Any) -> None:
    """scripts/services.sh up builds the archive; a session's JVM then maps thousands of
    classes from it (~9,400 right after the start; the JDK's own archive alone: ~1,300)."""
    from pyspark import SparkContext

    assert class_archive.built(), "no class archive: run scripts/services.sh class-archive"
    pid = SparkContext._gateway.proc.pid  # type: ignore[union-attr]
    jcmd = Path(java_binary()).parent / "jcmd"
    counters = subprocess.run(
        [str(jcmd), str(pid), "PerfCounter.print"], capture_output=True, text=True, check=True
    ).stdout
    shared = next(
        int(line.split("=", 1)[1])
        for line in counters.splitlines()
        if line.startswith("java.cls.sharedLoadedClasses=")
    )
    assert shared > 5_000, shared


@pytest.mark.integration
def test_a_broken_archive_is_ignored_and_delta_still_works(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    script = textwrap.dedent(
        f"""
        from airflow_dblog.spark import class_archive
        from airflow_dblog.engine.connector_jars import jar_conf, local_classpath
        from airflow_dblog.spark.session import build_spark_session
        archive = class_archive.archive_path(local_classpath(jar_conf()))
        archive.parent.mkdir(parents=True)
        archive.write_bytes(b"not an archive" * 1000)
        spark = build_spark_session("broken-archive", "local[1]", {{"spark.ui.enabled": "false"}})
        path = {str(tmp_path / "delta")!r}
        spark.createDataFrame([(1, "a")], "id INT, v STRING").write.format("delta").save(path)
        print(spark.read.format("delta").load(path).collect())
        """
    )
    env = {
        **os.environ,
        "DBLOG_CACHE_DIR": str(cache),
        "DBLOG_SPARK_JARS_DIR": str(spark_jars_dir()),
    }
    done = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "Row(id=1, v='a')" in done.stdout
