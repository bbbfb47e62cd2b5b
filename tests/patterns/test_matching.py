"""dibs.match on every store: preference order, idempotent dispatch, jittered bounded retries."""

from __future__ import annotations

import random
import threading
from collections import defaultdict
from typing import Any

import pytest

import dibs
from _race import race
from dibs import (
    Claim,
    ClaimState,
    FakeClock,
    HoldLost,
    InvalidInput,
    Match,
    RequestConflict,
    Store,
    Unit,
    match,
)

QUICK = True  # in `pytest -m quick` (conftest.is_quick: not slow, no server)

DRIVERS = [Unit(f"driver-{i}") for i in range(20)]


def no_sleep(seconds: float) -> None:
    pass


def test_first_free_candidate_in_preference_order(store: Store) -> None:
    store.claim(Unit("driver-0"), holder="someone")
    m = match(store, ["driver-0", "driver-1", "driver-2"], holder="disp", request_id="ride-1")
    assert m and m.candidate == Unit("driver-1")
    assert m.claim is not None and m.claim.holder == "disp"
    assert (m.attempts, m.rounds, m.replayed) == (2, 1, False)
    assert store.holder_of(Unit("driver-1")) == "disp"


def test_a_retried_dispatch_returns_the_same_driver(store: Store) -> None:
    first = match(store, DRIVERS, holder="disp", request_id="ride-1", ttl=60)
    again = match(store, list(reversed(DRIVERS)), holder="disp", request_id="ride-1", ttl=60)
    assert first.claim is not None and again.claim is not None
    assert again.replayed and again.candidate == first.candidate
    assert again.claim.id == first.claim.id
    # Another ride of the same dispatcher gets another driver.
    other = match(store, DRIVERS, holder="disp", request_id="ride-2", ttl=60)
    assert other.candidate != first.candidate
    # Once the assignment ended, the ID may dispatch again.
    store.release(first.claim.id, holder="disp", fence=first.claim.fence)
    fresh = match(store, DRIVERS, holder="disp", request_id="ride-1")
    assert fresh and not fresh.replayed and fresh.claim is not None
    assert fresh.claim.id != first.claim.id


@pytest.mark.usefixtures("fine_switching")
def test_concurrent_tries_of_one_dispatch_hold_one_driver(store: Store) -> None:
    for ride in range(10):

        def dispatch(i: int, ride: int = ride) -> str:
            order = DRIVERS[i % 20 :] + DRIVERS[: i % 20]  # each try prefers a different driver
            m = match(store, order, holder="disp", request_id=f"ride-{ride}", ttl=60)
            assert m.claim is not None
            return m.claim.id

        assert len(set(race(16, dispatch))) == 1
        mine = [c for c in store.claims_of("disp") if Unit("dibs.match", f"ride-{ride}") in c.units]
        assert len(mine) == 1


def test_a_request_id_held_by_another_holder_is_a_conflict(store: Store) -> None:
    assert match(store, DRIVERS, holder="alice", request_id="ride-1")
    with pytest.raises(RequestConflict) as info:
        match(store, DRIVERS, holder="bob", request_id="ride-1")
    assert info.value.request_id == "ride-1"


class Interleaved:
    """A store whose ``claims_of`` runs injected steps before and after its n-th read."""

    def __init__(self, store: Store, steps: dict[int, tuple[Any, Any]]) -> None:
        self._store = store
        self._steps = steps
        self._reads = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)

    def claims_of(self, holder: str) -> list[Claim]:
        self._reads += 1
        before, after = self._steps.get(self._reads, (None, None))
        if before is not None:
            before()
        claims = self._store.claims_of(holder)
        if after is not None:
            after()
        return claims


