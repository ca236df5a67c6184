"""The tests' own Spark session: ``local[2]`` with Delta and the Kafka source."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tests.support.stream_process import TEST_JVM_OPTIONS, TEST_SPARK_CONF


def local_session(warehouse: Path, like_streams: bool = False) -> Any:
    """A session for the tests; ``like_streams``: run as the tests' streams are (the serial
    collector, no code generation, see stream_process), for a tier whose session only reads
    what the streams wrote beside it, where Janino would take the cores they need. The
    integration tier drives the Delta sink through this session: there it generates code, as
    users run it."""
    from airflow_dblog.spark.session import build_spark_session

    options = f"-Dderby.system.home={warehouse}"
    conf: dict[str, Any] = {
        "spark.ui.enabled": False,
        "spark.sql.shuffle.partitions": 2,
        "spark.default.parallelism": 2,
        "spark.sql.warehouse.dir": str(warehouse),
        "spark.databricks.delta.snapshotPartitions": 2,
        "spark.sql.streaming.forceDeleteTempCheckpointLocation": True,
    }
    if like_streams:
        conf.update(TEST_SPARK_CONF)
        options = f"{options} {TEST_JVM_OPTIONS}"
    conf["spark.driver.extraJavaOptions"] = options
    session = build_spark_session("airflow-dblog-tests", master="local[2]", extra_conf=conf)
    session.sparkContext.setLogLevel("WARN")
    return session
