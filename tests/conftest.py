"""Shared fixtures: the one place service fixtures live (logic in tests/support/services.py).

The tests come in three tiers, each a folder mirroring the package:

- ``tests/unit``: no server, no JVM (``scripts/test.sh --unit``);
- ``tests/integration``: one real server at a time (a database, Kafka, ZooKeeper, the object
  store, a local Spark session);
- ``tests/system``: the whole job (the stream process end to end, the standalone Spark cluster,
  failover, the browser and Airflow's services).

Every test under integration/ and system/ is marked ``integration`` (so ``-m "not integration"``
is the unit tier), and under system/ also ``system``.

Session-scoped servers (testcontainers if a Docker engine answers, else the local services of
scripts/services.sh, started on first use if they are down):

- ``mysql_server``     -> services.MySQLServer: host, port, user, password, flavor ("mariadb" |
                          "mysql"), backend; url(db), sqlalchemy_url(db), connect(db=None, **kw),
                          replication_settings()
- ``postgres_server``  -> services.PostgresServer: host, port, user, password, database ("dblog"),
                          backend; url(db), sqlalchemy_url(db), dsn(db), connect(db=None, **kw)
- ``zookeeper_server`` -> services.ZooKeeperServer: host, port, hosts, connect_string(chroot),
                          client(chroot="") (a started KazooClient)
- ``kafka_server``     -> services.KafkaServer: host, port, bootstrap_servers, config(**extra),
                          admin()
- ``spark``            -> a local[2] SparkSession with Delta and the Kafka source
                          (tests/support/spark_session.py; the system tier's runs as its
                          streams do: tests/system/conftest.py)

Function-scoped isolation:

- ``mysql_db``    -> services.MySQLDatabase: name, url (mysql://dblog:dblog@127.0.0.1:PORT/<name>),
                     sqlalchemy_url, connect(**kw) (PyMySQL, autocommit on), server
- ``postgres_db`` -> services.PostgresDatabase: name, url (postgres://...), sqlalchemy_url, dsn,
                     connect(**kw) (psycopg2, autocommit on), server; its replication slots
                     are dropped with it
- ``kafka_topic`` -> str: a new 1-partition topic, deleted afterwards
- ``kafka_topics``-> callable new_topic(partitions=1, config=None) -> str, all deleted afterwards
- ``zk_path``     -> str: an existing, unique znode path (use as a chroot:
                     ``zookeeper_server.connect_string(zk_path)``), deleted recursively afterwards
- ``stream_factory`` -> callable make(config_path) -> stream_process.Stream (not started); every
                     stream still running at the end is stopped
"""

from __future__ import annotations

import logging
import os
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support import services
from tests.support.spark_session import local_session
from tests.support.stream_process import Stream

TESTS = Path(__file__).resolve().parent

# Airflow reads its home at import: point it at a throwaway folder before any test imports it.
os.environ.setdefault("AIRFLOW_HOME", tempfile.mkdtemp(prefix="dblog-airflow-home-"))
os.environ.setdefault("AIRFLOW__CORE__LOAD_EXAMPLES", "False")
os.environ.setdefault("AIRFLOW__CORE__DAGS_FOLDER", str(TESTS.parent / "dags"))

# py4j logs "Closing down clientserver connection" from __del__ at interpreter exit, after
# pytest closed its capture streams: a "Logging error" traceback under every run's summary.
logging.getLogger("py4j").setLevel(logging.WARNING)


@pytest.hookimpl(tryfirst=True)  # before ``-m`` deselects by marker
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark each test by its tier's folder: integration/ and system/ need services."""
    for item in items:
        tier = Path(item.path).resolve().relative_to(TESTS).parts[0]
        if tier in ("integration", "system"):
            item.add_marker(pytest.mark.integration)
        if tier == "system":
            item.add_marker(pytest.mark.system)


@pytest.fixture(scope="session")
def _servers() -> Iterator[services.Servers]:
    servers = services.open_servers()
    yield servers
    servers.close()


@pytest.fixture(scope="session")
def mysql_server(_servers: services.Servers) -> services.MySQLServer:
    return _servers.mysql()


@pytest.fixture(scope="session")
def postgres_server(_servers: services.Servers) -> services.PostgresServer:
    return _servers.postgres()


@pytest.fixture(scope="session")
def zookeeper_server(_servers: services.Servers) -> services.ZooKeeperServer:
    return _servers.zookeeper()


@pytest.fixture(scope="session")
def kafka_server(_servers: services.Servers) -> services.KafkaServer:
    return _servers.kafka()


@pytest.fixture
def mysql_db(
    mysql_server: services.MySQLServer, request: pytest.FixtureRequest
) -> Iterator[services.MySQLDatabase]:
    with services.fresh_mysql_database(mysql_server, request.node.name) as db:
        yield db


@pytest.fixture
def postgres_db(
    postgres_server: services.PostgresServer, request: pytest.FixtureRequest
) -> Iterator[services.PostgresDatabase]:
    with services.fresh_postgres_database(postgres_server, request.node.name) as db:
        yield db


@pytest.fixture
def kafka_topics(
    kafka_server: services.KafkaServer, request: pytest.FixtureRequest
) -> Iterator[Callable[..., str]]:
    with services.kafka_topics(kafka_server, request.node.name) as new_topic:
        yield new_topic


@pytest.fixture
def kafka_topic(kafka_topics: Callable[..., str]) -> str:
    return kafka_topics()


@pytest.fixture
def zk_path(
    zookeeper_server: services.ZooKeeperServer, request: pytest.FixtureRequest
) -> Iterator[str]:
    with services.fresh_zk_path(zookeeper_server, request.node.name) as path:
        yield path


@pytest.fixture
def stream_factory() -> Iterator[Callable[[Path], Stream]]:
    streams: list[Stream] = []

    def make(path: Path) -> Stream:
        streams.append(Stream(path))
        return streams[-1]

    yield make
    for s in streams:
        if s.proc is not None:
            s.stop()


@pytest.fixture(scope="session")
def spark(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    session = local_session(tmp_path_factory.mktemp("spark-warehouse"))
    yield session
    session.stop()
