"""``dibs verify --cluster etcd:3``: a private 3-member etcd, its fault injectors, and a clean run.

The members run Debian's ``etcd`` on free loopback ports (``scripts/cluster-ensure.sh``
installs it); the leader is found through each member's gateway
``/v3/maintenance/status``. One cluster per test, a few seconds of workload.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dibs.cli import main
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


@pytest.mark.timeout(CLUSTER_TIMEOUT)
@pytest.mark.xfail(
    reason=(
        "the etcd store stamps a claim's created_at (and a release's updated_at) on the "
        "client before its Txn, so a grant serialized after a release can carry the earlier "
        "time: grant-over-live-claim in the log and a store time going back on a unit "
        "(docs/reliability.md, 'what serializes'); clean in some runs, so not strict"
    ),
    strict=False,
)
def test_verify_on_etcd_under_leader_kills_pauses_and_restarts_is_clean(
    capsys: pytest.CaptureFixture[str],
) -> None:
    argv = ["verify", "--cluster", "etcd:3", "--faults", "kill-leader,pause-member,restart-member"]
    argv += ["--after", "2", "--quiet", "--json", "--shrink", "1", "--witnesses", "1"]
    code = main([*argv, "--budget", "60"])
    figures = json.loads(capsys.readouterr().out)
    print(f"\netcd:3 run: {figures['anomalies']} anomalies {figures['anomaly_kinds']}")
    print(f"faults {figures['faults']}, outage {figures['cluster']['write_outage']}")
    assert figures["verdict"] == "ok" and code == 0, figures["evidence"][:3]
    for fault in ("kill-leader", "pause-member", "restart-member"):
        assert figures["faults"].get(fault) == 1
