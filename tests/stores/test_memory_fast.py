"""memory://'s inline claim, confirm, extend and release against its general path.

The public methods of MemoryStore do the common well-formed call inline and
hand everything else to Store's checking path. A subclass that overrides the
backend steps turns the inline paths off, so it is the reference: every case
here runs on both and must answer alike (same result, same error, same
reason, same message). Then the snapshots the inline paths build (times kept
as microseconds until read) must behave as Claim always did, and the inline
transitions must hold up against sweeps and takeovers racing them.
"""

from __future__ import annotations

import copy
import dataclasses
import pickle
import random
import sys
import threading
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from _race import race
from dibs import (
    Claim,
    ClaimNotFound,
    ClaimResult,
    ClaimState,
    FakeClock,
    HoldLost,
    InvalidInput,
    NotHolder,
    RequestConflict,
    Span,
    Unit,
)
from dibs.stores.memory import MemoryStore
from dibs.testing import strategies


class GeneralPathStore(MemoryStore):
    """The memory store with its inline paths off: Store's checks, then the general steps."""

    def _claim(self, *args: Any) -> ClaimResult:
        return super()._claim(*args)

    def _confirm(self, claim_id: str, holder: str, fence: int) -> Claim:
        return super()._confirm(claim_id, holder, fence)

    def _extend(self, claim_id: str, holder: str, fence: int, ttl: float) -> Claim:
        return super()._extend(claim_id, holder, fence, ttl)

    def _release(self, claim_id: str, holder: str, fence: int) -> bool:
        return super()._release(claim_id, holder, fence)


def test_the_reference_store_really_takes_the_general_path() -> None:
    fast, general = MemoryStore(), GeneralPathStore()
    assert fast._fast_claim and fast._fast_confirm and fast._fast_extend and fast._fast_release
    assert not (general._fast_claim or general._fast_confirm)
    assert not (general._fast_extend or general._fast_release)


def _outcome(call: Callable[[], Any]) -> Any:
    """What a call did: the value, or the error with its reason, message and facts."""
    try:
        value = call()
    except (HoldLost, NotHolder, ClaimNotFound, InvalidInput, RequestConflict) as exc:
        return (type(exc).__name__, getattr(exc, "reason", None), str(exc), repr(vars(exc)))
    if isinstance(value, ClaimResult):
        return ("result", value.granted, value.taken, value.replayed, _fields(value.claim))
    if isinstance(value, Claim):
        return ("claim", _fields(value))
    return ("value", value)


def _fields(claim: Claim | None) -> Any:
    if claim is None:
        return None
    return (type(claim), *(getattr(claim, f.name) for f in dataclasses.fields(Claim)))


Scenario = Callable[[MemoryStore, FakeClock], list[Callable[[], Any]]]


def _hold(store: MemoryStore, unit: str = "a", holder: str = "alice", ttl: float = 10) -> Claim:
    claim = store.claim(Unit("seat", unit), holder=holder, ttl=ttl).claim
    assert claim is not None
    return claim


def wrong_holder(store: MemoryStore, clock: FakeClock) -> list[Callable[[], Any]]:
    c = _hold(store)
    return [
        lambda: store.confirm(c.id, holder="bob", fence=c.fence),
        lambda: store.extend(c.id, holder="bob", fence=c.fence, ttl=5),
        lambda: store.release(c.id, holder="bob", fence=c.fence),
    ]


def wrong_fence(store: MemoryStore, clock: FakeClock) -> list[Callable[[], Any]]:
    c = _hold(store)
    return [
        lambda: store.confirm(c.id, holder="alice", fence=c.fence + 1),
        lambda: store.extend(c.id, holder="alice", fence=c.fence + 1, ttl=5),
        lambda: store.release(c.id, holder="alice", fence=c.fence + 1),
        lambda: store.release(c.id, holder="alice", fence=c.fence),
        lambda: store.confirm(c.id, holder="alice", fence=c.fence + 1),  # released: fence first
    ]


