"""store.lease(): a fenced hold renewed while a block runs, on both faces and every store."""

from __future__ import annotations

import asyncio
import contextlib
import math
import os
import pickle
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings

import dibs
import dibs._lease
import dibs.aio
import dibs.lease
from conftest import SHARED_STORE_KINDS, kinds_offering
from dibs import (
    ClaimState,
    FakeClock,
    HoldLost,
    HoldLostReason,
    InvalidInput,
    ResourceBusy,
    Store,
    StoreUnavailable,
    Unit,
)
from dibs.aio import AsyncStore
from dibs.testing import strategies
from eventually import aeventually, eventually
from monotonic import Monotonic

UNIT = Unit("report", "2026-11-30")


@pytest.fixture
def astore(make_store: Any, clock: FakeClock) -> Iterator[AsyncStore]:
    """The async face on the same kind of store as ``store`` (memory: a store of its own)."""
    url = "memory://" if make_store.kind == "memory" else make_store.url
    yield dibs.aio.open(url, clock=clock)


def arun(astore: AsyncStore, main: Callable[[AsyncStore], Any]) -> Any:
    async def run() -> Any:
        async with astore:
            try:
                return await main(astore)
            finally:
                # Clean-ups a cancelled entry left running finish before the store closes.
                while dibs.lease._background:
                    await asyncio.gather(*dibs.lease._background, return_exceptions=True)

    return asyncio.run(run())


# --- the sync face --------------------------------------------------------------------------------


def test_renewal_keeps_the_hold_alive_well_past_its_ttl(store: Store, clock: FakeClock) -> None:
    with store.lease(UNIT, holder="w1", ttl=30.0, renew_every=0.01) as lease:
        first = lease.claim
        assert first.state is ClaimState.HELD
        assert (lease.id, lease.fence, lease.holder) == (first.id, first.fence, "w1")
        assert lease.targets == (UNIT,) and lease.state is ClaimState.HELD
        for _ in range(8):  # 160 s on the store's clock under a 30 s TTL
            seen = lease.renewals
            clock.advance(20.0)
            eventually(lambda seen=seen: lease.renewals >= seen + 2)  # one sent after the advance
        now = store.get(first.id)
        assert now is not None and now.state is ClaimState.HELD
        assert (lease.claim.id, lease.fence) == (first.id, first.fence)
        assert lease.claim.expires_at is not None and first.expires_at is not None
        assert lease.claim.expires_at > first.expires_at
        assert not store.claim(UNIT, holder="w2", ttl=5.0)
        lease.check()
        assert not lease.lost and lease.error is None


def test_exit_releases_the_hold(store: Store) -> None:
    with store.lease([UNIT, Unit("report", "x")], holder="w1", ttl=30.0) as lease:
        claim_id = lease.claim.id
        assert store.holder_of(UNIT) == "w1"
    ended = store.get(claim_id)
    assert ended is not None and ended.state is ClaimState.RELEASED
    assert store.holder_of(UNIT) is None
    assert not lease.lost and lease.error is None  # released, not lost
    assert store.claim(UNIT, holder="w2", ttl=5.0)


def test_an_exception_in_the_block_still_releases(store: Store) -> None:
    with pytest.raises(KeyError, match="boom"), store.lease(UNIT, holder="w1", ttl=30.0) as lease:
        raise KeyError("boom")
    ended = store.get(lease.claim.id)
    assert ended is not None and ended.state is ClaimState.RELEASED


def test_a_hold_released_from_outside_shows_in_check_and_at_exit(store: Store) -> None:
    with (
        pytest.raises(HoldLost) as lost,
        store.lease(UNIT, holder="w1", ttl=30.0, renew_every=0.01) as lease,
    ):
        store.release(lease.claim.id, holder="w1", fence=lease.fence)
        eventually(lambda: lease.lost)
        with pytest.raises(HoldLost) as early:
            lease.check()
        assert early.value.reason is HoldLostReason.RELEASED
    assert lost.value.reason is HoldLostReason.RELEASED
    assert lost.value.claim_id == lease.claim.id


def test_a_hold_taken_over_between_renewals_raises_at_exit(store: Store, clock: FakeClock) -> None:
    with (
        pytest.raises(HoldLost) as lost,
        store.lease(UNIT, holder="w1", ttl=30.0, renew_every=15.0) as lease,
    ):
        clock.advance(31.0)  # dead before its first renewal is due
        thief = store.claim(UNIT, holder="thief", ttl=30.0)
        assert thief and thief.claim is not None and thief.claim.fence > lease.fence
    assert lost.value.reason is HoldLostReason.TAKEN_OVER
    assert store.holder_of(UNIT) == "thief"  # the fenced release left the thief's claim alone


def test_a_loss_does_not_mask_the_blocks_own_exception(store: Store) -> None:
    with (
        pytest.raises(ZeroDivisionError) as raised,
        store.lease(UNIT, holder="w1", ttl=30.0, renew_every=0.01) as lease,
    ):
        store.release(lease.claim.id, holder="w1", fence=lease.fence)
        eventually(lambda: lease.lost)
        _ = 1 / 0
    assert any("lost" in note for note in raised.value.__notes__)


