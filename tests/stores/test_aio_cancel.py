"""Cancelling ``await store.claim(...)`` at every point of its life, then retrying it.

The promise (docs/async.md): a cancelled claim either made no claim, or made
one that a retry with the same request ID replays; never two claims, never a
hold nobody knows about, never a connection left mid-transaction. Each round
cancels one claim at another moment (before its task starts, after a number
of loop steps, after a short sleep: while opening, queued for a worker, running
on it, done), sometimes while other tasks keep the workers busy, retries it, and
checks the answer; at the end every claim is checked again on a fresh handle.
Written against the public API only, so it holds for threaded and native stores.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg
import pytest

import dibs
import dibs.aio
from conftest import fresh_url
from dibs import ClaimResult, ClaimState, Unit
from dibs.aio import AsyncStore

ROUNDS = {"memory": 320, "sqlite": 240, "postgresql": 160, "etcd": 80}  # etcd: CI time
# Real time, the point: cancellations land at spread moments of a call in flight.
SLEEPS = [0.0, 1e-5, 5e-5, 1e-4, 2e-4, 5e-4, 1e-3, 3e-3]


@pytest.fixture(params=list(ROUNDS))
def kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def url(kind: str, tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[str]:
    yield from fresh_url(kind, tmp_path, request)


@dataclass
class Tally:
    """What the rounds saw: how each cancelled claim turned out."""

    never_ran: int = 0  # cancelled, and the retry made the claim
    ran_anyway: int = 0  # cancelled, and the retry replayed what it had made
    finished: int = 0  # done before the cancel came
    kept: dict[str, dibs.Claim] = field(default_factory=dict)  # holder -> its one live claim
    released: dict[str, dibs.Claim] = field(default_factory=dict)


async def _cancel_at(task: asyncio.Task[ClaimResult], point: int) -> ClaimResult | None:
    """Cancel ``task`` at the moment ``point`` names; its result if it finished first."""
    if point == 0:
        task.cancel()  # before it ever runs
    elif point <= 6:
        for _ in range(point):  # after a few turns of the loop
            await asyncio.sleep(0)
        task.cancel()
    elif point <= 6 + len(SLEEPS):
        await asyncio.sleep(SLEEPS[point - 7])  # while it waits for a worker, or runs on one
        task.cancel()
    else:
        await asyncio.wait([task])  # after it finished: cancelling is a no-op
        task.cancel()
    try:
        return await task
    except asyncio.CancelledError:
        return None


async def _noise(store: AsyncStore, n: int, stop: asyncio.Event) -> None:
    """Keep the store's workers busy, so the claim under test waits in their queue."""
    for i in itertools.count():
        if stop.is_set():
            return
        result = await store.claim(Unit("noise", f"{n}-{i % 3}"), holder=f"noise-{n}", ttl=60)
        if result.claim is not None:
            await store.release(result.claim.id, holder=f"noise-{n}", fence=result.claim.fence)
        await asyncio.sleep(0)  # memory:// answers without suspending: yield, or starve the loop


async def _round(store: AsyncStore, r: int, tally: Tally) -> None:
    holder, unit, request_id = f"h{r}", Unit("cancel", str(r)), f"req-{r}"
    point = r % (8 + len(SLEEPS))
    stop = asyncio.Event()
    noise = [asyncio.ensure_future(_noise(store, n, stop)) for n in range(6 if r % 2 else 0)]
    await asyncio.sleep(0)
    task = asyncio.ensure_future(store.claim(unit, holder=holder, request_id=request_id, ttl=600))
    first = await _cancel_at(task, point)
    retry = await store.claim(unit, holder=holder, request_id=request_id, ttl=600)
    stop.set()
    await asyncio.gather(*noise)

    assert retry.granted, (r, point, retry)  # nobody else ever wants this unit
    claim = retry.claim
    assert claim is not None and claim.holder == holder and claim.targets == (unit,)
    assert claim.state is ClaimState.HELD, f"round {r}: the retry found {claim}"
    if first is not None:
        assert retry.replayed and first.claim == claim, (r, first, retry)
        tally.finished += 1
    elif retry.replayed:
        tally.ran_anyway += 1
    else:
        tally.never_ran += 1
    assert await store.claims_of(holder) == [claim], f"round {r}: not exactly one claim"
    assert await store.holder_of(unit) == holder
    if r % 3:  # released: a claim made behind the retry's back would now be stranded
        assert await store.release(claim.id, holder=holder, fence=claim.fence)
        tally.released[holder] = claim
    else:
        tally.kept[holder] = claim