def expired(store: MemoryStore, clock: FakeClock) -> list[Callable[[], Any]]:
    c = _hold(store, ttl=1)
    clock.advance(1)  # exactly at expiry: dead
    return [
        lambda: store.confirm(c.id, holder="alice", fence=c.fence),
        lambda: store.extend(c.id, holder="alice", fence=c.fence, ttl=5),
        lambda: store.release(c.id, holder="alice", fence=c.fence),
        lambda: store.sweep().expired,
        lambda: store.confirm(c.id, holder="alice", fence=c.fence),  # marked now
        lambda: store.release(c.id, holder="alice", fence=c.fence + 1),
    ]


def released(store: MemoryStore, clock: FakeClock) -> list[Callable[[], Any]]:
    c = _hold(store)
    d = store.claim(Unit("seat", "b"), holder="alice").claim
    assert d is not None
    return [
        lambda: store.release(c.id, holder="alice", fence=c.fence),
        lambda: store.release(c.id, holder="alice", fence=c.fence),
        lambda: store.confirm(c.id, holder="alice", fence=c.fence),
        lambda: store.extend(c.id, holder="alice", fence=c.fence, ttl=5),
        lambda: store.release(d.id, holder="alice", fence=d.fence),
        lambda: store.confirm(d.id, holder="alice", fence=d.fence),
        lambda: store.get(c.id),
    ]


def taken_over(store: MemoryStore, clock: FakeClock) -> list[Callable[[], Any]]:
    c = _hold(store, ttl=1)
    clock.advance(2)
    return [
        lambda: store.claim(Unit("seat", "a"), holder="bob", ttl=5),
        lambda: store.confirm(c.id, holder="alice", fence=c.fence),
        lambda: store.extend(c.id, holder="alice", fence=c.fence, ttl=5),
        lambda: store.release(c.id, holder="alice", fence=c.fence),
        lambda: store.get(c.id),
    ]


def live_transitions(store: MemoryStore, clock: FakeClock) -> list[Callable[[], Any]]:
    c = _hold(store, ttl=2)
    return [
        lambda: store.extend(c.id, holder="alice", fence=c.fence, ttl=30),
        lambda: clock.advance(20),
        lambda: store.extend(c.id, holder="alice", fence=c.fence, ttl=1),
        lambda: store.confirm(c.id, holder="alice", fence=c.fence),
        lambda: store.confirm(c.id, holder="alice", fence=c.fence),  # idempotent
        lambda: store.extend(c.id, holder="alice", fence=c.fence, ttl=1),  # unchanged
        lambda: clock.advance(1000),
        lambda: store.claims_of("alice"),
        lambda: store.release(c.id, holder="alice", fence=c.fence),
        lambda: store.release(c.id, holder="alice", fence=c.fence),
    ]


def bad_input(store: MemoryStore, clock: FakeClock) -> list[Callable[[], Any]]:
    c = _hold(store)
    calls: list[Callable[[], Any]] = []
    for method in ("confirm", "release"):
        for kwargs in (
            {"holder": "alice", "fence": 0},
            {"holder": "alice", "fence": True},
            {"holder": "alice", "fence": float(c.fence)},
            {"holder": "alice", "fence": 2**63},
            {"holder": "", "fence": c.fence},
            {"holder": 7, "fence": c.fence},
            {"holder": "al\x00ice", "fence": c.fence},
            {"holder": "a" * 1025, "fence": c.fence},
        ):
            calls.append(lambda m=method, k=kwargs: getattr(store, m)(c.id, **k))
        for claim_id in ("", 5, None, "x\x00", "no-such-claim"):
            calls.append(
                lambda m=method, i=claim_id: getattr(store, m)(i, holder="alice", fence=c.fence)
            )
    for ttl in (0, 0.0001, -1, float("nan"), float("inf"), True, "5", None, 10**9):
        calls.append(
            lambda t=ttl: store.extend(c.id, holder="alice", fence=c.fence, ttl=t)  # type: ignore[arg-type]
        )
    for kwargs in (
        {"holder": ""},
        {"holder": "\udcff"},
        {"holder": "alice", "ttl": 0},
        {"holder": "alice", "ttl": True},
        {"holder": "alice", "ttl": 10**12},
        {"holder": "alice", "request_id": ""},
        {"holder": "alice", "request_id": 3},
        {"holder": "alice", "request_id": "r\x00"},
    ):
        calls.append(lambda k=kwargs: store.claim(Unit("seat", "z"), **k))
    for targets in ([], [Unit("seat", "q"), "seat"], "seat", [Span("r", 1, 3), Span("r", 2, 4)]):
        calls.append(lambda t=targets: store.claim(t, holder="alice"))  # type: ignore[arg-type]
    return calls


