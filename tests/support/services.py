"""The servers the integration tests run against, and per-test isolation on top of them.

Two backends, chosen once per test session:

- ``docker``: a reachable Docker engine (``docker.from_env().ping()``) -> testcontainers:
  MySQL 8.0 (GTIDs, ROW binlog), PostgreSQL 15 + wal2json (built from docker/Dockerfile.postgres),
  ZooKeeper, Apache Kafka (KRaft).
- ``local``: otherwise, the loopback services of ``scripts/services.sh`` (MariaDB, PostgreSQL 15
  + wal2json, ZooKeeper, Kafka KRaft), started with ``scripts/services.sh up`` if not running.

``DBLOG_TEST_BACKEND=local|docker`` forces one. Ports of the local services come from
DBLOG_MYSQL_PORT, DBLOG_PG_PORT, DBLOG_ZK_PORT, DBLOG_KAFKA_PORT (defaults 3306, 5432, 2181,
9092). Credentials are ``dblog``/``dblog`` everywhere.

The fixtures themselves are in ``tests/conftest.py``; this module holds the logic so it can be
imported (``from services import MySQLServer``) without pytest magic.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import socket
import subprocess
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlparse

REPO_ROOT = Path(__file__).resolve().parents[2]
SERVICES_SH = REPO_ROOT / "scripts" / "services.sh"
USER = "dblog"
PASSWORD = "dblog"
LOCAL_HOST = "127.0.0.1"


class ServiceUnavailable(RuntimeError):
    """A test server could not be started or reached (message says which and where to look)."""


# ---------------------------------------------------------------------------------------------
# connection info objects


@dataclass(frozen=True)
class MySQLServer:
    """A MySQL-protocol server. ``flavor`` is ``"mariadb"`` (local) or ``"mysql"`` (Docker)."""

    host: str
    port: int
    user: str = USER
    password: str = PASSWORD
    flavor: str = "mariadb"
    backend: str = "local"

    def url(self, database: str = "") -> str:
        """``mysql://dblog:dblog@127.0.0.1:3306/<database>`` (the form dblog configs use)."""
        return f"mysql://{_auth(self.user, self.password)}@{self.host}:{self.port}/{database}"

    def sqlalchemy_url(self, database: str = "") -> str:
        """``mysql+pymysql://...``: for SQLAlchemy ``create_engine``."""
        return (
            f"mysql+pymysql://{_auth(self.user, self.password)}@{self.host}:{self.port}/{database}"
        )

    def connect(self, database: str | None = None, **kwargs: Any) -> Any:
        """A PyMySQL connection, autocommit on unless ``autocommit=False`` is passed."""
        import pymysql

        params: dict[str, Any] = {
            "host": self.host,
            "port": self.port,
            "user": self.user,
            "password": self.password,
            "database": database,
            "autocommit": True,
            "charset": "utf8mb4",
            "connect_timeout": 10,
        }
        params.update(kwargs)
        return pymysql.connect(**params)

    def replication_settings(self) -> dict[str, Any]:
        """``connection_settings`` for pymysqlreplication's ``BinLogStreamReader``."""
        return {"host": self.host, "port": self.port, "user": self.user, "password": self.password}


@dataclass(frozen=True)
class PostgresServer:
    """A PostgreSQL 15 server with wal2json; ``user`` is a superuser with REPLICATION."""

    host: str
    port: int
    user: str = USER
    password: str = PASSWORD
    database: str = "dblog"  # maintenance database that always exists
    backend: str = "local"

    def url(self, database: str | None = None) -> str:
        """``postgres://dblog:dblog@127.0.0.1:5432/<database>`` (the form dblog configs use)."""
        db = database or self.database
        return f"postgres://{_auth(self.user, self.password)}@{self.host}:{self.port}/{db}"

    def sqlalchemy_url(self, database: str | None = None) -> str:
        db = database or self.database
        return (
            f"postgresql+psycopg2://{_auth(self.user, self.password)}@{self.host}:{self.port}/{db}"
        )

    def dsn(self, database: str | None = None) -> str:
        """A libpq keyword DSN, e.g. for ``psycopg2.connect(dsn)``."""
        db = database or self.database
        return (
            f"host={self.host} port={self.port} user={self.user} password={self.password} "
            f"dbname={db}"
        )

    def connect(self, database: str | None = None, **kwargs: Any) -> Any:
        """A psycopg2 connection, autocommit on unless ``autocommit=False`` is passed."""
        import psycopg2

        autocommit = kwargs.pop("autocommit", True)
        kwargs.setdefault("connect_timeout", 10)
        conn = psycopg2.connect(self.dsn(database), **kwargs)
        conn.autocommit = autocommit
        return conn