async def _check_after(store: AsyncStore, tally: Tally) -> None:
    """With every call finished: one claim per holder, as the retries said; nothing else."""
    for holder, claim in tally.kept.items():
        assert await store.claims_of(holder) == [claim], holder
        assert await store.get(claim.id) == claim
    for holder, claim in tally.released.items():
        assert await store.claims_of(holder) == [], f"{holder} holds a stranded claim"
        released = await store.get(claim.id)
        assert released is not None and released.state is ClaimState.RELEASED
    # The store still works.
    won = await store.claim(Unit("after", "all"), holder="last", request_id="last", ttl=60)
    assert won.claim is not None and not won.replayed
    assert await store.release(won.claim.id, holder="last", fence=won.claim.fence)


def _idle_in_transaction(pg: str) -> list[str]:
    with psycopg.connect(pg, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT query FROM pg_stat_activity WHERE datname = current_database()"
            " AND state LIKE 'idle in transaction%' AND pid <> pg_backend_pid()"
        ).fetchall()
    return [str(row[0]) for row in rows]


def test_a_cancelled_claim_is_made_once_or_not_at_all(
    kind: str, url: str, request: pytest.FixtureRequest
) -> None:
    tally = Tally()

    async def main() -> None:
        store = dibs.aio.open(url)
        for r in range(ROUNDS[kind]):
            await _round(store, r, tally)
        if kind == "memory":  # one process's memory: check it on the same handle
            await _check_after(store, tally)
        if kind == "sqlite":
            # No connection of the async store sits inside a transaction: another handle
            # writes at once (a held write lock would make it give up, StoreUnavailable).
            with dibs.open(url, busy_timeout=10) as other:
                won = other.claim(Unit("beside", "it"), holder="other")
                assert won.claim is not None
                assert other.release(won.claim.id, holder="other", fence=won.claim.fence)
        await store.close()  # waits for any cancelled call still running on a worker
        if kind != "memory":
            async with dibs.aio.open(url) as fresh:
                await _check_after(fresh, tally)

    asyncio.run(main())
    assert tally.never_ran and tally.finished, tally
    if kind == "sqlite":  # threaded: a call a worker started runs to its end
        assert tally.ran_anyway, tally
    if kind == "postgresql":
        # No connection was left mid-transaction (a native store's pool is closed by now,
        # but a session that sat "idle in transaction" would still show here if it leaked).
        assert _idle_in_transaction(request.getfixturevalue("pg_url")) == []


def test_a_claim_cancelled_while_the_store_opens(kind: str, url: str) -> None:
    """The first call opens the store; cancelled at any point of that, the store opens once."""

    async def main() -> None:
        for r in range(12):
            store = dibs.aio.open(url)
            holder, unit = f"o{r}", Unit("opening", str(r))
            task = asyncio.ensure_future(store.claim(unit, holder=holder, request_id=holder))
            first = await _cancel_at(task, [0, 1, 2, 3, 4, 5, 6, 7, 9, 11, 13, 20][r])
            retry = await store.claim(unit, holder=holder, request_id=holder)
            assert retry.claim is not None and retry.claim.holder == holder
            if first is not None:
                assert retry.replayed and first.claim == retry.claim
            assert await store.claims_of(holder) == [retry.claim]
            await store.close()
            with pytest.raises(dibs.StoreClosed):
                await store.claim(unit, holder=holder)

    asyncio.run(main())


# --- @dibs.idempotent cancelled at every point ----------------------------------------------------

IDEMPOTENT_POINTS = 48  # loop steps to cancel after: past every await of a call on every store
IDEMPOTENT_SLEEPS = [1e-4, 5e-4, 1e-3, 2e-3, 5e-3, 1e-2, 2e-2, 5e-2]


