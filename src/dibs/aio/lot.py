""":class:`dibs.Lot` for asyncio: the same row and rules, awaited on an async store.

The part of :class:`Lot` between the markers below is the one implementation
of the lot's calls: ``scripts/unasync.py`` generates :class:`dibs.Lot`'s from
it by dropping ``async``/``await`` (the way psycopg keeps its sync face), so
the two cannot drift and the sync lot pays nothing for the async one. The
rules they call (validation, the search, the hint, the errors) live in
:class:`dibs.lot._Row`.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

from dibs._model import Claim, ClaimResult, Unit, is_plain_name
from dibs.exceptions import ClaimNotFound
from dibs.lot import _VEHICLE_RACES, Fit, Occupancy, _Row
from dibs.stores.base_async import AsyncStore

__all__ = ["Lot"]


class Lot(_Row):
    """:class:`dibs.Lot` on an :class:`~dibs.aio.AsyncStore`: the same arguments, as coroutines.

    ``park``, ``remove``, ``position_of``, ``is_free`` and ``occupancy``
    return and raise what :class:`dibs.Lot`'s do. Share one instance among
    the tasks of one event loop (they then share its hint of the row); any
    number of lots, sync or async, in any process, may share one row.
    Raises :class:`~dibs.InvalidInput` for a bad name, size, fit or resource.
    """

    # --- shared with the sync face: scripts/unasync.py makes it from this part ---

    def __init__(
        self,
        store: AsyncStore,
        name: str,
        size: int,
        *,
        fit: Fit = "first",
        resource: str | None = None,
    ) -> None:
        super().__init__(name, size, fit, resource)
        self.store = store

    async def park(self, vehicle_id: str, length: int = 1) -> int | None:
        """Park ``vehicle_id`` in ``length`` adjacent free slots; return the first slot's index.

        Returns None when no run of ``length`` free slots was found (a refusal
        is not remembered: the vehicle may try again later). Parking a vehicle
        that is already parked here returns its position and takes nothing new.

        Raises :class:`~dibs.AlreadyParked` if it is parked with a different
        length, :class:`~dibs.VehicleBlocked` if a claim that is not its
        parking here holds its vehicle unit, :class:`~dibs.InvalidInput` for
        an empty ID or a length outside ``1..size``, and what the store raises.
        """
        if type(vehicle_id) is not str or not vehicle_id:
            self._check_vehicle(vehicle_id)
        if type(length) is not int or not 1 <= length <= self.size:
            self._check_length(length)
        me = self._vehicle_unit(vehicle_id)
        if not self._shaped:
            await self._own_shape()
        occupied = self._hint  # read unlocked: only candidates; _lost copies it to mark
        fresh = False
        races = 0
        while True:
            start = self._choose(occupied, length)
            if start is None:
                if not fresh:
                    # The hint may be stale: look at the row itself before refusing.
                    occupied = [await self.store.holder_of(u) is not None for u in self._slots]
                    self._learn(enumerate(occupied))
                    fresh = True
                    continue
                existing = await self._claim_of(vehicle_id)
                return (
                    None if existing is None else self._same_vehicle(existing, vehicle_id, length)
                )
            result = await self._take(self._group(start, length, me), vehicle_id)
            # Linearization point: the store's group claim. Granted means the
            # slots and the vehicle unit are this vehicle's, all or none; a
            # replay means it already held exactly these.
            if result.granted:
                if result.replayed:
                    self._learn((i, True) for i in range(start, start + length))
                else:
                    assert result.claim is not None
                    self._remember(vehicle_id, result.claim, start, length)
                return start
            if me in result.taken:
                # Parked already, or a concurrent park of it won: find where.
                existing = await self._claim_of(vehicle_id)
                if existing is not None:
                    return self._same_vehicle(existing, vehicle_id, length)
                # No parking of this vehicle holds its unit, so some other claim
                # does; waiting for it would spin for as long as it lives. Only a
                # unit freed meanwhile (a concurrent remove) is worth a retry, and
                # a bounded number of them, so that park always ends.
                races += 1
                if races > _VEHICLE_RACES or await self.store.holder_of(me) is not None:
                    raise self._blocked(vehicle_id)
                continue
            occupied = self._lost(result, start, length, occupied)

    async def remove(self, vehicle_id: str) -> int:
        """Free every slot ``vehicle_id`` holds here, at once; return where it was parked.

        Raises :class:`~dibs.NotParked` if it holds no slots in this lot (never
        parked, already removed, or removed by a concurrent call),
        :class:`~dibs.InvalidInput` for an empty ID, and what the store raises.
        """
        if type(vehicle_id) is not str or not vehicle_id:
            self._check_vehicle(vehicle_id)
        if not self._shaped:
            await self._own_shape()
        # The release is conditional on the claim still being live: of two
        # concurrent removes, exactly one gets True. A vehicle has at most one
        # live parking here, so a remembered claim that is still live is it.
        with self._hint_lock:
            parked = self._parked.pop(vehicle_id, None)
        if parked is not None:
            mine, start, length = parked
            try:
                released = await self._free(mine, vehicle_id)
            except ClaimNotFound:  # ended and purged since: ask the store
                released = False
            if released:
                self._forget(vehicle_id, start, length)
                return start
        claim = await self._claim_of(vehicle_id)
        if claim is None or not await self._free(claim, vehicle_id):
            raise self._not_parked(vehicle_id)
        start, length = self._placement(claim)
        self._forget(vehicle_id, start, length)
        return start

    async def position_of(self, vehicle_id: str) -> int | None:
        """Where ``vehicle_id`` is parked (its first slot), or None; a snapshot."""
        self._check_vehicle(vehicle_id)
        if not self._shaped:
            await self._own_shape()
        claim = await self._claim_of(vehicle_id)
        return None if claim is None else self._placement(claim)[0]

    async def is_free(self, position: int, length: int = 1) -> bool:
        """Whether slots ``position .. position+length-1`` were all free a moment ago.

        A snapshot for display only: it may be stale before it returns, so
        never park on its word (:meth:`park` does not call it). Positions past
        the end are not free. Raises :class:`~dibs.InvalidInput` for a
        negative position or a length below 1.
        """
        self._check_is_free(position, length)
        if not self._shaped:
            await self._own_shape()
        if position + length > self.size:
            return False
        for slot in self._slots[position : position + length]:
            if await self.store.holder_of(slot) is not None:
                return False
        return True

    async def occupancy(self) -> Occupancy:
        """Who is in each slot, and the free runs; a snapshot for display."""
        if not self._shaped:
            await self._own_shape()
        return Occupancy(self.size, tuple([await self.store.holder_of(s) for s in self._slots]))

    async def _own_shape(self) -> None:
        """Store this lot's size as the row's, or learn that it is; once per instance.

        The confirmed claim of the shape unit is the compare-and-set: the first
        lot of a name writes its size, and a later one of the same size replays
        that claim. A lot of another size raises :class:`~dibs.InvalidInput`
        before it reads or writes a slot, so no handle misreads the row.
        """
        while True:
            result = await self.store.claim(self._shape_unit, holder=self._shape_holder)
            holder = None if result else await self.store.holder_of(self._shape_unit)
            if self._shape(bool(result), holder):
                self._shaped = True
                return

    async def _claim_of(self, vehicle_id: str) -> Claim | None:
        """The vehicle's parking here, as the store has it now."""
        return self._parking_in(await self.store.claims_of(vehicle_id), vehicle_id)

    # --- end of the shared part ---

    # A store call whose await is cancelled may still run to its end (on a worker
    # thread, or as a statement finishing in the background). A park's claim or a
    # remove's release landing after the call was over would undo what a later
    # call did: a retried park and remove, and then the vehicle parked again; a
    # park that found the vehicle, and then its parking freed. So these two calls
    # are not cancelled with the lot's call: it waits for them (one store call,
    # bounded by the store's own timeouts) before the cancellation goes on.

    async def _take(self, units: tuple[Unit, ...], vehicle_id: str) -> ClaimResult:
        """A park's group claim; a cancelled park ends once it has, and holds nothing.

        As :meth:`dibs.Lot._take`: a plain vehicle ID takes the store's path for
        checked input, any other the public claim.
        """
        if is_plain_name(vehicle_id):
            claim = self.store._claim_checked(units, vehicle_id)
        else:
            claim = self.store.claim(units, holder=vehicle_id)
        if self.store._inline:  # it cannot outlive its await: no task needed
            return await claim
        call = asyncio.ensure_future(claim)
        try:
            return await asyncio.shield(call)
        except asyncio.CancelledError:
            await _waited_out(asyncio.ensure_future(self._give_back(call, vehicle_id)))
            raise

    async def _give_back(self, call: asyncio.Future[ClaimResult], vehicle_id: str) -> None:
        """Release the claim ``call`` made, if it made one; never raises.

        A replay is a parking the vehicle held before this park, so it stays.
        If the claim's outcome or its release is unknown (the store failed),
        a claim it made holds the vehicle unit, so a retry of the park learns it.
        """
        with contextlib.suppress(Exception):
            result = await call
            if result and not result.replayed:
                assert result.claim is not None
                await self.store.release(
                    result.claim.id, holder=vehicle_id, fence=result.claim.fence
                )

    async def _free(self, claim: Claim, vehicle_id: str) -> bool:
        """A remove's release; a cancelled remove ends once it has (freed or not)."""
        release = self.store.release(claim.id, holder=vehicle_id, fence=claim.fence)
        if self.store._inline:
            return await release
        call = asyncio.ensure_future(release)
        try:
            return await asyncio.shield(call)
        except asyncio.CancelledError:
            await _waited_out(call)
            raise


async def _waited_out(task: asyncio.Future[Any]) -> None:
    """Wait until ``task`` is done, however often the waiting task is cancelled meanwhile.

    The caller raises its cancellation after this; ``task``'s own outcome is dropped.
    """
    while not task.done():
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.wait([task])
    if not task.cancelled():
        task.exception()  # retrieved: a failure here is not the caller's news
