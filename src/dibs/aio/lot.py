""":class:`dibs.Lot` for asyncio: the same row, the same rules, awaited on an async store.

The decisions (validation, the slot search, what a lost claim teaches, when a
park gives up) are :class:`dibs.Lot`'s own, written once as steps
(:mod:`dibs._steps`); this face only awaits the store calls they ask for.
"""

from __future__ import annotations

from dibs._steps import arun
from dibs.aio._store import AsyncStore
from dibs.lot import Fit, Occupancy, _Row

__all__ = ["Lot"]


class Lot(_Row):
    """:class:`dibs.Lot` on an :class:`~dibs.aio.AsyncStore`: the same arguments, as coroutines.

    ``park``, ``remove``, ``position_of``, ``is_free`` and ``occupancy``
    return and raise what :class:`dibs.Lot`'s do. Share one instance among
    the tasks of one event loop (its hint of the row is then shared too); any
    number of lots, sync or async, in any process, may share one row.
    Raises :class:`~dibs.InvalidInput` for a bad name, size, fit or resource.
    """

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
        """Park ``vehicle_id`` in ``length`` adjacent free slots: :meth:`dibs.Lot.park`."""
        return await arun(self.store, self._park(vehicle_id, length))

    async def remove(self, vehicle_id: str) -> int:
        """Free every slot ``vehicle_id`` holds here, at once: :meth:`dibs.Lot.remove`."""
        return await arun(self.store, self._remove(vehicle_id))

    async def position_of(self, vehicle_id: str) -> int | None:
        """Where ``vehicle_id`` is parked, or None: :meth:`dibs.Lot.position_of`."""
        return await arun(self.store, self._position_of(vehicle_id))

    async def is_free(self, position: int, length: int = 1) -> bool:
        """Whether those slots were free a moment ago (display only): :meth:`dibs.Lot.is_free`."""
        return await arun(self.store, self._is_free(position, length))

    async def occupancy(self) -> Occupancy:
        """Who is in each slot, and the free runs: :meth:`dibs.Lot.occupancy`."""
        return await arun(self.store, self._occupancy())
