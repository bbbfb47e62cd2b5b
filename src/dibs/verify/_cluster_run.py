"""``dibs verify --cluster``: start a cluster, run the workload on it under a fault plan, remove it.

Clusters (:func:`parse_cluster`):

* ``etcd:N`` — N etcd members (:class:`~dibs.verify.harness.EtcdCluster`);
  the store is ``etcd://h:p,h:p,...``. Faults, each round in the order given:
  ``kill-leader`` (``kill -9`` the leader, wait for a new one, start the dead
  member again on its data), ``pause-member`` (SIGSTOP the leader past an
  election, then SIGCONT) and ``restart-member`` (restart a follower with
  SIGTERM).
* ``postgresql-ha`` — PostgreSQL under Patroni
  (:class:`~dibs.verify.harness.PostgresHA`); the store is the libpq
  multi-host URL with ``target_session_attrs=read-write``. Fault:
  ``failover`` (the primary's member dies with ``kill -9``, with its standbys
  held ``lag`` seconds behind; Patroni promotes one).

A plan waits until the clients have invoked ``warmup_ops`` ops and ``warmup``
seconds have passed since their first, injects its faults (``rounds`` times for
etcd), lets the clients run ``after`` seconds more on the healed cluster, and
then stops them. The history records every step, and :func:`outage` measures
the write outage around a failover from it.
"""

from __future__ import annotations

import math
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from dibs.exceptions import InvalidInput
from dibs.verify._history import OK, History
from dibs.verify._runner import Plan, Progress, Record, run_workload
from dibs.verify._workload import Workload
from dibs.verify.harness import REPLICATION, EtcdCluster, PostgresHA

__all__ = [
    "CLUSTER_FAULTS",
    "ClusterRun",
    "outage",
    "parse_cluster",
    "run_on_cluster",
]

CLUSTER_FAULTS: dict[str, tuple[str, ...]] = {
    "etcd": ("kill-leader", "pause-member", "restart-member"),
    "postgresql-ha": ("failover",),
}
"""The faults each kind of cluster takes, in the order a round injects them."""

WRITES = frozenset({"claim", "confirm", "extend", "release"})


@dataclass(frozen=True)
class ClusterRun:
    """How to run on a cluster: which one, its faults, and the plan's timing (seconds)."""

    kind: str
    members: int = 3
    faults: tuple[str, ...] = ()
    replication: str = "sync"
    lag: float = 1.0
    """postgresql-ha: seconds the standbys are held behind before the primary dies."""
    warmup: float = 2.0
    """Seconds of workload before the first fault, counted from the clients' first ops."""
    warmup_ops: int = 200
    """...and at least this many ops invoked: a client process takes a while to start."""
    after: float = 3.0
    rounds: int = 1
    """etcd: how many times the fault list is run through."""
    pause: float = 3.0
    """etcd: how long a paused member stays stopped (past an election timeout)."""

    def describe(self) -> str:
        if self.kind == "etcd":
            return f"etcd:{self.members}"
        return f"postgresql-ha ({self.replication} replication)"


def parse_cluster(
    spec: str, faults: tuple[str, ...], replication: str | None = None, **timing: Any
) -> ClusterRun:
    """``etcd:3`` or ``postgresql-ha``, with its faults, checked.

    Raises :class:`~dibs.InvalidInput` naming the bad value: an unknown
    cluster, a fault it does not take, or replication given for etcd.
    """
    kind, _, count = spec.partition(":")
    if kind == "etcd":
        try:
            members = int(count or "3")
        except ValueError:
            members = 0
        if not 1 <= members <= 9:
            raise InvalidInput(
                f"etcd:N takes 1 to 9 members, got {spec!r}", field="cluster", value=spec
            )
    elif kind == "postgresql-ha" and not count:
        members = 3
    else:
        raise InvalidInput(
            f"unknown cluster {spec!r}: etcd:N (N members) or postgresql-ha",
            field="cluster",
            value=spec,
        )
    allowed = CLUSTER_FAULTS[kind]
    wrong = [f for f in faults if f not in allowed]
    if wrong:
        raise InvalidInput(
            f"fault(s) {wrong} do not apply to --cluster {kind} (it takes {', '.join(allowed)})",
            field="faults",
            value=",".join(faults),
        )
    if replication is not None and kind != "postgresql-ha":
        raise InvalidInput(
            "--replication applies to --cluster postgresql-ha only",
            field="replication",
            value=replication,
        )
    if replication is not None and replication not in REPLICATION:
        raise InvalidInput(
            f"--replication is one of {', '.join(REPLICATION)}, got {replication!r}",
            field="replication",
            value=replication,
        )
    if kind == "postgresql-ha" and timing.get("rounds", 1) != 1:
        raise InvalidInput(
            "--rounds applies to etcd: postgresql-ha fails over once (the old primary's "
            "machine stays dead)",
            field="rounds",
            value=timing["rounds"],
        )
    return ClusterRun(kind, members, faults, replication or "sync", **timing)


