"""A lease's lifecycle: ``on_lost`` and ``max_hold``, on both faces and every store.

Times the lease judges (overdue, max_hold) run on a fake monotonic clock the test moves;
the store runs on its fake clock. Nothing here waits for a duration to pass.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest

import dibs
import dibs.aio
import dibs.lease
from dibs import FakeClock, HoldLost, HoldLostReason, InvalidInput, Store, Unit
from dibs.aio import AsyncStore
from eventually import aeventually, eventually
from monotonic import Monotonic

UNIT = Unit("report", "2026-11-30")


class Told:
    """An ``on_lost`` that records each call: the loss and the thread (or task) it ran in."""

    def __init__(self, raises: bool = False) -> None:
        self.calls: list[tuple[HoldLost, str]] = []
        self.raises = raises

    def __call__(self, lost: HoldLost) -> None:
        task = _task_name()
        self.calls.append((lost, task or threading.current_thread().name))
        if self.raises:
            raise RuntimeError("on_lost failed")


def _task_name() -> str | None:
    try:
        task = asyncio.current_task()
    except RuntimeError:
        return None
    return None if task is None else task.get_name()


class Extends:
    """A store that records the lease clock's time at each extend it is asked."""

    def __init__(self, store: Any, clock: Monotonic) -> None:
        self.store, self.clock = store, clock
        self.sent: list[float] = []

    def extend(self, *args: Any, **kwargs: Any) -> Any:
        self.sent.append(self.clock())
        return self.store.extend(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.store, name)


class AsyncExtends(Extends):
    async def extend(self, *args: Any, **kwargs: Any) -> Any:  # type: ignore[override]
        self.sent.append(self.clock())
        return await self.store.extend(*args, **kwargs)


@pytest.fixture
def astore(make_store: Any, clock: FakeClock) -> Iterator[AsyncStore]:
    url = "memory://" if make_store.kind == "memory" else make_store.url
    yield dibs.aio.open(url, clock=clock)


def arun(astore: AsyncStore, main: Callable[[AsyncStore], Any]) -> Any:
    async def run() -> Any:
        async with astore:
            return await main(astore)

    return asyncio.run(run())


# --- on_lost, sync face ---------------------------------------------------------------------------


def test_on_lost_is_called_once_from_the_renewal_thread(store: Store) -> None:
    told = Told()
    with (
        pytest.raises(HoldLost) as raised,
        store.lease(UNIT, holder="w1", ttl=30.0, renew_every=0.01, on_lost=told) as lease,
    ):
        store.release(lease.id, holder="w1", fence=lease.fence)  # behind the lease's back
        eventually(lambda: told.calls, "on_lost was called")
        assert lease.lost
        with pytest.raises(HoldLost):
            lease.check()
    [(lost, thread)] = told.calls  # once, though check() and the exit saw the loss too
    assert lost is raised.value and lost.reason is HoldLostReason.RELEASED
    assert lost.claim_id == lease.id
    assert thread == f"dibs-lease-{lease.id}"


def test_on_lost_is_never_called_after_a_clean_exit(store: Store) -> None:
    told = Told()
    with store.lease(UNIT, holder="w1", ttl=30.0, renew_every=0.01, on_lost=told) as lease:
        seen = lease.renewals
        eventually(lambda: lease.renewals > seen)
    renewer = lease._renewer
    assert renewer is not None
    renewer.join()  # the renewal thread is over: nothing can call on_lost later
    assert told.calls == []
    assert store.holder_of(UNIT) is None


def test_on_lost_that_raises_is_logged_and_the_lease_goes_on(
    store: Store, caplog: pytest.LogCaptureFixture
) -> None:
    told = Told(raises=True)
    with (
        caplog.at_level(logging.ERROR, logger="dibs.lease"),
        pytest.raises(HoldLost),
        store.lease(UNIT, holder="w1", ttl=30.0, renew_every=0.01, on_lost=told) as lease,
    ):
        store.release(lease.id, holder="w1", fence=lease.fence)
        eventually(lambda: told.calls)
        eventually(lambda: lease.lost)
    assert len(told.calls) == 1
    assert any("on_lost raised" in r.getMessage() and r.exc_info for r in caplog.records)


def test_on_lost_hears_of_an_overdue_renewal(store: Store) -> None:
    mono, told = Monotonic(), Told()
    lease = dibs.lease.Lease(store, UNIT, holder="w1", ttl=30.0, on_lost=told, monotonic=mono)
    with pytest.raises(HoldLost) as raised, lease:
        mono.advance(28.0)  # past ttl less its margin since the claim was sent, unrenewed
        assert lease.lost  # the block's look latches the loss...
        eventually(lambda: told.calls, "on_lost was called")  # ...and the renewal tells
    [(lost, thread)] = told.calls
    assert lost is raised.value and lost.reason is HoldLostReason.EXPIRED
    assert thread.startswith("dibs-lease-")