def claims_and_replays(store: MemoryStore, clock: FakeClock) -> list[Callable[[], Any]]:
    a, b = Unit("seat", "a"), Unit("seat", "b")
    return [
        lambda: store.claim(a, holder="alice", ttl=5, request_id="r1"),
        lambda: store.claim(a, holder="alice", ttl=5, request_id="r1"),  # replay
        lambda: store.claim(a, holder="alice", ttl=6, request_id="r1"),  # conflict
        lambda: store.claim(a, holder="bob", ttl=5),  # taken
        lambda: store.claim(a, holder="bob", ttl=5, request_id="r2"),  # taken, recorded
        lambda: store.claim(a, holder="bob", ttl=5, request_id="r2"),  # replayed refusal
        lambda: store.claim(a, holder="alice", ttl=5),  # natural key: replayed
        lambda: store.claim([b, a, b], holder="carol"),  # group, one taken
        lambda: store.claim([b, Unit("seat", "c")], holder="carol", request_id="r3"),
        lambda: store.claim((Unit("seat", "c"), b), holder="carol", request_id="r3"),  # replay
        lambda: clock.advance(5),
        lambda: store.claim([a, Unit("seat", "d")], holder="dave", ttl=2),  # takes a over
        lambda: store.claim(a, holder="alice", ttl=5, request_id="r1"),  # replay: expired now
        lambda: store.claim(Unit("seat", "e"), holder="erin", ttl=5.5),
        lambda: store.claim(Unit("seat", "e"), holder="erin", ttl=5.5),
        lambda: store.claims_of("carol"),
    ]


def requests_across_transitions(store: MemoryStore, clock: FakeClock) -> list[Callable[[], Any]]:
    # An inline grant keeps its claim's record as the request's record: the
    # replay must still see the TTL asked for after confirm and extend moved the
    # claim's expiry, see the claim's current state, and the request must go
    # with the sweep on its own clock (created at), not the claim's.
    a, b, c = Unit("seat", "a"), Unit("seat", "b"), Unit("seat", "c")
    made: dict[str, Claim] = {}

    def hold(key: str, targets: Any, **kwargs: Any) -> Any:
        result = store.claim(targets, **kwargs)
        if result.claim is not None and not result.replayed:
            made[key] = result.claim
        return result

    def on(key: str, method: str, **kwargs: Any) -> Any:
        claim = made[key]
        return getattr(store, method)(claim.id, holder=claim.holder, fence=claim.fence, **kwargs)

    return [
        lambda: hold("a", a, holder="alice", ttl=5, request_id="ra"),
        lambda: hold("g", [b, c], holder="gus", ttl=7.5, request_id="rg"),
        lambda: on("a", "extend", ttl=50),
        lambda: store.claim(a, holder="alice", ttl=5, request_id="ra"),  # replay, extended
        lambda: store.claim(a, holder="alice", ttl=50, request_id="ra"),  # conflict: TTL
        lambda: store.claim(a, holder="alice", request_id="ra"),  # conflict: no TTL
        lambda: on("g", "confirm"),
        lambda: store.claim((c, b), holder="gus", ttl=7.5, request_id="rg"),  # replay, confirmed
        lambda: store.claim([b, c], holder="gus", ttl=7, request_id="rg"),  # conflict
        lambda: store.claim([b], holder="gus", ttl=7.5, request_id="rg"),  # conflict: targets
        lambda: on("g", "release"),
        lambda: store.claim([b, c], holder="gus", ttl=7.5, request_id="rg"),  # replay, released
        lambda: clock.advance(60),
        lambda: hold("d", a, holder="dora", ttl=90_000, request_id="rd"),  # takes a over
        lambda: store.claim(a, holder="alice", ttl=5, request_id="ra"),  # replay, taken over
        store.sweep,
        lambda: clock.advance(24 * 3600 - 30),
        store.sweep,  # purges ra, rg and their claims; rd stays
        lambda: store.claim(a, holder="alice", ttl=9, request_id="ra"),  # new: dora has a
        lambda: store.claim(a, holder="dora", ttl=90_000, request_id="rd"),  # replay
        lambda: store.claim([b, c], holder="erin", request_id="rg"),  # new, granted
        lambda: clock.advance(60),
        store.sweep,
        lambda: store.claim(Unit("seat", "e"), holder="dora", ttl=5, request_id="rd"),  # new
        lambda: store.claim(a, holder="alice", ttl=9, request_id="ra"),  # replayed refusal
        lambda: store.claims_of("erin"),
    ]