@dataclass(frozen=True)
class ZooKeeperServer:
    host: str
    port: int
    backend: str = "local"

    @property
    def hosts(self) -> str:
        """``127.0.0.1:2181``: kazoo's ``hosts`` / dblog's ``ha.zookeeper``."""
        return f"{self.host}:{self.port}"

    def connect_string(self, chroot: str = "") -> str:
        """``host:port/chroot``: a connection string confined to ``chroot``."""
        return self.hosts + chroot

    def client(self, chroot: str = "", **kwargs: Any) -> Any:
        """A started ``KazooClient`` (the caller stops and closes it)."""
        from kazoo.client import KazooClient

        kwargs.setdefault("timeout", 10.0)
        client = KazooClient(hosts=self.connect_string(chroot), **kwargs)
        client.start(timeout=15)
        return client


@dataclass(frozen=True)
class KafkaServer:
    host: str
    port: int
    backend: str = "local"

    @property
    def bootstrap_servers(self) -> str:
        """``127.0.0.1:9092``."""
        return f"{self.host}:{self.port}"

    def config(self, **extra: Any) -> dict[str, Any]:
        """A confluent_kafka config dict: ``{"bootstrap.servers": ..., **extra}``.

        Keyword names use ``_`` for ``.``: ``config(group_id="g")`` -> ``{"group.id": "g"}``.
        """
        conf: dict[str, Any] = {"bootstrap.servers": self.bootstrap_servers}
        conf.update({key.replace("_", "."): value for key, value in extra.items()})
        return conf

    def admin(self) -> Any:
        from confluent_kafka.admin import AdminClient

        return AdminClient(self.config())


@dataclass(frozen=True)
class MySQLDatabase:
    """A fresh database on the MySQL server, dropped after the test."""

    server: MySQLServer
    name: str

    @property
    def url(self) -> str:
        """``mysql://dblog:dblog@127.0.0.1:PORT/<name>``."""
        return self.server.url(self.name)

    @property
    def sqlalchemy_url(self) -> str:
        return self.server.sqlalchemy_url(self.name)

    def connect(self, **kwargs: Any) -> Any:
        """A PyMySQL connection to this database (autocommit on unless told otherwise)."""
        return self.server.connect(self.name, **kwargs)


@dataclass(frozen=True)
class PostgresDatabase:
    """A fresh database on the PostgreSQL server, dropped (with its replication slots) after."""

    server: PostgresServer
    name: str

    @property
    def url(self) -> str:
        """``postgres://dblog:dblog@127.0.0.1:PORT/<name>``."""
        return self.server.url(self.name)

    @property
    def sqlalchemy_url(self) -> str:
        return self.server.sqlalchemy_url(self.name)

    @property
    def dsn(self) -> str:
        return self.server.dsn(self.name)

    def connect(self, **kwargs: Any) -> Any:
        """A psycopg2 connection to this database (autocommit on unless told otherwise)."""
        return self.server.connect(self.name, **kwargs)


@dataclass
class Servers:
    """What one test session runs against."""

    backend: str
    mysql: Callable[[], MySQLServer]
    postgres: Callable[[], PostgresServer]
    zookeeper: Callable[[], ZooKeeperServer]
    kafka: Callable[[], KafkaServer]
    cleanups: list[Callable[[], None]] = field(default_factory=list)

    def close(self) -> None:
        while self.cleanups:
            with contextlib.suppress(Exception):
                self.cleanups.pop()()


def run_sql(server: MySQLServer | PostgresServer, *statements: str) -> list[tuple[Any, ...]]:
    """Run ``statements`` on a fresh autocommit connection; the rows of the last, if any."""
    conn = server.connect()
    try:
        with conn.cursor() as cur:
            for statement in statements:
                cur.execute(statement)
            return list(cur.fetchall()) if cur.description else []
    finally:
        conn.close()


