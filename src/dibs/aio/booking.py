""":mod:`dibs.booking` for asyncio: the unit makers as they are, and an ``async with`` exclusive.

:func:`nights`, :func:`night_of` and :func:`time_slots` make units without a
store, so they are the sync module's own functions. :func:`exclusive` takes
:func:`dibs.booking.exclusive`'s steps (:mod:`dibs._steps`) and awaits them.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from dibs._model import Claim
from dibs._steps import arun
from dibs.aio._store import AsyncStore
from dibs.booking import (
    EXCLUSIVE_SLOT,
    ResourceBusy,
    _enter,
    _leave,
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
    claim, me = await arun(store, _enter(resource, ttl, wait, holder), asyncio.sleep)
    try:
        yield claim
    except BaseException:
        # The block's own failure (or its cancellation) is the news: give the
        # resource back quietly, shielded so a cancelled task still lets go.
        await asyncio.shield(store.release(claim.id, holder=me, fence=claim.fence))
        raise
    await arun(store, _leave(resource, claim, me))
