"""dibs.Semaphore: at most ``permits`` live holders, on every store and both faces, under races.

The invariant is checked with a counter that each holder raises after its lease is
entered and lowers before it exits, so the counted holders are always a subset of the
live ones: a count over the limit is a real breach, never a false alarm.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import dibs
import dibs.aio
from conftest import fresh_url
from dibs import InvalidInput, ResourceBusy, Store, Unit
from dibs.semaphore import PERMITS_MAX
from eventually import eventually

QUICK = True

# Threads x rounds of the race per store: the SQL stores commit every call.
ROUNDS = {"memory": 60, "sqlite": 12, "postgresql": 10, "etcd": 6}


@pytest.fixture
def url(store_kind: str, tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[str]:
    yield from fresh_url(store_kind, tmp_path, request)


def test_permits_are_granted_then_refused_then_freed(store: Store) -> None:
    sem = dibs.Semaphore(store, "reports", permits=2)
    with sem.lease(holder="a", ttl=30) as first, sem.lease(holder="b", ttl=30) as second:
        assert {first.slot, second.slot} == {0, 1}
        assert first.fence != second.fence or first.slot != second.slot
        assert sorted(sem.holders()) == ["a", "b"]
        assert first.permits == 2
        with pytest.raises(ResourceBusy) as busy, sem.lease(holder="c", ttl=30):
            pass
        assert busy.value.resource == "reports"
        assert busy.value.permits == 2
    assert sem.holders() == []
    with sem.lease(holder="c", ttl=30) as third:
        assert store.holder_of(Unit("reports", str(third.slot))) == "c"


def test_one_holder_may_hold_several_permits(store: Store) -> None:
    sem = dibs.Semaphore(store, "k", permits=2)
    with sem.lease(holder="a", ttl=30), sem.lease(holder="a", ttl=30):
        assert sem.holders() == ["a", "a"]


def test_permits_zero_admits_no_one(store: Store) -> None:
    sem = dibs.Semaphore(store, "paused", permits=0)
    with pytest.raises(ResourceBusy), sem.lease(holder="a", ttl=30):
        pass


def test_the_limit_is_the_stores_and_changes_at_run_time(store: Store) -> None:
    first = dibs.Semaphore(store, "tenant-7", permits=3)
    assert first.current_permits() == 3
    other = dibs.Semaphore(store, "tenant-7", permits=3)
    other.set_permits(1)
    assert first.current_permits() == 1
    with first.lease(holder="a", ttl=30), pytest.raises(ResourceBusy):
        other.lease(holder="b", ttl=30).__enter__()
    # A handle declaring another limit replaces it on first use.
    assert dibs.Semaphore(store, "tenant-7", permits=5).current_permits() == 5


def test_a_lowered_limit_admits_no_one_until_the_count_is_below_it(store: Store) -> None:
    sem = dibs.Semaphore(store, "q", permits=4)
    held = [sem.lease(holder=f"h{i}", ttl=30) for i in range(4)]
    for lease in held:
        lease.__enter__()
    sem.set_permits(2)
    newcomer = dibs.Semaphore(store, "q", permits=2)
    by_slot = sorted(held, key=lambda lease: lease.slot)
    for leaving, admitted in ((by_slot[0], False), (by_slot[3], False), (by_slot[1], True)):
        leaving.__exit__(None, None, None)
        try:
            with newcomer.lease(holder="new", ttl=30):
                got = True
                assert len(newcomer.holders()) <= 2
        except ResourceBusy:
            got = False
        assert got is admitted, (leaving.slot, newcomer.holders())
    by_slot[2].__exit__(None, None, None)
    # Raised again: the slots above come back.
    sem.set_permits(4)
    leases = [sem.lease(holder=f"x{i}", ttl=30) for i in range(4)]
    for lease in leases:
        lease.__enter__()
    assert sorted(lease.slot for lease in leases) == [0, 1, 2, 3]
    for lease in leases:
        lease.__exit__(None, None, None)


class _PausingStore:
    """The store, but the first permit claim of holder ``a`` waits for ``go``: an
    acquirer stopped between reading the limit and claiming its slot."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self.paused = threading.Event()
        self.go = threading.Event()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.store, name)

    def lease(self, target: Unit, **options: Any) -> Any:
        if options["holder"] == "a" and not self.paused.is_set():
            self.paused.set()
            assert self.go.wait(60)
        return self.store.lease(target, **options)