def _auth(user: str, password: str) -> str:
    return f"{quote(user, safe='')}:{quote(password, safe='')}"


def unique_name(hint: str = "", prefix: str = "t") -> str:
    """A short lowercase identifier that is unique and valid as a database or topic name."""
    slug = re.sub(r"[^a-z0-9]+", "_", hint.lower()).strip("_")[:24]
    return "_".join(part for part in (prefix, slug, uuid.uuid4().hex[:10]) if part)


# ---------------------------------------------------------------------------------------------
# readiness probes (short timeouts: they decide whether to start anything)


def _probe_mysql(server: MySQLServer) -> None:
    conn = server.connect(connect_timeout=3)
    conn.close()


def _probe_postgres(server: PostgresServer) -> None:
    conn = server.connect(connect_timeout=3)
    conn.close()


def _probe_zookeeper(server: ZooKeeperServer) -> None:
    with socket.create_connection((server.host, server.port), timeout=3) as sock:
        sock.sendall(b"ruok")
        if sock.recv(16) != b"imok":
            raise OSError("zookeeper did not answer imok")


def _probe_kafka(server: KafkaServer) -> None:
    from confluent_kafka.admin import AdminClient

    meta = AdminClient(server.config()).list_topics(timeout=5)
    if not meta.brokers:
        raise OSError("kafka metadata lists no brokers")


def wait_until_ready(what: str, probe: Callable[[], None], timeout: float = 120.0) -> None:
    """Until ``probe`` passes, trying every 0.2 s (private servers are often up within one)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            probe()
            return
        except Exception as err:
            if time.monotonic() > deadline:
                raise ServiceUnavailable(f"{what} not ready after {timeout:.0f}s: {err}") from err
            time.sleep(0.2)


# ---------------------------------------------------------------------------------------------
# backend choice


def docker_available() -> bool:
    try:
        import docker

        client = docker.from_env(timeout=5)
        try:
            return bool(client.ping())
        finally:
            client.close()
    except Exception:
        return False


def choose_backend() -> str:
    forced = os.environ.get("DBLOG_TEST_BACKEND", "").strip().lower()
    if forced in ("local", "docker"):
        return forced
    if forced:
        raise ServiceUnavailable(f"DBLOG_TEST_BACKEND={forced!r}; use 'local' or 'docker'")
    return "docker" if docker_available() else "local"


def open_servers() -> Servers:
    backend = choose_backend()
    return _docker_servers() if backend == "docker" else _local_servers()


# ---------------------------------------------------------------------------------------------
# local services (scripts/services.sh)


def _env_port(name: str, default: int) -> int:
    return int(os.environ.get(name) or default)


def _local_servers() -> Servers:
    mysql = MySQLServer(LOCAL_HOST, _env_port("DBLOG_MYSQL_PORT", 3306))
    postgres = PostgresServer(LOCAL_HOST, _env_port("DBLOG_PG_PORT", 5432))
    zookeeper = ZooKeeperServer(LOCAL_HOST, _env_port("DBLOG_ZK_PORT", 2181))
    kafka = KafkaServer(LOCAL_HOST, _env_port("DBLOG_KAFKA_PORT", 9092))
    probes: list[tuple[str, Callable[[], None]]] = [
        ("mysql", lambda: _probe_mysql(mysql)),
        ("postgres", lambda: _probe_postgres(postgres)),
        ("zookeeper", lambda: _probe_zookeeper(zookeeper)),
        ("kafka", lambda: _probe_kafka(kafka)),
    ]
    lock = threading.Lock()
    state = {"checked": False}

    def ensure_up() -> None:
        # One check (and at most one `services.sh up`) per session, on first use.
        with lock:
            if state["checked"]:
                return
            down = []
            for name, probe in probes:
                try:
                    probe()
                except Exception:
                    down.append(name)
            if down:
                _run_services_up(down)
                for name, probe in probes:
                    wait_until_ready(f"local {name}", probe, timeout=60)
            state["checked"] = True

    def get(server: Any) -> Callable[[], Any]:
        def factory() -> Any:
            ensure_up()
            return server

        return factory

    return Servers("local", get(mysql), get(postgres), get(zookeeper), get(kafka))


def restart_local_service(name: str, down_s: float = 0) -> None:
    """Stop one of ``scripts/services.sh``'s services, wait ``down_s``, start it (fault tests)."""
    for command in ("down", "up"):
        if command == "up":
            time.sleep(down_s)
        subprocess.run(
            ["bash", str(SERVICES_SH), command, name],
            stdin=subprocess.DEVNULL,
            capture_output=True,
            check=True,
            timeout=300,
        )


