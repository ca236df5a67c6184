"""A throwaway PostgreSQL primary and a streaming standby of it, for promotion tests.

Configured for CDC like the shared server of ``scripts/services.sh`` (``wal_level=logical``,
the superuser ``dblog``/``dblog`` over loopback TCP only, database ``dblog``). As root the
servers run as the ``postgres`` OS user, in directories that user owns.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

from tests.support.services import PostgresServer, _free_port, wait_until_ready

PG_BIN = Path("/usr/lib/postgresql/15/bin")
_AS_PG = (
    ["setpriv", "--reuid=postgres", "--regid=postgres", "--init-groups", "--"]
    if os.geteuid() == 0
    else []
)
_SETTINGS = {
    "listen_addresses": "127.0.0.1",
    "unix_socket_directories": "''",
    "wal_level": "logical",
    "max_replication_slots": "10",
    "max_wal_senders": "10",
    "hot_standby": "on",
    "fsync": "off",
    "timezone": "UTC",
}
_HBA = "host all all 127.0.0.1/32 scram-sha-256\nhost replication all 127.0.0.1/32 scram-sha-256\n"


def _as_pg(*args: str, env: dict[str, str] | None = None) -> None:
    subprocess.run([*_AS_PG, *args], check=True, capture_output=True, cwd="/", env=env)


class PrivateCluster:
    """One cluster in ``base``; ``server`` connects to it."""

    def __init__(self, base: Path) -> None:
        self.base, self.data, self.port = base, base / "data", _free_port()
        self.server = PostgresServer("127.0.0.1", self.port, backend="private")

    def start(self) -> None:
        options = " ".join(f"-c {k}={v}" for k, v in {**_SETTINGS, "port": self.port}.items())
        log = str(self.base / "postgres.log")
        _as_pg(str(PG_BIN / "pg_ctl"), "-D", str(self.data), "-l", log, "-o", options, "start")
        wait_until_ready("private postgres", lambda: self.server.connect("postgres").close(), 60)

    def stop(self) -> None:
        if (self.data / "postmaster.pid").exists():
            with contextlib.suppress(subprocess.CalledProcessError):
                _as_pg(str(PG_BIN / "pg_ctl"), "-D", str(self.data), "-m", "fast", "-w", "stop")

    def promote(self) -> None:
        _as_pg(str(PG_BIN / "pg_ctl"), "-D", str(self.data), "-w", "promote")


def _owned_dir() -> Path:
    base = Path(tempfile.mkdtemp(prefix="dblog-pg-"))
    if _AS_PG:
        shutil.chown(base, "postgres", "postgres")
    return base


@contextlib.contextmanager
def primary_and_standby() -> Iterator[tuple[PrivateCluster, PrivateCluster]]:
    """A running primary and a standby streaming from it; both stopped and deleted on exit."""
    primary, standby = PrivateCluster(_owned_dir()), PrivateCluster(_owned_dir())
    try:
        pwfile = primary.base / "pwfile"
        pwfile.write_text("dblog\n")
        if _AS_PG:
            shutil.chown(pwfile, "postgres", "postgres")
        _as_pg(
            str(PG_BIN / "initdb"), "-D", str(primary.data), "-U", "dblog",
            f"--pwfile={pwfile}", "--auth=scram-sha-256", "-E", "UTF8", "--no-locale",
        )  # fmt: skip
        (primary.data / "pg_hba.conf").write_text(_HBA)
        primary.start()
        conn = primary.server.connect("postgres")
        with conn.cursor() as cur:
            cur.execute("CREATE DATABASE dblog")
        conn.close()
        _as_pg(
            str(PG_BIN / "pg_basebackup"), "-h", "127.0.0.1", "-p", str(primary.port),
            "-U", "dblog", "-D", str(standby.data), "-R", "-X", "stream",
            # its starting checkpoint at once: the default "spread" one is paced over
            # checkpoint_completion_target of checkpoint_timeout (~90 s of idling here)
            "--checkpoint=fast",
            env={**os.environ, "PGPASSWORD": "dblog"},
        )  # fmt: skip
        standby.start()
        yield primary, standby
    finally:
        for cluster in (standby, primary):
            cluster.stop()
            shutil.rmtree(cluster.base, ignore_errors=True)
