"""The etcd store on a 3-member cluster while members die, stop and come back.

Threads race for every unit while the leader is killed (``kill -9``) and
restarted and then the new leader is paused (``SIGSTOP``) and resumed. A call
that gets :class:`~dibs.StoreUnavailable` is retried with its request ID, as
the docs tell callers to. Afterwards every unit has exactly one winner, and
every grant that was acknowledged is stored with the fence it was given.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pytest

import dibs
from dibs import StoreUnavailable, Unit
from dibs.verify.harness import EtcdCluster
from etcd_fixtures import cluster
from eventually import eventually

THREADS = 4
UNITS = 240


@pytest.fixture(scope="module")
def three() -> Iterator[EtcdCluster]:
    with cluster(3) as running:
        yield running


def _claim_retrying(
    store: dibs.Store, unit: Unit, holder: str, unavailable: list[int]
) -> dibs.ClaimResult:
    request_id = f"{holder}:{unit.slot}"
    while True:
        try:
            return store.claim(unit, holder=holder, request_id=request_id)
        except StoreUnavailable:
            unavailable.append(1)  # list.append is atomic: a counter for every thread
            time.sleep(0.05)  # paced, as a client's retry would be


@pytest.mark.timeout(300)
def test_one_winner_per_unit_and_nothing_acknowledged_lost_across_faults(
    three: EtcdCluster,
) -> None:
    url = three.url("faults") + "?timeout=1&connect_timeout=0.3"
    store = dibs.open(url)
    units = [Unit("seat", str(i)) for i in range(UNITS)]
    granted: list[tuple[str, dibs.Claim]] = []
    lock = threading.Lock()  # guards granted
    done = threading.Event()
    unavailable: list[int] = []
    injected: list[str] = []

    def racer(n: int) -> None:
        holder = f"t{n}"
        for i in range(UNITS):
            result = _claim_retrying(store, units[(i * 7 + n * 61) % UNITS], holder, unavailable)
            if result and result.claim is not None and result.claim.holder == holder:
                with lock:
                    granted.append((holder, result.claim))

    def progress() -> int:
        with lock:
            return len(granted)

    def faults() -> None:
        # Each fault waits for some grants first, so claims really run through it.
        for wait_for, fault in [(30, "kill"), (70, "restart"), (110, "pause"), (150, "resume")]:
            eventually(lambda n=wait_for: progress() >= n or done.is_set(), f"{wait_for} grants")
            if fault == "kill":
                killed = three.wait_leader()
                three.kill(killed)
            elif fault == "restart":
                three.restart(killed, graceful=False)
            elif fault == "pause":
                paused = three.wait_leader()
                three.pause(paused)
            else:
                three.resume(paused)
            injected.append(fault)

    threads = [threading.Thread(target=racer, args=(n,)) for n in range(THREADS)]
    injector = threading.Thread(target=faults)
    injector.start()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    done.set()
    injector.join()
    for member in three.members:
        member.resume()
    three.wait_ready()

    assert injected == ["kill", "restart", "pause", "resume"], injected
    print(f"{len(unavailable)} calls met StoreUnavailable and were retried")
    winners: dict[Unit, list[str]] = {}
    fences: list[int] = []
    for holder, claim in granted:
        (unit,) = claim.units
        winners.setdefault(unit, []).append(holder)
        fences.append(claim.fence)
        stored = store.get(claim.id)
        assert stored is not None, f"acknowledged claim {claim.id} was lost"
        assert (stored.holder, stored.fence) == (holder, claim.fence)
    assert set(winners) == set(units)
    doubles = {u: h for u, h in winners.items() if len(set(h)) != 1}
    assert not doubles, f"units granted to two holders: {doubles}"
    assert len(set(fences)) == len(set(c.id for _, c in granted))
    for unit, (holder, *_) in winners.items():
        assert store.holder_of(unit) == holder
    store.close()
