"""Spark's connector jars (Delta Lake, Kafka source, S3A) and the one SparkSession builder.

``scripts/services.sh spark-jars`` resolves ``io.delta:delta-spark_4.2_2.13``,
``org.apache.spark:spark-sql-kafka-0-10_2.13`` and ``org.apache.hadoop:hadoop-aws`` with their
runtime dependencies, minus what pyspark already ships, into
``${DBLOG_CACHE_DIR:-~/.cache/airflow-dblog}/spark-jars-4.2.0/``.
A session built here puts exactly those jars on ``spark.jars`` (on ``local[...]``: on the driver
JVM's class path, see :mod:`~airflow_dblog.spark.class_archive`): nothing is downloaded when a job
starts. ``DBLOG_SPARK_JARS_DIR`` points somewhere else (e.g. a cluster image's jar directory).
Without either (an installed wheel, no ``scripts/``), the first session downloads the same jars
(:data:`CONNECTOR_JARS`) from Maven Central into that cache, each checked against Central's SHA-1.

On a cluster master (``spark://``, ``yarn``, ``k8s://``, or none given: spark-submit's) the
session ships this package to the executors as a zip (``addPyFile``), so they run the driver's
code whatever is (or is not) installed on them; ``s3a://`` paths get the endpoint, path-style
access and region from ``DBLOG_S3_ENDPOINT`` / ``AWS_REGION`` (a ``spark.hadoop.fs.s3a.*`` key in
the config's ``spark.conf`` wins) and credentials from Hadoop's default provider chain
(``AWS_ACCESS_KEY_ID`` / ``AWS_SECRET_ACCESS_KEY``, instance roles, ...).

Importing this module does not import pyspark; :func:`build_spark_session` does.
"""

from __future__ import annotations

import atexit
import contextlib
import hashlib
import logging
import os
import shutil
import sys
import tempfile
import urllib.request
import zipfile
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from airflow_dblog.errors import DblogError

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

log = logging.getLogger(__name__)

SPARK_VERSION = "4.2.0"
HADOOP_VERSION = "3.5.0"  # pyspark 4.2.0's hadoop-client-api/runtime
AWS_SDK_VERSION = "2.35.4"  # what hadoop-aws 3.5.0 is built against
PACKAGES = (
    "io.delta:delta-spark_4.2_2.13:4.4.0",
    f"org.apache.spark:spark-sql-kafka-0-10_2.13:{SPARK_VERSION}",
    # s3a://, with the AWS SDK v2 modules it uses (s3, s3-transfer-manager, sts, apache-client,
    # netty-nio-client) instead of the SDK's 686 MB bundle: 13.4 MB, and every executor copies
    # spark.jars. (KMS encryption and S3 Access Grants would need more modules.)
    f"org.apache.hadoop:hadoop-aws:{HADOOP_VERSION}",
)
# PACKAGES' runtime closure minus what pyspark ships: what scripts/services.sh resolves with
# Maven (tests/spark/test_session.py checks that the two agree). The AWS SDK's apache-client
# uses pyspark's httpclient, httpcore and jcl-over-slf4j (for commons-logging).
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

# Delta Lake wiring; every session that touches a Delta table needs both.
DELTA_CONF: dict[str, str] = {
    "spark.sql.extensions": "io.delta.sql.DeltaSparkSessionExtension",
    "spark.sql.catalog.spark_catalog": "org.apache.spark.sql.delta.catalog.DeltaCatalog",
}


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


def _conf_value(value: Any) -> str:
    if isinstance(value, bool):  # Spark wants "true"/"false", not Python's "True"
        return "true" if value else "false"
    return str(value)


def s3a_conf(paths: Iterable[str | None] = (), conf: Mapping[str, Any] | None = None) -> dict:
    """``spark.hadoop.fs.s3a.*`` settings for an S3-compatible store, or ``{}``.

    Applied when one of ``paths`` is ``s3a://`` or an endpoint is given. The endpoint is
    ``conf``'s ``spark.hadoop.fs.s3a.endpoint`` or ``DBLOG_S3_ENDPOINT`` (none: AWS itself);
    a custom endpoint gets path-style access (MinIO, moto, Ceph) and, for ``http://``, no TLS.
    The region is ``AWS_REGION`` (or ``AWS_DEFAULT_REGION``; ``us-east-1`` for a custom
    endpoint). Credentials are not set here: Hadoop's default provider chain reads
    ``AWS_ACCESS_KEY_ID`` / ``AWS_SECRET_ACCESS_KEY`` (Spark also copies those from the driver's
    environment into the Hadoop configuration that tasks carry to the executors), or an
    instance/pod role.
    """
    conf = conf or {}
    env_endpoint = os.environ.get("DBLOG_S3_ENDPOINT", "").strip()
    wanted = (
        env_endpoint
        or conf.get("spark.hadoop.fs.s3a.endpoint")
        or any(str(p or "").startswith("s3a://") for p in paths)
    )
    if not wanted:
        return {}
    out: dict[str, str] = {}
    endpoint = str(conf.get("spark.hadoop.fs.s3a.endpoint") or env_endpoint)
    region = os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION")
    if endpoint:
        out["spark.hadoop.fs.s3a.endpoint"] = endpoint
        out["spark.hadoop.fs.s3a.path.style.access"] = "true"
        if endpoint.startswith("http://"):
            out["spark.hadoop.fs.s3a.connection.ssl.enabled"] = "false"
        region = region or "us-east-1"
    if region:
        out["spark.hadoop.fs.s3a.endpoint.region"] = region
    log.info("s3a: endpoint %s, region %s", endpoint or "AWS", region or "(SDK default)")
    return out