def test_on_lost_hears_of_a_loss_the_exit_finds(store: Store, clock: FakeClock) -> None:
    told = Told()
    with (
        pytest.raises(HoldLost) as raised,
        store.lease(UNIT, holder="w1", ttl=30.0, on_lost=told) as lease,  # renews in 10 s
    ):
        clock.advance(31.0)  # the store's clock: the hold expires, and is taken
        assert store.claim(UNIT, holder="thief", ttl=60.0)
    [(lost, thread)] = told.calls
    assert lost is raised.value and lost.reason is HoldLostReason.TAKEN_OVER
    assert thread == threading.current_thread().name  # the exit told, before raising
    assert lease.error is lost


# --- max_hold, sync face --------------------------------------------------------------------------


def test_max_hold_stops_renewing_and_the_hold_runs_out(store: Store) -> None:
    mono, told = Monotonic(), Told()
    extends = Extends(store, mono)
    lease = dibs.lease.Lease(
        extends,  # type: ignore[arg-type]
        UNIT,
        holder="w1",
        ttl=30.0,
        renew_every=0.01,
        max_hold=60.0,
        on_lost=told,
        monotonic=mono,
    )
    with pytest.raises(HoldLost) as raised, lease:
        began = mono()
        assert lease.max_hold == 60.0
        for _ in range(3):  # renewals go on before max_hold (each step well inside the TTL)
            mono.advance(18.0)
            _renewed_since_now(lease, extends)
        mono.advance(7.0)  # past max_hold: no renewal is sent from here on
        eventually(lambda: lease._live().ran_out, "the renewal stopped")
        assert not lease.lost  # the last renewal's TTL still runs
        mono.advance(30.0)  # past that TTL (less its margin): the hold ran out
        eventually(lambda: told.calls, "on_lost was called")
        assert lease.lost
    assert raised.value.reason is HoldLostReason.EXPIRED
    assert "max_hold" in str(raised.value)
    assert [call[0] for call in told.calls] == [raised.value]
    assert extends.sent and max(extends.sent) < began + 60.0


def _renewed_since_now(lease: Any, extends: Extends) -> None:
    """Wait for a renewal sent after this call: the second extend asked from now on.

    (The first may have read the lease's clock before the caller moved it.)
    """
    asked = len(extends.sent)
    eventually(lambda: lease.renewals > asked + 1, "a renewal sent after the clock moved")


@pytest.mark.parametrize("max_hold", [0, -1.0, float("nan"), float("inf"), True, "60", 10**12])
def test_a_bad_max_hold_is_invalid_input(store: Store, max_hold: Any) -> None:
    with pytest.raises(InvalidInput) as raised:
        store.lease(UNIT, holder="w1", ttl=30.0, max_hold=max_hold)
    assert raised.value.field == "max_hold" and raised.value.value is max_hold
    with pytest.raises(InvalidInput) as semaphore:
        dibs.Semaphore(store, "k", permits=1).lease(holder="w1", ttl=30.0, max_hold=max_hold)
    assert semaphore.value.field == "max_hold"


@pytest.mark.parametrize("on_lost", [1, "print", object()])
def test_an_on_lost_that_cannot_be_called_is_invalid_input(store: Store, on_lost: Any) -> None:
    with pytest.raises(InvalidInput) as raised:
        store.lease(UNIT, holder="w1", ttl=30.0, on_lost=on_lost)
    assert raised.value.field == "on_lost"
    with pytest.raises(InvalidInput):
        dibs.Semaphore(store, "k", permits=1).lease(holder="w1", ttl=30.0, on_lost=on_lost)


# --- the semaphore's permits ----------------------------------------------------------------------


def test_a_semaphore_permit_calls_on_lost_once(store: Store) -> None:
    told = Told()
    sem = dibs.Semaphore(store, "k", permits=2)
    with (
        pytest.raises(HoldLost),
        sem.lease(holder="a", ttl=30.0, renew_every=0.01, on_lost=told) as permit,
    ):
        store.release(permit.id, holder="a", fence=permit.fence)
        eventually(lambda: told.calls, "on_lost was called")
    [(lost, _)] = told.calls
    assert lost.claim_id == permit.id and lost.reason is HoldLostReason.RELEASED
    with sem.lease(holder="b", ttl=30.0, on_lost=told):
        pass
    assert len(told.calls) == 1


def test_a_semaphore_permit_holds_under_its_max_hold(store: Store) -> None:
    sem = dibs.Semaphore(store, "k", permits=1)
    with sem.lease(holder="a", ttl=30.0, max_hold=60.0) as permit:
        inner = permit._live()
        assert inner.max_hold == 60.0 and inner.ttl == 30.0


