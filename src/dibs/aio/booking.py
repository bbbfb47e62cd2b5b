""":mod:`dibs.booking` for asyncio: the unit makers as they are, and an ``async with`` exclusive.

:func:`nights`, :func:`night_of` and :func:`time_slots` make units without a
store, so they are the sync module's own functions. The body of
:func:`exclusive` between the markers below is the one implementation of both
faces: ``scripts/unasync.py`` makes :func:`dibs.booking.exclusive`'s from it.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

from dibs._bell import alisten, rung
from dibs._drive import adrive
from dibs._fair import lease_queue
from dibs._model import Claim, ClaimResult, Unit
from dibs._queue import QUEUE_ERRORS, Place, QCall, QPause, abandon, awaited, behind, turn
from dibs.aio.lot import _waited_out
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
from dibs.stores.base_async import AsyncStore

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
    # Waiters are served first come, first served: a ticket in the unit's queue (the
    # one leases of the unit wait in); only the head tries (docs/leases.md).
    queue, place, tried = lease_queue(unit), Place(), wait == 0
    try:
        while True:
            since = rung()  # before the reads: a release while they run ends the pause below
            until = None if wait is None else started + wait
            if wait == 0 or await adrive(
                turn(queue, place, tried, until), _in(store), QUEUE_ERRORS
            ):
                tried = True
                result = await _claim(store, unit, me, ttl)
                # Linearization point: the store's claim on the conflict unit.
                if result:
                    claim = result.claim
                    assert claim is not None
                    break
            # A release in this process ends the pause (dibs._bell): for one behind the
            # head, only the release of every ticket ahead of it.
            ids = awaited(place)
            if ids:
                pause = _pause(resource, started, wait, behind(ids), behind(ids) / 2)
            else:
                pause = _pause(resource, started, wait, delay)
            await alisten(since, pause, ids)
            delay = min(delay * 2, 0.1)
    except BaseException:  # gave up, cancelled: the next waiter goes on
        if place.ticket is not None or place.pending:
            await asyncio.shield(_settle(store, queue, place))
        raise
    if place.ticket is not None or place.pending:  # queued: leave (no await point if not)
        try:
            await asyncio.shield(_settle(store, queue, place))
        except BaseException:  # cancelled while leaving the queue: the hold goes too
            await _give_up(store, claim, me)
            raise
    try:
        yield claim
    except BaseException:
        # The block's own failure is the news; give the resource back quietly.
        await _give_up(store, claim, me)
        raise
    if not await store.release(claim.id, holder=me, fence=claim.fence):
        _check_lost(resource, claim, await store.get(claim.id))
    # --- end of the shared part ---


def _in(store: AsyncStore) -> Callable[[QCall | QPause], Awaitable[Any]]:
    """How the queue's steps are performed on this face."""

    async def perform(step: QCall | QPause) -> Any:
        if isinstance(step, QPause):
            return await alisten(step.since, step.seconds, step.ids)
        return await getattr(store, step.method)(*step.args, **step.kwargs)

    return perform


async def _settle(store: AsyncStore, queue: str, place: Place) -> None:
    """Give back the entry's ticket (and claims sent for it unanswered); never raises."""
    with contextlib.suppress(Exception):
        await adrive(abandon(queue, place), _in(store), QUEUE_ERRORS)


async def _claim(store: AsyncStore, unit: Unit, me: str, ttl: float) -> ClaimResult:
    """The entry's claim; a cancelled entry ends once it has, and holds nothing.

    On a store whose calls can outlive their await (threads, a statement that
    finishes on the server), a claim cancelled in flight may still land and hold the
    resource for its whole TTL; so the cancelled entry waits for it and gives
    it back before the cancellation goes on (as :class:`dibs.aio.Lot`'s park).
    """
    claim = store.claim(unit, holder=me, ttl=ttl)
    if store._inline:  # it cannot outlive its await: no task needed
        return await claim
    call = asyncio.ensure_future(claim)
    try:
        return await asyncio.shield(call)
    except asyncio.CancelledError:
        await _waited_out(asyncio.ensure_future(_give_back(store, call, me)))
        raise


async def _give_back(store: AsyncStore, call: asyncio.Future[ClaimResult], me: str) -> None:
    """Release what ``call`` claimed, if it claimed anything; never raises."""
    with contextlib.suppress(Exception):
        result = await call
        if result and result.claim is not None:
            await store.release(result.claim.id, holder=me, fence=result.claim.fence)


async def _give_up(store: AsyncStore, claim: Claim, me: str) -> None:
    """Release the hold when the block failed; done before a cancellation goes on.

    Cancelled again while it runs (a timeout, then a task group), it still waits
    for the release, so the resource is free when the caller hears of the cancel.
    """
    call = asyncio.ensure_future(store.release(claim.id, holder=me, fence=claim.fence))
    try:
        await asyncio.shield(call)
    except asyncio.CancelledError:
        await _waited_out(call)
        raise
