"""The ZooKeeper leader lease (``ha.zookeeper``): one active stream process per stream name.

Candidates queue on ``/dblog/<name>/leader`` (kazoo's lock recipe: ephemeral sequential nodes).
The winner's node sequence number is its fencing token: ZooKeeper hands them out in increasing
order, so a newer leader always holds a larger token than any deposed one. The token is written
to the metadata store (:meth:`MetadataStore.take_lead`), which then refuses the old leader's
writes; the Kafka sink's transactional id fences its producer at the broker.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time

from airflow_dblog.config import HaConfig
from airflow_dblog.engine.metadata.database import Fence
from airflow_dblog.errors import DblogError, FencedError

log = logging.getLogger(__name__)


class LeaderLease:
    def __init__(self, ha: HaConfig, stream: str, identity: str | None = None) -> None:
        from kazoo.client import KazooClient

        self.stream = stream
        self.identity = identity or f"{socket.gethostname()}:{os.getpid()}"
        self.path = f"/dblog/{stream}/leader"
        self.client = KazooClient(hosts=ha.zookeeper, timeout=ha.session_timeout_s)
        self.lost = threading.Event()
        self._lock = self.client.Lock(self.path, self.identity)
        self._hosts, self._start_s = ha.zookeeper, ha.session_timeout_s * 1.5

    def acquire(self, stop: threading.Event, poll_s: float = 1.0) -> Fence | None:
        """Block until this process leads (its fence) or ``stop`` is set (``None``)."""
        from kazoo.exceptions import LockTimeout
        from kazoo.handlers.threading import KazooTimeoutError

        try:
            self.client.start(timeout=self._start_s)
        except KazooTimeoutError:
            raise DblogError(
                f"cannot reach ZooKeeper at {self._hosts}", "check ha.zookeeper and the ensemble"
            ) from None
        waited = time.monotonic()
        logged = False
        while not stop.is_set():
            try:
                if self._lock.acquire(timeout=poll_s):
                    break
            except LockTimeout:
                pass
            if not logged:
                log.info("standby for stream %s: waiting for the leader lease", self.stream)
                logged = True
        else:
            return None
        self.client.add_listener(self._on_state)
        token = int(self._lock.node[-10:])
        log.info(
            "leading stream %s with lease token %d (waited %.1f s)",
            self.stream,
            token,
            time.monotonic() - waited,
        )
        return Fence(self.stream, token, self.check)

    def _on_state(self, state: str) -> None:
        # SUSPENDED: the session may already be gone and another process leading; stop writing
        if state != "CONNECTED":
            self.lost.set()

    def check(self) -> None:
        if self.lost.is_set():
            raise FencedError(
                f"stream {self.stream}: this process lost its ZooKeeper session and with it the"
                " leader lease; it stops without writing",
                "restart it to queue as a standby",
            )

    def close(self) -> None:
        try:
            if self._lock.is_acquired and not self.lost.is_set():
                self._lock.release()
        finally:
            self.client.stop()
            self.client.close()