SCENARIOS: list[Scenario] = [
    wrong_holder,
    wrong_fence,
    expired,
    released,
    taken_over,
    live_transitions,
    bad_input,
    claims_and_replays,
    requests_across_transitions,
]


@pytest.mark.parametrize("scenario", SCENARIOS, ids=lambda s: s.__name__)
def test_the_inline_paths_answer_as_the_general_path(scenario: Scenario) -> None:
    outcomes = []
    for cls in (MemoryStore, GeneralPathStore):
        clock = FakeClock()
        store = cls(clock=clock)
        store._id_prefix = "c-"  # the same claim IDs on both
        outcomes.append([_outcome(call) for call in scenario(store, clock)])
    fast, general = outcomes
    for i, (a, b) in enumerate(zip(fast, general, strict=True)):
        assert a == b, f"step {i}: inline {a!r} != general {b!r}"


def test_the_errors_name_the_reason() -> None:
    """The inline paths' errors, spelled out (the comparison above checks they match)."""
    clock = FakeClock()
    store = MemoryStore(clock=clock)
    c = _hold(store, ttl=1)
    with pytest.raises(NotHolder):
        store.confirm(c.id, holder="bob", fence=c.fence)
    with pytest.raises(HoldLost) as lost:
        store.extend(c.id, holder="alice", fence=c.fence + 1, ttl=5)
    assert lost.value.reason == "fence"
    clock.advance(1)
    with pytest.raises(HoldLost) as lost:
        store.confirm(c.id, holder="alice", fence=c.fence)
    assert lost.value.reason == "expired"
    assert store.release(c.id, holder="alice", fence=c.fence) is False
    store.claim(Unit("seat", "a"), holder="bob")
    with pytest.raises(HoldLost) as lost:
        store.confirm(c.id, holder="alice", fence=c.fence)
    assert lost.value.reason == "taken_over"
    d = _hold(store, unit="b")
    assert store.release(d.id, holder="alice", fence=d.fence) is True
    with pytest.raises(HoldLost) as lost:
        store.extend(d.id, holder="alice", fence=d.fence, ttl=5)
    assert lost.value.reason == "released"
    with pytest.raises(InvalidInput) as bad:
        store.confirm(d.id, holder="alice", fence=-3)
    assert bad.value.field == "fence" and "-3" in str(bad.value)
    with pytest.raises(ClaimNotFound):
        store.release("nope", holder="alice", fence=1)


# --- the snapshots: integer times, datetimes on first read -------------------------------------


