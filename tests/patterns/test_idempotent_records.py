"""``@dibs.idempotent``'s records on every store: how many store calls a call makes, the
records of the previous release, and the race windows the fixed result holder changed.

A first call is four store calls (two writes) and a replay one read; the counts are
pinned here, on both faces, so a change cannot add a round trip unseen. The run hold
now stays to its TTL once a result outlives it, so the tests below also drive by hand
the windows where a winner of the run hold must still find a stored result: a caller
that stalls past the finisher's hold, a result kept shorter than the hold (which is
released, as a caller on the previous release always did), and records written by the
previous release (the done claim under the call's own holder).
"""

from __future__ import annotations

import asyncio
import hashlib
import inspect
import json
import threading
from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest

import dibs
import dibs.aio
from _race import race
from dibs import FakeClock, IdempotencyInProgress, RequestConflict, Store

THREADS = 8


class _Counting:
    """A store that counts the calls the decorator makes, by method."""

    def __init__(self, store: Any) -> None:
        self.store = store
        self.calls: Counter[str] = Counter()
        self.request_retention = store.request_retention

    def __getattr__(self, name: str) -> Any:
        inner = getattr(self.store, name)
        if name not in ("claim", "release", "holder_of", "claims_of"):
            return inner
        if inspect.iscoroutinefunction(inner):

            async def acall(*args: Any, **kwargs: Any) -> Any:
                self.calls[name] += 1
                return await inner(*args, **kwargs)

            return acall

        def call(*args: Any, **kwargs: Any) -> Any:
            self.calls[name] += 1
            return inner(*args, **kwargs)

        return call

    def taken(self) -> Counter[str]:
        """The calls counted since the last look."""
        seen, self.calls = self.calls, Counter()
        return seen


FIRST = Counter(claims_of=1, claim=2, holder_of=1)
"""A first call: no result (one read), the run hold, no result under it, the result."""
REPLAY = Counter(claims_of=1)
"""A replay: the stored result, read by its fixed holder."""


def test_a_first_call_is_four_store_calls_and_a_replay_one(store: Store) -> None:
    counting = _Counting(store)
    runs: list[str] = []

    @dibs.idempotent(counting, key="k")
    def work(k: str) -> str:
        runs.append(k)
        return k * 2

    assert work("a") == "aa"
    assert counting.taken() == FIRST
    for _ in range(3):
        assert work("a") == "aa"
        assert counting.taken() == REPLAY
    assert work("b") == "bb"
    assert counting.taken() == FIRST
    assert runs == ["a", "b"]

    # A result kept shorter than the run hold ends the hold: one more call.
    @dibs.idempotent(counting, key="k", name="short", ttl=600, keep=60)
    def brief(k: str) -> str:
        return k

    assert brief("a") == "a"
    assert counting.taken() == FIRST + Counter(release=1)
    assert brief("a") == "a"
    assert counting.taken() == REPLAY


def test_on_an_async_store_a_first_call_is_four_store_calls_and_a_replay_one(
    aio_url: str,
) -> None:
    async def main() -> None:
        async with dibs.aio.open(aio_url) as store:
            counting = _Counting(store)

            @dibs.idempotent(counting, key="k")
            async def work(k: str) -> str:
                return k * 2

            assert await work("a") == "aa"
            assert counting.taken() == FIRST
            assert await work("a") == "aa"
            assert counting.taken() == REPLAY

    asyncio.run(main())


# --- records written by the previous release -----------------------------------------------------


def _fingerprint(payload: object) -> str:
    text = json.dumps(payload, sort_keys=True, separators=(",", ":"), allow_nan=False)
    return hashlib.sha256(text.encode()).hexdigest()


def _previous_release_record(
    store: Any, name: str, key: str, payload: object, result: str, *, run_hold: bool = False
) -> list[Any]:
    """The claims the previous release wrote for a call that finished: the done unit and
    the result under the call's own holder (``dibs.idempotent.<fingerprint>.<nonce>``),
    the result as printable JSON in one unit; with ``run_hold``, its run hold too, as
    left when ending it failed. Returns the store calls to make (sync or async)."""
    holder = f"dibs.idempotent.{_fingerprint(payload)}.{'ab' * 16}"
    done = dibs.Unit(f"dibs.idempotent.done:{name}", key)
    slot = dibs.Unit(f"dibs.idempotent.result:{name}", f"{'ab' * 16}.000000.t{result}")
    calls = [
        lambda: store.claim([done, slot], holder=holder, ttl=3600, request_id=f"{holder}.done")
    ]
    if run_hold:
        run = dibs.Unit(f"dibs.idempotent.run:{name}", key)
        calls.insert(0, lambda: store.claim(run, holder=holder, ttl=60))
    return calls


