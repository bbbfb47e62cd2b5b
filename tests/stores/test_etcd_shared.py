"""Shared holds on etcd: the race the contract's pressure test meets only sometimes, readers
on real leases, and a writer taking over more dead readers than one transaction holds.

A writer's claim transaction must fail if a reader took the unit after the writer's view
(the range compare over the unit key and its readers' keys). Readers here churn without
rest, so a writer's view often finds the last one just gone and a new one comes while the
writer's grant is on the wire; check_rw_history then sees every overlap. Both faces.
"""

from __future__ import annotations

import functools
import threading
import time

import pytest

import dibs
from dibs import ClaimState, HoldLost, HoldLostReason, Store, Target, Unit
from dibs.testing.shared import _join, check_rw_history
from etcd_fixtures import fresh_prefix
from eventually import eventually

DOC = Unit("doc", "1")
DOC_B = Unit("doc", "2")
READERS = 6
WRITERS = 4
ROUNDS = 150


@pytest.fixture(params=["etcd", "aio-etcd"])
def store_kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def test_a_writer_never_gets_in_beside_a_reader_that_came_after_its_view(store: Store) -> None:
    lock = threading.Lock()
    events: list[tuple[int, str, str, Target]] = []
    counter = iter(range(10**9))
    start = threading.Barrier(READERS + WRITERS)

    def work(n: int, mode: str) -> None:
        start.wait()
        for _ in range(ROUNDS):
            with lock:
                step = next(counter)
            result = store.claim(DOC, holder=f"h{n}", mode=mode)
            if not result:
                continue
            assert result.claim is not None and result.claim.mode == mode
            with lock:
                events.append((step, "in", mode, DOC))
            time.sleep(0.001)  # held a while, so an overlap shows on the timeline
            with lock:
                events.append((step, "out", mode, DOC))
            assert store.release(result.claim.id, holder=f"h{n}", fence=result.claim.fence)

    _join(
        [functools.partial(work, n, "shared") for n in range(READERS)]
        + [functools.partial(work, READERS + n, "exclusive") for n in range(WRITERS)]
    )
    assert any(e[2] == "shared" for e in events)
    check_rw_history(events)


def test_a_reader_on_a_lease_lapses_and_a_writer_takes_it_over(etcd_url: str) -> None:
    """Real leases (no test clock): a lapsed reader is freed for a writer, not a reader."""
    with dibs.open(f"{etcd_url}/{fresh_prefix()}") as store:
        ann = store.claim(DOC, holder="ann", mode="shared", ttl=2).claim
        bob = store.claim(DOC, holder="bob", mode="shared", ttl=2).claim
        assert ann is not None and bob is not None
        assert not store.claim(DOC, holder="wes")
        eventually(lambda: store.holder_of(DOC) is None, "both readers' leases lapsed")
        cy = store.claim(DOC, holder="cy", mode="shared").claim  # takes nobody over
        assert cy is not None
        assert store.get(ann.id).taken_over is False  # type: ignore[union-attr]
        assert store.release(cy.id, holder="cy", fence=cy.fence)
        wes = store.claim(DOC, holder="wes", ttl=5).claim
        assert wes is not None and wes.fence > cy.fence
        for reader in (ann, bob):
            with pytest.raises(HoldLost) as raised:
                store.confirm(reader.id, holder=reader.holder, fence=reader.fence)
            assert raised.value.reason is HoldLostReason.TAKEN_OVER
            old = store.get(reader.id)
            assert old is not None and old.state is ClaimState.EXPIRED and old.mode == "shared"
        assert not store.claim(DOC, holder="dee", mode="shared")


def test_a_writer_taking_over_more_dead_readers_than_one_txn_holds(etcd_url: str) -> None:
    """Marks past etcd's limits are made right after the grant; keys left behind cost a read."""
    clock = dibs.FakeClock()
    with dibs.open(f"{etcd_url}/{fresh_prefix()}", clock=clock) as store:
        readers = [
            store.claim(DOC, holder=f"r{i}", mode="shared", ttl=10).claim for i in range(150)
        ]
        clock.advance(11)
        wes = store.claim(DOC, holder="wes").claim
        assert wes is not None
        for reader in readers:
            assert reader is not None
            with pytest.raises(HoldLost) as raised:
                store.confirm(reader.id, holder=reader.holder, fence=reader.fence)
            assert raised.value.reason is HoldLostReason.TAKEN_OVER
        assert store.holder_of(DOC) == "wes"
        assert store.release(wes.id, holder="wes", fence=wes.fence)
        again = store.claim(DOC, holder="xi")  # past the dead readers' keys left behind
        assert again and again.claim is not None
        assert store.release(again.claim.id, holder="xi", fence=again.claim.fence)
        clock.advance(store.request_retention + 1)
        store.sweep()
        store.claim(DOC_B, holder="last")  # the newest claim is never purged
        store.sweep()
        assert store.claim(DOC, holder="yu", mode="shared") and store.holder_of(DOC) == "yu"
        ops = store._ops  # type: ignore[attr-defined]
        left = store._driver.run(ops._scan(ops.keys.unit(DOC)))  # type: ignore[attr-defined]
        assert [kv.value for kv in left] == [b"yu"]  # the purge took the dead readers' keys