def _run_services_up(down: list[str]) -> None:
    print(f"\n[tests] local services not reachable ({', '.join(down)}): running {SERVICES_SH} up")
    result = subprocess.run(
        ["bash", str(SERVICES_SH), "up"],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=1800,
        check=False,
    )
    if result.returncode != 0:
        tail = "\n".join(result.stdout.splitlines()[-30:])
        raise ServiceUnavailable(
            f"scripts/services.sh up failed (exit {result.returncode}); logs are in "
            f"{os.environ.get('DBLOG_SERVICES_DIR', REPO_ROOT / '.dblog-services')}/logs\n{tail}"
        )


# ---------------------------------------------------------------------------------------------
# Docker (testcontainers); only the generic DockerContainer API, which every 4.x release has.

MYSQL_IMAGE = os.environ.get("DBLOG_MYSQL_IMAGE", "mysql:8.0")
ZOOKEEPER_IMAGE = os.environ.get("DBLOG_ZOOKEEPER_IMAGE", "zookeeper:3.9")
KAFKA_IMAGE = os.environ.get("DBLOG_KAFKA_IMAGE", "apache/kafka:4.1.1")
POSTGRES_IMAGE_TAG = "airflow-dblog-postgres-wal2json:15"


def _docker_servers() -> Servers:
    cleanups: list[Callable[[], None]] = []
    lock = threading.Lock()
    cache: dict[str, Any] = {}

    def lazily(name: str, start: Callable[[list[Callable[[], None]]], Any]) -> Callable[[], Any]:
        # Containers start on first use: a session that needs only Kafka starts only Kafka.
        def factory() -> Any:
            with lock:
                if name not in cache:
                    cache[name] = start(cleanups)
                return cache[name]

        return factory

    return Servers(
        "docker",
        lazily("mysql", _start_mysql_container),
        lazily("postgres", _start_postgres_container),
        lazily("zookeeper", _start_zookeeper_container),
        lazily("kafka", _start_kafka_container),
        cleanups,
    )


def _container(image: str) -> Any:
    from testcontainers.core.container import DockerContainer

    return DockerContainer(image)


def _started(cleanups: list[Callable[[], None]], container: Any) -> Any:
    container.start()
    cleanups.append(container.stop)
    return container


def _mapped(container: Any, port: int) -> tuple[str, int]:
    return container.get_container_host_ip(), int(container.get_exposed_port(port))


def _start_mysql_container(cleanups: list[Callable[[], None]]) -> MySQLServer:
    root_password = "dblog-root"
    container = (
        _container(MYSQL_IMAGE)
        .with_env("MYSQL_ROOT_PASSWORD", root_password)
        .with_env("MYSQL_ROOT_HOST", "%")
        .with_exposed_ports(3306)
        .with_command(
            "--server-id=1 --log-bin=mysql-bin --binlog-format=ROW --binlog-row-image=FULL "
            "--binlog-row-metadata=FULL --gtid-mode=ON --enforce-gtid-consistency=ON "
            "--default-authentication-plugin=mysql_native_password "
            "--character-set-server=utf8mb4 --default-time-zone=+00:00"
        )
    )
    _started(cleanups, container)
    host, port = _mapped(container, 3306)
    root = MySQLServer(host, port, "root", root_password, flavor="mysql", backend="docker")
    wait_until_ready("mysql container", lambda: _probe_mysql(root), timeout=180)
    conn = root.connect()
    try:
        with conn.cursor() as cur:
            cur.execute(
                "CREATE USER IF NOT EXISTS 'dblog'@'%' IDENTIFIED WITH mysql_native_password "
                "BY 'dblog'"
            )
            cur.execute("GRANT ALL PRIVILEGES ON *.* TO 'dblog'@'%' WITH GRANT OPTION")
    finally:
        conn.close()
    return MySQLServer(host, port, flavor="mysql", backend="docker")