@pytest.mark.parametrize("run_hold", [False, True], ids=["released", "left"])
def test_a_result_stored_by_the_previous_release_is_replayed(store: Store, run_hold: bool) -> None:
    for call in _previous_release_record(
        store, "old", "o-1", {"k": "o-1"}, '"then"', run_hold=run_hold
    ):
        assert call()
    runs: list[str] = []
    counting = _Counting(store)

    @dibs.idempotent(counting, key="k", name="old")
    def work(k: str) -> str:
        runs.append(k)
        return "now"

    # Not found by the fixed holder: under the run hold (taken, then let go), or, when
    # the old hold is still there, after the refused claim: found by holder_of.
    per_call = Counter(claims_of=2, claim=1, holder_of=1, release=0 if run_hold else 1)
    for _ in range(3):
        assert work("o-1") == "then"  # replayed, never run again
        assert counting.taken() == +per_call
    assert runs == []
    old_holder = f"dibs.idempotent.{_fingerprint({'k': 'o-1'})}.{'ab' * 16}"
    run = dibs.Unit("dibs.idempotent.run:old", "o-1")
    assert store.holder_of(run) == (old_holder if run_hold else None)
    assert work("o-2") == "now" and runs == ["o-2"]


def test_a_result_stored_by_the_previous_release_with_another_payload_conflicts(
    store: Store,
) -> None:
    for call in _previous_release_record(store, "old", "o-1", {"k": "o-1", "n": 1}, "1"):
        assert call()
    runs: list[int] = []

    @dibs.idempotent(store, key="k", name="old")
    def work(k: str, n: int) -> int:
        runs.append(n)
        return n

    with pytest.raises(RequestConflict):
        work("o-1", 2)
    assert runs == []
    assert store.holder_of(dibs.Unit("dibs.idempotent.run:old", "o-1")) is None  # let go
    assert work("o-1", 1) == 1 and runs == []


def test_on_an_async_store_a_result_stored_by_the_previous_release_is_replayed(
    aio_url: str,
) -> None:
    runs: list[str] = []

    async def main() -> None:
        async with dibs.aio.open(aio_url) as store:
            for call in _previous_release_record(store, "old", "o-1", {"k": "o-1"}, '"then"'):
                assert await call()

            @dibs.idempotent(store, key="k", name="old")
            async def work(k: str) -> str:
                runs.append(k)
                return "now"

            assert await work("o-1") == "then"
            assert await work("o-1") == "then"

    asyncio.run(main())
    assert runs == []


def test_the_previous_release_reads_these_records_as_its_own(store: Store) -> None:
    """What the previous release does on a duplicate (``holder_of`` the done unit, the
    fingerprint from its holder, ``claims_of`` it) finds a result stored by this one."""

    @dibs.idempotent(store, key="k", name="new")
    def work(k: str) -> str:
        return "stored"

    assert work("n-1") == "stored"
    done = dibs.Unit("dibs.idempotent.done:new", "n-1")
    holder = store.holder_of(done)
    assert holder is not None
    assert holder[len("dibs.idempotent.") :].split(".", 1)[0] == _fingerprint({"k": "n-1"})
    (claim,) = [c for c in store.claims_of(holder) if done in c.targets]
    (slot,) = [u.slot for u in claim.units if u.resource == "dibs.idempotent.result:new"]
    assert slot.split(".", 2)[2] == 't"stored"'


# --- the windows where the winner of the run hold must still find a result -----------------------


class _Stalls:
    """A store that runs ``meanwhile`` once, just before the first claim of a run hold."""

    def __init__(self, store: Store, meanwhile: Callable[[], None]) -> None:
        self.store, self.meanwhile = store, meanwhile
        self.request_retention = store.request_retention
        self.armed = True

    def claim(self, targets: Any, **kwargs: Any) -> Any:
        if self.armed and str(kwargs.get("request_id", "")).endswith(".run.0"):
            self.armed = False
            self.meanwhile()
        return self.store.claim(targets, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.store, name)


def test_a_caller_stalled_past_the_finishers_hold_replays_its_result(
    store: Store, clock: FakeClock
) -> None:
    """Caller A finds no result; before its run-hold claim lands, B runs the function,
    stores its result and its hold expires. A wins the run hold and must replay B's
    result (the read under the hold), not run the function again. Skipping that read
    fails this every run."""
    runs: list[str] = []

    def finish_first() -> None:
        assert work_directly("a", "B") == "by B"
        clock.advance(31)  # B's run hold (ttl 30) is over; its result is kept a day

    stalled = _Stalls(store, finish_first)

    def body(k: str, who: str) -> str:
        runs.append(who)
        return f"by {who}"

    work = dibs.idempotent(stalled, key="k", name="stall", ttl=30, payload=lambda k, who: k)(body)
    work_directly = dibs.idempotent(store, key="k", name="stall", ttl=30, payload=lambda k, who: k)(
        body
    )
    assert work("a", "A") == "by B"
    assert runs == ["B"]
    assert store.holder_of(dibs.Unit("dibs.idempotent.run:stall", "a")) is None  # A let go