@pytest.fixture
def lazy_and_eager() -> Iterator[tuple[Claim, Claim]]:
    clock = FakeClock(1_800_000_000.123456)
    store = MemoryStore(clock=clock)
    lazy = _hold(store, ttl=90.5)
    assert "expires_at" not in vars(lazy)  # not made yet
    eager = Claim(
        id=lazy.id,
        holder="alice",
        targets=(Unit("seat", "a"),),
        state=ClaimState.HELD,
        fence=lazy.fence,
        expires_at=datetime.fromtimestamp(1_800_000_090.623456, UTC),
        request_id=None,
        created_at=datetime.fromtimestamp(1_800_000_000.123456, UTC),
        updated_at=datetime.fromtimestamp(1_800_000_000.123456, UTC),
    )
    yield lazy, eager


def test_a_lazy_claim_equals_and_hashes_as_the_eager_one(
    lazy_and_eager: tuple[Claim, Claim],
) -> None:
    lazy, eager = lazy_and_eager
    assert lazy == eager and eager == lazy
    assert hash(lazy) == hash(eager)
    assert repr(lazy) == repr(eager)
    assert lazy.expires_at == eager.expires_at
    assert isinstance(lazy.created_at, datetime) and lazy.created_at.tzinfo is UTC
    assert dataclasses.replace(lazy, state=ClaimState.CONFIRMED).state is ClaimState.CONFIRMED
    assert dataclasses.asdict(lazy) == dataclasses.asdict(eager)
    assert copy.copy(lazy) == eager and copy.deepcopy(lazy) == eager


def test_a_lazy_claim_pickles_as_plain_fields(lazy_and_eager: tuple[Claim, Claim]) -> None:
    lazy, eager = lazy_and_eager
    for protocol in range(2, pickle.HIGHEST_PROTOCOL + 1):
        back = pickle.loads(pickle.dumps(lazy, protocol))
        assert back == eager and hash(back) == hash(eager)
        assert not any(key.endswith("_us") for key in vars(back))
    assert pickle.loads(pickle.dumps(eager)) == lazy


def test_a_lazy_claim_is_immutable(lazy_and_eager: tuple[Claim, Claim]) -> None:
    lazy, _ = lazy_and_eager
    with pytest.raises(dataclasses.FrozenInstanceError):
        lazy.expires_at = None  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        lazy.state = ClaimState.CONFIRMED  # type: ignore[misc]
    with pytest.raises(AttributeError):
        lazy.no_such_field  # type: ignore[attr-defined]  # noqa: B018


def test_a_snapshot_does_not_change_with_the_claim() -> None:
    clock = FakeClock()
    store = MemoryStore(clock=clock)
    held = _hold(store, ttl=5)
    clock.advance(1)
    confirmed = store.confirm(held.id, holder="alice", fence=held.fence)
    assert held.state is ClaimState.HELD and held.expires_at is not None
    assert held.updated_at == held.created_at < confirmed.updated_at
    assert confirmed.state is ClaimState.CONFIRMED and confirmed.expires_at is None


def test_refusals_of_a_confirmed_claim_answer_alike_on_both_paths() -> None:
    # The inline path refuses a unit another holder has confirmed before it reads
    # the clock: every refusal must still name the unit asked for (a group
    # claim's units each their own), before and after the unit changes hands.
    def play(cls: type[MemoryStore]) -> list[Any]:
        store = cls(clock=FakeClock())
        store._id_prefix = "c-"
        seats = [Unit("hall", "1"), Unit("hall", "2"), Unit("hall", "3")]
        out: list[Any] = [store.claim(seats[0], holder="alice")]
        out += [store.claim(seats[0], holder=who) for who in ("bob", "carol", "bob")]
        out.append(store.claim(seats[1:], holder="alice"))
        out += [store.claim(seat, holder="bob") for seat in (seats[1], seats[2], seats[1])]
        first = out[0].claim
        out.append(store.release(first.id, holder="alice", fence=first.fence))
        out.append(store.claim(seats[0], holder="bob"))
        out += [store.claim(seats[0], holder=who) for who in ("alice", "bob")]
        out.append([_fields(c) for c in store.claim_log().claims()])
        return out

    inline = play(MemoryStore)
    assert inline == play(GeneralPathStore)
    assert [r.taken for r in inline[1:4]] == [(Unit("hall", "1"),)] * 3
    assert [r.taken for r in inline[5:8]] == [(Unit("hall", "2"),), (Unit("hall", "3"),),
                                              (Unit("hall", "2"),)]  # fmt: skip
    assert inline[9].granted and not inline[10].granted and inline[11].replayed


