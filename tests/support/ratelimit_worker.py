"""One process hammering one rate limit, for tests/patterns/test_ratelimit.py.

    python ratelimit_worker.py URL KEY RATE FACE THREADS REFUSALS MAX_COST

Runs THREADS threads (FACE ``sync``) or tasks (FACE ``aio``), each calling
``acquire`` until it has been refused REFUSALS times at cost 1 (so the limit was
full then), with costs from 1 to MAX_COST. Prints one JSON line: every
admission as ``[created_at µs, expires_at µs, cost]`` from the store's claims,
and the number of refusals.
"""

from __future__ import annotations

import asyncio
import json
import random
import sys
import threading

import dibs
import dibs.aio
from dibs.ratelimit import _micros


def _record(decision: dibs.Decision, cost: int, out: list[list[int]]) -> None:
    claim = decision.claim
    assert claim is not None and claim.expires_at is not None
    out.append([_micros(claim.created_at), _micros(claim.expires_at), cost])


def _cost(i: int, max_cost: int) -> int:
    # Half the callers ask for one unit only: their refusals prove the limit was full.
    return 1 if i % 2 == 0 else random.randint(1, max_cost)


def run_sync(url: str, key: str, rate: str, threads: int, refusals: int, max_cost: int) -> None:
    admitted: list[list[int]] = []
    refused = [0]
    with dibs.open(url) as store:
        limit = dibs.RateLimit(store, key, rate=rate)

        def hammer(i: int) -> None:
            seen = 0
            while seen < refusals:
                cost = _cost(i, max_cost)
                decision = limit.acquire(cost)
                if decision:
                    _record(decision, cost, admitted)
                else:
                    assert decision.retry_after > 0, decision
                    refused[0] += 1
                    seen += cost == 1 or i % 2 == 1

        pool = [threading.Thread(target=hammer, args=(i,)) for i in range(threads)]
        for t in pool:
            t.start()
        for t in pool:
            t.join()
    print(json.dumps({"admitted": admitted, "refused": refused[0]}))


async def run_aio(url: str, key: str, rate: str, tasks: int, refusals: int, max_cost: int) -> None:
    admitted: list[list[int]] = []
    refused = 0
    async with dibs.aio.open(url) as store:
        limit = dibs.aio.RateLimit(store, key, rate=rate)

        async def hammer(i: int) -> None:
            nonlocal refused
            seen = 0
            while seen < refusals:
                cost = _cost(i, max_cost)
                decision = await limit.acquire(cost)
                if decision:
                    _record(decision, cost, admitted)
                else:
                    assert decision.retry_after > 0, decision
                    refused += 1
                    seen += cost == 1 or i % 2 == 1

        await asyncio.gather(*(hammer(i) for i in range(tasks)))
    print(json.dumps({"admitted": admitted, "refused": refused}))


if __name__ == "__main__":
    url, key, rate, face = sys.argv[1:5]
    threads, refusals, max_cost = map(int, sys.argv[5:8])
    if face == "aio":
        asyncio.run(run_aio(url, key, rate, threads, refusals, max_cost))
    else:
        run_sync(url, key, rate, threads, refusals, max_cost)
