"""The customers' side of the rush: each customer is a coroutine, store calls run on threads.

A worker (a spawned process, or a thread of the demo's own process for
``memory://``) runs its share of the customers on one asyncio loop. Waiting —
for the doors to open, thinking before paying, paying late — costs no thread;
every store call runs on a thread pool, so ``threads`` bounds how many claims
one worker has in flight (payments run on two threads of their own, as a
checkout would, so a payer's confirm never queues behind the crowd's claims
and misses its TTL for that alone). Each finished customer is reported at once as
an :class:`Outcome` on the events queue, which feeds the progress bar and,
at the end, the audit.
"""

from __future__ import annotations

import asyncio
import os
import random
import threading
import time
import traceback
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Protocol, TypeVar

import dibs
from dibs._model import ClaimResult, Unit
from dibs.demo._plan import Behaviour, Customer, DemoConfig, Venue
from dibs.exceptions import DibsError, HoldLost
from dibs.stores.base import Store

__all__ = ["Outcome", "Timings", "serve_customers", "work_in_process"]

_T = TypeVar("_T")
_PAY_THREADS = 2


class Events(Protocol):
    """The queue a worker reports on (``queue.Queue`` or ``multiprocessing.Queue``)."""

    def put(self, item: Any) -> None: ...


@dataclass(slots=True)
class Outcome:
    """What happened to one customer, as the customer saw it.

    ``paid`` means the customer was told "you got it": a confirm returned
    without error. ``refused`` is the :class:`~dibs.HoldLostReason` of a
    payment the store turned down.
    """

    customer: str
    behaviour: Behaviour
    party: int
    claims: int = 0
    taken: int = 0
    replayed: int = 0
    granted: bool = False
    claim_id: str | None = None
    fence: int | None = None
    seats: tuple[str, ...] = ()
    expires_at: float | None = None
    paid: bool = False
    paid_after: float | None = None
    refused: str | None = None
    replay_mismatches: list[str] = field(default_factory=list)
    bad_losses: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)


@dataclass(slots=True)
class Timings:
    """Every claim call of one worker: when it finished (epoch s) and how long it took (s)."""

    finished: list[float] = field(default_factory=list)
    latencies: list[float] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class _Rules:
    venue: Venue
    ttl: float
    tries: int
    late_delay: float