def test_taken_targets_raise_resource_busy_naming_the_holder(store: Store) -> None:
    other = store.claim(UNIT, holder="alice", ttl=30.0)
    free = Unit("report", "free")
    with pytest.raises(ResourceBusy) as busy, store.lease([free, UNIT], holder="w1", ttl=30.0):
        pytest.fail("entered a lease on taken targets")
    assert isinstance(busy.value, TimeoutError)
    assert busy.value.taken == (UNIT,)
    assert busy.value.holders == {UNIT: "alice"}
    assert busy.value.resource == "report"
    assert "alice" in str(busy.value)
    copy = pickle.loads(pickle.dumps(busy.value))  # errors cross processes unchanged
    assert (copy.taken, copy.holders, copy.waited) == ((UNIT,), {UNIT: "alice"}, busy.value.waited)
    assert store.claims_of("w1") == []  # all or nothing
    assert other.claim is not None and store.holder_of(UNIT) == "alice"


def test_a_lease_never_adopts_a_hold_its_holder_already_has(store: Store) -> None:
    mine = store.claim(UNIT, holder="w1", ttl=30.0)
    assert mine.claim is not None
    with pytest.raises(ResourceBusy) as busy, store.lease(UNIT, holder="w1", ttl=30.0):
        pytest.fail("adopted a claim the lease did not make")
    assert busy.value.holders == {UNIT: "w1"}
    still = store.get(mine.claim.id)
    assert still is not None and still.state is ClaimState.HELD


def test_wait_gives_up_with_resource_busy(store: Store) -> None:
    store.claim(UNIT, holder="alice", ttl=30.0)
    with pytest.raises(ResourceBusy) as busy, store.lease(UNIT, holder="w1", ttl=30.0, wait=0.05):
        pytest.fail("entered a lease on a taken unit")
    assert busy.value.waited >= 0.05


def test_wait_gets_the_targets_once_released(store: Store) -> None:
    other = store.claim(UNIT, holder="alice", ttl=30.0)
    assert other.claim is not None
    release = threading.Timer(
        0.1, store.release, (other.claim.id,), {"holder": "alice", "fence": other.claim.fence}
    )
    release.start()
    with store.lease(UNIT, holder="w1", ttl=30.0, wait=None) as lease:
        assert lease.fence > other.claim.fence
    release.join()


def test_wait_gets_the_targets_once_their_hold_expires(store: Store, clock: FakeClock) -> None:
    store.claim(UNIT, holder="alice", ttl=5.0)  # abandoned: only time frees it
    expire = threading.Timer(0.1, clock.advance, (6.0,))
    expire.start()
    with store.lease(UNIT, holder="w1", ttl=30.0, wait=60.0) as lease:
        assert store.holder_of(UNIT) == "w1" and lease.claim.holder == "w1"
    expire.join()


BAD_ARGUMENTS = [
    ({"ttl": None}, "ttl"),
    ({"ttl": 0.05}, "ttl"),
    ({"ttl": -1.0}, "ttl"),
    ({"ttl": math.nan}, "ttl"),
    ({"ttl": True}, "ttl"),
    ({"ttl": "10"}, "ttl"),
    ({"holder": ""}, "holder"),
    ({"holder": 7}, "holder"),
    ({"holder": "a\x00b"}, "holder"),
    ({"targets": []}, "targets"),
    ({"targets": "report"}, "targets"),
    ({"wait": -1.0}, "wait"),
    ({"wait": math.inf}, "wait"),
    ({"wait": True}, "wait"),
    ({"renew_every": 0.0}, "renew_every"),
    ({"renew_every": 10.0}, "renew_every"),
    ({"renew_every": 1e-9}, "renew_every"),  # a busy loop of extends
    ({"renew_every": 0.009}, "renew_every"),
    ({"renew_every": True}, "renew_every"),
]


@pytest.mark.parametrize(("bad", "field"), BAD_ARGUMENTS)
def test_bad_arguments_raise_invalid_input_naming_them(
    store: Store, bad: dict[str, Any], field: str
) -> None:
    args: dict[str, Any] = {"targets": UNIT, "holder": "w1", "ttl": 10.0, **bad}
    targets = args.pop("targets")
    with pytest.raises(InvalidInput) as raised:
        store.lease(targets, **args)
    assert raised.value.field == field
    assert raised.value.value is bad[field] or raised.value.value == bad[field]
    assert repr(bad[field]) in str(raised.value) or field in {"holder", "targets"}
    if field == "ttl":  # the lease's own rule, not claim()'s (which takes None)
        assert "None" not in str(raised.value).replace(repr(bad[field]), "")
    if field in {"holder", "targets"}:  # the very error claim() gives
        with pytest.raises(InvalidInput) as claimed:
            store.claim(targets, holder=args["holder"], ttl=10.0)
        assert str(claimed.value) == str(raised.value)
    assert store.claims_of("w1") == []


