""":mod:`dibs.booking` for asyncio: the unit makers as they are, and an ``async with`` exclusive.

:func:`nights`, :func:`night_of` and :func:`time_slots` make units without a
store, so they are the sync module's own functions. The body of
:func:`exclusive` between the markers below is the one implementation of both
faces: ``scripts/unasync.py`` makes :func:`dibs.booking.exclusive`'s from it.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from dibs._model import Claim
from dibs.aio._store import AsyncStore
from dibs.booking import (
    EXCLUSIVE_SLOT,
    ResourceBusy,
    _check_lost,
    _entry,
    _pause,
    night_of,
    nights,
    time_slots,
)

__all__ = ["EXCLUSIVE_SLOT", "ResourceBusy", "exclusive", "night_of", "nights", "time_slots"]


@asynccontextmanager
async def exclusive(
    store: AsyncStore,
    resource: str,
    *,
    ttl: float = 30.0,
    wait: float | None = 10.0,
    holder: str = "exclusive",
) -> AsyncIterator[Claim]:
    """Hold ``resource``'s conflict unit for the ``async with`` block: one writer at a time.

    :func:`dibs.booking.exclusive` for asyncio: the same arguments, waits
    (with :func:`asyncio.sleep`, so the loop runs on), results and errors.
    Raises :class:`ResourceBusy` when the wait runs out, and
    :class:`~dibs.HoldLost` on exit if the hold was lost while the block ran.
    """
    # --- shared with the sync face: scripts/unasync.py makes it from this part ---
    unit, me = _entry(resource, wait, holder)
    started = time.monotonic()
    delay = 0.001
    while True:
        result = await store.claim(unit, holder=me, ttl=ttl)
        # Linearization point: the store's claim on the conflict unit.
        if result:
            claim = result.claim
            assert claim is not None
            break
        await asyncio.sleep(_pause(resource, started, wait, delay))
        delay = min(delay * 2, 0.1)
    try:
        yield claim
    except BaseException:
        # The block's own failure is the news; give the resource back quietly.
        await asyncio.shield(store.release(claim.id, holder=me, fence=claim.fence))
        raise
    if not await store.release(claim.id, holder=me, fence=claim.fence):
        _check_lost(resource, claim, await store.get(claim.id))
    # --- end of the shared part ---