def _start_postgres_container(cleanups: list[Callable[[], None]]) -> PostgresServer:
    import docker

    client = docker.from_env()
    try:
        # PostgreSQL 15 + postgresql-15-wal2json (debezium/postgres:15 has no wal2json).
        client.images.build(
            path=str(REPO_ROOT / "docker"),
            dockerfile="Dockerfile.postgres",
            tag=POSTGRES_IMAGE_TAG,
            rm=True,
        )
    finally:
        client.close()
    container = (
        _container(POSTGRES_IMAGE_TAG)
        .with_env("POSTGRES_USER", USER)
        .with_env("POSTGRES_PASSWORD", PASSWORD)
        .with_env("POSTGRES_DB", "dblog")
        .with_exposed_ports(5432)
        .with_command(
            "postgres -c wal_level=logical -c max_replication_slots=20 -c max_wal_senders=20 "
            "-c max_connections=200 -c timezone=UTC"
        )
    )
    _started(cleanups, container)
    host, port = _mapped(container, 5432)
    server = PostgresServer(host, port, backend="docker")
    # The entrypoint restarts the server once after init: require a few consecutive successes.
    wait_until_ready("postgres container", lambda: _probe_postgres_stable(server), timeout=180)
    return server


def _probe_postgres_stable(server: PostgresServer) -> None:
    for _ in range(3):
        _probe_postgres(server)
        time.sleep(0.5)


def _start_zookeeper_container(cleanups: list[Callable[[], None]]) -> ZooKeeperServer:
    container = (
        _container(ZOOKEEPER_IMAGE)
        .with_env("ZOO_4LW_COMMANDS_WHITELIST", "ruok,srvr,stat")
        .with_env("ZOO_ADMINSERVER_ENABLED", "false")
        .with_exposed_ports(2181)
    )
    _started(cleanups, container)
    host, port = _mapped(container, 2181)
    server = ZooKeeperServer(host, port, backend="docker")
    wait_until_ready("zookeeper container", lambda: _probe_zookeeper(server), timeout=120)
    return server


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("", 0))
        return int(sock.getsockname()[1])


def _docker_host() -> str:
    try:
        from testcontainers.core.docker_client import DockerClient

        return str(DockerClient().host())
    except Exception:
        return "localhost"


def _start_kafka_container(cleanups: list[Callable[[], None]]) -> KafkaServer:
    # The advertised listener must be the address clients use, so the host port is fixed up front
    # (same number inside and outside) instead of being picked by Docker.
    port = _free_port()
    host = _docker_host()
    env = {
        "KAFKA_NODE_ID": "1",
        "KAFKA_PROCESS_ROLES": "broker,controller",
        "KAFKA_LISTENERS": f"PLAINTEXT://0.0.0.0:{port},CONTROLLER://0.0.0.0:9093",
        "KAFKA_ADVERTISED_LISTENERS": f"PLAINTEXT://{host}:{port}",
        "KAFKA_CONTROLLER_LISTENER_NAMES": "CONTROLLER",
        "KAFKA_LISTENER_SECURITY_PROTOCOL_MAP": "CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT",
        "KAFKA_CONTROLLER_QUORUM_VOTERS": "1@localhost:9093",
        "KAFKA_OFFSETS_TOPIC_REPLICATION_FACTOR": "1",
        "KAFKA_TRANSACTION_STATE_LOG_REPLICATION_FACTOR": "1",
        "KAFKA_TRANSACTION_STATE_LOG_MIN_ISR": "1",
        "KAFKA_SHARE_COORDINATOR_STATE_TOPIC_REPLICATION_FACTOR": "1",
        "KAFKA_SHARE_COORDINATOR_STATE_TOPIC_MIN_ISR": "1",
        "KAFKA_GROUP_INITIAL_REBALANCE_DELAY_MS": "0",
        "KAFKA_AUTO_CREATE_TOPICS_ENABLE": "true",
    }
    container = _container(KAFKA_IMAGE).with_bind_ports(port, port)
    for key, value in env.items():
        container = container.with_env(key, value)
    _started(cleanups, container)
    server = KafkaServer(host, port, backend="docker")
    wait_until_ready("kafka container", lambda: _probe_kafka(server), timeout=180)
    return server


