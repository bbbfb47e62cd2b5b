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
from dibs.verify import read_history
from dibs.verify.harness import EtcdCluster

RUN_EARLY = True  # long: started first under pytest -n (conftest), not last

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
def test_verify_on_etcd_under_leader_kills_pauses_and_restarts_is_clean(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # The store stamps its times on the client, before its Txn: the checkers order
    # its writes by their calls (Store.client_stamps, docs/reliability.md).
    path = tmp_path / "h.jsonl"
    argv = ["verify", "--cluster", "etcd:3", "--faults", "kill-leader,pause-member,restart-member"]
    argv += ["--after", "2", "--quiet", "--json", "--shrink", "1", "--witnesses", "1"]
    code = main([*argv, "--budget", "60", "--history", str(path)])
    figures = json.loads(capsys.readouterr().out)
    print(f"\netcd:3 run: {figures['anomalies']} anomalies {figures['anomaly_kinds']}")
    print(f"faults {figures['faults']}, outage {figures['cluster']['write_outage']}")
    assert figures["verdict"] == "ok" and code == 0, figures["evidence"][:3]
    for fault in ("kill-leader", "pause-member", "restart-member"):
        assert figures["faults"].get(fault) == 1
    history = read_history(path)
    assert history.header["client_stamps"] and history.header["holds_outlive_ttl"]
    # etcd leases are whole seconds, at least 2: so are the workload's TTLs.
    ttls = {op.args["ttl"] for op in history.ops if op.fn in ("claim", "extend")} - {None}
    assert ttls and all(ttl >= 2 and ttl == int(ttl) for ttl in ttls), ttls
