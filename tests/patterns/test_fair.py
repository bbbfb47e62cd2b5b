"""Fair waiting: ``wait=`` serves waiters first come, first served, on every store and both faces.

Arrival is forced, never timed: each waiter starts only once the one before it
holds its ticket (the queue's live tickets are counted in the store), so the
arrival order is known, and the test checks the order in which they got in.

In one process a release wakes only the waiter it concerns (``dibs._bell``): the
head, or the one whose tickets ahead are all gone. The in-process order tests
make every release wake every waiter instead (``every_release_wakes_all``), as
a change feed wakes waiters in other processes, so that the order rests on the
head check alone: with it planted away, they fail.
"""

from __future__ import annotations

import asyncio
import os
import random
import subprocess
import sys
import threading
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import dibs
import dibs._bell
import dibs.aio
from conftest import fresh_url
from dibs import FakeClock, ResourceBusy, Store, Unit
from dibs._fair import lease_queue
from dibs._queue import queue_name
from dibs.lease import LEASE_TTL_MIN, Lease
from dibs.limits import TTL_MAX
from dibs.stores.memory import MemoryStore
from eventually import aeventually, eventually
from monotonic import Monotonic

UNIT = Unit("fair-seat", "show-1")
STEP_GUARD = 30.0  # seconds: a hang guard per step, far above any real wait
T = TypeVar("T")
WAITERS = 6