def test_an_admission_is_judged_again_when_the_limit_changed_before_its_claim(
    store: Store,
) -> None:
    # A reads the limit (4) and stops before claiming a slot. The limit drops to 1 and B
    # is admitted. A's claim then lands under the new limit: it must not stand.
    pausing = _PausingStore(store)
    sem_a = dibs.Semaphore(pausing, "rejudge", permits=4)  # type: ignore[arg-type]
    sem_a.current_permits()  # declared now, so that A's lease declares nothing later
    outcome: list[object] = []

    def acquire_a() -> None:
        try:
            with sem_a.lease(holder="a", ttl=30, wait=0):
                outcome.append("admitted")
        except ResourceBusy:
            outcome.append("busy")

    a = threading.Thread(target=acquire_a)
    a.start()
    assert pausing.paused.wait(60)
    sem = dibs.Semaphore(store, "rejudge", permits=1)  # its first use lowers the limit to 1
    with sem.lease(holder="b", ttl=30, wait=0):
        pausing.go.set()
        a.join(60)
        assert outcome == ["busy"]  # judged again under 1, with B holding
        assert sem.holders() == ["b"]


class _PausedLease:
    """An async lease whose entry first waits for the test's ``go``."""

    def __init__(self, lease: Any, pausing: _AsyncPausingStore) -> None:
        self.lease = lease
        self.pausing = pausing

    async def __aenter__(self) -> Any:
        self.pausing.paused.set()
        await asyncio.wait_for(self.pausing.go.wait(), 60)
        return await self.lease.__aenter__()

    async def __aexit__(self, *exc: Any) -> Any:
        return await self.lease.__aexit__(*exc)


class _AsyncPausingStore:
    """:class:`_PausingStore` for the async face: A's first permit claim waits for ``go``."""

    def __init__(self, store: dibs.aio.AsyncStore) -> None:
        self.store = store
        self.paused = asyncio.Event()
        self.go = asyncio.Event()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.store, name)

    def lease(self, target: Unit, **options: Any) -> Any:
        lease = self.store.lease(target, **options)
        if options["holder"] == "a" and not self.paused.is_set():
            return _PausedLease(lease, self)
        return lease


async def _async_rejudge(url: str) -> list[object]:
    async with dibs.aio.open(url) as store:
        pausing = _AsyncPausingStore(store)
        sem_a = dibs.aio.Semaphore(pausing, "rejudge", permits=4)  # type: ignore[arg-type]
        await sem_a.current_permits()  # declared now, so that A's lease declares nothing later
        outcome: list[object] = []

        async def acquire_a() -> None:
            try:
                async with sem_a.lease(holder="a", ttl=30, wait=0):
                    outcome.append("admitted")
            except ResourceBusy:
                outcome.append("busy")

        a = asyncio.create_task(acquire_a())
        await asyncio.wait_for(pausing.paused.wait(), 60)
        sem = dibs.aio.Semaphore(store, "rejudge", permits=1)  # lowers the limit to 1
        async with sem.lease(holder="b", ttl=30, wait=0):
            pausing.go.set()
            await asyncio.wait_for(a, 60)
            assert await sem.holders() == ["b"]
        return outcome


def test_an_admission_is_judged_again_when_the_limit_changed_before_its_claim_async(
    url: str,
) -> None:
    # The async face of the test above: A's claim lands under the lowered limit.
    assert asyncio.run(_async_rejudge(url)) == ["busy"]


def test_a_lost_permit_raises_hold_lost(store: Store) -> None:
    sem = dibs.Semaphore(store, "k", permits=1)
    # Renewing often, the lease learns of the loss at its next renewal, not in 10 s.
    with pytest.raises(dibs.HoldLost), sem.lease(holder="a", ttl=30, renew_every=0.05) as permit:
        store.release(permit.id, holder="a", fence=permit.fence)
        eventually(lambda: permit.lost, "the renewal found the permit's hold released")
        permit.check()


class _Limits:
    """The limits set so far, in order: an admission is judged under one current meanwhile."""

    def __init__(self, first: int) -> None:
        self.history = [first]
        self.lock = threading.Lock()

    def now(self) -> int:
        return len(self.history) - 1

    def bound(self, since: int) -> int:
        with self.lock:
            return max(self.history[since:])


def _race(store: Store, kind: str, *, changes: list[int], permits: int = 3) -> list[str]:
    """Threads hammer one semaphore while the limit changes; the breaches found."""
    threads = 8
    rounds = ROUNDS[kind]
    limits = _Limits(permits)
    active = 0
    breaches: list[str] = []
    guard = threading.Lock()
    done = threading.Event()

    def work(me: int) -> None:
        nonlocal active
        for _ in range(rounds):
            since = limits.now()
            with sem.lease(holder=f"w{me}", ttl=30, wait=None):
                with guard:
                    active += 1
                    bound = limits.bound(since)
                    if active > bound:
                        breaches.append(f"{active} holders under a limit of {bound}")
                time.sleep(0.002)
                with guard:
                    active -= 1

    def control() -> None:
        for limit in changes:
            if done.wait(0.03):
                return
            with limits.lock:
                sem.set_permits(limit)
                limits.history.append(limit)

    sem = dibs.Semaphore(store, "race", permits=permits)  # one handle, shared by the threads
    sem.current_permits()  # declared before the race
    workers = [threading.Thread(target=work, args=(i,)) for i in range(threads)]
    controller = threading.Thread(target=control)
    for thread in [*workers, controller]:
        thread.start()
    for thread in workers:
        thread.join()
    done.set()
    controller.join()
    return breaches