def test_async_a_semaphore_permit_calls_on_lost(astore: AsyncStore) -> None:
    async def main(store: AsyncStore) -> None:
        told = Told()
        sem = dibs.aio.Semaphore(store, "k", permits=1)
        with pytest.raises(HoldLost):
            async with sem.lease(holder="a", ttl=30.0, renew_every=0.01, on_lost=told) as permit:
                await store.release(permit.id, holder="a", fence=permit.fence)
                await asyncio.sleep(3600)  # cut short by the loss
        [(lost, task)] = told.calls
        assert lost.reason is HoldLostReason.RELEASED and task == f"dibs-lease-{permit.id}"

    arun(astore, main)


# --- the async face -------------------------------------------------------------------------------


def test_async_on_lost_coroutine_is_awaited_before_the_block_hears(astore: AsyncStore) -> None:
    async def main(store: AsyncStore) -> None:
        calls: list[tuple[HoldLost, str | None]] = []
        finished = asyncio.Event()

        async def on_lost(lost: HoldLost) -> None:
            calls.append((lost, _task_name()))
            await asyncio.sleep(0)  # it may await: the exit waits for it
            finished.set()

        with pytest.raises(HoldLost) as raised:
            async with store.lease(
                UNIT, holder="w1", ttl=30.0, renew_every=0.01, on_lost=on_lost
            ) as lease:
                await store.release(lease.id, holder="w1", fence=lease.fence)
                await asyncio.sleep(3600)  # cut short: the renewal cancels the block
        assert finished.is_set()
        [(lost, task)] = calls
        assert lost is raised.value and lost.reason is HoldLostReason.RELEASED
        assert task == f"dibs-lease-{lease.id}"

    arun(astore, main)


def test_async_on_lost_may_be_a_plain_callable(astore: AsyncStore) -> None:
    async def main(store: AsyncStore) -> None:
        told = Told()
        with pytest.raises(HoldLost):
            async with store.lease(
                UNIT, holder="w1", ttl=30.0, renew_every=0.01, on_lost=told
            ) as lease:
                await store.release(lease.id, holder="w1", fence=lease.fence)
                await asyncio.sleep(3600)
        assert len(told.calls) == 1

    arun(astore, main)


def test_async_on_lost_is_never_called_after_a_clean_exit(astore: AsyncStore) -> None:
    async def main(store: AsyncStore) -> None:
        told = Told()
        async with store.lease(
            UNIT, holder="w1", ttl=30.0, renew_every=0.01, on_lost=told
        ) as lease:

            async def renewed() -> bool:
                return lease.renewals > 1

            await aeventually(renewed)
        renewer = lease._renewer
        assert renewer is not None and renewer.done()
        assert told.calls == []

    arun(astore, main)


def test_async_on_lost_that_raises_is_logged(
    astore: AsyncStore, caplog: pytest.LogCaptureFixture
) -> None:
    async def main(store: AsyncStore) -> None:
        async def on_lost(lost: HoldLost) -> None:
            raise RuntimeError("on_lost failed")

        with caplog.at_level(logging.ERROR, logger="dibs.lease"), pytest.raises(HoldLost):
            async with store.lease(
                UNIT, holder="w1", ttl=30.0, renew_every=0.01, on_lost=on_lost
            ) as lease:
                await store.release(lease.id, holder="w1", fence=lease.fence)
                await asyncio.sleep(3600)
        assert any("on_lost raised" in r.getMessage() for r in caplog.records)

    arun(astore, main)


def test_async_max_hold_stops_renewing_and_cancels_the_block(astore: AsyncStore) -> None:
    async def main(store: AsyncStore) -> None:
        mono, told = Monotonic(), Told()
        extends = AsyncExtends(store, mono)
        lease = dibs.lease.AsyncLease(
            extends,  # type: ignore[arg-type]
            UNIT,
            holder="w1",
            ttl=30.0,
            renew_every=0.01,
            max_hold=60.0,
            on_lost=told,
            monotonic=mono,
        )
        with pytest.raises(HoldLost) as raised:
            async with lease:
                began = mono()

                for _ in range(3):  # renewals go on before max_hold (steps inside the TTL)
                    mono.advance(18.0)
                    asked = len(extends.sent)

                    async def renewed(asked: int = asked) -> bool:  # the 2nd extend from now
                        return lease.renewals > asked + 1

                    await aeventually(renewed)
                mono.advance(7.0)  # past max_hold

                async def ran_out() -> bool:  # no extend in flight to time out below
                    return lease._live().ran_out

                await aeventually(ran_out)
                assert not lease.lost
                mono.advance(30.0)  # past the last renewal's TTL, less its margin
                await asyncio.sleep(3600)  # cut short by the loss
        assert "max_hold" in str(raised.value)
        assert [call[0] for call in told.calls] == [raised.value]
        assert max(extends.sent) < began + 60.0

    arun(astore, main)