@pytest.mark.parametrize("other_try_wins", [False, True])
def test_a_dispatch_unit_freed_between_the_reads_is_claimed_again(
    store: Store, other_try_wins: bool
) -> None:
    # Another try of this dispatch holds the dispatch unit when our claim is
    # made, then ends; before our second read, a third try may win. The free
    # candidate must not be skipped: we get it, or the third try's assignment.
    dispatch = Unit("dibs.match", "ride-1")
    first: list[Claim] = []
    third: list[Claim] = []

    def first_try_claims() -> None:
        claim = store.claim([Unit("driver-0"), dispatch], holder="disp", ttl=60).claim
        assert claim is not None
        first.append(claim)

    def first_try_ends() -> None:
        store.release(first[0].id, holder="disp", fence=first[0].fence)

    def third_try_claims() -> None:
        if other_try_wins:
            claim = store.claim([Unit("driver-2"), dispatch], holder="disp", ttl=60).claim
            assert claim is not None
            third.append(claim)

    steps = {1: (None, first_try_claims), 2: (first_try_ends, third_try_claims)}
    racing: Any = Interleaved(store, steps)
    m = match(racing, ["driver-1"], holder="disp", request_id="ride-1", attempts=1, ttl=60)
    assert m, "no match, although driver-1 was free all along"
    mine = [c for c in store.claims_of("disp") if dispatch in c.units]
    assert [c.id for c in mine] == [m.claim.id]  # type: ignore[union-attr]
    if other_try_wins:
        assert m.replayed and m.candidate == Unit("driver-2") and m.claim == third[0]
    else:
        assert not m.replayed and m.candidate == Unit("driver-1")


def test_none_to_be_had_after_bounded_jittered_rounds(store: Store) -> None:
    for unit in DRIVERS[:3]:
        store.claim(unit, holder="busy")
    pauses: list[float] = []
    m = match(
        store,
        DRIVERS[:3],
        holder="disp",
        request_id="ride-1",
        attempts=5,
        backoff=0.5,
        max_backoff=2.0,
        rng=random.Random(7),
        sleep=pauses.append,
    )
    assert not m and m.candidate is None and m.claim is None
    assert isinstance(m, Match) and (m.attempts, m.rounds) == (15, 5)
    caps = [0.5, 1.0, 2.0, 2.0]
    assert len(pauses) == 4 and all(0 <= p <= cap for p, cap in zip(pauses, caps, strict=True))
    assert store.holder_of(Unit("dibs.match", "ride-1")) is None  # losing left nothing behind
    lockstep: list[float] = []
    match(store, DRIVERS[:3], holder="disp", request_id="ride-2", attempts=5, backoff=0.5,
          max_backoff=2.0, jitter=False, sleep=lockstep.append)  # fmt: skip
    assert lockstep == caps


def test_candidates_can_be_recomputed_each_round(store: Store) -> None:
    store.claim(DRIVERS[0], holder="busy")
    rounds: list[int] = []

    def nearest() -> list[Unit]:
        rounds.append(1)
        return DRIVERS[:1] if len(rounds) < 3 else DRIVERS[:2]

    m = match(store, nearest, holder="disp", request_id="r", attempts=4, sleep=no_sleep)
    assert m.candidate == DRIVERS[1] and m.rounds == 3 and len(rounds) == 3


def test_expired_holds_give_drivers_back(store: Store, clock: FakeClock) -> None:
    held = match(store, DRIVERS[:1], holder="disp", request_id="ride-1", ttl=30)
    assert held
    assert not match(store, DRIVERS[:1], holder="disp", request_id="ride-2", attempts=1)
    clock.advance(31)
    taken_over = match(store, DRIVERS[:1], holder="disp", request_id="ride-2", attempts=1)
    assert taken_over and taken_over.candidate == DRIVERS[0]
    assert held.claim is not None
    with pytest.raises(HoldLost):
        store.confirm(held.claim.id, holder="disp", fence=held.claim.fence)


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"request_id": ""}, "request_id"),
        ({"request_id": None}, "request_id"),
        ({"attempts": 0}, "attempts"),
        ({"backoff": -1}, "backoff"),
        ({"max_backoff": float("inf")}, "max_backoff"),
        ({"candidates": "driver-1"}, "candidates"),
        ({"candidates": [3]}, "candidates"),
        ({"candidates": [Unit("dibs.match", "x")]}, "candidates"),
    ],
)
def test_bad_arguments(store: Store, kwargs: dict[str, Any], field: str) -> None:
    args: dict[str, Any] = {"candidates": DRIVERS, "holder": "disp", "request_id": "r"}
    args.update(kwargs)
    candidates = args.pop("candidates")
    with pytest.raises(InvalidInput) as info:
        match(store, candidates, **args)
    assert info.value.field == field


# --- stress: 50 dispatchers, 20 drivers ----------------------------------------------------------


