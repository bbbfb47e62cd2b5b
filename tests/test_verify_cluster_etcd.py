"""``dibs verify --cluster etcd:3``: a private 3-member etcd, its fault injectors, and a clean run.

The members run Debian's ``etcd`` on free loopback ports (``scripts/cluster-ensure.sh``
installs it); the leader is found through each member's gateway
``/v3/maintenance/status``. One cluster per test.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from dibs.verify._cluster import EtcdCluster

CLUSTER_TIMEOUT = 300


@pytest.mark.timeout(CLUSTER_TIMEOUT)
def test_an_etcd_cluster_elects_rejoins_and_is_removed() -> None:
    cluster = EtcdCluster(3)
    root = cluster.root
    try:
        cluster.start()
        leader = cluster.wait_leader()
        assert {cluster.status(i)["leader"] for i in range(3)} == {
            cluster.status(leader)["header"]["member_id"]
        }
        cluster.kill(leader)
        second = cluster.wait_leader(not_=leader)
        cluster.restart(leader, graceful=False)  # rejoins on its data
        assert cluster.status(leader)["leader"] == cluster.status(second)["header"]["member_id"]
        cluster.pause(second)
        third = cluster.wait_leader(not_=second)
        cluster.resume(second)
        follower = next(i for i in range(3) if i != third)
        cluster.restart(follower)
        assert cluster.wait_leader() in range(3)
        pids = [m.pid for m in cluster.members]
    finally:
        cluster.close()
    assert not root.exists()
    for pid in pids:
        assert not Path(f"/proc/{pid}").exists() or "zombie" in _state(pid)


def _state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/status").read_text().lower()
    except OSError:
        return "zombie"
