"""Closing a store while calls are in flight: every call during or after ``close()`` either
answers as usual or raises :class:`dibs.StoreClosed`, never a driver's error.

Many threads (sync face) or tasks (async face) call every method in a loop; ``close()``
comes while they are mid-call. Every worker ends on an error (close is coming); each
must be ``StoreClosed``, and the store's own state must not be hurt (a call already
acknowledged stays as acknowledged: checked on a fresh handle). Enough rounds that a
store whose driver's error escapes (httpx's ``RuntimeError`` on a closed client, a
psycopg ``PoolClosed``, ``sqlite3.ProgrammingError``) fails every run.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

import dibs
import dibs.aio
from conftest import STORE_KINDS, fresh_url
from dibs import Claim, Unit
from dibs.aio import AsyncStore

ROUNDS = {"memory": 40, "sqlite": 30, "postgresql": 20, "etcd": 20}
WORKERS = 8
MEMORY_CLOSES = 400
PG_QUEUED_ROUNDS = 60
QUEUED = 16


@pytest.fixture(params=STORE_KINDS)
def kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def url(kind: str, tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[str]:
    yield from fresh_url(kind, tmp_path, request)


def _mix(
    store: dibs.Store, worker: str, kept: dict[str, Claim], arrive: Callable[[], None]
) -> None:
    """One worker's calls, every method of the contract, until one raises; ``kept`` gets
    its confirmed claims. It calls ``arrive`` once it is well under way."""
    for n in itertools.count():
        if n == 1:
            arrive()
        unit = Unit(f"w{worker}", str(n))
        holder = f"h{worker}"
        claim = store.claim(unit, holder=holder, request_id=f"{worker}-{n}", ttl=60).claim
        assert claim is not None
        store.extend(claim.id, holder=holder, fence=claim.fence, ttl=60)
        store.get(claim.id)
        store.holder_of(unit)
        store.claims_of(holder)
        if n % 2:
            confirmed = store.confirm(claim.id, holder=holder, fence=claim.fence)
            kept[confirmed.id] = confirmed
        else:
            store.release(claim.id, holder=holder, fence=claim.fence)
        if n % 5 == 0:
            store.sweep()
            store.now()


def _sync_round(url: str, round_: int) -> tuple[list[BaseException], dict[str, Claim]]:
    store = dibs.open(url)
    errors: list[BaseException] = []
    kept: dict[str, Claim] = {}
    warm = threading.Barrier(WORKERS + 1)

    def work(worker: int) -> None:
        arrived = False

        def arrive() -> None:
            nonlocal arrived
            warm.wait()
            arrived = True

        try:
            _mix(store, f"{round_}.{worker}", kept, arrive)
        except BaseException as exc:  # every worker ends on one: close() is coming
            errors.append(exc)
            if not arrived:  # it failed before close() came: the round ends at once
                warm.abort()

    threads = [threading.Thread(target=work, args=(w,)) for w in range(WORKERS)]
    for thread in threads:
        thread.start()
    with contextlib.suppress(threading.BrokenBarrierError):  # a worker failed: it says why
        warm.wait()
    store.close()
    for thread in threads:
        thread.join()
    return errors, kept


def _check_kept(url: str, kept: dict[str, Claim]) -> None:
    """What close() raced did not undo what was acknowledged (a fresh handle sees it)."""
    if url == "memory://":
        return
    with dibs.open(url) as fresh:
        for claim in kept.values():
            assert fresh.get(claim.id) == claim


@pytest.mark.usefixtures("fine_switching")
def test_sync_calls_racing_close_raise_store_closed(kind: str, url: str) -> None:
    for r in range(ROUNDS[kind]):
        errors, kept = _sync_round(url, r)
        assert len(errors) == WORKERS
        assert [e for e in errors if type(e) is not dibs.StoreClosed] == [], errors
        _check_kept(url, kept)


async def _amix(store: AsyncStore, worker: str, kept: dict[str, Claim]) -> None:
    """The async twin of :func:`_mix`, run until it raises."""
    for n in itertools.count():
        unit = Unit(f"w{worker}", str(n))
        holder = f"h{worker}"
        result = await store.claim(unit, holder=holder, request_id=f"{worker}-{n}", ttl=60)
        claim = result.claim
        assert claim is not None
        await store.extend(claim.id, holder=holder, fence=claim.fence, ttl=60)
        await store.get(claim.id)
        await store.holder_of(unit)
        await store.claims_of(holder)
        if n % 2:
            confirmed = await store.confirm(claim.id, holder=holder, fence=claim.fence)
            kept[confirmed.id] = confirmed
        else:
            await store.release(claim.id, holder=holder, fence=claim.fence)
        if n % 5 == 0:
            await store.sweep()
            await store.now()
        await asyncio.sleep(0)  # memory:// answers without suspending: let the others run


async def _aio_round(url: str, round_: int) -> tuple[list[BaseException], dict[str, Claim]]:
    store = await dibs.aio.open(url)
    kept: dict[str, Claim] = {}
    tasks = [asyncio.ensure_future(_amix(store, f"{round_}.{w}", kept)) for w in range(WORKERS)]
    # Close at another moment each round: after a number of loop turns.
    for _ in range(1 + round_ % 7 * 3):
        await asyncio.sleep(0)
    await store.close()
    outcomes = await asyncio.gather(*tasks, return_exceptions=True)
    return [e for e in outcomes if isinstance(e, BaseException)], kept


def test_async_calls_racing_close_raise_store_closed(kind: str, url: str) -> None:
    for r in range(ROUNDS[kind]):
        errors, kept = asyncio.run(_aio_round(url, r))
        assert len(errors) == WORKERS
        assert [e for e in errors if type(e) is not dibs.StoreClosed] == [], errors
        _check_kept(url, kept)


@pytest.mark.usefixtures("fine_switching")
def test_memory_close_in_the_middle_of_calls() -> None:
    """memory:// has no driver to refuse: close() must not pull its dicts from under a call.

    Workers claim and release (the paths that drop index entries) on one store after
    another; close() comes to each while every worker is mid-loop on it. Many closes,
    cheaply: one store per close, the same threads throughout.
    """
    stores = [dibs.open("memory://") for _ in range(MEMORY_CLOSES)]
    errors: list[BaseException] = []
    arrived = threading.Barrier(WORKERS + 1)

    def work(worker: int) -> None:
        for store in stores:
            try:
                for n in itertools.count():
                    if n == 2:
                        arrived.wait()
                    holder = f"h{worker}.{n % 3}"
                    won = store.claim(Unit(f"w{worker}", str(n % 5)), holder=holder, ttl=60)
                    if won.claim is not None:
                        store.release(won.claim.id, holder=holder, fence=won.claim.fence)
                    if n % 7 == 0:
                        store.claims_of(holder)
            except dibs.StoreClosed:
                continue
            except threading.BrokenBarrierError:
                return  # another worker failed
            except BaseException as exc:
                errors.append(exc)
                arrived.abort()
                return

    threads = [threading.Thread(target=work, args=(w,)) for w in range(WORKERS)]
    for thread in threads:
        thread.start()
    try:
        for store in stores:
            arrived.wait()
            store.close()
    except threading.BrokenBarrierError:
        for store in stores:
            store.close()
    for thread in threads:
        thread.join()
    assert errors == []


@pytest.mark.usefixtures("fine_switching")
def test_postgres_calls_queued_for_a_connection_meet_store_closed(pg_schema_url: str) -> None:
    """Few connections, many threads queued for them when close() comes: each call that was
    waiting gets its turn or StoreClosed, at once, never a wait of pool_timeout that ends
    in StoreUnavailable (psycopg_pool queues a getconn that raced its close)."""
    for r in range(PG_QUEUED_ROUNDS):
        store = dibs.open(pg_schema_url, pool_max=4, pool_timeout=3)
        errors: list[BaseException] = []
        warm = threading.Barrier(QUEUED + 1)

        def work(
            worker: int,
            store: dibs.Store = store,
            r: int = r,
            warm: threading.Barrier = warm,
            errors: list[BaseException] = errors,
        ) -> None:
            try:
                for n in itertools.count():
                    if n == 1:
                        warm.wait()
                    store.claim(Unit(f"q{r}.{worker}", str(n)), holder="h")
            except BaseException as exc:  # every worker ends on one: close() is coming
                errors.append(exc)

        threads = [threading.Thread(target=work, args=(w,)) for w in range(QUEUED)]
        for thread in threads:
            thread.start()
        warm.wait()
        store.close()
        for thread in threads:
            thread.join()
        assert [type(e) for e in errors] == [dibs.StoreClosed] * QUEUED, errors


@pytest.mark.parametrize("kind", ["sqlite", "postgresql"])
def test_a_closed_stores_job_table_raises_store_closed(kind: str, url: str) -> None:
    """The job table closes with its store: a call after that is StoreClosed, as the store's
    own calls are, never StoreUnavailable (nothing to retry)."""
    store = dibs.open(url)
    jobs = store.job_table()
    assert jobs is not None
    store.close()
    with pytest.raises(dibs.StoreClosed):
        jobs.get("1")
