"""Where the spool and the chunk files live: what a Spark task is given to open the store."""

from __future__ import annotations

import pytest

from airflow_dblog.engine.spool_store import (
    S3_ACCESS_KEY,
    S3_ENDPOINT,
    S3_REGION,
    S3_SECRET_KEY,
    S3_SESSION_TOKEN,
    task_conf,
)

_VARIABLES = (
    "DBLOG_S3_ENDPOINT",
    "AWS_REGION",
    "AWS_DEFAULT_REGION",
    "AWS_ACCESS_KEY_ID",
    "AWS_SECRET_ACCESS_KEY",
    "AWS_SESSION_TOKEN",
)


@pytest.fixture(autouse=True)
def _no_store_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for variable in _VARIABLES:
        monkeypatch.delenv(variable, raising=False)


def test_a_task_gets_the_stores_settings_of_the_conf_and_nothing_else_of_it() -> None:
    conf = {
        S3_ENDPOINT: "http://store:9000",
        S3_ACCESS_KEY: "key",
        S3_SECRET_KEY: "secret",
        "spark.hadoop.javax.jdo.option.ConnectionPassword": "metastore-secret",
        "spark.executor.memory": "2g",
    }
    assert task_conf(conf) == {
        S3_ENDPOINT: "http://store:9000",
        S3_ACCESS_KEY: "key",
        S3_SECRET_KEY: "secret",
    }


def test_settings_the_conf_lacks_come_from_the_drivers_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """As Spark copies AWS_* into the Hadoop settings every task carries to the executors."""
    for variable, value in {
        "DBLOG_S3_ENDPOINT": "http://env-store:9000",
        "AWS_DEFAULT_REGION": "eu-west-1",
        "AWS_ACCESS_KEY_ID": "env-key",
        "AWS_SECRET_ACCESS_KEY": "env-secret",
        "AWS_SESSION_TOKEN": "env-token",
    }.items():
        monkeypatch.setenv(variable, value)
    assert task_conf({S3_REGION: "us-west-2"}) == {
        S3_ENDPOINT: "http://env-store:9000",
        S3_REGION: "us-west-2",
        S3_ACCESS_KEY: "env-key",
        S3_SECRET_KEY: "env-secret",
        S3_SESSION_TOKEN: "env-token",
    }
    # a key in the conf brings its secret and token from there, none from the environment
    assert task_conf({S3_ACCESS_KEY: "conf-key", S3_SECRET_KEY: "conf-secret"}) == {
        S3_ENDPOINT: "http://env-store:9000",
        S3_REGION: "eu-west-1",
        S3_ACCESS_KEY: "conf-key",
        S3_SECRET_KEY: "conf-secret",
    }


def test_a_driver_without_store_settings_gives_a_task_none() -> None:
    """The executors then use their own (instance or pod roles)."""
    assert task_conf({"spark.executor.memory": "2g"}) == {}