# ---------------------------------------------------------------------------------------------
# per-test isolation


@contextlib.contextmanager
def fresh_mysql_database(server: MySQLServer, hint: str = "") -> Iterator[MySQLDatabase]:
    name = unique_name(hint)
    conn = server.connect()
    try:
        with conn.cursor() as cur:
            cur.execute(f"CREATE DATABASE `{name}` CHARACTER SET utf8mb4")
    finally:
        conn.close()
    try:
        yield MySQLDatabase(server, name)
    finally:
        conn = server.connect()
        try:
            with conn.cursor() as cur:
                # Connections a test left open would block DROP DATABASE on metadata locks.
                cur.execute(
                    "SELECT id FROM information_schema.processlist WHERE db = %s AND id <> "
                    "CONNECTION_ID()",
                    (name,),
                )
                for (thread_id,) in cur.fetchall():
                    with contextlib.suppress(Exception):
                        cur.execute(f"KILL {int(thread_id)}")
                cur.execute(f"DROP DATABASE IF EXISTS `{name}`")
        finally:
            conn.close()


@contextlib.contextmanager
def fresh_postgres_database(server: PostgresServer, hint: str = "") -> Iterator[PostgresDatabase]:
    name = unique_name(hint)
    conn = server.connect()
    try:
        with conn.cursor() as cur:
            cur.execute(f'CREATE DATABASE "{name}"')
    finally:
        conn.close()
    try:
        yield PostgresDatabase(server, name)
    finally:
        drop_postgres_database(server, name)


def drop_postgres_database(server: PostgresServer, name: str) -> None:
    """Drop the database's replication slots (ending walsenders using them), then the database."""
    conn = server.connect()
    try:
        with conn.cursor() as cur:
            for _ in range(20):
                cur.execute(
                    "SELECT slot_name, active_pid FROM pg_replication_slots WHERE database = %s",
                    (name,),
                )
                slots = cur.fetchall()
                if not slots:
                    break
                for slot_name, active_pid in slots:
                    try:
                        if active_pid is not None:
                            cur.execute("SELECT pg_terminate_backend(%s)", (active_pid,))
                        cur.execute("SELECT pg_drop_replication_slot(%s)", (slot_name,))
                    except Exception:
                        time.sleep(0.25)  # still active for a moment after the terminate
            cur.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    finally:
        conn.close()


@contextlib.contextmanager
def kafka_topics(server: KafkaServer, hint: str = "") -> Iterator[Callable[..., str]]:
    """A factory ``new_topic(partitions=1, config=None) -> name``; all topics deleted after."""
    from confluent_kafka.admin import NewTopic

    admin = server.admin()
    created: list[str] = []

    def new_topic(partitions: int = 1, config: dict[str, str] | None = None) -> str:
        name = unique_name(hint, prefix="dblog_test").replace("_", "-")
        futures = admin.create_topics(
            [NewTopic(name, num_partitions=partitions, replication_factor=1, config=config or {})],
            operation_timeout=30,
        )
        futures[name].result(timeout=60)
        created.append(name)
        _wait_for_topic(admin, name, partitions)
        return name

    try:
        yield new_topic
    finally:
        if created:
            with contextlib.suppress(Exception):
                for future in admin.delete_topics(created, operation_timeout=30).values():
                    with contextlib.suppress(Exception):
                        future.result(timeout=60)


