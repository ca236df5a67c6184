"""A throwaway MariaDB server of a test's own: for server-wide settings the shared one must not get.

Semi-synchronous replication, a primary with a replica, ``SET GLOBAL`` of anything: tests that
need those start their own ``mariadbd`` on a free loopback port, with a fresh datadir in a
temporary directory, configured for CDC like the shared server of ``scripts/services.sh``
(ROW binlog with full images and metadata, GTID strict mode, ``server_id``). The user
``dblog``/``dblog`` has ALL privileges. :func:`private_mariadb` stops the server and removes
its files afterwards.
"""

from __future__ import annotations

import contextlib
import getpass
import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator, Mapping
from pathlib import Path

from tests.support.services import (
    MySQLServer,
    ServiceUnavailable,
    _free_port,
    run_sql,
    wait_until_ready,
)

MARIADBD = "/usr/sbin/mariadbd"
INSTALL_DB = "mariadb-install-db"
CLIENT = "mariadb"

# What scripts/services.sh gives the shared server, minus what only suits a long-lived one.
CDC_OPTIONS: dict[str, str] = {
    "log_bin": "mariadb-bin",
    "binlog_format": "ROW",
    "binlog_row_image": "FULL",
    "binlog_row_metadata": "FULL",
    "binlog_annotate_row_events": "OFF",
    "log_slave_updates": "ON",
    "gtid_strict_mode": "ON",
    "character_set_server": "utf8mb4",
    "collation_server": "utf8mb4_general_ci",
    "default_time_zone": "'+00:00'",
    "performance_schema": "OFF",
    "innodb_buffer_pool_size": "64M",
    "innodb_flush_log_at_trx_commit": "2",
    "sync_binlog": "0",
    "max_connections": "100",
}


@contextlib.contextmanager
def private_mariadb(
    server_id: int = 1, options: Mapping[str, str] | None = None
) -> Iterator[MySQLServer]:
    """A running private MariaDB as a :class:`MySQLServer`; stopped and deleted on exit.

    ``options`` are extra ``[mariadbd]`` settings (they override :data:`CDC_OPTIONS`); see
    :func:`primary_and_replica` for two servers replicating.
    """
    # Short path: the unix socket path must stay under ~107 bytes.
    base = Path(tempfile.mkdtemp(prefix="dblog-mdb-"))
    proc: subprocess.Popen[bytes] | None = None
    try:
        port = _free_port()
        socket_path = base / "mysqld.sock"
        cnf = _write_cnf(base, port, socket_path, server_id, {**CDC_OPTIONS, **(options or {})})
        _install(base)
        with open(base / "mariadbd.log", "ab") as log:
            proc = subprocess.Popen(
                [MARIADBD, f"--defaults-file={cnf}"],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        wait_until_ready(
            "private mariadb (socket)", lambda: _admin_sql(socket_path, "SELECT 1", proc), 60
        )
        _admin_sql(
            socket_path,
            "SET sql_log_bin = 0; "
            "CREATE USER 'dblog'@'%' IDENTIFIED BY 'dblog'; "
            "GRANT ALL PRIVILEGES ON *.* TO 'dblog'@'%' WITH GRANT OPTION; "
            "CREATE USER 'dblog'@'localhost' IDENTIFIED BY 'dblog'; "
            "GRANT ALL PRIVILEGES ON *.* TO 'dblog'@'localhost' WITH GRANT OPTION;",
            proc,
        )
        server = MySQLServer("127.0.0.1", port, flavor="mariadb", backend="private")
        wait_until_ready("private mariadb (tcp)", lambda: server.connect().close(), 30)
        yield server
    finally:
        if proc is not None and proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(30)
        shutil.rmtree(base, ignore_errors=True)


@contextlib.contextmanager
def primary_and_replica(
    primary_id: int, replica_id: int
) -> Iterator[tuple[MySQLServer, MySQLServer]]:
    """Two private servers, the second replicating the first by GTID from its first event."""
    with private_mariadb(primary_id) as primary, private_mariadb(replica_id) as replica:
        run_sql(
            replica,
            f"CHANGE MASTER TO MASTER_HOST='127.0.0.1', MASTER_PORT={primary.port},"
            " MASTER_USER='dblog', MASTER_PASSWORD='dblog', MASTER_USE_GTID=slave_pos",
            "START SLAVE",
        )
        yield primary, replica


def promote(primary: MySQLServer, replica: MySQLServer, timeout_s: float) -> None:
    """Once the replica has applied everything the primary logged, make it a primary."""
    head = run_sql(primary, "SELECT @@gtid_binlog_pos")[0][0]
    deadline = time.monotonic() + timeout_s
    while run_sql(replica, "SELECT @@gtid_slave_pos")[0][0] != head:
        assert time.monotonic() < deadline, "the replica did not catch up"
        time.sleep(0.2)
    run_sql(replica, "STOP SLAVE", "RESET SLAVE ALL")


def _write_cnf(
    base: Path, port: int, socket_path: Path, server_id: int, options: Mapping[str, str]
) -> Path:
    (base / "tmp").mkdir()
    lines = [
        "[mariadbd]",
        "user = root" if _running_as_root() else "",
        f"datadir = {base / 'data'}",
        f"tmpdir = {base / 'tmp'}",
        f"socket = {socket_path}",
        f"pid-file = {base / 'mysqld.pid'}",
        f"port = {port}",
        "bind-address = 127.0.0.1",
        "skip-name-resolve",
        f"log-error = {base / 'mariadbd.log'}",
        f"server_id = {server_id}",
    ]
    for key, value in options.items():
        if key == "log_bin":
            value = str(base / "binlog" / value)
            lines.append(f"log_bin_index = {value}.index")
        lines.append(f"{key} = {value}")
    (base / "binlog").mkdir()
    cnf = base / "my.cnf"
    cnf.write_text("\n".join(line for line in lines if line) + "\n")
    return cnf


def _running_as_root() -> bool:
    return os.geteuid() == 0


def _install(base: Path) -> None:
    result = subprocess.run(
        [
            INSTALL_DB,
            "--no-defaults",
            f"--datadir={base / 'data'}",
            f"--user={getpass.getuser()}",
            "--auth-root-authentication-method=socket",
            "--skip-test-db",
        ],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    if result.returncode != 0:
        raise ServiceUnavailable(f"mariadb-install-db failed: {result.stdout[-2000:]}")


def _admin_sql(socket_path: Path, sql: str, proc: subprocess.Popen[bytes] | None) -> None:
    """SQL as the OS user over the socket (``unix_socket`` auth, as scripts/services.sh does)."""
    if proc is not None and proc.poll() is not None:
        raise ServiceUnavailable(f"mariadbd exited with {proc.returncode}")
    client = [CLIENT, "--no-defaults", "--protocol=socket", f"--socket={socket_path}"]
    subprocess.run(
        [*client, f"-u{getpass.getuser()}", "-N", "-B", "-e", sql],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        timeout=30,
        check=True,
    )