def test_threads_never_exceed_the_limit(store: Store, store_kind: str) -> None:
    assert _race(store, store_kind, changes=[]) == []


def test_threads_never_exceed_a_limit_changed_mid_race(store: Store, store_kind: str) -> None:
    assert _race(store, store_kind, changes=[5, 2, 4, 1, 3, 2, 5, 1] * 3) == []


_PROCESS_ROUNDS = 5  # at least; the workers go on until the limit has stopped changing
_PROCESS_HOLD = {"sqlite": 0.1, "postgresql": 0.1, "etcd": 0.4}  # longer than an acquire there
_PROCESS_CHANGES = [4, 1, 4, 2, 3, 1] * 5  # many lowerings, each with holders above it


def _holder_process(url: str, me: int, hold: float, shared: tuple[Any, ...]) -> None:
    active, breaches, lock, limits, changes, started, done = shared
    with dibs.open(url) as store:
        sem = dibs.Semaphore(store, "procs", permits=2)
        sem.current_permits()  # declared (2) by the parent already: nothing written
        with lock:
            started.value += 1
        rounds = 0
        while rounds < _PROCESS_ROUNDS or not done.value:
            # wait=0 and a retry here: each attempt is judged by the limits current during it.
            with lock:
                since = changes.value
            try:
                permit = sem.lease(holder=f"p{me}", ttl=30).__enter__()
            except ResourceBusy:
                time.sleep(0.001)
                continue
            rounds += 1
            with lock:
                active.value += 1
                bound = max(limits[since : changes.value + 1])
                if active.value > bound:
                    breaches.value += 1
            time.sleep(hold)  # longer than an acquire on a loaded machine: holders overlap
            with lock:
                active.value -= 1
            permit.__exit__(None, None, None)


@pytest.mark.processes
@pytest.mark.parametrize("store_kind", ["sqlite", "postgresql", "etcd"])
@pytest.mark.parametrize("start", ["fork", "spawn"])
@pytest.mark.parametrize("changing", [False, True], ids=["fixed", "changed-mid-race"])
def test_processes_never_exceed_the_limit(
    url: str, store_kind: str, start: str, changing: bool
) -> None:
    hold = _PROCESS_HOLD[store_kind]
    context = multiprocessing.get_context(start)
    lock = context.Lock()
    limits = context.Array("i", [2] * (len(_PROCESS_CHANGES) + 1), lock=False)
    changes, started, done = context.Value("i", 0), context.Value("i", 0), context.Value("i", 0)
    shared = (context.Value("i", 0), context.Value("i", 0), lock, limits, changes, started, done)
    with dibs.open(url) as store:
        sem = dibs.Semaphore(store, "procs", permits=2)
        sem.current_permits()
        workers = [
            context.Process(target=_holder_process, args=(url, me, hold, shared)) for me in range(5)
        ]
        for worker in workers:
            worker.start()
        while started.value < len(workers):  # spawn takes a while: change under contention
            time.sleep(0.01)
        for limit in _PROCESS_CHANGES if changing else []:
            time.sleep(2 * hold)
            with lock:  # the workers judge by the limits current while they acquired
                sem.set_permits(limit)
                limits[changes.value + 1] = limit
                changes.value += 1
        done.value = 1
        for worker in workers:
            worker.join(100)
            assert worker.exitcode == 0
    assert shared[1].value == 0


_DOOMED = """
import sys, time, dibs
store = dibs.open(sys.argv[1])
sem = dibs.Semaphore(store, "procs", permits=1)
with sem.lease(holder="doomed", ttl=1.0) as permit:
    print(permit.fence, flush=True)
    time.sleep(3600)
"""


@pytest.mark.processes
@pytest.mark.parametrize("store_kind", ["sqlite", "postgresql", "etcd"])
def test_a_killed_holders_permit_comes_back_when_its_lease_ends(url: str) -> None:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    doomed = subprocess.Popen(
        [sys.executable, "-c", _DOOMED, url], stdout=subprocess.PIPE, text=True, env=env
    )
    try:
        assert doomed.stdout is not None
        doomed_fence = int(doomed.stdout.readline())
    finally:
        doomed.kill()  # SIGKILL: nothing releases the permit
        doomed.communicate()
    with dibs.open(url) as store:
        sem = dibs.Semaphore(store, "procs", permits=1)
        with pytest.raises(ResourceBusy):
            sem.lease(holder="next", ttl=30).__enter__()
        with sem.lease(holder="next", ttl=30, wait=None) as permit:
            assert permit.fence > doomed_fence
            assert sem.holders() == ["next"]


