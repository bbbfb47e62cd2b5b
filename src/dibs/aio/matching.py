""":func:`dibs.match` for asyncio: the same rounds and rules, awaited on an async store.

The body of :func:`match` between the markers below is the one implementation
of both faces: ``scripts/unasync.py`` makes :func:`dibs.match`'s from it by
dropping ``async``/``await``. The rules it calls live in :mod:`dibs.matching`.
"""

from __future__ import annotations

import asyncio
import inspect
import random
from collections.abc import Awaitable, Callable, Iterable

from dibs._model import Unit
from dibs.matching import (
    REQUEST_RESOURCE,
    Match,
    _assignment,
    _candidate,
    _check,
    _conflict,
    _fixed,
    _units,
)
from dibs.stores.base_async import AsyncStore

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
    # --- shared with the sync face: scripts/unasync.py makes it from this part ---
    _check(request_id, attempts, backoff, max_backoff)
    pick = rng if rng is not None else random
    dispatch = Unit(REQUEST_RESOURCE, request_id)
    fixed = _fixed(candidates)

    earlier = _assignment(await store.claims_of(holder), dispatch)
    if earlier is not None:
        return Match(_candidate(earlier, dispatch), earlier, replayed=True)

    tried = 0
    for round_ in range(1, attempts + 1):
        if round_ > 1:
            cap = min(max_backoff, backoff * 2 ** (round_ - 2))
            await sleep(pick.uniform(0, cap) if jitter else cap)
        units = fixed if fixed is not None else _units(await _call(candidates))  # type: ignore[arg-type]
        for unit in units:
            while True:
                tried += 1
                result = await store.claim([unit, dispatch], holder=holder, ttl=ttl)
                # Linearization point: the store's group claim on the candidate and
                # the dispatch unit. Granted means both are this dispatch's.
                if result:
                    assert result.claim is not None
                    return Match(unit, result.claim, result.replayed, tried, round_)
                if dispatch not in result.taken:
                    break  # the candidate is taken: try the next one
                # Another try of this dispatch holds a candidate: answer with it.
                earlier = _assignment(await store.claims_of(holder), dispatch)
                if earlier is not None:
                    return Match(_candidate(earlier, dispatch), earlier, True, tried, round_)
                other = await store.holder_of(dispatch)
                if other is not None and other != holder:
                    raise _conflict(request_id)
                # The claim that blocked us ended before our first read, and a try
                # of ours may have won since: neither read decides, the claim does,
                # so claim this candidate again. Not endless: each extra loop needs
                # another claim on the dispatch unit to have ended meanwhile.
    return Match(None, None, attempts=tried, rounds=attempts)
    # --- end of the shared part ---


async def _call(
    candidates: Callable[[], Iterable[Unit | str] | Awaitable[Iterable[Unit | str]]],
) -> Iterable[Unit | str]:
    found = candidates()
    return await found if inspect.isawaitable(found) else found