# psycopg_pool's background threads draw from the global random module while they open
# connections, which Hypothesis takes for a strategy using it.
@pytest.mark.filterwarnings("ignore::hypothesis.errors.HypothesisDeprecationWarning")
@settings(
    max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    targets=strategies.target_lists(),
    holder=strategies.names(),
    ttl=strategies.ttls(allow_none=False),
)
def test_any_input_in_the_domain_leases_and_releases(
    store: Store, targets: list[Any], holder: str, ttl: float
) -> None:
    if ttl < dibs.lease.LEASE_TTL_MIN:
        with pytest.raises(InvalidInput) as raised:
            store.lease(targets, holder=holder, ttl=ttl)
        assert raised.value.field == "ttl"
        return
    with store.lease(targets, holder=holder, ttl=ttl) as lease:
        assert set(lease.targets) == set(targets)
        assert [claim.id for claim in store.claims_of(holder)] == [lease.id]
    assert store.claims_of(holder) == []


class Flaky:
    """A store whose answers get lost on demand: the call may have happened, or not."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self.lose_claim_replies = 0
        self.lose_release_replies = 0
        self.slow_replay = 0.0  # seconds the claim after a lost reply takes to answer
        self.clock: Monotonic | None = None  # the lease's: a slow answer moves it, no sleep
        self.failing_extends = 0
        self.request_ids: list[str | None] = []
        self.claims: list[Any] = []
        self.lock = threading.Lock()

    def claim(self, *args: Any, **kwargs: Any) -> Any:
        self.request_ids.append(kwargs.get("request_id"))
        result = self.store.claim(*args, **kwargs)
        self.claims.append(result.claim)
        with self.lock:
            if self.lose_claim_replies:
                self.lose_claim_replies -= 1
                raise StoreUnavailable("the claim's reply was lost")
            slow, self.slow_replay = self.slow_replay, 0.0
        # The lease judges a late answer on its monotonic clock, not the store's.
        if self.clock is not None:
            self.clock.advance(slow)
        else:
            time.sleep(slow)  # the replay's answer comes late, after the store came back
        return result

    def release(self, *args: Any, **kwargs: Any) -> Any:
        result = self.store.release(*args, **kwargs)  # the write lands...
        with self.lock:
            if self.lose_release_replies:
                self.lose_release_replies -= 1
                raise StoreUnavailable("the release's reply was lost")  # ...its answer doesn't
        return result

    def extend(self, *args: Any, **kwargs: Any) -> Any:
        with self.lock:
            if self.failing_extends:
                self.failing_extends -= 1
                raise StoreUnavailable("no answer")
        return self.store.extend(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.store, name)


def test_a_claim_whose_reply_was_lost_is_retried_without_a_second_hold(store: Store) -> None:
    flaky = Flaky(store)
    flaky.lose_claim_replies = 3
    with dibs.lease.Lease(flaky, UNIT, holder="w1", ttl=30.0) as lease:  # type: ignore[arg-type]
        assert [claim.id for claim in store.claims_of("w1")] == [lease.claim.id]
        # Every retry asked with the first attempt's request ID, so the store answered its outcome.
        assert len(flaky.request_ids) == 4 and len(set(flaky.request_ids)) == 1
    assert store.claims_of("w1") == []


def test_renewal_rides_out_a_store_outage_shorter_than_the_ttl(store: Store) -> None:
    flaky = Flaky(store)
    with dibs.lease.Lease(flaky, UNIT, holder="w1", ttl=30.0, renew_every=0.01) as lease:  # type: ignore[arg-type]
        flaky.failing_extends = 20
        eventually(lambda: flaky.failing_extends == 0)
        seen = lease.renewals
        eventually(lambda: lease.renewals > seen)
        lease.check()


def test_an_outage_until_the_hold_could_expire_loses_the_lease(store: Store) -> None:
    flaky = Flaky(store)
    with (
        pytest.raises(HoldLost) as lost,
        dibs.lease.Lease(flaky, UNIT, holder="w1", ttl=1.0, renew_every=0.05) as lease,  # type: ignore[arg-type]
    ):
        flaky.failing_extends = 10**9
        eventually(lambda: lease.lost)
    assert lost.value.reason is HoldLostReason.EXPIRED
    assert isinstance(lost.value.__cause__, StoreUnavailable)


def test_a_release_whose_reply_was_lost_is_no_loss(store: Store) -> None:
    flaky = Flaky(store)
    flaky.lose_release_replies = 1  # the release lands; its retry finds the claim released
    with dibs.lease.Lease(flaky, UNIT, holder="w1", ttl=30.0) as lease:  # type: ignore[arg-type]
        pass
    ended = store.get(lease.id)
    assert ended is not None and ended.state is ClaimState.RELEASED
    assert not lease.lost and lease.error is None


# The lease's clock is frozen but for the late answer, so these hold under any load. A 600 s
# TTL renews every 200 s: a renewal timed by renew_every alone would never come in time.
LATE = 600.0 - 60.0 - 0.2  # answered with 0.2 s left before the margin: renew in 0.1 s
TOO_LATE = 599.0  # answered past the margin: the hold may expire any moment


def test_a_claim_answered_late_is_renewed_before_it_can_expire(store: Store) -> None:
    flaky = Flaky(store)
    flaky.lose_claim_replies = 1
    flaky.slow_replay, flaky.clock = LATE, Monotonic()
    lease = dibs.lease.Lease(flaky, UNIT, holder="w1", ttl=600.0, monotonic=flaky.clock)  # type: ignore[arg-type]
    with lease:
        assert lease.id == flaky.claims[0].id  # the replay answered the first claim
        eventually(lambda: lease.renewals > 0, "renewed in the time the hold had left")
        lease.check()


def test_a_claim_answered_too_late_to_renew_is_dropped_and_claimed_again(store: Store) -> None:
    flaky = Flaky(store)
    flaky.lose_claim_replies = 1
    flaky.slow_replay, flaky.clock = TOO_LATE, Monotonic()
    lease = dibs.lease.Lease(flaky, UNIT, holder="w1", ttl=600.0, monotonic=flaky.clock)  # type: ignore[arg-type]
    with lease:
        first = flaky.claims[0]
        assert lease.id != first.id and lease.fence > first.fence
        lease.check()
        assert [claim.id for claim in store.claims_of("w1")] == [lease.id]
    dropped = store.get(first.id)
    assert dropped is not None and dropped.state is ClaimState.RELEASED


class Counting:
    """A store that counts the claims it is asked."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self.claims = 0

    def claim(self, *args: Any, **kwargs: Any) -> Any:
        self.claims += 1
        return self.store.claim(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.store, name)


