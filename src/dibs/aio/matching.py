""":func:`dibs.match` for asyncio: the same rounds and rules, awaited on an async store.

The decisions (validation, preference order, the dispatch unit, full-jitter
rounds, what a lost claim means) are :func:`dibs.match`'s own, written once as
steps (:mod:`dibs._steps`); this face only awaits what they ask for.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Awaitable, Callable, Iterable

from dibs._model import Unit
from dibs._steps import arun
from dibs.aio._store import AsyncStore
from dibs.matching import Match, _match

__all__ = ["match"]

Candidates = (
    Iterable[Unit | str]
    | Callable[[], Iterable[Unit | str]]
    | Callable[[], Awaitable[Iterable[Unit | str]]]
)


async def match(
    store: AsyncStore,
    candidates: Candidates,
    *,
    holder: str,
    request_id: str,
    ttl: float | None = None,
    attempts: int = 4,
    backoff: float = 0.05,
    max_backoff: float = 2.0,
    jitter: bool = True,
    rng: random.Random | None = None,
    sleep: Callable[[float], Awaitable[object]] = asyncio.sleep,
) -> Match:
    """Claim the first free candidate for ``holder``: :func:`dibs.match`, awaited.

    Takes the same arguments and returns and raises the same. ``candidates``
    may also be a coroutine function (e.g. a query for the nearest drivers
    now), awaited afresh each round; ``sleep`` is awaited between rounds.
    """
    steps = _match(candidates, holder, request_id, ttl, attempts, backoff, max_backoff, jitter, rng)  # type: ignore[arg-type]
    return await arun(store, steps, sleep)