# --- races: inline transitions against sweeps and takeovers ------------------------------------


@pytest.fixture
def hard_switching() -> Iterator[None]:
    before = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    yield
    sys.setswitchinterval(before)


class _YieldingClock(FakeClock):
    """A FakeClock that lets other threads run right after each read.

    The inline paths read the clock at their linearization point; a preemption
    right there is where a check made outside the lock would go stale.
    """

    def now(self) -> float:
        value = super().now()
        time.sleep(0)
        return value


@pytest.mark.usefixtures("hard_switching")
def test_transitions_racing_sweeps_and_takeovers_keep_one_live_claim_per_unit() -> None:
    """Holders confirm, extend and release short holds while the clock runs, sweeps mark
    dead holds and rivals take them over. Checked at every step:

    * a confirm or extend that succeeded began before the hold's expiry (the
      FakeClock only moves forward, so a hold dead when the call began is dead
      at its linearization point);
    * after a successful confirm, or an extend far past the test's end, the unit is
      the holder's until it releases it (nobody else may take it);
    * at the end, no unit has two live claims and the unit index agrees with them.
    """
    clock = _YieldingClock()
    store = MemoryStore(clock=clock, stripes=4)  # few stripes: more keys share a lock
    units = [Unit("race", str(i)) for i in range(4)]
    holders, rivals, rounds = 4, 2, 1000
    stop = threading.Event()
    finished = [0]
    finished_lock = threading.Lock()  # guards finished
    violations: list[str] = []

    def holder(n: int) -> None:
        rng = random.Random(n)
        me = f"holder-{n}"
        for _ in range(rounds):
            unit = rng.choice(units)
            claim = store.claim(unit, holder=me, ttl=rng.choice((0.3, 0.5, 1.0))).claim
            if claim is None:
                continue
            assert claim.expires_at is not None
            action = rng.choice(("confirm", "extend", "release", "nothing"))
            clock.advance(rng.choice((0, 0, 0.25, 0.5, 1.0)))  # often dead by the call
            began = clock.now()
            try:
                if action == "confirm":
                    store.confirm(claim.id, holder=me, fence=claim.fence)
                elif action == "extend":
                    store.extend(claim.id, holder=me, fence=claim.fence, ttl=10**6)
                elif action == "release":
                    store.release(claim.id, holder=me, fence=claim.fence)
                    continue
                else:
                    continue
            except HoldLost:
                continue
            if round(began * 1e6) >= round(claim.expires_at.timestamp() * 1e6):
                violations.append(f"{action} of {claim.id} succeeded after its expiry")
            if store.holder_of(unit) != me:
                violations.append(f"{unit} not held by {me} right after its {action}")
            if not store.release(claim.id, holder=me, fence=claim.fence):
                violations.append(f"{me} could not release its live {claim.id}")

    def rival(n: int) -> None:
        me = f"rival-{n}"
        while not stop.is_set():
            for unit in units:
                taken = store.claim(unit, holder=me, ttl=0.2).claim
                if taken is not None and taken.holder == me and taken.state == "held":
                    clock.advance(0.1)
                    store.release(taken.id, holder=me, fence=taken.fence)

    def run(n: int) -> None:
        if n < holders:
            try:
                holder(n)
            finally:
                with finished_lock:
                    finished[0] += 1
                    if finished[0] == holders:
                        stop.set()
        elif n < holders + rivals:
            rival(n)
        else:
            while not stop.is_set():
                clock.advance(0.05)
                store.sweep()

    race(holders + rivals + 1, run)
    assert not violations, f"{len(violations)} violations, e.g. {violations[:5]}"
    now = round(clock.now() * 1e6)
    live: dict[Unit, list[str]] = {}
    for claim in store.claim_log().claims():
        alive = claim.state == "confirmed" or (
            claim.state == "held"
            and claim.expires_at is not None
            and round(claim.expires_at.timestamp() * 1e6) > now
        )
        if alive:
            for unit in claim.units:
                live.setdefault(unit, []).append(claim.id)
    assert all(len(ids) == 1 for ids in live.values()), live
    for unit, ids in live.items():
        assert store._units[unit._key]["id"] == ids[0]


