"""memory:// internals the contract cannot see: its indexes under races and after purges."""

from __future__ import annotations

import asyncio
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from _race import race
from dibs import FakeClock, Span, Unit
from dibs.stores import memory
from dibs.stores.memory import MemoryStore
from dibs.stores.threaded import ThreadedStore

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
    assert list(store._units) == [Unit("keeper", "")._key]
    assert store._spans == {}
    assert list(store._by_holder) == ["keeper"]


def _interleave_at_first_liveness_check(
    monkeypatch: pytest.MonkeyPatch, store: MemoryStore, watched: str, step: Any
) -> None:
    """Run ``step`` the first time a read judges the record ``watched`` live, as a
    thread preempted there would let another thread do; unless the read holds that
    record's stripe, when no other thread could run ``step`` until the read ends."""
    real = memory._live
    armed = [True]

    def live(record: Any, now: int) -> bool:
        if armed[0] and record["id"] == watched:
            armed[0] = False
            if not any(store._locks[i].locked() for i in store._stripes_of(record)):
                step()
        return real(record, now)

    monkeypatch.setattr(memory, "_live", live)


def _read(face: str, store: MemoryStore, method: str, *args: Any) -> Any:
    """``store.<method>(*args)`` on the sync face, or awaited on the async face over it."""
    if face == "sync":
        return getattr(store, method)(*args)

    async def read() -> Any:
        async with ThreadedStore.over(store) as astore:
            return await getattr(astore, method)(*args)

    return asyncio.run(read())


@pytest.mark.parametrize("face", ["sync", "aio"])
def test_claims_of_is_one_moments_snapshot(monkeypatch: pytest.MonkeyPatch, face: str) -> None:
    # c0 always holds a claim: b is granted before a is released. A read that
    # listed the holder's claims before b's grant and judged a after its release
    # found neither (dibs verify saw it under load, a read stalled mid-list).
    store = MemoryStore()
    a = store.claim(Unit("r", "1"), holder="c0").claim
    assert a is not None
    granted: list[str] = []

    def step() -> None:
        b = store.claim(Span("s", 0, 2), holder="c0").claim
        assert b is not None
        granted.append(b.id)
        assert store.release(a.id, holder="c0", fence=a.fence)

    _interleave_at_first_liveness_check(monkeypatch, store, a.id, step)
    shown = [c.id for c in _read(face, store, "claims_of", "c0")]
    assert shown in ([a.id], [a.id, *granted], granted) and shown, shown


@pytest.mark.parametrize("face", ["sync", "aio"])
def test_holder_of_a_span_is_one_moments_answer(monkeypatch: pytest.MonkeyPatch, face: str) -> None:
    # Some claim overlaps [0, 4) throughout: b ([2, 4)) is granted before a ([0, 2))
    # is released. An unlocked read of the span list could see only a, released.
    store = MemoryStore()
    a = store.claim(Span("s", 0, 2), holder="alice").claim
    assert a is not None

    def step() -> None:
        assert store.claim(Span("s", 2, 4), holder="bob").granted
        assert store.release(a.id, holder="alice", fence=a.fence)

    _interleave_at_first_liveness_check(monkeypatch, store, a.id, step)
    assert _read(face, store, "holder_of", Span("s", 0, 4)) in ("alice", "bob")
