"""Session settings for clusters and object stores, without starting Spark."""

from __future__ import annotations

import zipfile
from pathlib import Path

import pytest

from airflow_dblog.engine import connector_jars
from airflow_dblog.spark import session


@pytest.fixture
def no_s3_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    for name in ("DBLOG_S3_ENDPOINT", "AWS_REGION", "AWS_DEFAULT_REGION"):
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


def test_no_s3a_path_and_no_endpoint_adds_nothing(no_s3_env: pytest.MonkeyPatch) -> None:
    assert session.s3a_conf(["/data/delta", None, "hdfs://nn/x"]) == {}


def test_an_s3a_path_on_aws_sets_only_the_region(no_s3_env: pytest.MonkeyPatch) -> None:
    assert session.s3a_conf(["s3a://bucket/delta"]) == {}
    no_s3_env.setenv("AWS_REGION", "eu-west-1")
    assert session.s3a_conf(["s3a://bucket/delta"]) == {
        "spark.hadoop.fs.s3a.endpoint.region": "eu-west-1"
    }


def test_a_custom_endpoint_gets_path_style_and_no_tls(no_s3_env: pytest.MonkeyPatch) -> None:
    no_s3_env.setenv("DBLOG_S3_ENDPOINT", "http://127.0.0.1:9000")
    no_s3_env.setenv("AWS_SECRET_ACCESS_KEY", "not-in-the-conf")
    conf = session.s3a_conf([])
    assert conf == {
        "spark.hadoop.fs.s3a.endpoint": "http://127.0.0.1:9000",
        "spark.hadoop.fs.s3a.path.style.access": "true",
        "spark.hadoop.fs.s3a.connection.ssl.enabled": "false",
        "spark.hadoop.fs.s3a.endpoint.region": "us-east-1",
    }
    assert "not-in-the-conf" not in str(conf)


def test_the_configs_endpoint_wins_over_the_environment(no_s3_env: pytest.MonkeyPatch) -> None:
    no_s3_env.setenv("DBLOG_S3_ENDPOINT", "http://127.0.0.1:9000")
    conf = session.s3a_conf(
        ["s3a://b/x"], {"spark.hadoop.fs.s3a.endpoint": "https://minio.internal:9000"}
    )
    assert conf["spark.hadoop.fs.s3a.endpoint"] == "https://minio.internal:9000"
    assert "spark.hadoop.fs.s3a.connection.ssl.enabled" not in conf


def test_the_package_zip_holds_the_package_and_its_data() -> None:
    with zipfile.ZipFile(session.package_zip()) as zf:
        names = set(zf.namelist())
    assert "airflow_dblog/__init__.py" in names
    assert "airflow_dblog/spark/session.py" in names
    assert "airflow_dblog/engine/metadata/migrations/env.py" in names  # not a package: data
    assert not any("__pycache__" in n for n in names)
    assert session.package_zip() == session.package_zip()  # built once per process


def test_a_jar_cache_missing_a_pinned_jar_is_not_complete(tmp_path: Path) -> None:
    (tmp_path / ".complete").write_text("old\n")
    for coordinate in connector_jars.CONNECTOR_JARS:
        _group, artifact, version = coordinate.split(":")
        if artifact != "hadoop-aws":
            (tmp_path / f"{artifact}-{version}.jar").write_bytes(b"")
    assert not connector_jars._complete(tmp_path)
    (tmp_path / "hadoop-aws-3.5.0.jar").write_bytes(b"")
    assert connector_jars._complete(tmp_path)


def test_an_endpoint_in_the_config_alone_gets_path_style(no_s3_env: pytest.MonkeyPatch) -> None:
    conf = session.s3a_conf([], {"spark.hadoop.fs.s3a.endpoint": "http://minio:9000"})
    assert conf["spark.hadoop.fs.s3a.path.style.access"] == "true"
    assert conf["spark.hadoop.fs.s3a.connection.ssl.enabled"] == "false"
