"""The Spark session's connector jars: the cache scripts/ fills, or a download from Central."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from airflow_dblog.engine.connector_jars import CONNECTOR_JARS, SPARK_VERSION


@pytest.mark.integration
def test_the_pinned_jars_are_what_maven_resolves_for_the_connectors() -> None:
    """scripts/services.sh resolves the connectors' closure with Maven; a wheel downloads the
    pinned list: they must be the same jars."""
    cache = Path(os.environ.get("DBLOG_CACHE_DIR", Path.home() / ".cache" / "airflow-dblog"))
    resolved = {p.name for p in (cache / f"spark-jars-{SPARK_VERSION}").glob("*.jar")}
    pinned = {"{1}-{2}.jar".format(*c.split(":")) for c in CONNECTOR_JARS}
    assert resolved == pinned


@pytest.mark.integration
def test_a_wheel_install_without_scripts_downloads_the_jars_and_writes_delta(
    tmp_path: Path,
) -> None:
    """No jar cache: the first session downloads the pinned jars from Maven Central (checked
    against their SHA-1) into the cache, and a Delta table round-trips."""
    script = textwrap.dedent(
        f"""
        from airflow_dblog.spark.session import build_spark_session
        spark = build_spark_session("wheel-jars", "local[1]")
        path = {str(tmp_path / "delta")!r}
        spark.createDataFrame([(1, "a")], "id INT, v STRING").write.format("delta").save(path)
        print(spark.read.format("delta").load(path).collect())
        """
    )
    env = {**os.environ, "DBLOG_CACHE_DIR": str(tmp_path / "cache")}
    env.pop("DBLOG_SPARK_JARS_DIR", None)
    done = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=540
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "Row(id=1, v='a')" in done.stdout
    jars = tmp_path / "cache" / f"spark-jars-{SPARK_VERSION}"
    assert len(list(jars.glob("*.jar"))) == len(CONNECTOR_JARS)
    assert (jars / ".complete").is_file()


@pytest.mark.integration
def test_a_session_keeps_more_generated_classes_than_sparks_default_hundred(spark: Any) -> None:
    """A stream's batches cycle through more generated classes than Spark's cache of 100 keeps;
    past it every batch compiled them again. After 150 distinct plans the first one runs again
    without a compile."""
    from pyspark.sql import functions as F

    compiles = spark._jvm.org.apache.spark.metrics.source.CodegenMetrics.METRIC_COMPILATION_TIME
    plans = [spark.range(0, 8).where(F.col("id") > F.lit(1_000 + i)) for i in range(150)]
    for plan in plans:
        plan.collect()
    before = compiles().getCount()
    plans[0].collect()
    assert compiles().getCount() == before
