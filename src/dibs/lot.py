"""A row of slots where the lot picks the position: contiguous k-slot parking on any store.

Each slot is the unit ``Unit("lot:<name>", "slot:<i>")``. A vehicle of length
k parks by claiming the k slot units *and* its own vehicle unit
``Unit("lot:<name>", "vehicle:<id>")`` as one group claim held by the vehicle
ID, confirmed at once. The store decides that claim atomically, so:

* two vehicles never share a slot (the slot units are unique);
* one vehicle never parks twice, even when two parks of it race from two
  processes and pick different positions: both claims contain its vehicle
  unit, the store grants one, and the other learns the vehicle's position;
* a vehicle is removed whole, by releasing its one claim.

The row's size is its shape, kept in the store once: the first call of a lot
claims ``Unit("lot:<name>", "shape")`` for the holder ``dibs.lot-size-<size>``
(never released), and a lot that finds another size there raises
:class:`~dibs.InvalidInput` on every call, before it reads a slot.

The search only picks candidates: from a hint of the row this ``Lot`` keeps
(what its own parks, removes and lost claims taught it), and, before it
refuses a vehicle, from a fresh snapshot (``holder_of`` per slot). The group
claim is the check; when it loses, the slots it reports taken are marked and
the search moves on. Every decision is the store's.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from operator import attrgetter
from typing import Literal

from dibs._model import Claim, ClaimResult, Unit, checked_unit, is_plain_name
from dibs.exceptions import ClaimNotFound, DibsError, InvalidInput
from dibs.stores.base import Store

__all__ = ["AlreadyParked", "Lot", "NotParked", "Occupancy", "VehicleBlocked"]

Fit = Literal["first", "best"]
# How often one park may find its vehicle unit taken and then free again
# (concurrent parks and removes of the same vehicle) before it gives up.
_VEHICLE_RACES = 8
_unit_key = attrgetter("resource", "slot")  # the order a store keeps a claim's units in
# The lot's shape (its size) is kept once per row, as the holder of a confirmed
# claim on Unit(<resource>, "shape") that no one releases: "dibs.lot-size-<size>".
_SHAPE_SLOT = "shape"
_SHAPE_HOLDER = "dibs.lot-size-"


class NotParked(DibsError, LookupError):
    """Raised by :meth:`Lot.remove` when ``vehicle_id`` holds no slots in ``lot``."""

    lot: str
    vehicle_id: str


class AlreadyParked(DibsError, ValueError):
    """Raised when a parked vehicle is parked again with a different ``length``.

    ``position`` and ``parked_length`` say where and how it is parked.
    """

    lot: str
    vehicle_id: str
    position: int
    parked_length: int


class VehicleBlocked(DibsError, RuntimeError):
    """Raised by :meth:`Lot.park` when the vehicle's own unit is held outside a parking of it.

    Another claim (of any holder) that holds ``Unit("lot:<lot>", "vehicle:<id>")``
    but is not this vehicle's parking in this lot keeps the vehicle from parking
    until that claim ends.
    """

    lot: str
    vehicle_id: str


@dataclass(frozen=True, slots=True)
class Occupancy:
    """A snapshot of the row, for display: who is in each slot and how fragmented it is.

    ``slots[i]`` is the vehicle ID in slot ``i`` or None; ``largest_free_run``
    is the longest vehicle that would fit right now.
    """

    size: int
    slots: tuple[str | None, ...]

    @property
    def free(self) -> int:
        """How many slots are free."""
        return sum(1 for v in self.slots if v is None)

    @property
    def free_runs(self) -> tuple[tuple[int, int], ...]:
        """Each maximal run of free slots as ``(start, length)``, left to right."""
        return tuple(_free_runs([v is not None for v in self.slots]))

    @property
    def largest_free_run(self) -> int:
        """The length of the longest run of free slots (0 when full)."""
        return max((n for _, n in self.free_runs), default=0)

    def __str__(self) -> str:
        return "".join("." if v is None else "#" for v in self.slots)


class _Row:
    """What both faces of the lot share: validation, the search, the hint, errors.

    :class:`Lot` and :class:`dibs.aio.Lot` differ only in awaiting their store
    calls; the sync one is generated from the async one (``scripts/unasync.py``).
    """

    def __init__(self, name: str, size: int, fit: Fit, resource: str | None) -> None:
        if not isinstance(name, str) or not name:
            raise InvalidInput(
                f"lot name must be a non-empty string, got {name!r}", field="name", value=name
            )
        if isinstance(size, bool) or not isinstance(size, int) or size < 1:
            raise InvalidInput(
                f"size must be a positive integer, got {size!r}", field="size", value=size
            )
        if fit not in ("first", "best"):
            raise InvalidInput(
                f"fit must be 'first' or 'best', got {fit!r}", field="fit", value=fit
            )
        self.name = name
        self.size = size
        self.fit: Fit = fit
        if resource is not None and (not isinstance(resource, str) or not resource):
            raise InvalidInput(
                f"resource must be a non-empty string, got {resource!r}",
                field="resource",
                value=resource,
            )
        self._resource = f"lot:{name}" if resource is None else resource
        self._slots = tuple(Unit(self._resource, f"slot:{i}") for i in range(size))
        # Whether this instance has seen its size stored as the row's (see _shape).
        self._shape_unit = Unit(self._resource, _SHAPE_SLOT)
        self._shape_holder = f"{_SHAPE_HOLDER}{size}"
        self._shaped = False
        # A park claims its run and its vehicle unit sorted by (resource, slot), as
        # the store keeps them: "slot:10" sorts before "slot:9", so a run that
        # crosses a power of ten is sorted (the vehicle unit sorts after "slot:").
        self._digits = [len(str(i)) for i in range(size)]
        # A hint of which slots are taken, from this instance's own parks,
        # removes, lost claims and snapshots. Never trusted: it only orders the
        # candidates, so a stale entry costs one lost claim or one fresh
        # snapshot. _hint_lock guards its writes and is never held across a store
        # call (nor, on the async face, across an await); a park reads it unlocked,
        # element by element, which can only misorder candidates.
        self._hint = [False] * size
        # The claims of this instance's own parks, by vehicle, and which vehicle
        # it last parked in each slot: remove tries the remembered claim first
        # (its release is conditional, so a stale one just returns False and the
        # store is asked). A park over a slot forgets the vehicle that was there,
        # so at most `size` claims are kept. Guarded by _hint_lock too.
        self._parked: dict[str, tuple[Claim, int, int]] = {}  # claim, start, length
        self._parked_at: list[str | None] = [None] * size
        self._hint_lock = threading.Lock()

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r}, size={self.size}, fit={self.fit!r})"

    # --- rules both faces apply around their store calls ----------------------------------------

    def _shape(self, granted: bool, holder: str | None) -> bool:
        """Whether the row's stored size is this lot's, from the shape claim and its holder.

        ``granted`` is the outcome of this lot's claim of the shape unit (a
        replay when it is stored already); ``holder`` the unit's holder when
        it was not. False means the unit was freed meanwhile: claim it again.
        Raises :class:`~dibs.InvalidInput` (field ``size``) when the row was
        made with another size, and (field ``resource``) when something that
        is not a lot holds the shape unit.
        """
        if granted or holder == self._shape_holder:
            return True
        if holder is None:
            return False
        stored = holder.removeprefix(_SHAPE_HOLDER)
        if holder.startswith(_SHAPE_HOLDER) and stored.isdecimal():
            raise InvalidInput(
                f"lot {self.name!r} has size {int(stored)} in this store, not {self.size}: "
                "every lot of one name must give it the same size",
                field="size",
                value=self.size,
            )
        raise InvalidInput(
            f"lot {self.name!r} cannot use resource {self._resource!r}: its unit "
            f"{_SHAPE_SLOT!r} is held by {holder!r}, which is not a lot",
            field="resource",
            value=self._resource,
        )

    def _check_length(self, length: object) -> None:
        if isinstance(length, bool) or not isinstance(length, int) or not 1 <= length <= self.size:
            raise InvalidInput(
                f"length must be an integer from 1 to {self.size}, got {length!r}",
                field="length",
                value=length,
            )

    def _blocked(self, vehicle_id: str) -> VehicleBlocked:
        return VehicleBlocked(
            f"vehicle {vehicle_id!r} cannot park in lot {self.name!r}: its "
            "vehicle unit is held by a claim that is not its parking here",
            lot=self.name,
            vehicle_id=vehicle_id,
        )

    def _lost(
        self, result: ClaimResult, start: int, length: int, occupied: list[bool]
    ) -> list[bool]:
        """Mark the slots a lost park claim reports taken (all of its run if it names none).

        Returns the park's view of the row to search on: ``occupied`` with them
        marked, copied first if it is the shared hint (a park reads the hint
        without copying it, and copies only once a claim lost).
        """
        # Every loss marks at least one slot, so the search always ends.
        taken = [self._index(u) for u in result.taken if isinstance(u, Unit)] or list(
            range(start, start + length)
        )
        if occupied is self._hint:
            occupied = self._hinted()
        for i in taken:
            occupied[i] = True
        self._learn((i, True) for i in taken)
        return occupied

    def _not_parked(self, vehicle_id: str) -> NotParked:
        return NotParked(
            f"vehicle {vehicle_id!r} is not parked in lot {self.name!r}",
            lot=self.name,
            vehicle_id=vehicle_id,
        )

    def _check_is_free(self, position: object, length: object) -> None:
        if isinstance(position, bool) or not isinstance(position, int) or position < 0:
            raise InvalidInput(
                f"position must be an integer >= 0, got {position!r}",
                field="position",
                value=position,
            )
        if isinstance(length, bool) or not isinstance(length, int) or length < 1:
            raise InvalidInput(
                f"length must be an integer >= 1, got {length!r}", field="length", value=length
            )

    def _parking_in(self, claims: Iterable[Claim], vehicle_id: str) -> Claim | None:
        """The vehicle's parking here among its claims: the one on its unit and on our slots."""
        me = self._vehicle_unit(vehicle_id)
        for claim in claims:
            units = claim.units
            if me in units and any(
                u.resource == self._resource and u.slot.startswith("slot:") for u in units
            ):
                return claim
        return None

    # --- the search and the hint ---------------------------------------------------------------

    def _choose(self, occupied: Sequence[bool], length: int) -> int | None:
        """Pick a start in the snapshot by the fit policy, or None if no run fits."""
        if self.fit == "first":
            # The leftmost free slot, then whether the run from it fits; if not, on
            # from just past the last taken slot of that run (the scans are list
            # methods, in C: a busy row is searched in a few calls).
            end = len(occupied) - length
            i = 0
            while True:
                try:
                    i = occupied.index(False, i, end + 1)
                except ValueError:
                    return None
                run = occupied[i : i + length]
                if True not in run:
                    return i
                i += length - list(reversed(run)).index(True)
        fits = [(start, n) for start, n in _free_runs(occupied) if n >= length]
        if not fits:
            return None
        return min(fits, key=lambda run: (run[1], run[0]))[0]

    def _hinted(self) -> list[bool]:
        with self._hint_lock:
            return list(self._hint)

    def _learn(self, facts: Iterable[tuple[int, bool]]) -> None:
        facts = list(facts)
        with self._hint_lock:
            for i, taken in facts:
                self._hint[i] = taken

    def _remember(self, vehicle_id: str, claim: Claim, start: int, length: int) -> None:
        """Note this instance's granted park: the slots are taken, and by which claim."""
        hint, parked, parked_at = self._hint, self._parked, self._parked_at
        with self._hint_lock:
            for i in range(start, start + length):
                hint[i] = True
                before = parked_at[i]
                if before is not None and before != vehicle_id:
                    parked.pop(before, None)  # its claim no longer holds slot i
                parked_at[i] = vehicle_id
            parked[vehicle_id] = (claim, start, length)

    def _forget(self, vehicle_id: str, start: int, length: int) -> None:
        """Note a removal: the slots are free and no longer this vehicle's."""
        hint, parked_at = self._hint, self._parked_at
        with self._hint_lock:
            self._parked.pop(vehicle_id, None)
            for i in range(start, start + length):
                hint[i] = False
                if parked_at[i] == vehicle_id:
                    parked_at[i] = None

    def _vehicle_unit(self, vehicle_id: str) -> Unit:
        slot = "vehicle:" + vehicle_id
        if is_plain_name(slot):  # the resource is the slots' own: checked when they were made
            return checked_unit(self._resource, slot)
        return Unit(self._resource, slot)  # checks the name, raising InvalidInput for a bad one

    def _group(self, start: int, length: int, me: Unit) -> tuple[Unit, ...]:
        """A park's units: its run and the vehicle's, sorted as a store keeps them."""
        run = self._slots[start : start + length]
        if self._digits[start] != self._digits[start + length - 1]:
            return (*sorted(run, key=_unit_key), me)
        return (*run, me)

    def _index(self, unit: Unit) -> int:
        return int(unit.slot.removeprefix("slot:"))

    def _placement(self, claim: Claim) -> tuple[int, int]:
        """(start, length) of a parking claim."""
        slots = [self._index(u) for u in claim.units if u.slot.startswith("slot:")]
        return min(slots), len(slots)

    def _same_vehicle(self, claim: Claim, vehicle_id: str, length: int) -> int:
        start, parked = self._placement(claim)
        if parked != length:
            raise AlreadyParked(
                f"vehicle {vehicle_id!r} is parked in lot {self.name!r} at {start} with "
                f"length {parked}, not {length}",
                lot=self.name,
                vehicle_id=vehicle_id,
                position=start,
                parked_length=parked,
            )
        return start

    @staticmethod
    def _check_vehicle(vehicle_id: object) -> None:
        if not isinstance(vehicle_id, str) or not vehicle_id:
            raise InvalidInput(
                f"vehicle_id must be a non-empty string, got {vehicle_id!r}",
                field="vehicle_id",
                value=vehicle_id,
            )


