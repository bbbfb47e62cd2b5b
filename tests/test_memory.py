"""memory:// internals the contract cannot see: its indexes under races and after purges."""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from _race import race
from dibs import FakeClock, Span, Unit
from dibs.stores.memory import MemoryStore

QUICK = True  # in `pytest -m quick` (conftest.is_quick: not slow, no server)


@pytest.fixture
def hard_switching() -> Iterator[None]:
    """Switch threads every microsecond, so the claim path's few bytecodes interleave."""
    before = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    yield
    sys.setswitchinterval(before)


class _YieldingDict(dict[str, Any]):
    """A dict that lets other threads run right after each write, as a preemption there would.

    The claim path's window between making a holder's index and adding to it
    is a bytecode or two; yielding there makes every claim a chance to race.
    """

    def setdefault(self, key: str, default: Any = None) -> Any:
        value = super().setdefault(key, default)
        time.sleep(0)
        return value

    def __setitem__(self, key: str, value: Any) -> None:
        super().__setitem__(key, value)
        time.sleep(0)


@pytest.mark.usefixtures("hard_switching")
def test_claims_of_finds_every_live_claim_while_sweeps_prune_holders() -> None:
    """A sweep must never drop a holder's index while a claim is adding to it.

    Each claimer claims for a fresh holder, looks itself up with claims_of,
    then releases, so the holder's index empties and the sweepers prune it.
    """
    clock = FakeClock()
    store = MemoryStore(clock=clock, request_retention=1)
    store._by_holder = _YieldingDict()
    claimers, sweepers, rounds = 8, 2, 500
    running = [claimers]
    lock = threading.Lock()  # guards running and lost
    lost: list[str] = []

    def run(n: int) -> None:
        if n < sweepers:
            while running[0]:
                clock.advance(2)  # purge released claims, so each sweep stays short
                store.sweep()
            return
        for i in range(rounds):
            holder = f"h{n}-{i}"
            claim = store.claim(Unit("race", holder), holder=holder).claim
            assert claim is not None
            if claim.id not in [c.id for c in store.claims_of(holder)]:
                with lock:
                    lost.append(holder)
            assert store.release(claim.id, holder=holder, fence=claim.fence)
        with lock:
            running[0] -= 1

    race(claimers + sweepers, run)
    assert not lost, f"{len(lost)} live claims missing from claims_of, e.g. {lost[:5]}"


def test_an_expired_hold_leaves_the_indexes_when_it_is_purged() -> None:
    """Swept holds keep their index entries (the reason rule) only until their purge."""
    clock = FakeClock()
    store = MemoryStore(clock=clock, request_retention=10)
    for i in range(50):
        store.claim([Unit("seat", str(i)), Span("room", i, i + 1)], holder=f"h{i}", ttl=1)
    clock.advance(2)
    assert store.sweep().expired == 50
    assert len(store._units) == 50 and len(store._spans["room"]) == 50
    store.claim(Unit("keeper", ""), holder="keeper")  # the newest claim is kept
    clock.advance(10)
    assert store.sweep().purged_claims == 50
    assert list(store._units) == [Unit("keeper", "")]
    assert store._spans == {}
    assert list(store._by_holder) == ["keeper"]