def _wait_for_topic(admin: Any, name: str, partitions: int, timeout: float = 30.0) -> None:
    """Until every partition has a leader, so the first produce/consume does not race creation."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        topic = admin.list_topics(topic=name, timeout=10).topics.get(name)
        if (
            topic is not None
            and topic.error is None
            and len(topic.partitions) == partitions
            and all(p.leader >= 0 for p in topic.partitions.values())
        ):
            return
        time.sleep(0.2)
    raise ServiceUnavailable(f"kafka topic {name} has no leader after {timeout:.0f}s")


@contextlib.contextmanager
def fresh_zk_path(server: ZooKeeperServer, hint: str = "") -> Iterator[str]:
    path = f"/dblog-tests/{unique_name(hint)}"
    client = server.client()
    try:
        client.ensure_path(path)  # a chroot must exist before clients confined to it can write
        yield path
    finally:
        with contextlib.suppress(Exception):
            client.delete(path, recursive=True)
        client.stop()
        client.close()


def read_committed(servers: str, topic: str, quiet_s: float = 5.0) -> list[tuple[Any, Any]]:
    """Everything committed on ``topic`` when read, as (key, value) decoded from JSON.

    Read from the start to each partition's end, which for a read_committed consumer is the
    last stable offset: every transaction committed by then is in, an open one is not (a
    caller that expects more reads again). No consumer group joins (``assign``), and no quiet
    period is waited out at the end; ``quiet_s`` only bounds a read that stops making progress.
    """
    from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, TopicPartition

    consumer = Consumer(
        {
            "bootstrap.servers": servers,
            "group.id": f"test-{uuid.uuid4().hex}",
            "isolation.level": "read_committed",
            "enable.auto.commit": False,
            "enable.partition.eof": True,
        }
    )
    out: list[tuple[Any, Any]] = []
    try:
        metadata = consumer.list_topics(topic, timeout=30).topics.get(topic)
        if metadata is None or metadata.error is not None or not metadata.partitions:
            return out
        at_end_pending = set(metadata.partitions)
        consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in at_end_pending])
        last = time.monotonic()
        while at_end_pending and time.monotonic() - last < quiet_s:
            msg = consumer.poll(0.5)
            if msg is None:
                continue
            if msg.error():
                if msg.error().code() == KafkaError._PARTITION_EOF:
                    at_end_pending.discard(msg.partition())
                continue
            last = time.monotonic()
            value = msg.value()
            out.append((json.loads(msg.key()), None if value is None else json.loads(value)))
        return out
    finally:
        consumer.close()


def read_committed_until(
    servers: str,
    topic: str,
    done: Callable[[list[tuple[Any, Any]]], bool],
    timeout_s: float = 60.0,
) -> list[tuple[Any, Any]]:
    """:func:`read_committed` again until ``done`` holds of what it read, or ``timeout_s``
    passed; the last read either way. A batch's Kafka transaction may commit just after
    Delta's, so Delta having caught up does not mean Kafka has."""
    deadline = time.monotonic() + timeout_s
    while not done(messages := read_committed(servers, topic)) and time.monotonic() < deadline:
        time.sleep(0.5)
    return messages


# ---------------------------------------------------------------------------------------------
# the standalone Spark cluster and object store (scripts/services.sh up spark object-store)

CLUSTER_ENV = (
    "DBLOG_SPARK_MASTER",
    "DBLOG_S3_ENDPOINT",
    "AWS_ACCESS_KEY_ID",
    "AWS_SECRET_ACCESS_KEY",
)


def cluster_missing() -> list[str]:
    """The variables of ``scripts/services.sh env`` the cluster tests need and lack."""
    return [name for name in CLUSTER_ENV if not os.environ.get(name)]


def _listening(url: str) -> bool:
    parts = urlparse(url)
    try:
        socket.create_connection((parts.hostname, parts.port), timeout=2).close()
    except OSError:
        return False
    return True


def ensure_cluster() -> None:
    """Like the other local services: started on first use when they are down."""
    if _listening(os.environ["DBLOG_SPARK_MASTER"]) and _listening(os.environ["DBLOG_S3_ENDPOINT"]):
        return
    done = subprocess.run(
        ["bash", str(SERVICES_SH), "up", "spark", "object-store"],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, f"services.sh up spark object-store failed: {done.stderr[-3000:]}"


def s3_storage_options() -> dict[str, str]:
    """The object store for another engine (``deltalake``), from the same environment."""
    return {
        "AWS_ENDPOINT_URL": os.environ["DBLOG_S3_ENDPOINT"],
        "AWS_ACCESS_KEY_ID": os.environ["AWS_ACCESS_KEY_ID"],
        "AWS_SECRET_ACCESS_KEY": os.environ["AWS_SECRET_ACCESS_KEY"],
        "AWS_REGION": os.environ.get("AWS_REGION", "us-east-1"),
        "AWS_ALLOW_HTTP": "true",
    }