# --- the same, over drawn inputs: any sequence of calls answers alike on both paths -----------

Step = tuple[str, Any]


def _steps() -> st.SearchStrategy[list[Step]]:
    few = st.sampled_from(["a", "b", "c"])  # few names, so claims collide
    holders = st.one_of(st.sampled_from(["alice", "bob"]), strategies.names(allow_empty=True))
    unit_targets = strategies.units(few, few)
    claim = st.tuples(
        st.one_of(unit_targets, st.lists(unit_targets, min_size=1, max_size=4),
                  strategies.target_lists(strategies.targets(few))),
        holders,
        st.one_of(st.none(), st.sampled_from(["r1", "r2"]), strategies.names(allow_empty=True)),
        strategies.ttls(),
    )  # fmt: skip
    transition = st.tuples(
        st.sampled_from(["confirm", "extend", "release"]),
        st.integers(0, 5),  # which earlier claim
        st.one_of(st.none(), holders),  # None: the claim's own holder
        st.one_of(st.none(), st.integers(-2, 2), st.sampled_from([0, True, 2**63, 1.0, "1"])),
        strategies.ttls(),
    )
    return st.lists(
        st.one_of(
            st.tuples(st.just("claim"), claim),
            st.tuples(st.just("transition"), transition),
            st.tuples(st.just("advance"), st.sampled_from([0.0005, 0.3, 1.0, 400.0])),
            st.tuples(st.just("sweep"), st.none()),
        ),
        max_size=25,
    )


def _play(cls: type[MemoryStore], steps: list[Step]) -> list[Any]:
    clock = FakeClock()
    store = cls(clock=clock)
    store._id_prefix = "c-"
    made: list[Claim] = []
    outcomes = []
    for kind, arg in steps:
        if kind == "claim":
            targets, holder, request_id, ttl = arg

            def call(t: Any = targets, h: Any = holder, r: Any = request_id, d: Any = ttl) -> Any:
                result = store.claim(t, holder=h, request_id=r, ttl=d)
                if result.claim is not None:
                    made.append(result.claim)
                return result

            outcomes.append(_outcome(call))
        elif kind == "transition":
            method, which, holder, fence_delta, ttl = arg
            if not made:
                continue
            claim = made[which % len(made)]
            who = claim.holder if holder is None else holder
            if fence_delta is None:
                fence: Any = claim.fence
            elif type(fence_delta) is int:
                fence = claim.fence + fence_delta
            else:
                fence = fence_delta
            if method == "extend":
                outcomes.append(
                    _outcome(lambda c=claim, w=who, f=fence, d=ttl: store.extend(
                        c.id, holder=w, fence=f, ttl=d))
                )  # fmt: skip
            else:
                outcomes.append(
                    _outcome(lambda m=method, c=claim, w=who, f=fence: getattr(store, m)(
                        c.id, holder=w, fence=f))
                )  # fmt: skip
        elif kind == "advance":
            clock.advance(arg)
        else:
            outcomes.append(_outcome(store.sweep))
    outcomes.append([_fields(c) for c in store.claim_log().claims()])
    return outcomes


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_steps())
def test_any_sequence_of_calls_answers_alike_on_both_paths(steps: list[Step]) -> None:
    assert _play(MemoryStore, steps) == _play(GeneralPathStore, steps)