class _Worker:
    def __init__(
        self,
        store: Store,
        rules: _Rules,
        pools: tuple[ThreadPoolExecutor, ThreadPoolExecutor],
        start: float,
    ) -> None:
        self.store = store
        self.rules = rules
        self.shop_pool, self.pay_pool = pools
        self.start = start
        self.timings = Timings()

    async def _call(self, work: Callable[[], _T], *, paying: bool = False) -> _T:
        pool = self.pay_pool if paying else self.shop_pool
        return await asyncio.get_running_loop().run_in_executor(pool, work)

    def _claim(self, seats: tuple[Unit, ...], holder: str, request_id: str) -> ClaimResult:
        began = time.perf_counter()
        result = self.store.claim(seats, holder=holder, request_id=request_id, ttl=self.rules.ttl)
        # list.append is atomic, so the pool's threads can share these lists.
        self.timings.latencies.append(time.perf_counter() - began)
        self.timings.finished.append(time.time())
        return result

    async def serve(self, customer: Customer) -> Outcome:
        out = Outcome(customer.name, customer.behaviour, customer.party)
        await asyncio.sleep(max(0.0, self.start + customer.arrives - time.time()))
        try:
            await self._shop(customer, out)
        except DibsError as exc:
            out.errors.append(f"{type(exc).__name__}: {exc}")
        except Exception as exc:  # the audit reports it instead of losing the customer
            out.errors.append("".join(traceback.format_exception_only(exc)).strip())
        return out

    async def _shop(self, customer: Customer, out: Outcome) -> None:
        rules = self.rules
        rng = random.Random(customer.seed)
        for attempt in range(1, rules.tries + 1):
            seats = rules.venue.pick(rng, customer.party)
            request_id = f"{rules.venue.show}/{customer.name}/{attempt}"
            send = partial(self._claim, seats, customer.name, request_id)
            result = await self._call(send)
            out.claims += 1
            if customer.behaviour is Behaviour.RETRY:
                # The response "got lost": the app sends the very same request again.
                again = await self._call(send)
                out.claims += 1
                self._check_replay(out, result, again, request_id)
            if not result:
                out.taken += 1
                if not result.taken or not set(result.taken) <= set(seats):
                    out.bad_losses.append(
                        f"{customer.name} asked for {_names(seats)} and was told "
                        f"{_names(result.taken)} were taken"
                    )
                continue
            claim = result.claim
            if claim is None:
                out.errors.append(f"{customer.name}: a granted claim came back without a claim")
                return
            out.granted = True
            out.claim_id, out.fence, out.seats = claim.id, claim.fence, _names(seats)
            out.expires_at = None if claim.expires_at is None else claim.expires_at.timestamp()
            break
        else:
            return  # sold out, as far as this customer could tell
        if customer.behaviour is Behaviour.ABANDON:
            return
        granted_at = time.monotonic()
        if customer.behaviour is Behaviour.LATE:
            await asyncio.sleep(rules.late_delay)
        else:
            # The checkout page counts down: with little time left, pay at once.
            left = (out.expires_at or 0.0) - time.time()
            await asyncio.sleep(min(rng.uniform(0.05, 0.35) * rules.ttl, max(0.0, left / 2)))
        claim_id, fence = out.claim_id, out.fence
        assert claim_id is not None and fence is not None
        try:
            confirm = partial(self.store.confirm, claim_id, holder=customer.name, fence=fence)
            await self._call(confirm, paying=True)
        except HoldLost as lost:
            out.refused = str(lost.reason)
        else:
            out.paid = True
            out.paid_after = time.monotonic() - granted_at

    @staticmethod
    def _check_replay(
        out: Outcome, first: ClaimResult, again: ClaimResult, request_id: str
    ) -> None:
        if again.replayed:
            out.replayed += 1
        first_id = first.claim.id if first.claim is not None else None
        again_id = again.claim.id if again.claim is not None else None
        first_fence = first.claim.fence if first.claim is not None else None
        again_fence = again.claim.fence if again.claim is not None else None
        same = (
            again.replayed
            and again.granted == first.granted
            and again_id == first_id
            and again_fence == first_fence
            and (first.granted or set(again.taken) == set(first.taken))
        )
        if not same:
            out.replay_mismatches.append(
                f"{request_id}: first answer granted={first.granted} claim={first_id}, "
                f"retry answered granted={again.granted} claim={again_id} "
                f"replayed={again.replayed}"
            )


def _names(units: tuple[Any, ...]) -> tuple[str, ...]:
    return tuple(u.resource if isinstance(u, Unit) else repr(u) for u in units)


def serve_customers(
    store: Store,
    customers: list[Customer],
    config: DemoConfig,
    venue: Venue,
    events: Events,
    wait_for_start: Callable[[], float],
) -> Timings:
    """Run ``customers`` against ``store``, putting each :class:`Outcome` on ``events``.

    ``wait_for_start`` blocks until the doors open and returns that moment
    (epoch seconds); arrivals are offsets from it.
    """
    rules = _Rules(venue, config.ttl, config.tries, config.late_delay)
    with (
        ThreadPoolExecutor(config.threads, thread_name_prefix="dibs-demo-shop") as shop,
        ThreadPoolExecutor(_PAY_THREADS, thread_name_prefix="dibs-demo-pay") as pay,
    ):
        worker = _Worker(store, rules, (shop, pay), wait_for_start())

        async def everyone() -> None:
            async def one(customer: Customer) -> None:
                events.put(("customer", await worker.serve(customer)))

            await asyncio.gather(*(one(c) for c in customers))

        asyncio.run(everyone())
    return worker.timings


def work_in_process(
    url: str,
    customers: list[Customer],
    config: DemoConfig,
    venue: Venue,
    events: Events,
    go: threading.Event,
    start: Any,
) -> None:
    """Entry point of one spawned worker process: open the store, wait, serve, report.

    ``go`` is a ``multiprocessing.Event`` and ``start`` a shared double holding
    the moment the doors open; they are typed loosely because multiprocessing's
    synchronized types are not generic.
    """
    name = f"worker-{os.getpid()}"
    try:
        store = dibs.open(url)
    except Exception as exc:
        events.put(("failed", name, f"{type(exc).__name__}: {exc}"))
        events.put(("done", name, Timings()))
        return
    events.put(("ready", name))

    def wait_for_start() -> float:
        go.wait()
        return float(start.value)

    timings = Timings()
    try:
        timings = serve_customers(store, customers, config, venue, events, wait_for_start)
    except Exception:
        events.put(("failed", name, traceback.format_exc()))
    finally:
        store.close()
        events.put(("done", name, timings))
