"""Spark's connector jars (Delta Lake, Kafka source, S3A): which ones, where they are cached, and
their download.

``scripts/services.sh spark-jars`` resolves ``io.delta:delta-spark_4.2_2.13``,
``org.apache.spark:spark-sql-kafka-0-10_2.13`` and ``org.apache.hadoop:hadoop-aws`` with their
runtime dependencies, minus what pyspark already ships, into
``${DBLOG_CACHE_DIR:-~/.cache/airflow-dblog}/spark-jars-4.2.0/``. ``DBLOG_SPARK_JARS_DIR`` points
somewhere else (e.g. a cluster image's jar directory). Without either (an installed wheel, no
``scripts/``), :func:`jar_conf` downloads the same jars (:data:`CONNECTOR_JARS`) from Maven
Central into that cache, each checked against Central's SHA-1.

No pyspark import: the launcher puts these jars on spark-submit's ``--jars`` without Spark in
its process, and the session builder (:mod:`~airflow_dblog.spark.session`) on ``spark.jars``.
``python -m airflow_dblog.engine.connector_jars`` prints them, comma-separated, for
``spark-submit --jars``.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import shutil
import tempfile
import urllib.request
from collections.abc import Mapping
from pathlib import Path

from airflow_dblog.errors import DblogError

log = logging.getLogger(__name__)

SPARK_VERSION = "4.2.0"
HADOOP_VERSION = "3.5.0"  # pyspark 4.2.0's hadoop-client-api/runtime
AWS_SDK_VERSION = "2.35.4"  # what hadoop-aws 3.5.0 is built against
PACKAGES = (
    "io.delta:delta-spark_4.2_2.13:4.4.0",
    f"org.apache.spark:spark-sql-kafka-0-10_2.13:{SPARK_VERSION}",
    # s3a://, with the AWS SDK v2 modules it uses (s3, s3-transfer-manager, sts, apache-client,
    # netty-nio-client) instead of the SDK's whole bundle, many times larger, since every
    # executor copies spark.jars. (KMS encryption and S3 Access Grants would need more modules.)
    f"org.apache.hadoop:hadoop-aws:{HADOOP_VERSION}",
)
# PACKAGES' runtime closure minus what pyspark ships: what scripts/services.sh resolves with
# Maven (tests/integration/spark/test_session.py checks that the two agree). The AWS SDK's
# apache-client uses pyspark's httpclient, httpcore and jcl-over-slf4j (for commons-logging).
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
    "org.apache.hadoop:hadoop-aws:3.5.0",
    "org.apache.kafka:kafka-clients:3.9.2",
    f"org.apache.spark:spark-sql-kafka-0-10_2.13:{SPARK_VERSION}",
    f"org.apache.spark:spark-token-provider-kafka-0-10_2.13:{SPARK_VERSION}",
    "org.reactivestreams:reactive-streams:1.0.4",
    "org.wildfly.openssl:wildfly-openssl:2.2.5.Final",
    "software.amazon.awssdk:annotations:2.35.4",
    "software.amazon.awssdk:apache-client:2.35.4",
    "software.amazon.awssdk:arns:2.35.4",
    "software.amazon.awssdk:auth:2.35.4",
    "software.amazon.awssdk:aws-core:2.35.4",
    "software.amazon.awssdk:aws-query-protocol:2.35.4",
    "software.amazon.awssdk:aws-xml-protocol:2.35.4",
    "software.amazon.awssdk:checksums-spi:2.35.4",
    "software.amazon.awssdk:checksums:2.35.4",
    "software.amazon.awssdk:crt-core:2.35.4",
    "software.amazon.awssdk:endpoints-spi:2.35.4",
    "software.amazon.awssdk:http-auth-aws-eventstream:2.35.4",
    "software.amazon.awssdk:http-auth-aws:2.35.4",
    "software.amazon.awssdk:http-auth-spi:2.35.4",
    "software.amazon.awssdk:http-auth:2.35.4",
    "software.amazon.awssdk:http-client-spi:2.35.4",
    "software.amazon.awssdk:identity-spi:2.35.4",
    "software.amazon.awssdk:json-utils:2.35.4",
    "software.amazon.awssdk:metrics-spi:2.35.4",
    "software.amazon.awssdk:netty-nio-client:2.35.4",
    "software.amazon.awssdk:profiles:2.35.4",
    "software.amazon.awssdk:protocol-core:2.35.4",
    "software.amazon.awssdk:regions:2.35.4",
    "software.amazon.awssdk:retries-spi:2.35.4",
    "software.amazon.awssdk:retries:2.35.4",
    "software.amazon.awssdk:s3-transfer-manager:2.35.4",
    "software.amazon.awssdk:s3:2.35.4",
    "software.amazon.awssdk:sdk-core:2.35.4",
    "software.amazon.awssdk:sts:2.35.4",
    "software.amazon.awssdk:third-party-jackson-core:2.35.4",
    "software.amazon.awssdk:utils-lite:2.35.4",
    "software.amazon.awssdk:utils:2.35.4",
    "software.amazon.eventstream:eventstream:1.0.1",
    "software.amazon.s3.analyticsaccelerator:analyticsaccelerator-s3:1.3.1",
)
MAVEN_REPO = "https://repo1.maven.org/maven2"
FIX = (
    "let the job reach Maven Central once (it caches the jars), run scripts/services.sh"
    " spark-jars in a source checkout, or set DBLOG_SPARK_JARS_DIR to a directory holding"
    f" io.delta:delta-spark_4.2_2.13 4.4.0 and spark-sql-kafka-0-10_2.13 {SPARK_VERSION}"
    " with their dependencies"
)


def cache_dir() -> Path:
    """``$DBLOG_CACHE_DIR``, else ``~/.cache/airflow-dblog``: jars and the JVM class archive."""
    cache = os.environ.get("DBLOG_CACHE_DIR") or str(Path.home() / ".cache" / "airflow-dblog")
    return Path(cache).expanduser()


def spark_jars_dir() -> Path:
    """The directory holding the connector jars (it may not exist yet)."""
    override = os.environ.get("DBLOG_SPARK_JARS_DIR")
    if override:
        return Path(override).expanduser()
    return cache_dir() / f"spark-jars-{SPARK_VERSION}"


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
    if _complete(directory):
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
            if directory.exists() and not _complete(directory):
                shutil.rmtree(directory)
            os.rename(work, directory)
    return directory


def _complete(directory: Path) -> bool:
    """Finished (``.complete``) and holding every pinned jar: a cache from an older release,
    before a connector was added, is downloaded again."""
    if not (directory / ".complete").is_file():
        return False
    have = {p.name for p in directory.glob("*.jar")}
    return all("{1}-{2}.jar".format(*c.split(":")) in have for c in CONNECTOR_JARS)


def jar_conf() -> dict[str, str]:
    """``spark.jars``: the cached jars, downloaded first when there is no cache (a wheel)."""
    if os.environ.get("DBLOG_SPARK_JARS_DIR") is None:
        fetch_jars()
    return {"spark.jars": ",".join(spark_jars())}


def local_classpath(jars: Mapping[str, str]) -> str:
    """``jars``' ``spark.jars`` as a JVM class path (what a ``local[...]`` driver loads them
    from, so that :mod:`~airflow_dblog.spark.class_archive` can map their classes)."""
    return os.pathsep.join(jars["spark.jars"].split(","))


if __name__ == "__main__":  # spark-submit --jars "$(python -m airflow_dblog.engine.connector_jars)"
    if os.environ.get("DBLOG_SPARK_JARS_DIR") is None:
        fetch_jars()
    print(",".join(spark_jars()))
