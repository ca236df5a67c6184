"""Spark's connector jars (Delta Lake, Kafka source) and the one SparkSession builder.

``scripts/services.sh spark-jars`` resolves ``io.delta:delta-spark_4.2_2.13`` and
``org.apache.spark:spark-sql-kafka-0-10_2.13`` with their runtime dependencies, minus what
pyspark already ships, into ``${DBLOG_CACHE_DIR:-~/.cache/airflow-dblog}/spark-jars-4.2.0/``.
A session built here puts exactly those jars on ``spark.jars``: nothing is downloaded when a job
starts. ``DBLOG_SPARK_JARS_DIR`` points somewhere else (e.g. a cluster image's jar directory).
Without either (an installed wheel, no ``scripts/``), the first session downloads the same jars
(:data:`CONNECTOR_JARS`) from Maven Central into that cache, each checked against Central's SHA-1.

Importing this module does not import pyspark; :func:`build_spark_session` does.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import shutil
import sys
import tempfile
import urllib.request
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from airflow_dblog.errors import DblogError

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

log = logging.getLogger(__name__)

SPARK_VERSION = "4.2.0"
PACKAGES = (
    "io.delta:delta-spark_4.2_2.13:4.4.0",
    f"org.apache.spark:spark-sql-kafka-0-10_2.13:{SPARK_VERSION}",
)
# PACKAGES' runtime closure minus what pyspark ships: what scripts/services.sh resolves with
# Maven (tests/spark/test_session.py checks that the two agree)
CONNECTOR_JARS = (
    "com.fasterxml.jackson.datatype:jackson-datatype-jdk8:2.21.2",
    "io.delta:delta-kernel-api:4.4.0",
    "io.delta:delta-kernel-defaults:4.4.0",
    "io.delta:delta-kernel-unitycatalog:4.4.0",
    "io.delta:delta-spark_4.2_2.13:4.4.0",
    "io.delta:delta-storage:4.4.0",
    "io.unitycatalog:unitycatalog-client:0.6.0",
    "io.unitycatalog:unitycatalog-hadoop:0.6.0",
    "org.apache.commons:commons-pool2:2.13.1",
    "org.apache.kafka:kafka-clients:3.9.2",
    f"org.apache.spark:spark-sql-kafka-0-10_2.13:{SPARK_VERSION}",
    f"org.apache.spark:spark-token-provider-kafka-0-10_2.13:{SPARK_VERSION}",
)
MAVEN_REPO = "https://repo1.maven.org/maven2"
FIX = (
    "let the job reach Maven Central once (it caches the jars), run scripts/services.sh"
    " spark-jars in a source checkout, or set DBLOG_SPARK_JARS_DIR to a directory holding"
    f" io.delta:delta-spark_4.2_2.13 4.4.0 and spark-sql-kafka-0-10_2.13 {SPARK_VERSION}"
    " with their dependencies"
)

# Delta Lake wiring; every session that touches a Delta table needs both.
DELTA_CONF: dict[str, str] = {
    "spark.sql.extensions": "io.delta.sql.DeltaSparkSessionExtension",
    "spark.sql.catalog.spark_catalog": "org.apache.spark.sql.delta.catalog.DeltaCatalog",
}


def spark_jars_dir() -> Path:
    """The directory holding the connector jars (it may not exist yet)."""
    override = os.environ.get("DBLOG_SPARK_JARS_DIR")
    if override:
        return Path(override).expanduser()
    cache = os.environ.get("DBLOG_CACHE_DIR") or str(Path.home() / ".cache" / "airflow-dblog")
    return Path(cache).expanduser() / f"spark-jars-{SPARK_VERSION}"


def spark_jars() -> list[str]:
    """Absolute paths of the connector jars, sorted; a one-line DblogError if they are missing."""
    directory = spark_jars_dir()
    if not directory.is_dir():
        raise DblogError(f"Spark connector jars not found: {directory} does not exist", FIX)
    # services.sh writes .complete last; a dir without it is a half-finished download.
    if os.environ.get("DBLOG_SPARK_JARS_DIR") is None and not (directory / ".complete").is_file():
        raise DblogError(f"Spark connector jars in {directory} are incomplete", FIX)
    jars = sorted(str(p.resolve()) for p in directory.glob("*.jar"))
    names = " ".join(Path(j).name for j in jars)
    if "delta-spark" not in names or "spark-sql-kafka" not in names:
        raise DblogError(
            f"Spark connector jars in {directory} lack delta-spark or spark-sql-kafka", FIX
        )
    return jars


def fetch_jars(repo: str = MAVEN_REPO) -> Path:
    """Download :data:`CONNECTOR_JARS` into :func:`spark_jars_dir` unless it is complete.

    Written to a sibling directory and renamed into place, so a half-finished download (or a
    second process doing the same) never looks complete.
    """
    directory = spark_jars_dir()
    if (directory / ".complete").is_file():
        return directory
    log.info("downloading Spark's connector jars from %s into %s", repo, directory)
    directory.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=directory.parent, prefix=".jars-") as work:
        for coordinate in CONNECTOR_JARS:
            group, artifact, version = coordinate.split(":")
            name = f"{artifact}-{version}.jar"
            url = f"{repo}/{group.replace('.', '/')}/{artifact}/{version}/{name}"
            try:
                with urllib.request.urlopen(url, timeout=60) as response:
                    body = response.read()
                with urllib.request.urlopen(url + ".sha1", timeout=60) as response:
                    expected = response.read().decode().split()[0]
            except OSError as err:
                raise DblogError(f"cannot download {url}: {err}", FIX) from None
            if hashlib.sha1(body).hexdigest() != expected:
                raise DblogError(f"{url} does not match its SHA-1 {expected}", FIX)
            (Path(work) / name).write_bytes(body)
        (Path(work) / ".complete").write_text(" ".join(PACKAGES) + "\n")
        with contextlib.suppress(OSError):  # another process finished first: keep its copy
            if directory.exists() and not (directory / ".complete").is_file():
                shutil.rmtree(directory)
            os.rename(work, directory)
    return directory


def jar_conf() -> dict[str, str]:
    """``spark.jars``: the cached jars, downloaded first when there is no cache (a wheel)."""
    if os.environ.get("DBLOG_SPARK_JARS_DIR") is None:
        fetch_jars()
    return {"spark.jars": ",".join(spark_jars())}


def _conf_value(value: Any) -> str:
    if isinstance(value, bool):  # Spark wants "true"/"false", not Python's "True"
        return "true" if value else "false"
    return str(value)


def build_spark_session(
    app_name: str,
    master: str | None = "local[*]",
    extra_conf: Mapping[str, Any] | None = None,
) -> SparkSession:
    """A SparkSession with Delta Lake and the Kafka source, from the cached jars.

    ``master=None`` leaves the master to ``spark-submit`` (a cluster run). ``extra_conf`` wins
    over the defaults here. If a session already exists in this process, Spark returns it and
    static settings (jars, extensions) of the first one stay in force.
    """
    from pyspark.sql import SparkSession

    conf: dict[str, str] = {
        **jar_conf(),
        **DELTA_CONF,
        "spark.sql.session.timeZone": "UTC",
        # CDC tables are small per micro-batch; Spark's default of 200 shuffle partitions is
        # all overhead. Override per job if needed.
        "spark.sql.shuffle.partitions": "8",
        # Delta replays its log with 50 partitions by default: most of a small MERGE's time
        "spark.databricks.delta.snapshotPartitions": "4",
        "spark.ui.showConsoleProgress": "false",
        # local mode: the driver is the executor too; Spark's 1g is tight for a dump's batches
        "spark.driver.memory": "2g",
    }
    for key, value in (extra_conf or {}).items():
        conf[key] = _conf_value(value)
    if master is not None and master.startswith("local"):
        # Keep a local driver on loopback (and quiet Spark's "hostname resolves to a loopback
        # address" warning); a cluster run leaves networking to spark-submit.
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
        # Python workers (the changelog source, UDFs) run this interpreter and its packages
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
        conf.setdefault("spark.driver.host", "127.0.0.1")
        conf.setdefault("spark.driver.bindAddress", "127.0.0.1")
    builder = SparkSession.builder.appName(app_name)
    if master is not None:
        builder = builder.master(master)
    for key, value in conf.items():
        builder = builder.config(key, value)
    return builder.getOrCreate()


if __name__ == "__main__":  # `spark-submit --jars "$(python -m airflow_dblog.spark.session)" ...`
    if os.environ.get("DBLOG_SPARK_JARS_DIR") is None:
        fetch_jars()
    print(",".join(spark_jars()))