@pytest.fixture
def url(store_kind: str, tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[str]:
    yield from fresh_url(store_kind, tmp_path, request)


@pytest.fixture
def every_release_wakes_all(monkeypatch: pytest.MonkeyPatch) -> None:
    """Any release in this process wakes every waiter, tasks in a random order (see the
    module docstring)."""
    monkeypatch.setattr(dibs._bell, "_news", lambda since, ids: dibs._bell._count != since)
    wake = dibs._bell._wake

    def shuffled(future: asyncio.Future[None]) -> None:
        asyncio.get_running_loop().call_later(random.uniform(0, 0.002), wake, future)

    monkeypatch.setattr(dibs._bell, "_wake", shuffled)


def _tickets(claims: list[dibs.Claim]) -> int:
    """How many of a queue's live claims are tickets (not a joiner's turn at its counter)."""
    return sum(1 for claim in claims if claim.targets[0].slot.isdigit())  # type: ignore[union-attr]


def _queued(store: Store, queue: str) -> Callable[[], int]:
    return lambda: _tickets(store.claims_of(queue))


def _start_in_order(
    store: Store, make: Callable[[int], Any], queue: str, served: list[int]
) -> list[threading.Thread]:
    """Start WAITERS threads one after another, each once the one before it is queued."""

    def wait(me: int) -> None:
        with make(me):
            served.append(me)

    threads = []
    for me in range(WAITERS):
        thread = threading.Thread(target=wait, args=(me,))
        thread.start()
        threads.append(thread)
        eventually(lambda n=me + 1: _queued(store, queue)() == n, f"waiter {me} queued")
    return threads


def _joined(threads: list[threading.Thread]) -> None:
    for thread in threads:
        thread.join(60)
        assert not thread.is_alive()


@pytest.mark.usefixtures("every_release_wakes_all")
def test_lease_waiters_are_served_in_arrival_order(url: str) -> None:
    with dibs.open(url) as store:
        queue, served = lease_queue(UNIT), []
        with store.lease(UNIT, holder="owner", ttl=30):
            threads = _start_in_order(
                store,
                lambda me: store.lease(UNIT, holder=f"w{me}", ttl=30, wait=None),
                queue,
                served,
            )
        _joined(threads)
        assert served == list(range(WAITERS))
        assert store.claims_of(queue) == []


@pytest.mark.usefixtures("every_release_wakes_all")
def test_semaphore_waiters_are_served_in_arrival_order(url: str) -> None:
    with dibs.open(url) as store:
        sem = dibs.Semaphore(store, "fair-pool", permits=1)
        queue, served = queue_name("semaphore", "fair-pool"), []
        with sem.lease(holder="owner", ttl=30):
            threads = _start_in_order(
                store, lambda me: sem.lease(holder=f"w{me}", ttl=30, wait=None), queue, served
            )
        _joined(threads)
        assert served == list(range(WAITERS))
        assert store.claims_of(queue) == []


async def _async_order(url: str, semaphore: bool) -> list[int]:
    async with dibs.aio.open(url) as store:
        sem = dibs.aio.Semaphore(store, "fair-pool", permits=1)
        queue = queue_name("semaphore", "fair-pool") if semaphore else lease_queue(UNIT)

        def make(me: int) -> Any:
            if semaphore:
                return sem.lease(holder=f"w{me}", ttl=30, wait=None)
            return store.lease(UNIT, holder=f"w{me}", ttl=30, wait=None)

        served: list[int] = []

        async def wait(me: int) -> None:
            async with make(me):
                served.append(me)

        async def queued() -> int:
            return _tickets(await store.claims_of(queue))

        owner = (
            sem.lease(holder="owner", ttl=30)
            if semaphore
            else store.lease(UNIT, holder="owner", ttl=30)
        )
        async with owner:
            tasks = []
            for me in range(WAITERS):
                tasks.append(asyncio.create_task(wait(me)))
                await aeventually(lambda n=me + 1: _is(queued, n), f"waiter {me} queued")
        await asyncio.gather(*tasks)
        assert await store.claims_of(queue) == []
        return served


async def _is(count: Callable[[], Any], n: int) -> bool:
    return bool(await count() == n)


@pytest.mark.usefixtures("every_release_wakes_all")
@pytest.mark.parametrize("semaphore", [False, True], ids=["lease", "semaphore"])
def test_async_waiters_are_served_in_arrival_order(url: str, semaphore: bool) -> None:
    assert asyncio.run(_async_order(url, semaphore)) == list(range(WAITERS))


def test_a_waiter_whose_wait_runs_out_leaves_the_queue(url: str) -> None:
    with dibs.open(url) as store, store.lease(UNIT, holder="owner", ttl=30):
        with pytest.raises(ResourceBusy) as busy, store.lease(UNIT, holder="w", ttl=30, wait=0.2):
            pass
        assert busy.value.taken == (UNIT,)
        assert store.claims_of(lease_queue(UNIT)) == []
        sem = dibs.Semaphore(store, "fair-pool", permits=1)
        with sem.lease(holder="a", ttl=30), pytest.raises(ResourceBusy):
            sem.lease(holder="b", ttl=30, wait=0.2).__enter__()
        assert store.claims_of(queue_name("semaphore", "fair-pool")) == []


def test_wait_zero_never_queues(url: str) -> None:
    with dibs.open(url) as store, store.lease(UNIT, holder="owner", ttl=30):
        for _ in range(3):
            with pytest.raises(ResourceBusy), store.lease(UNIT, holder="w", ttl=30):
                pass
        assert store.claims_of(lease_queue(UNIT)) == []


async def _guarded(step: str, awaitable: Awaitable[T]) -> T:
    """``awaitable``'s value; AssertionError naming ``step`` if it never comes (a hang guard)."""
    try:
        async with asyncio.timeout(STEP_GUARD):
            return await awaitable
    except TimeoutError:
        raise AssertionError(f"{step}: no answer in {STEP_GUARD:g} s") from None


async def _cancelled(url: str) -> None:
    # Each step has its own hang guard, so a hang names the step that hung
    # (a loaded CI run once hung here past pytest's timeout with no clue which).
    async with dibs.aio.open(url) as store:
        queue = lease_queue(UNIT)
        async with store.lease(UNIT, holder="owner", ttl=30):

            async def wait() -> None:
                async with store.lease(UNIT, holder="w", ttl=30, wait=None):
                    pytest.fail("entered while the owner holds it")

            task = asyncio.create_task(wait())
            await _guarded(
                "the waiter's ticket",
                aeventually(lambda: _is(lambda: _count(store, queue), 1), "queued"),
            )
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await _guarded("the cancelled waiter's end", asyncio.shield(task))
            # given back before the cancel propagated
            assert await _guarded("claims_of", store.claims_of(queue)) == []


async def _count(store: dibs.aio.AsyncStore, queue: str) -> int:
    return _tickets(await store.claims_of(queue))


def test_a_cancelled_async_waiter_gives_its_ticket_back(url: str) -> None:
    asyncio.run(_cancelled(url))


_WAITER = """
import sys, dibs
store = dibs.open(sys.argv[1])
with store.lease(dibs.Unit("fair-seat", "show-1"), holder="p" + sys.argv[2], ttl=30, wait=None):
    with open(sys.argv[3], "a") as out:
        out.write(sys.argv[2] + "\\n")
"""


@pytest.mark.processes
@pytest.mark.parametrize("store_kind", ["sqlite", "postgresql", "etcd"])
def test_processes_are_served_in_arrival_order_past_a_killed_waiter(
    url: str, tmp_path: Path
) -> None:
    """Four waiting processes; the second is killed with SIGKILL while queued: its ticket
    expires (no one renews it) and the others are served in their arrival order."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    out = tmp_path / "served"
    queue = lease_queue(UNIT)
    with dibs.open(url) as store:
        owner = store.lease(UNIT, holder="owner", ttl=30)
        owner.__enter__()
        waiters = []
        for me in range(4):
            waiters.append(
                subprocess.Popen([sys.executable, "-c", _WAITER, url, str(me), str(out)], env=env)
            )
            eventually(lambda n=me + 1: _queued(store, queue)() == n, f"process {me} queued")
        waiters[1].kill()  # SIGKILL while queued: nothing gives its ticket back
        waiters[1].wait()
        owner.__exit__(None, None, None)
        for me in (0, 2, 3):
            assert waiters[me].wait(100) == 0
        assert out.read_text().split() == ["0", "2", "3"]
        assert store.claims_of(queue) == []


names = st.text(
    st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"),
    min_size=1,
    max_size=30,
)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    resource=names,
    slot=st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00")),
    holder=names,
    ttl=st.one_of(st.just(LEASE_TTL_MIN), st.just(TTL_MAX), st.floats(LEASE_TTL_MIN, TTL_MAX)),
    wait=st.sampled_from([0.01, None]),
)
def test_any_unit_and_ttl_waits_in_its_own_queue(
    resource: str, slot: str, holder: str, ttl: float, wait: float | None
) -> None:
    unit = Unit(resource, slot)
    # The store's clock and the lease's are frozen: a 0.1 s hold neither expires nor counts
    # itself overdue while a loaded machine starves its renewal thread.
    clock = Monotonic()
    with MemoryStore(clock=FakeClock()) as store:
        with Lease(store, unit, holder=holder, ttl=ttl, wait=wait, monotonic=clock) as lease:
            assert store.holder_of(unit) == holder  # free: at once
            if wait is not None:
                with (
                    pytest.raises(ResourceBusy),
                    Lease(store, unit, holder="x", ttl=ttl, wait=wait, monotonic=clock),
                ):
                    pass
        assert lease.claim.holder == holder
        assert store.claims_of(lease_queue(unit)) == []


def test_racing_threads_hold_one_at_a_time_and_all_get_in(url: str, store_kind: str) -> None:
    """Waiters racing without a forced order: one holder at a time, each served, no ticket left."""
    rounds = {"memory": 8, "sqlite": 3, "postgresql": 3, "etcd": 2}[store_kind]
    with dibs.open(url) as store:
        inside, most, served = [0], [0], []
        lock = threading.Lock()

        def work(me: int) -> None:
            for _ in range(rounds):
                with store.lease(UNIT, holder=f"t{me}", ttl=30, wait=None):
                    with lock:
                        inside[0] += 1
                        most[0] = max(most[0], inside[0])
                    served.append(me)
                    with lock:
                        inside[0] -= 1

        threads = [threading.Thread(target=work, args=(me,)) for me in range(6)]
        for thread in threads:
            thread.start()
        _joined(threads)
        assert most[0] == 1
        assert sorted(served) == sorted(list(range(6)) * rounds)
        assert store.claims_of(lease_queue(UNIT)) == []


@pytest.mark.usefixtures("every_release_wakes_all")
def test_booking_exclusive_waiters_are_served_in_arrival_order(url: str) -> None:
    unit = Unit("fair-room", dibs.booking.EXCLUSIVE_SLOT)
    with dibs.open(url) as store:
        queue, served = lease_queue(unit), []
        with dibs.booking.exclusive(store, "fair-room", holder="owner"):
            threads = _start_in_order(
                store,
                lambda me: dibs.booking.exclusive(store, "fair-room", holder=f"w{me}", wait=None),
                queue,
                served,
            )
        _joined(threads)
        assert served == list(range(WAITERS))
        assert store.claims_of(queue) == []


async def _async_booking_order(url: str) -> list[int]:
    unit = Unit("fair-room", dibs.booking.EXCLUSIVE_SLOT)
    async with dibs.aio.open(url) as store:
        queue, served = lease_queue(unit), []

        async def wait(me: int) -> None:
            async with dibs.aio.booking.exclusive(store, "fair-room", holder=f"w{me}", wait=None):
                served.append(me)

        async with dibs.aio.booking.exclusive(store, "fair-room", holder="owner"):
            tasks = []
            for me in range(WAITERS):
                tasks.append(asyncio.create_task(wait(me)))
                await aeventually(
                    lambda n=me + 1: _is(lambda: _count(store, queue), n), f"waiter {me} queued"
                )
        await asyncio.gather(*tasks)
        assert await store.claims_of(queue) == []
        return served


@pytest.mark.usefixtures("every_release_wakes_all")
def test_async_booking_exclusive_waiters_are_served_in_arrival_order(url: str) -> None:
    assert asyncio.run(_async_booking_order(url)) == list(range(WAITERS))