def test_an_idempotent_call_cancelled_anywhere_leaves_the_key_free_or_done(
    kind: str, url: str
) -> None:
    """Cancel an async ``@dibs.idempotent`` call after 0, 1, 2, ... loop steps (and after
    short sleeps): while its run-hold claim is in flight, while the function runs, while
    its result is stored. A retry then runs the function or replays its result at once;
    never "in progress" (the ttl is an hour: only the cancelled call itself can free the
    key in time), and the function ran to its end at most once per key."""
    ran: dict[str, int] = {}
    started: dict[str, int] = {}

    async def main() -> None:
        store = dibs.aio.open(url)

        @dibs.idempotent(store, key="key", ttl=3600)
        async def work(key: str) -> str:
            started[key] = started.get(key, 0) + 1
            await asyncio.sleep(0)
            ran[key] = ran.get(key, 0) + 1
            return f"done {key}"

        points = [("steps", n) for n in range(IDEMPOTENT_POINTS)]
        points += [("sleep", s) for s in IDEMPOTENT_SLEEPS]
        points += [("end", 0)]  # after it finished: cancelling is a no-op
        outcomes: dict[str, int] = {"cancelled": 0, "finished": 0}
        for i, (how, amount) in enumerate(points):
            key = f"k{i}"
            task = asyncio.ensure_future(work(key))
            if how == "steps":
                for _ in range(int(amount)):
                    await asyncio.sleep(0)
            elif how == "sleep":
                await asyncio.sleep(amount)
            else:
                await asyncio.wait([task])
            task.cancel()
            try:
                first: str | None = await task
            except asyncio.CancelledError:
                first = None
            outcomes["cancelled" if first is None else "finished"] += 1
            # At once: an IdempotencyInProgress here is a run hold the cancel stranded.
            assert await work(key) == f"done {key}", (how, amount)
            assert ran.get(key) == 1, (how, amount, ran.get(key), started.get(key))
            if first is not None:
                assert started[key] == 1  # the retry replayed
        assert outcomes["cancelled"] and outcomes["finished"], outcomes
        await store.close()

    asyncio.run(main())


# --- confirm, extend, release and lease cancelled at every point ---------------------------------

TRANSITION_POINTS = 24


async def _cancelled_after(aw: Any, steps: int) -> Any:
    """``aw`` as a task cancelled after ``steps`` loop turns; its result, or None if cancelled."""
    task = asyncio.ensure_future(aw)
    for _ in range(steps):
        await asyncio.sleep(0)
    task.cancel()
    try:
        return await task
    except asyncio.CancelledError:
        return None


def test_transitions_and_leases_cancelled_anywhere_leave_a_consistent_store(
    kind: str, url: str, request: pytest.FixtureRequest
) -> None:
    """Cancel confirm, extend, release and a lease's entry after 0, 1, 2, ... loop steps.
    The retry answers as if the cancelled call had run or not (a confirm and an extend
    succeed, a release ends the claim), nothing is left held, and the store (its pool
    connections) keeps working."""

    async def main() -> None:
        store = dibs.aio.open(url)
        for n in range(TRANSITION_POINTS):
            holder, unit = f"t{n}", Unit("transition", str(n))
            held = (await store.claim(unit, holder=holder, ttl=3600)).claim
            assert held is not None
            await _cancelled_after(
                store.extend(held.id, holder=holder, fence=held.fence, ttl=3000), n
            )
            extended = await store.extend(held.id, holder=holder, fence=held.fence, ttl=3600)
            assert extended.state is ClaimState.HELD
            await _cancelled_after(store.confirm(held.id, holder=holder, fence=held.fence), n)
            confirmed = await store.confirm(held.id, holder=holder, fence=held.fence)
            assert confirmed.state is ClaimState.CONFIRMED
            await _cancelled_after(store.release(held.id, holder=holder, fence=held.fence), n)
            await store.release(held.id, holder=holder, fence=held.fence)
            released = await store.get(held.id)
            assert released is not None and released.state is ClaimState.RELEASED
            assert await store.holder_of(unit) is None
            assert await store.claims_of(holder) == []

            # A lease entered and cancelled at this point: its hold must not outlive it
            # (ttl an hour: another holder waiting for the unit gets it only if it ends).
            async def leased(unit: Unit = unit, holder: str = holder) -> None:
                async with store.lease(unit, holder=holder, ttl=3600):
                    await asyncio.sleep(0)

            await _cancelled_after(leased(), n)
            async with store.lease(unit, holder=f"other{n}", ttl=60, wait=60) as lease:
                assert lease.claim.holder == f"other{n}"
            left = await store.claims_of(holder)
            assert left == [], (n, left)
        await store.close()

    asyncio.run(main())
    if kind == "postgresql":
        assert _idle_in_transaction(request.getfixturevalue("pg_url")) == []