def _claims_while_waiting(store: Store) -> int:
    store.claim(UNIT, holder="alice", ttl=60.0)
    counting = Counting(store)
    with (
        pytest.raises(ResourceBusy),
        dibs.lease.Lease(counting, UNIT, holder="w1", ttl=30.0, wait=1.0),  # type: ignore[arg-type]
    ):
        pytest.fail("entered a lease on a taken unit")
    return counting.claims


@pytest.mark.parametrize(
    "store_kind", [k for k in SHARED_STORE_KINDS if k in kinds_offering("change_feed")]
)  # a feed that moves
def test_a_waiters_own_claims_do_not_defeat_its_backoff(make_store: Any) -> None:
    # Each failed claim writes (its request record), which moves the waiter's own change feed
    # (and on PostgreSQL any write in the cluster does): a change may shorten a pause, never end
    # it, so a waiter retries about as often as on memory://, which has no feed.
    polled = _claims_while_waiting(dibs.open("memory://"))
    fed = _claims_while_waiting(make_store())
    assert fed <= 3 * polled + 5, (fed, polled)


def _expire_take_over_and_purge(store: Store, clock: FakeClock) -> None:
    clock.advance(2.0)  # the worker paused: its 1 s hold expired unrenewed
    assert store.claim(UNIT, holder="thief", ttl=60.0)
    store.sweep()
    clock.advance(5.0)
    store.sweep()  # past the retention: the expired claim is gone from the store


@pytest.mark.parametrize("block", ["raises", "succeeds"])
def test_a_hold_purged_before_the_exit_is_a_loss_not_a_claim_not_found(
    make_store: Any, clock: FakeClock, block: str
) -> None:
    store = make_store(clock, request_retention=1.0)
    with (
        pytest.raises(ValueError if block == "raises" else HoldLost) as raised,
        store.lease(UNIT, holder="w1", ttl=1.0, renew_every=0.5) as lease,
    ):
        _expire_take_over_and_purge(store, clock)
        assert store.get(lease.id) is None
        if block == "raises":
            raise ValueError("the block's own error")
    if block == "raises":
        assert any("lost" in note for note in raised.value.__notes__)
    else:
        assert isinstance(raised.value, HoldLost)
        assert raised.value.reason is HoldLostReason.TAKEN_OVER
    assert store.holder_of(UNIT) == "thief"