class Lot(_Row):
    """A parking row of ``size`` slots named ``name`` on ``store``; the lot picks positions.

    ``fit="first"`` parks at the leftmost run that fits; ``fit="best"`` at the
    start of the smallest run that fits, which leaves longer runs for longer
    vehicles. The store keeps a row's size (its first lot's); a lot of that
    name with another size raises :class:`~dibs.InvalidInput` (``size``) on
    every call. ``resource`` names the resource of the lot's units (default
    ``lot:<name>``), e.g. to keep them in a namespace other callers cannot claim.
    :class:`dibs.aio.Lot` is the same lot for asyncio code.
    Raises :class:`~dibs.InvalidInput` for a bad name, size, fit or resource.
    """

    # --- generated from dibs/aio/lot.py (scripts/unasync.py): edit that, then run it ---

    def __init__(
        self,
        store: Store,
        name: str,
        size: int,
        *,
        fit: Fit = "first",
        resource: str | None = None,
    ) -> None:
        super().__init__(name, size, fit, resource)
        self.store = store

    def park(self, vehicle_id: str, length: int = 1) -> int | None:
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
            self._own_shape()
        occupied = self._hint  # read unlocked: only candidates; _lost copies it to mark
        fresh = False
        races = 0
        while True:
            start = self._choose(occupied, length)
            if start is None:
                if not fresh:
                    # The hint may be stale: look at the row itself before refusing.
                    occupied = [self.store.holder_of(u) is not None for u in self._slots]
                    self._learn(enumerate(occupied))
                    fresh = True
                    continue
                existing = self._claim_of(vehicle_id)
                return (
                    None if existing is None else self._same_vehicle(existing, vehicle_id, length)
                )
            result = self._take(self._group(start, length, me), vehicle_id)
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
                existing = self._claim_of(vehicle_id)
                if existing is not None:
                    return self._same_vehicle(existing, vehicle_id, length)
                # No parking of this vehicle holds its unit, so some other claim
                # does; waiting for it would spin for as long as it lives. Only a
                # unit freed meanwhile (a concurrent remove) is worth a retry, and
                # a bounded number of them, so that park always ends.
                races += 1
                if races > _VEHICLE_RACES or self.store.holder_of(me) is not None:
                    raise self._blocked(vehicle_id)
                continue
            occupied = self._lost(result, start, length, occupied)

    def remove(self, vehicle_id: str) -> int:
        """Free every slot ``vehicle_id`` holds here, at once; return where it was parked.

        Raises :class:`~dibs.NotParked` if it holds no slots in this lot (never
        parked, already removed, or removed by a concurrent call),
        :class:`~dibs.InvalidInput` for an empty ID, and what the store raises.
        """
        if type(vehicle_id) is not str or not vehicle_id:
            self._check_vehicle(vehicle_id)
        if not self._shaped:
            self._own_shape()
        # The release is conditional on the claim still being live: of two
        # concurrent removes, exactly one gets True. A vehicle has at most one
        # live parking here, so a remembered claim that is still live is it.
        with self._hint_lock:
            parked = self._parked.pop(vehicle_id, None)
        if parked is not None:
            mine, start, length = parked
            try:
                released = self._free(mine, vehicle_id)
            except ClaimNotFound:  # ended and purged since: ask the store
                released = False
            if released:
                self._forget(vehicle_id, start, length)
                return start
        claim = self._claim_of(vehicle_id)
        if claim is None or not self._free(claim, vehicle_id):
            raise self._not_parked(vehicle_id)
        start, length = self._placement(claim)
        self._forget(vehicle_id, start, length)
        return start

    def position_of(self, vehicle_id: str) -> int | None:
        """Where ``vehicle_id`` is parked (its first slot), or None; a snapshot."""
        self._check_vehicle(vehicle_id)
        if not self._shaped:
            self._own_shape()
        claim = self._claim_of(vehicle_id)
        return None if claim is None else self._placement(claim)[0]

    def is_free(self, position: int, length: int = 1) -> bool:
        """Whether slots ``position .. position+length-1`` were all free a moment ago.

        A snapshot for display only: it may be stale before it returns, so
        never park on its word (:meth:`park` does not call it). Positions past
        the end are not free. Raises :class:`~dibs.InvalidInput` for a
        negative position or a length below 1.
        """
        self._check_is_free(position, length)
        if not self._shaped:
            self._own_shape()
        if position + length > self.size:
            return False
        for slot in self._slots[position : position + length]:
            if self.store.holder_of(slot) is not None:
                return False
        return True

    def occupancy(self) -> Occupancy:
        """Who is in each slot, and the free runs; a snapshot for display."""
        if not self._shaped:
            self._own_shape()
        return Occupancy(self.size, tuple([self.store.holder_of(s) for s in self._slots]))

    def _own_shape(self) -> None:
        """Store this lot's size as the row's, or learn that it is; once per instance.

        The confirmed claim of the shape unit is the compare-and-set: the first
        lot of a name writes its size, and a later one of the same size replays
        that claim. A lot of another size raises :class:`~dibs.InvalidInput`
        before it reads or writes a slot, so no handle misreads the row.
        """
        while True:
            result = self.store.claim(self._shape_unit, holder=self._shape_holder)
            holder = None if result else self.store.holder_of(self._shape_unit)
            if self._shape(bool(result), holder):
                self._shaped = True
                return

    def _claim_of(self, vehicle_id: str) -> Claim | None:
        """The vehicle's parking here, as the store has it now."""
        return self._parking_in(self.store.claims_of(vehicle_id), vehicle_id)

    # --- end of the generated part ---

    def _take(self, units: tuple[Unit, ...], vehicle_id: str) -> ClaimResult:
        """A park's group claim (:class:`dibs.aio.Lot`'s waits out a cancellation).

        The units are the lot's own, sorted, so a plain vehicle ID (a checked
        holder) takes the store's path for checked input; any other ID the
        public claim, which checks it.
        """
        if is_plain_name(vehicle_id):
            return self.store._claim_checked(units, vehicle_id)
        return self.store.claim(units, holder=vehicle_id)

    def _free(self, claim: Claim, vehicle_id: str) -> bool:
        """A remove's release (:class:`dibs.aio.Lot`'s waits out a cancellation)."""
        return self.store.release(claim.id, holder=vehicle_id, fence=claim.fence)


def _free_runs(occupied: Sequence[bool]) -> list[tuple[int, int]]:
    runs: list[tuple[int, int]] = []
    start = None
    for i, taken in enumerate((*occupied, True)):
        if not taken and start is None:
            start = i
        elif taken and start is not None:
            runs.append((start, i - start))
            start = None
    return runs
