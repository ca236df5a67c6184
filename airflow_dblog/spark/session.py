"""The one SparkSession builder: Delta Lake, the Kafka source and S3A from the connector jars.

A session built here puts exactly the cached connector jars
(:mod:`~airflow_dblog.engine.connector_jars`) on ``spark.jars`` (on ``local[...]``: on the driver
JVM's class path, mapped from the JVM class archive when one was made, see
:mod:`~airflow_dblog.spark.class_archive`): nothing is downloaded when a job starts, unless there
is no cache yet (an installed wheel).

On a cluster master (``spark://``, ``yarn``, ``k8s://``, or none given: spark-submit's) the
session ships this package to the executors as a zip (``addPyFile``), so they run the driver's
code whatever is (or is not) installed on them; ``s3a://`` paths get the endpoint, path-style
access and region from ``DBLOG_S3_ENDPOINT`` / ``AWS_REGION`` (a ``spark.hadoop.fs.s3a.*`` key in
the config's ``spark.conf`` wins) and credentials from Hadoop's default provider chain
(``AWS_ACCESS_KEY_ID`` / ``AWS_SECRET_ACCESS_KEY``, instance roles, ...).

Importing this module does not import pyspark; :func:`build_spark_session` and
:func:`archive_path` do.
"""

from __future__ import annotations

import atexit
import hashlib
import logging
import os
import shutil
import sys
import tempfile
import zipfile
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from airflow_dblog.engine.connector_jars import cache_dir, jar_conf, local_classpath

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

log = logging.getLogger(__name__)

# Delta Lake wiring; every session that touches a Delta table needs both.
DELTA_CONF: dict[str, str] = {
    "spark.sql.extensions": "io.delta.sql.DeltaSparkSessionExtension",
    "spark.sql.catalog.spark_catalog": "org.apache.spark.sql.delta.catalog.DeltaCatalog",
}


# Spark's JVMs compile with the client compiler (C1) alone. A stream's work arrives in bursts
# of new query plans (its MERGEs and appends, Delta's log replay, chunk jobs), and the
# optimising compiler (C2) spent more of its CPU compiling (Spark's and Delta's code as the JVM
# warms, the classes Spark generates for each plan) than the tasks spent running. C1 alone
# would shrink the code cache to 48 MB, which Spark and Delta fill (the compiler then stops,
# and the JVM dies when a method handle needs the cache): it keeps its tiered size. Options
# given in the config come after these and win (``-XX:TieredStopAtLevel=4`` brings C2 back).
JIT_OPTIONS = "-XX:TieredStopAtLevel=1 -XX:ReservedCodeCacheSize=240m"
_JAVA_OPTIONS = ("spark.driver.extraJavaOptions", "spark.executor.extraJavaOptions")


def jit_first(conf: Mapping[str, str]) -> dict[str, str]:
    """The driver's and executors' Java options of ``conf`` with :data:`JIT_OPTIONS` ahead."""
    return {key: f"{JIT_OPTIONS} {conf.get(key, '')}".strip() for key in _JAVA_OPTIONS}


def _conf_value(value: Any) -> str:
    if isinstance(value, bool):  # Spark wants "true"/"false", not Python's "True"
        return "true" if value else "false"
    return str(value)


def s3a_conf(paths: Iterable[str | None] = (), conf: Mapping[str, Any] | None = None) -> dict:
    """``spark.hadoop.fs.s3a.*`` settings for an S3-compatible store, or ``{}``.

    Applied when one of ``paths`` is ``s3a://`` or an endpoint is given. The endpoint is
    ``conf``'s ``spark.hadoop.fs.s3a.endpoint`` or ``DBLOG_S3_ENDPOINT`` (none: AWS itself);
    a custom endpoint gets path-style access (MinIO, versitygw, Ceph) and, for ``http://``, no TLS.
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
        # them in a job of one task per path (slow on an object store: a task per segment);
        # the driver's own listing of named files takes a HEAD each.
        "spark.sql.sources.parallelPartitionDiscovery.threshold": "100000",
        "spark.ui.showConsoleProgress": "false",
        # A stream's batches run more distinct generated classes (its MERGEs, Delta's log
        # replay, the change feed, chunk jobs) than Spark's cache of 100 keeps: past it each
        # batch compiles them again, and the JIT compiles the new classes again
        "spark.sql.codegen.cache.maxEntries": "1000",
        # local mode: the driver is the executor too; Spark's 1g is tight for a dump's batches
        "spark.driver.memory": "2g",
    }
    conf.update(s3a_conf(paths, extra_conf))
    for key, value in (extra_conf or {}).items():
        conf[key] = _conf_value(value)
    conf.update(jit_first(conf))
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
    classpath = local_classpath(jars)
    options = conf.get("spark.driver.extraJavaOptions", "")
    if class_archive and "-XX:SharedArchiveFile" not in options:
        options = f"{options} {java_options(classpath)}".strip()
    extra = conf.get("spark.driver.extraClassPath")
    return {
        "spark.driver.extraClassPath": os.pathsep.join(filter(None, [classpath, extra])),
        **({"spark.driver.extraJavaOptions": options} if options else {}),
    }


# -- the JVM class archive a local driver maps its classes from (spark/class_archive builds it) --


def java_binary() -> str:
    """The java PySpark's launcher runs: ``$JAVA_HOME/bin/java``, else the one on PATH."""
    home = os.environ.get("JAVA_HOME")
    java = str(Path(home) / "bin" / "java") if home else shutil.which("java") or "java"
    return os.path.realpath(java)


def archive_path(classpath: str) -> Path:
    """Where the class archive for this Java and driver class path lives (it may not exist).

    Keyed by the Java binary, pyspark and the class path, and by the times of the JVM, of
    pyspark's jars and of the class path's jars: the JVM ignores an archive whose jars changed
    since it was built, and a venv reinstalled at the same path writes the same jars anew.
    """
    import pyspark

    java = java_binary()
    jvm = Path(java).parent.parent / "lib" / "server" / "libjvm.so"  # a JDK update changes it
    pyspark_jars = Path(pyspark.__file__).parent / "jars"
    times = [_mtime(p) for p in (jvm, pyspark_jars, *map(Path, classpath.split(os.pathsep)))]
    key = hashlib.sha256(
        "\0".join([java, pyspark.__version__, pyspark.__file__, classpath, *times]).encode()
    ).hexdigest()[:16]
    return cache_dir() / "jvm-class-archives" / f"spark-{key}.jsa"


def _mtime(path: Path) -> str:
    try:
        return str(path.stat().st_mtime_ns)
    except OSError:
        return ""


def java_options(classpath: str) -> str:
    """``-XX:SharedArchiveFile=...`` when the class archive exists, else nothing."""
    path = archive_path(classpath)
    return f"-XX:SharedArchiveFile={path}" if path.is_file() else ""