def run_on_cluster(
    run: ClusterRun,
    workload: Workload,
    history: str | Path,
    *,
    progress: Progress | None = None,
    started: Callable[[str], None] | None = None,
) -> Path:
    """Start the cluster, run ``workload`` on it (its ``store`` replaced) under the plan, remove it.

    ``started(url)`` is called once the cluster is up, with its (redactable) store URL.
    Raises :class:`~dibs.verify.harness.ServerSetupError` when the cluster
    cannot be started.
    """
    header: dict[str, Any] = {
        "cluster": {
            "kind": run.kind,
            "members": run.members,
            "faults": list(run.faults),
            "replication": run.replication if run.kind == "postgresql-ha" else None,
            "lag": run.lag if run.kind == "postgresql-ha" else None,
        }
    }
    if run.kind == "postgresql-ha":
        with PostgresHA(replication=run.replication) as pg:
            if started is not None:
                started(pg.url())
            work = replace(workload, store=pg.url(), admin_url=pg.url(admin=True))
            return run_workload(
                work, history, progress=progress, plan=_pg_plan(run, pg), header=header
            )
    # Any store on etcd holds claims as leases, and a lease restarts its TTL on a
    # leader change: its holds may outlive their TTL (never end before it).
    header["holds_outlive_ttl"] = True
    with EtcdCluster(run.members) as etcd:
        url = etcd.url(f"dibs-verify-{workload.run}")
        if started is not None:
            started(url)
        work = replace(workload, store=url)
        return run_workload(
            work, history, progress=progress, plan=_etcd_plan(run, etcd), header=header
        )


def _warm_up(run: ClusterRun, invoked: Callable[[], int], patience: float = 120.0) -> None:
    """Wait until the clients are running: their first op, then ``warmup`` s and ``warmup_ops``."""
    deadline = time.monotonic() + patience
    while invoked() == 0 and time.monotonic() < deadline:
        time.sleep(0.05)
    began = time.monotonic()
    while time.monotonic() < deadline and (
        invoked() < run.warmup_ops or time.monotonic() - began < run.warmup
    ):
        time.sleep(0.05)


def _pg_plan(run: ClusterRun, pg: PostgresHA) -> Plan:
    def plan(record: Record, invoked: Callable[[], int]) -> None:
        _warm_up(run, invoked)
        if "failover" in run.faults:
            pg.fail_primary(lag=run.lag, record=record)
        time.sleep(run.after)

    return plan


def _etcd_plan(run: ClusterRun, etcd: EtcdCluster) -> Plan:
    rng = random.Random(0)

    def plan(record: Record, invoked: Callable[[], int]) -> None:
        _warm_up(run, invoked)
        for _ in range(run.rounds if run.faults else 0):
            for fault in run.faults:
                leader = etcd.wait_leader()
                if fault == "kill-leader":
                    etcd.kill(leader)
                    record({"f": "kill-leader", "member": leader})
                    new = etcd.wait_leader(not_=leader)
                    record({"f": "elected", "member": new})
                    time.sleep(1.0)
                    etcd.restart(leader, graceful=False)
                    record({"f": "rejoined", "member": leader})
                elif fault == "pause-member":
                    etcd.pause(leader)
                    record({"f": "pause-member", "member": leader})
                    time.sleep(run.pause)
                    etcd.resume(leader)
                    record({"f": "resumed", "member": leader})
                elif fault == "restart-member":
                    follower = rng.choice([i for i in range(len(etcd.members)) if i != leader])
                    etcd.restart(follower)
                    record({"f": "restart-member", "member": follower})
                time.sleep(1.0)
        time.sleep(run.after)

    return plan


def outage(history: History) -> dict[str, float] | None:
    """The write outage around the first failover (or leader kill) in ``history``, in seconds.

    ``after_kill``: from the kill to the first write acknowledged by the new
    primary; ``from_last_write``: from the last write acknowledged before the
    kill (with standbys held behind under synchronous replication, commits
    already wait then). None when the history has no such fault or no write
    acknowledged after it.
    """
    kill = next(
        (e for e in history.nemesis if e.get("f") in ("failover", "kill-leader")),
        None,
    )
    if kill is None:
        return None
    t = float(kill["t"])
    writes = [op for op in history.ops if op.fn in WRITES and op.status == OK]
    after = min((op.end for op in writes if op.start >= t), default=math.inf)
    before = max((op.end for op in writes if op.end <= t), default=t)
    if math.isinf(after):
        return None
    return {"after_kill": round(after - t, 3), "from_last_write": round(after - before, 3)}