@pytest.mark.usefixtures("fine_switching")
def test_fifty_dispatchers_never_double_assign_a_driver(
    store: Store, clock: FakeClock, store_kind: str
) -> None:
    # etcd: fewer rides (network round trips) to keep CI time; still 50 racing dispatchers.
    rides_each = {"memory": 40, "etcd": 2}.get(store_kind, 8)
    guard = threading.Lock()
    # Guarded by `guard`: every claim granted per driver, and the claim per ride.
    history: dict[Unit, list[Claim]] = defaultdict(list)
    assigned: dict[str, str] = {}
    problems: list[str] = []

    def granted(m: Match, ride: str) -> None:
        assert m.candidate is not None and m.claim is not None
        with guard:
            if assigned.setdefault(ride, m.claim.id) != m.claim.id:
                problems.append(f"{ride} assigned twice")
            if m.replayed:
                return
            for older in history[m.candidate]:
                if older.fence >= m.claim.fence:
                    continue
                # Granted after `older`, so `older` must have ended by now, for good.
                now = store.get(older.id)
                if now is None or now.state not in (ClaimState.RELEASED, ClaimState.EXPIRED):
                    problems.append(f"{m.candidate} held by {older.id} and {m.claim.id}")
            history[m.candidate].append(m.claim)

    def dispatcher(d: int) -> int:
        rng = random.Random(d)
        holder = f"dispatcher-{d}"
        got = 0
        for r in range(rides_each):
            ride = f"ride-{d}-{r}"
            here = rng.randrange(20)
            nearest = sorted(DRIVERS, key=lambda u: abs(int(u.resource[7:]) - here))
            m = match(store, nearest[:8], holder=holder, request_id=ride, ttl=20, attempts=6,
                      backoff=0.0005, max_backoff=0.005, rng=rng)  # fmt: skip
            clock.advance(1)  # time passes, so abandoned holds run out
            if not m:
                continue
            got += 1
            granted(m, ride)
            assert m.claim is not None
            fate = rng.random()
            try:
                if fate < 0.6:  # accepted, driven, done: the driver comes back
                    store.confirm(m.claim.id, holder=holder, fence=m.claim.fence)
                    retry = match(store, nearest, holder=holder, request_id=ride, ttl=20)
                    granted(retry, ride)
                    if not retry.replayed or retry.candidate != m.candidate:
                        problems.append(f"retry of {ride} got {retry}")
                    store.release(m.claim.id, holder=holder, fence=m.claim.fence)
                elif fate < 0.8:  # declined: given back at once
                    store.release(m.claim.id, holder=holder, fence=m.claim.fence)
                # else abandoned: the hold expires and the driver is taken over
            except HoldLost:
                pass  # the hold ran out first; the driver went to someone else
        return got

    total = sum(race(50, dispatcher))
    assert not problems, problems[:5]
    assert total > rides_each * 5
    assert len(assigned) == total
    clock.advance(60)
    store.sweep()
    assert all(store.holder_of(u) is None for u in DRIVERS)


# --- jitter spreads dispatchers ------------------------------------------------------------------


def _arrivals(jitter: bool) -> list[list[float]]:
    """When each of 50 dispatchers reaches the nearest driver, round by round, in virtual time."""
    store = dibs.open("memory://")
    for unit in DRIVERS:
        store.claim(unit, holder="on-a-ride")

    class Dispatcher:
        def __init__(self) -> None:
            self.now = 0.0
            self.arrivals = [0.0]

        def sleep(self, seconds: float) -> None:
            self.now += seconds
            self.arrivals.append(self.now)

    def dispatch(i: int) -> list[float]:
        me = Dispatcher()
        m = match(store, DRIVERS, holder=f"d{i}", request_id=f"r{i}", attempts=4, backoff=1.0,
                  max_backoff=8.0, jitter=jitter, rng=random.Random(i), sleep=me.sleep)  # fmt: skip
        assert not m
        return me.arrivals

    try:
        return race(50, dispatch)
    finally:
        store.close()


def _crowd(times: list[float], window: float) -> int:
    """The most dispatchers arriving within any ``window`` seconds of each other."""
    times = sorted(times)
    return max(sum(1 for t in times[i:] if t - s < window) for i, s in enumerate(times))


def test_jitter_spreads_dispatchers_instead_of_herding_them() -> None:
    # Every driver is busy, so every dispatcher keeps coming back to the nearest
    # one. In lockstep all 50 arrive at the same instant each round; with full
    # jitter they are spread over the backoff window.
    lockstep, jittered = _arrivals(jitter=False), _arrivals(jitter=True)
    for round_ in (1, 2, 3):
        assert _crowd([a[round_] for a in lockstep], 0.05) == 50
        crowd = _crowd([a[round_] for a in jittered], 0.05)
        assert crowd <= 12, f"round {round_}: {crowd} dispatchers within 50 ms"