# --- the async face ----------------------------------------------------------------


async def _async_race(url: str) -> list[int]:
    async with dibs.aio.open(url) as store:
        sem = dibs.aio.Semaphore(store, "race", permits=2)
        active, peaks = 0, []

        async def work(me: int) -> None:
            nonlocal active
            for _ in range(5):
                async with sem.lease(holder=f"t{me}", ttl=30, wait=None) as permit:
                    assert permit.slot in (0, 1)
                    active += 1
                    peaks.append(active)
                    await asyncio.sleep(0.002)
                    active -= 1

        await asyncio.gather(*(work(me) for me in range(6)))
        assert await sem.holders() == []
        return peaks


def test_async_tasks_never_exceed_the_limit(url: str) -> None:
    peaks = asyncio.run(_async_race(url))
    assert max(peaks) <= 2


async def _async_basics(url: str) -> None:
    async with dibs.aio.open(url) as store:
        sem = dibs.aio.Semaphore(store, "k", permits=1)
        async with sem.lease(holder="a", ttl=30) as permit:
            assert await sem.holders() == ["a"]
            assert permit.permits == 1
            with pytest.raises(ResourceBusy):
                async with sem.lease(holder="b", ttl=30):
                    pass
        await sem.set_permits(2)
        assert await sem.current_permits() == 2
        async with sem.lease(holder="a", ttl=30), sem.lease(holder="b", ttl=30):
            assert sorted(await sem.holders()) == ["a", "b"]


def test_async_face_grants_refuses_and_changes(url: str) -> None:
    asyncio.run(_async_basics(url))


@pytest.mark.parametrize(
    ("key", "permits", "holder", "ttl", "field"),
    [
        ("", 1, "a", 1.0, "key"),
        ("k", -1, "a", 1.0, "permits"),
        ("k", 2**70, "a", 1.0, "permits"),
        ("k", True, "a", 1.0, "permits"),
        ("k", 1, "", 1.0, "holder"),
        ("k", 1, "a", 0.01, "ttl"),
        ("k", 1, "a", float("nan"), "ttl"),
    ],
)
def test_async_face_refuses_bad_input_alike(
    url: str, key: Any, permits: Any, holder: Any, ttl: Any, field: str
) -> None:
    async def attempt() -> None:
        async with dibs.aio.open(url) as store:
            sem = dibs.aio.Semaphore(store, key, permits=permits)
            async with sem.lease(holder=holder, ttl=ttl):
                pass

    with pytest.raises(InvalidInput) as bad:
        asyncio.run(attempt())
    assert bad.value.field == field


# --- the input domain --------------------------------------------------------------

_valid_names = st.text(
    st.characters(codec="utf-8", exclude_characters="\x00"), min_size=1, max_size=40
)
_names = _valid_names | st.sampled_from(["", "a\x00b", "\ud800", "x" * 1025, "é" * 513]) | st.none()
_numbers = (
    st.integers()
    | st.floats(allow_nan=True)
    | st.sampled_from([True, False, -1, PERMITS_MAX, PERMITS_MAX + 1, 2**63, "3"])
)
_ttls = st.floats(allow_nan=True) | st.sampled_from([0.1, 0.0999, 366 * 86400.0, 1e300, "1"])


def _outcome(fn: Any) -> tuple[str, str | None]:
    try:
        fn()
    except InvalidInput as exc:
        return "invalid", exc.field
    except ResourceBusy:
        return "busy", None
    return "ok", None


@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
@given(key=_names, permits=_numbers, holder=_names, ttl=_ttls)
def test_bad_input_is_invalid_input_naming_it(
    store: Store, key: Any, permits: Any, holder: Any, ttl: Any
) -> None:
    def attempt() -> None:
        sem = dibs.Semaphore(store, key, permits=permits)
        with sem.lease(holder=holder, ttl=ttl):
            pass

    result, field = _outcome(attempt)
    key_ok = _outcome(lambda: Unit(key, "0"))[0] == "ok"
    permits_ok = (
        isinstance(permits, int) and not isinstance(permits, bool) and 0 <= permits <= PERMITS_MAX
    )
    holder_ok = _outcome(lambda: dibs.ClaimRequest(Unit("r"), holder=holder))[0] == "ok"
    ttl_ok = (
        isinstance(ttl, int | float) and not isinstance(ttl, bool) and 0.1 <= ttl <= 366 * 86400.0
    )
    if not key_ok:
        assert (result, field) == ("invalid", "key")
    elif not permits_ok:
        assert (result, field) == ("invalid", "permits")
    elif not (holder_ok and ttl_ok):
        assert result == "invalid"
        assert field in {"holder", "ttl"}
    else:
        assert result == ("busy" if permits == 0 else "ok")