class BreaksOnRelease:
    """A store whose release fails in a way the lease does not expect."""

    def __init__(self, store: Any) -> None:
        self.store = store

    def release(self, *args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("the release broke")

    def __getattr__(self, name: str) -> Any:
        return getattr(self.store, name)


def test_an_unexpected_release_error_never_masks_the_blocks_exception(store: Store) -> None:
    broken = BreaksOnRelease(store)
    with pytest.raises(KeyError) as raised, dibs.lease.Lease(broken, UNIT, holder="w1", ttl=30.0):  # type: ignore[arg-type]
        raise KeyError("the block's own error")
    assert any("the release broke" in note for note in raised.value.__notes__)
    with (
        pytest.raises(RuntimeError, match="the release broke"),  # after a clean block: raised
        dibs.lease.Lease(broken, Unit("report", "2"), holder="w2", ttl=30.0),  # type: ignore[arg-type]
    ):
        pass


def test_an_interrupted_entry_leaves_no_hold(store: Store) -> None:
    class Interrupted(Flaky):
        def claim(self, *args: Any, **kwargs: Any) -> Any:
            result = super().claim(*args, **kwargs)
            if len(self.claims) == 1:
                raise KeyboardInterrupt  # Ctrl-C while the claim's answer was on its way
            return result

    with pytest.raises(KeyboardInterrupt):
        dibs.lease.Lease(Interrupted(store), UNIT, holder="w1", ttl=30.0).__enter__()  # type: ignore[arg-type]
    assert store.claims_of("w1") == []
    assert store.holder_of(UNIT) is None


def test_an_entry_that_gives_up_on_the_store_leaves_no_hold(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(dibs._lease, "UNAVAILABLE_RETRY", 0.0)  # give up at the first outage
    flaky = Flaky(store)
    flaky.lose_claim_replies = 1  # the claim landed; the lease cannot know
    with pytest.raises(StoreUnavailable):
        dibs.lease.Lease(flaky, UNIT, holder="w1", ttl=30.0).__enter__()  # type: ignore[arg-type]
    assert store.claims_of("w1") == []


class Stuck:
    """A store whose extends hang until let go (a connection that never answers)."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self.go = threading.Event()
        self.stuck = threading.Event()

    def extend(self, *args: Any, **kwargs: Any) -> Any:
        self.stuck.set()
        self.go.wait()
        return self.store.extend(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.store, name)


def test_the_exit_does_not_wait_forever_for_a_stuck_renewal(store: Store) -> None:
    stuck = Stuck(store)
    try:
        with (
            pytest.raises(HoldLost) as lost,
            dibs.lease.Lease(stuck, UNIT, holder="w1", ttl=1.0, renew_every=0.05) as lease,  # type: ignore[arg-type]
        ):
            stuck.stuck.wait()
        assert lost.value.reason is HoldLostReason.EXPIRED  # not renewed: it may have expired
        ended = store.get(lease.id)
        assert ended is not None and ended.state is ClaimState.RELEASED  # released all the same
    finally:
        stuck.go.set()


class BrokenFeed:
    def read(self) -> object:
        raise OSError("the feed's connection broke")

    def close(self) -> None:
        raise OSError("and so did closing it")


def test_a_broken_change_feed_falls_back_to_polling(store: Store) -> None:
    flaky = Flaky(store)
    flaky.change_feed = BrokenFeed  # type: ignore[method-assign]
    other = store.claim(UNIT, holder="alice", ttl=30.0)
    assert other.claim is not None
    release = threading.Timer(
        0.1, store.release, (other.claim.id,), {"holder": "alice", "fence": other.claim.fence}
    )
    release.start()
    with dibs.lease.Lease(flaky, UNIT, holder="w1", ttl=30.0, wait=None) as lease:  # type: ignore[arg-type]
        assert lease.fence > other.claim.fence
    release.join()


def test_a_store_closed_under_the_lease_loses_it_without_masking(store: Store) -> None:
    with (
        pytest.raises(HoldLost) as lost,
        store.lease(UNIT, holder="w1", ttl=30.0, renew_every=0.01) as lease,
    ):
        store.close()
        eventually(lambda: lease.lost)
    assert isinstance(lost.value.__cause__, dibs.StoreClosed)
    with pytest.raises(dibs.StoreClosed):
        store.lease(UNIT, holder="w1", ttl=30.0)


_CRASHING_WORKER = """
import sys, time, dibs
store = dibs.open(sys.argv[1])
with store.lease(dibs.Unit("report", "2026-11-30"), holder="doomed", ttl=1.0) as lease:
    print(lease.fence, flush=True)
    time.sleep(3600)
"""


@pytest.mark.parametrize("store_kind", SHARED_STORE_KINDS)
def test_a_killed_workers_lease_expires_and_a_waiter_gets_it(make_store: Any) -> None:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    worker = subprocess.Popen(
        [sys.executable, "-c", _CRASHING_WORKER, make_store.url],
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        assert worker.stdout is not None
        doomed_fence = int(worker.stdout.readline())
    finally:
        worker.kill()  # SIGKILL: no exit handler releases anything
        worker.communicate()
    store = make_store()  # the real clock: the hold expires a second after its last renewal
    with store.lease(UNIT, holder="w1", ttl=30.0, wait=None) as lease:
        assert lease.fence > doomed_fence
        assert lease.claim.holder == "w1"


def test_a_lease_is_entered_once(store: Store) -> None:
    lease = store.lease(UNIT, holder="w1", ttl=10.0)
    with lease, pytest.raises(RuntimeError), lease:
        pass


@pytest.mark.parametrize("holders", ["one holder", "a holder each"])
def test_contending_threads_never_overlap(store: Store, holders: str, fine_switching: None) -> None:
    threads, rounds = 6, 8
    active = 0
    fences: list[int] = []
    overlaps: list[int] = []
    guard = threading.Lock()

    def work(me: int) -> None:
        nonlocal active
        holder = "w" if holders == "one holder" else f"w{me}"
        for _ in range(rounds):
            with store.lease(UNIT, holder=holder, ttl=30.0, wait=None) as lease:
                with guard:
                    active += 1
                    if active > 1:
                        overlaps.append(active)
                    fences.append(lease.fence)
                time.sleep(0.001)  # real time inside the lease: others contend meanwhile
                lease.check()
                with guard:
                    active -= 1

    workers = [threading.Thread(target=work, args=(i,)) for i in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    assert overlaps == []
    assert len(fences) == threads * rounds
    assert fences == sorted(set(fences))  # each lease's fence beats the one before


# --- the async face -------------------------------------------------------------------------------


def test_async_renewal_keeps_the_hold_alive(astore: AsyncStore, clock: FakeClock) -> None:
    async def main(store: AsyncStore) -> None:
        async with store.lease(UNIT, holder="w1", ttl=30.0, renew_every=0.01) as lease:
            for _ in range(8):
                seen = lease.renewals
                clock.advance(20.0)

                async def renewed(seen: int = seen) -> bool:
                    return lease.renewals >= seen + 2

                await aeventually(renewed)
            now = await store.get(lease.claim.id)
            assert now is not None and now.state is ClaimState.HELD
            assert not await store.claim(UNIT, holder="w2", ttl=5.0)
        assert await store.holder_of(UNIT) is None

    arun(astore, main)


def test_async_loss_raises_hold_lost_promptly_inside_the_task(astore: AsyncStore) -> None:
    async def main(store: AsyncStore) -> None:
        reached = False
        with pytest.raises(HoldLost) as lost:
            async with store.lease(UNIT, holder="w1", ttl=30.0, renew_every=0.01) as lease:
                await store.release(lease.claim.id, holder="w1", fence=lease.fence)
                await asyncio.sleep(3600)  # cut short by the loss, not run out
                reached = True
        assert not reached
        assert lost.value.reason is HoldLostReason.RELEASED
        assert isinstance(lost.value.__context__, asyncio.CancelledError)
        task = asyncio.current_task()
        assert task is not None and task.cancelling() == 0  # nothing left to cancel us later
        await asyncio.sleep(0)

    arun(astore, main)


def test_async_takeover_raises_hold_lost(astore: AsyncStore, clock: FakeClock) -> None:
    async def main(store: AsyncStore) -> None:
        with pytest.raises(HoldLost) as lost:
            async with store.lease(UNIT, holder="w1", ttl=30.0, renew_every=0.01):
                clock.advance(31.0)
                await store.claim(UNIT, holder="thief", ttl=30.0)
                await asyncio.sleep(3600)
        assert lost.value.reason in {HoldLostReason.EXPIRED, HoldLostReason.TAKEN_OVER}

    arun(astore, main)


def test_async_outside_cancellation_propagates_and_releases(astore: AsyncStore) -> None:
    async def main(store: AsyncStore) -> None:
        entered = asyncio.Event()

        async def hold() -> None:
            async with store.lease(UNIT, holder="w1", ttl=30.0, renew_every=0.01):
                entered.set()
                await asyncio.sleep(3600)

        task = asyncio.create_task(hold())
        await entered.wait()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert await store.holder_of(UNIT) is None

    arun(astore, main)


def test_async_outside_cancellation_wins_over_a_loss(astore: AsyncStore) -> None:
    async def main(store: AsyncStore) -> None:
        leases: list[dibs.lease.AsyncLease] = []

        async def hold() -> None:
            async with store.lease(UNIT, holder="w1", ttl=30.0, renew_every=0.01) as lease:
                leases.append(lease)
                await store.release(lease.claim.id, holder="w1", fence=lease.fence)
                await asyncio.sleep(3600)

        task = asyncio.create_task(hold())
        # Cancel the moment the lease is lost: the lease's cancellation and ours arrive together.
        while not (leases and leases[0].lost):
            await asyncio.sleep(0)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    arun(astore, main)


def test_async_a_block_that_swallows_the_cancellation_still_gets_hold_lost(
    astore: AsyncStore,
) -> None:
    async def main(store: AsyncStore) -> None:
        with pytest.raises(HoldLost):
            async with store.lease(UNIT, holder="w1", ttl=30.0, renew_every=0.01) as lease:
                await store.release(lease.claim.id, holder="w1", fence=lease.fence)
                with contextlib.suppress(asyncio.CancelledError):  # a careless block
                    await asyncio.sleep(3600)
        task = asyncio.current_task()
        assert task is not None and task.cancelling() == 0

    arun(astore, main)


def test_async_exception_in_block_releases_and_propagates(astore: AsyncStore) -> None:
    async def main(store: AsyncStore) -> None:
        with pytest.raises(KeyError):
            async with store.lease(UNIT, holder="w1", ttl=30.0):
                raise KeyError("boom")
        assert await store.holder_of(UNIT) is None

    arun(astore, main)


def test_async_taken_raises_then_waits(astore: AsyncStore) -> None:
    async def main(store: AsyncStore) -> None:
        other = await store.claim(UNIT, holder="alice", ttl=30.0)
        assert other.claim is not None
        with pytest.raises(ResourceBusy) as busy:
            async with store.lease(UNIT, holder="w1", ttl=30.0):
                pytest.fail("entered a lease on a taken unit")
        assert busy.value.holders == {UNIT: "alice"}

        counting = AsyncCounting(store)

        async def release_once_refused() -> None:
            # A second claim asked means the first was refused: the lease is waiting.
            await aeventually(lambda: counting.claims >= 2, "the lease's retry")
            assert other.claim is not None
            await store.release(other.claim.id, holder="alice", fence=other.claim.fence)

        releaser = asyncio.create_task(release_once_refused())
        async with dibs.lease.AsyncLease(counting, UNIT, holder="w1", ttl=30.0, wait=None) as lease:  # type: ignore[arg-type]
            assert lease.fence > other.claim.fence
        await releaser

    arun(astore, main)


def test_async_cancelled_entry_leaves_no_hold(astore: AsyncStore) -> None:
    async def main(store: AsyncStore) -> None:
        for step in range(12):  # cancel at successive points of the entry's life
            task = asyncio.create_task(_enter_and_hold(store, f"w{step}"))
            for _ in range(step):
                await asyncio.sleep(0)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            while dibs.lease._background:
                await asyncio.gather(*dibs.lease._background, return_exceptions=True)
            assert await store.claims_of(f"w{step}") == []

    arun(astore, main)


async def _enter_and_hold(store: AsyncStore, holder: str) -> None:
    async with store.lease(UNIT, holder=holder, ttl=30.0, wait=None):
        await asyncio.sleep(3600)


class AsyncCounting:
    """:class:`Counting` for the async face."""

    def __init__(self, store: AsyncStore) -> None:
        self.store = store
        self.claims = 0

    async def claim(self, *args: Any, **kwargs: Any) -> Any:
        self.claims += 1
        return await self.store.claim(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.store, name)


class AsyncHanging:
    """An async store whose extends never answer."""

    def __init__(self, store: AsyncStore) -> None:
        self.store = store

    async def extend(self, *args: Any, **kwargs: Any) -> Any:
        await asyncio.sleep(3600)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.store, name)


def test_async_an_extend_that_never_answers_loses_the_lease(astore: AsyncStore) -> None:
    async def main(store: AsyncStore) -> None:
        hanging = AsyncHanging(store)
        with pytest.raises(HoldLost) as lost:
            async with dibs.lease.AsyncLease(hanging, UNIT, holder="w1", ttl=1.0):  # type: ignore[arg-type]
                await asyncio.sleep(3600)
        assert lost.value.reason is HoldLostReason.EXPIRED

    arun(astore, main)


@pytest.mark.parametrize(("bad", "field"), BAD_ARGUMENTS)
def test_async_bad_arguments_raise_invalid_input(
    astore: AsyncStore, bad: dict[str, Any], field: str
) -> None:
    args: dict[str, Any] = {"targets": UNIT, "holder": "w1", "ttl": 10.0, **bad}
    targets = args.pop("targets")
    with pytest.raises(InvalidInput) as raised:
        astore.lease(targets, **args)
    assert raised.value.field == field


@pytest.mark.parametrize("holders", ["one holder", "a holder each"])
def test_async_contending_tasks_never_overlap(astore: AsyncStore, holders: str) -> None:
    tasks, rounds = 8, 6

    async def main(store: AsyncStore) -> None:
        active = 0
        fences: list[int] = []
        overlaps: list[int] = []

        async def work(me: int) -> None:
            nonlocal active
            holder = "w" if holders == "one holder" else f"w{me}"
            for _ in range(rounds):
                async with store.lease(UNIT, holder=holder, ttl=30.0, wait=None) as lease:
                    active += 1
                    if active > 1:
                        overlaps.append(active)
                    fences.append(lease.fence)
                    await asyncio.sleep(0.001)  # a real pause inside: others contend meanwhile
                    active -= 1

        await asyncio.gather(*(work(i) for i in range(tasks)))
        assert overlaps == []
        assert len(fences) == tasks * rounds
        assert fences == sorted(set(fences))

    arun(astore, main)


class AsyncFlaky:
    """:class:`Flaky` for the async face."""

    def __init__(self, store: AsyncStore) -> None:
        self.store = store
        self.lose_claim_replies = 0
        self.lose_release_replies = 0
        self.slow_replay = 0.0
        self.clock: Monotonic | None = None
        self.claims: list[Any] = []
        self.release_fails: Exception | None = None

    async def claim(self, *args: Any, **kwargs: Any) -> Any:
        result = await self.store.claim(*args, **kwargs)
        self.claims.append(result.claim)
        if self.lose_claim_replies:
            self.lose_claim_replies -= 1
            raise StoreUnavailable("the claim's reply was lost")
        slow, self.slow_replay = self.slow_replay, 0.0
        if self.clock is not None:  # the lease ages answers on its monotonic clock
            self.clock.advance(slow)
        else:
            await asyncio.sleep(slow)
        return result

    async def release(self, *args: Any, **kwargs: Any) -> Any:
        if self.release_fails is not None:
            raise self.release_fails
        result = await self.store.release(*args, **kwargs)
        if self.lose_release_replies:
            self.lose_release_replies -= 1
            raise StoreUnavailable("the release's reply was lost")
        return result

    def __getattr__(self, name: str) -> Any:
        return getattr(self.store, name)


def test_async_a_release_whose_reply_was_lost_is_no_loss(astore: AsyncStore) -> None:
    async def main(store: AsyncStore) -> None:
        flaky = AsyncFlaky(store)
        flaky.lose_release_replies = 1
        async with dibs.lease.AsyncLease(flaky, UNIT, holder="w1", ttl=30.0) as lease:  # type: ignore[arg-type]
            pass
        ended = await store.get(lease.id)
        assert ended is not None and ended.state is ClaimState.RELEASED
        assert not lease.lost

    arun(astore, main)


def test_async_a_claim_answered_late_is_renewed_before_it_can_expire(astore: AsyncStore) -> None:
    async def main(store: AsyncStore) -> None:
        flaky = AsyncFlaky(store)
        flaky.lose_claim_replies = 1
        flaky.slow_replay, flaky.clock = LATE, Monotonic()
        lease = dibs.lease.AsyncLease(flaky, UNIT, holder="w1", ttl=600.0, monotonic=flaky.clock)  # type: ignore[arg-type]
        async with lease:
            assert lease.id == flaky.claims[0].id

            async def renewed() -> bool:
                return lease.renewals > 0

            await aeventually(renewed, "renewed in the time the hold had left")
            lease.check()

    arun(astore, main)


def test_async_a_claim_answered_too_late_to_renew_is_claimed_again(astore: AsyncStore) -> None:
    async def main(store: AsyncStore) -> None:
        flaky = AsyncFlaky(store)
        flaky.lose_claim_replies = 1
        flaky.slow_replay, flaky.clock = TOO_LATE, Monotonic()
        lease = dibs.lease.AsyncLease(flaky, UNIT, holder="w1", ttl=600.0, monotonic=flaky.clock)  # type: ignore[arg-type]
        async with lease:
            first = flaky.claims[0]
            assert lease.id != first.id and lease.fence > first.fence
            lease.check()
        dropped = await store.get(first.id)
        assert dropped is not None and dropped.state is ClaimState.RELEASED

    arun(astore, main)


@pytest.mark.parametrize("block", ["raises", "succeeds"])
def test_async_a_hold_purged_before_the_exit_is_a_loss(
    make_store: Any, clock: FakeClock, block: str
) -> None:
    url = "memory://" if make_store.kind == "memory" else make_store.url
    astore = dibs.aio.open(url, clock=clock, request_retention=1.0)

    async def main(store: AsyncStore) -> None:
        with pytest.raises(ValueError if block == "raises" else HoldLost) as raised:
            async with store.lease(UNIT, holder="w1", ttl=1.0, renew_every=0.5) as lease:
                clock.advance(2.0)
                assert await store.claim(UNIT, holder="thief", ttl=60.0)
                await store.sweep()
                clock.advance(5.0)
                await store.sweep()
                assert await store.get(lease.id) is None
                if block == "raises":
                    raise ValueError("the block's own error")
        if block == "raises":
            assert any("lost" in note for note in raised.value.__notes__)
        else:
            assert isinstance(raised.value, HoldLost)
            assert raised.value.reason is HoldLostReason.TAKEN_OVER

    arun(astore, main)


def test_async_an_unexpected_release_error_never_masks_the_blocks_exception(
    astore: AsyncStore,
) -> None:
    async def main(store: AsyncStore) -> None:
        broken = AsyncFlaky(store)
        broken.release_fails = RuntimeError("the release broke")
        with pytest.raises(KeyError) as raised:
            async with dibs.lease.AsyncLease(broken, UNIT, holder="w1", ttl=30.0):  # type: ignore[arg-type]
                raise KeyError("the block's own error")
        assert any("the release broke" in note for note in raised.value.__notes__)
        with pytest.raises(RuntimeError, match="the release broke"):
            async with dibs.lease.AsyncLease(broken, Unit("report", "2"), holder="w2", ttl=30.0):  # type: ignore[arg-type]
                pass

    arun(astore, main)


def test_async_a_lease_exited_in_another_task_says_so_and_releases(astore: AsyncStore) -> None:
    async def main(store: AsyncStore) -> None:
        lease = store.lease(UNIT, holder="w1", ttl=30.0)
        await asyncio.create_task(lease.__aenter__())
        with pytest.raises(RuntimeError, match="task that entered it"):
            await lease.__aexit__(None, None, None)
        assert await store.holder_of(UNIT) is None

    arun(astore, main)
