"""The ZooKeeper leader lease on a real ZooKeeper: one leader, ordered tokens, takeover."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from airflow_dblog.config import HaConfig
from airflow_dblog.engine.leader import LeaderLease
from airflow_dblog.errors import DblogError, FencedError

pytestmark = pytest.mark.integration


def test_one_leader_at_a_time_and_a_standby_takes_over_with_a_larger_token(
    zookeeper_server: Any, zk_path: str
) -> None:
    ha = HaConfig(zookeeper_server.connect_string(zk_path), session_timeout_s=4)
    first, second = LeaderLease(ha, "s", "a"), LeaderLease(ha, "s", "b")
    stop = threading.Event()
    fence_a = first.acquire(stop)
    assert fence_a is not None
    got: list[Any] = []
    standby = threading.Thread(target=lambda: got.append(second.acquire(stop)))
    standby.start()
    time.sleep(3)
    assert got == [], "a second process led while the first held the lease"
    fence_a.alive()
    died = time.monotonic()
    first.client.stop()  # the leader's session ends, as when its process dies
    standby.join(timeout=30)
    assert got and got[0] is not None
    print(f"takeover after the leader's session ended: {time.monotonic() - died:.2f} s")
    assert got[0].token > fence_a.token
    second.close()
    first.client.close()


def test_a_lost_session_makes_the_lease_refuse_writes(zookeeper_server: Any, zk_path: str) -> None:
    lease = LeaderLease(HaConfig(zookeeper_server.connect_string(zk_path)), "s")
    fence = lease.acquire(threading.Event())
    assert fence is not None
    lease.client.stop()  # the listener sees LOST, as after a pause past the session timeout
    with pytest.raises(FencedError, match="lost its ZooKeeper session"):
        fence.alive()
    lease.client.close()


def test_a_stopped_standby_returns_without_leading(zookeeper_server: Any, zk_path: str) -> None:
    ha = HaConfig(zookeeper_server.connect_string(zk_path))
    leader, standby = LeaderLease(ha, "s"), LeaderLease(ha, "s")
    assert leader.acquire(threading.Event()) is not None
    stop = threading.Event()
    threading.Timer(1.5, stop.set).start()
    assert standby.acquire(stop) is None
    standby.close()
    leader.close()


def test_unreachable_zookeeper_is_one_line() -> None:
    lease = LeaderLease(HaConfig("127.0.0.1:1", session_timeout_s=2), "s")
    with pytest.raises(DblogError, match=r"cannot reach ZooKeeper at 127.0.0.1:1; check ha"):
        lease.acquire(threading.Event())
    lease.client.close()