def test_a_caller_refused_by_a_finished_calls_hold_replays_its_result(store: Store) -> None:
    """Caller A finds no result; B then runs and stores its result, and its run hold stays.
    A's claim of the run hold is refused: A must replay B's result (it reads the result
    before the hold), not say "in progress". Skipping that read fails this every run."""
    runs: list[str] = []
    stalled = _Stalls(store, lambda: runs.append(work_directly("a", "B")))

    def body(k: str, who: str) -> str:
        runs.append(who)
        return f"by {who}"

    work = dibs.idempotent(stalled, key="k", name="refused", payload=lambda k, who: k)(body)
    work_directly = dibs.idempotent(store, key="k", name="refused", payload=lambda k, who: k)(body)
    assert work("a", "A") == "by B"
    assert runs == ["B", "by B"]


def test_a_caller_stalled_past_a_conflicting_finisher_raises_and_frees_the_key(
    store: Store, clock: FakeClock
) -> None:
    runs: list[int] = []

    def finish_first() -> None:
        assert work_directly("a", 1) == 1
        clock.advance(31)

    stalled = _Stalls(store, finish_first)

    def body(k: str, n: int) -> int:
        runs.append(n)
        return n

    work = dibs.idempotent(stalled, key="k", name="stall", ttl=30)(body)
    work_directly = dibs.idempotent(store, key="k", name="stall", ttl=30)(body)
    with pytest.raises(RequestConflict):
        work("a", 2)
    assert runs == [1]
    assert store.holder_of(dibs.Unit("dibs.idempotent.run:stall", "a")) is None


def test_a_result_kept_shorter_than_the_ttl_frees_the_key_when_it_expires(
    store: Store, clock: FakeClock
) -> None:
    """The run hold is released when the result would expire before it: after ``keep``
    the next call runs the function, never "in progress" for the rest of ``ttl``."""
    runs: list[int] = []

    @dibs.idempotent(store, key="k", ttl=600, keep=10)
    def work(k: str) -> int:
        runs.append(1)
        return len(runs)

    assert work("a") == work("a") == 1
    clock.advance(11)
    assert work("a") == 2
    assert runs == [1, 1]


def test_a_lingering_run_hold_is_not_in_progress_while_its_result_is_kept(
    store: Store, clock: FakeClock
) -> None:
    """After a first call the run hold stays to its TTL: a duplicate replays, one with
    another payload conflicts, and after the hold is over, the same again."""

    @dibs.idempotent(store, key="k", ttl=30)
    def work(k: str, n: int) -> int:
        return n

    assert work("a", 1) == 1
    run = dibs.Unit(f"dibs.idempotent.run:{work.__module__}.{work.__qualname__}", "a")
    assert store.holder_of(run) is not None
    for _ in range(2):
        assert work("a", 1) == 1
        with pytest.raises(RequestConflict):
            work("a", 2)
        clock.advance(31)
    assert store.holder_of(run) is None


@pytest.mark.timeout(300)
@pytest.mark.usefixtures("fine_switching")
def test_concurrent_duplicates_run_once_when_each_finisher_ends_its_hold(
    store: Store, store_kind: str
) -> None:
    """Results kept shorter than the ttl: each finisher releases its run hold as it
    stores (as the previous release always did), so a duplicate that looked before the
    result landed can win the hold after it. The read under the hold catches it;
    skipping that read fails this on every store, every run."""
    rounds = {"memory": 150, "sqlite": 30, "postgresql": 30, "etcd": 30}[store_kind]
    runs: Counter[str] = Counter()
    lock = threading.Lock()

    @dibs.idempotent(store, key="k", payload=lambda k, thread: k, ttl=600, keep=300)
    def work(k: str, thread: int) -> str:
        with lock:
            runs[k] += 1
        return f"{k} by {thread}"

    def until_done(key: str, thread: int) -> str:
        while True:
            try:
                return work(key, thread)
            except IdempotencyInProgress:
                pass

    for r in range(rounds):
        key = f"k{r}"
        answers = race(THREADS, lambda thread, key=key: until_done(key, thread))
        assert runs[key] == 1, (key, runs[key])
        assert len(set(answers)) == 1, answers