_PACKAGE_ZIP: list[str] = []


def package_zip() -> str:
    """A zip of the ``airflow_dblog`` package this driver runs (``.py`` files and package data),
    built once per process, for executors (``SparkContext.addPyFile``). An editable install
    points into a source checkout the executors may not see; the zip needs nothing on them."""
    if _PACKAGE_ZIP:
        return _PACKAGE_ZIP[0]
    import airflow_dblog

    root = Path(airflow_dblog.__file__).resolve().parent
    work = tempfile.mkdtemp(prefix="dblog-pyfiles-")
    atexit.register(shutil.rmtree, work, True)
    target = Path(work) / "airflow_dblog.zip"
    with zipfile.ZipFile(target, "w", zipfile.ZIP_DEFLATED) as zf:
        for path in sorted(root.rglob("*")):
            if path.is_file() and "__pycache__" not in path.parts and path.suffix != ".pyc":
                zf.write(path, Path("airflow_dblog") / path.relative_to(root))
    _PACKAGE_ZIP.append(str(target))
    return str(target)


def _loopback(master: str) -> bool:
    """``local[...]``, or a cluster master on this machine's loopback interface."""
    if master.startswith("local"):
        return True
    host = master.split("://", 1)[-1].split(":", 1)[0]
    return host in ("127.0.0.1", "localhost")


def build_spark_session(
    app_name: str,
    master: str | None = "local[*]",
    extra_conf: Mapping[str, Any] | None = None,
    paths: Iterable[str | None] = (),
    class_archive: bool = True,
) -> SparkSession:
    """A SparkSession with Delta Lake, the Kafka source and S3A, from the cached jars.

    ``master=None`` leaves the master to ``spark-submit`` (a cluster run). ``extra_conf`` wins
    over the defaults here. ``paths``: the checkpoint and Delta paths the session will use; an
    ``s3a://`` one adds :func:`s3a_conf`. Off ``local[...]``, the executors get this package
    (:func:`package_zip`). On ``local[...]`` the jars go on the driver JVM's class path
    instead, with the :mod:`~airflow_dblog.spark.class_archive` when there is one (and
    ``class_archive``). If a session already exists in this process, Spark returns it and
    static settings (jars, extensions) of the first one stay in force.
    """
    from pyspark.sql import SparkSession

    local = master is not None and master.startswith("local")
    jars = jar_conf()
    conf: dict[str, str] = {
        **({} if local else jars),
        **DELTA_CONF,
        "spark.sql.session.timeZone": "UTC",
        # CDC tables are small per micro-batch; Spark's default of 200 shuffle partitions is
        # all overhead. Override per job if needed.
        "spark.sql.shuffle.partitions": "8",
        # Delta replays its log with 50 partitions by default: most of a small MERGE's time
        "spark.databricks.delta.snapshotPartitions": "4",
        # A batch reads its spool segments by name, often hundreds: past 32 paths Spark lists
        # them in a job of one task per path (measured on the two-worker cluster with S3: ~30 s
        # for 287 segments); the driver's own listing of named files takes a HEAD each.
        "spark.sql.sources.parallelPartitionDiscovery.threshold": "100000",
        "spark.ui.showConsoleProgress": "false",
        # local mode: the driver is the executor too; Spark's 1g is tight for a dump's batches
        "spark.driver.memory": "2g",
    }
    conf.update(s3a_conf(paths, extra_conf))
    for key, value in (extra_conf or {}).items():
        conf[key] = _conf_value(value)
    if local:
        conf.update(_local_driver_conf(jars, conf, class_archive))
    if master is not None:
        # Python workers (the changelog source, UDFs) run this interpreter: PySpark sends the
        # driver's PYSPARK_PYTHON to the executors. On a cluster whose Python lives elsewhere,
        # set PYSPARK_PYTHON (spark-submit: spark.pyspark.python) to the executors' path.
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    if master is not None and _loopback(master):
        # Keep a driver on loopback (and quiet Spark's "hostname resolves to a loopback
        # address" warning) when the master is too; otherwise networking is spark-submit's.
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
        conf.setdefault("spark.driver.host", "127.0.0.1")
        conf.setdefault("spark.driver.bindAddress", "127.0.0.1")
    builder = SparkSession.builder.appName(app_name)
    if master is not None:
        builder = builder.master(master)
    for key, value in conf.items():
        builder = builder.config(key, value)
    session = builder.getOrCreate()
    if not local:
        session.sparkContext.addPyFile(package_zip())
    return session


def _local_driver_conf(
    jars: Mapping[str, str], conf: Mapping[str, str], class_archive: bool
) -> dict[str, str]:
    """The connector jars ahead of the configured driver class path, and the class archive's
    option after the configured Java options."""
    from airflow_dblog.spark import class_archive as archive

    classpath = local_classpath(jars)
    options = conf.get("spark.driver.extraJavaOptions", "")
    if class_archive and "-XX:SharedArchiveFile" not in options:
        options = f"{options} {archive.java_options(classpath)}".strip()
    extra = conf.get("spark.driver.extraClassPath")
    return {
        "spark.driver.extraClassPath": os.pathsep.join(filter(None, [classpath, extra])),
        **({"spark.driver.extraJavaOptions": options} if options else {}),
    }


if __name__ == "__main__":  # `spark-submit --jars "$(python -m airflow_dblog.spark.session)" ...`
    if os.environ.get("DBLOG_SPARK_JARS_DIR") is None:
        fetch_jars()
    print(",".join(spark_jars()))
