"""Bookings over time: three ways to keep two bookings of one resource from overlapping.

A unique key catches equal keys, never overlapping intervals, so an interval
booking needs one of:

* **discretize** — cut time into fixed units (:func:`nights`,
  :func:`time_slots`) and claim them as one group; overlap becomes "same
  unit", which the store's unique key refuses. Best when the domain has a
  natural grain.
* **exclusion over ranges** — claim a :class:`~dibs.Span`; every store
  refuses a span overlapping a live one on the same resource (PostgreSQL by an
  ``EXCLUDE`` constraint). Exact, for arbitrary times.
* **materialized conflict** — one unit stands for the whole resource and
  every writer takes it first (:func:`exclusive`), serializing them so a
  read-check-write of a richer rule (a daily cap, a cleaning gap) cannot
  interleave. Portable, one writer per resource at a time.

See ``docs/patterns/booking.md`` for when to use which.
"""

from __future__ import annotations

import contextlib
import random
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, date, datetime, timedelta, tzinfo
from typing import Any
from zoneinfo import ZoneInfo

from dibs._bell import listen, rung
from dibs._drive import drive
from dibs._fair import lease_queue
from dibs._model import Claim, ClaimResult, ClaimState, Unit
from dibs._queue import QUEUE_ERRORS, Place, QCall, QPause, abandon, awaited, behind, turn
from dibs.exceptions import HoldLost, HoldLostReason, InvalidInput, ResourceBusy
from dibs.stores.base import Store

__all__ = ["ResourceBusy", "exclusive", "night_of", "nights", "time_slots"]

EXCLUSIVE_SLOT = "dibs:exclusive"
"""The slot of the unit that :func:`exclusive` claims on a resource."""

_DAY = timedelta(days=1)


def nights(room: str, check_in: date, check_out: date) -> list[Unit]:
    """The nights of a stay as units ``Unit(room, "YYYY-MM-DD")``, check-out night excluded.

    Claim them together (``store.claim(nights(...), ...)``) so the stay is
    all or nothing. Raises :class:`~dibs.InvalidInput` for datetimes instead
    of dates or a check-out not after check-in.
    """
    for name, value in (("check_in", check_in), ("check_out", check_out)):
        if isinstance(value, datetime) or not isinstance(value, date):
            raise InvalidInput(f"{name} must be a date, got {value!r}", field=name, value=value)
    if check_out <= check_in:
        raise InvalidInput(
            f"check_out {check_out} must be after check_in {check_in}",
            field="check_out",
            value=check_out,
        )
    count = (check_out - check_in).days
    return [Unit(room, (check_in + timedelta(days=i)).isoformat()) for i in range(count)]


def night_of(unit: Unit) -> date:
    """The date of a unit made by :func:`nights`, e.g. to say which nights were taken.

    Raises :class:`~dibs.InvalidInput` if the slot is not an ISO date.
    """
    try:
        return date.fromisoformat(unit.slot)
    except ValueError:
        raise InvalidInput(
            f"{unit!r} is not a night made by nights()", field="unit", value=unit
        ) from None


def time_slots(
    resource: str,
    start: datetime,
    end: datetime,
    *,
    every: timedelta,
    tz: str | tzinfo = "UTC",
) -> list[Unit]:
    """Fixed-size slots covering ``[start, end)`` as units keyed by local start time.

    The grid is ``every`` long (it must divide a day) and aligned to midnight
    in ``tz``; each unit's slot is the slot start as ISO local time with its
    UTC offset, e.g. ``"2026-03-29T09:30:00+02:00"``, so a slot is one instant
    even across a daylight-saving change. Naive ``start``/``end`` are read as
    local time in ``tz``. Raises :class:`~dibs.InvalidInput` for a bad
    ``every`` or zone, an empty range, or bounds off the grid.
    """
    zone = _zone(tz)
    if not isinstance(every, timedelta) or every <= timedelta(0) or _DAY % every:
        raise InvalidInput(
            f"every must be a positive timedelta that divides a day, got {every!r}",
            field="every",
            value=every,
        )
    first = _aware(start, zone, "start")
    last = _aware(end, zone, "end")
    if last <= first:
        raise InvalidInput(f"end {end} must be after start {start}", field="end", value=end)
    local = first.astimezone(zone)
    # Same tzinfo on both sides: this subtraction is wall-clock time since midnight.
    if (local - local.replace(hour=0, minute=0, second=0, microsecond=0)) % every:
        raise InvalidInput(
            f"start {local.isoformat()} is not on the {every} grid of {zone}",
            field="start",
            value=start,
        )
    if (last - first) % every:
        raise InvalidInput(
            f"end {end} is not a whole number of {every} slots after start",
            field="end",
            value=end,
        )
    units = []
    moment = first.astimezone(UTC)
    stop = last.astimezone(UTC)
    while moment < stop:
        units.append(Unit(resource, moment.astimezone(zone).isoformat()))
        moment += every
    return units


@contextmanager
def exclusive(
    store: Store,
    resource: str,
    *,
    ttl: float = 30.0,
    wait: float | None = 10.0,
    holder: str = "exclusive",
) -> Iterator[Claim]:
    """Hold ``resource``'s conflict unit for the ``with`` block: one writer at a time.

    Claims ``Unit(resource, EXCLUSIVE_SLOT)`` as a hold of ``ttl`` seconds
    (on the store's clock) under a holder unique to this entry, waiting with
    jittered backoff for up to ``wait`` seconds (``None``: forever), yields
    the claim and releases it on exit. The hold can expire under a block that
    runs too long: extend it (``store.extend``) in long blocks, and pass its
    ``fence`` to any system you write to so it can refuse a stale writer.

    Raises :class:`ResourceBusy` when the wait runs out, and
    :class:`~dibs.HoldLost` on exit if the hold expired or was taken over
    while the block ran (its work may have overlapped another writer's).
    :func:`dibs.aio.booking.exclusive` is the same, as ``async with``.
    """
    # --- generated from dibs/aio/booking.py (scripts/unasync.py): edit that, then run it ---
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
            if wait == 0 or drive(turn(queue, place, tried, until), _in(store), QUEUE_ERRORS):
                tried = True
                result = _claim(store, unit, me, ttl)
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
            listen(since, pause, ids)
            delay = min(delay * 2, 0.1)
    except BaseException:  # gave up, cancelled: the next waiter goes on
        if place.ticket is not None or place.pending:
            _settle(store, queue, place)
        raise
    if place.ticket is not None or place.pending:  # queued: leave (no point if not)
        try:
            _settle(store, queue, place)
        except BaseException:  # cancelled while leaving the queue: the hold goes too
            _give_up(store, claim, me)
            raise
    try:
        yield claim
    except BaseException:
        # The block's own failure is the news; give the resource back quietly.
        _give_up(store, claim, me)
        raise
    if not store.release(claim.id, holder=me, fence=claim.fence):
        _check_lost(resource, claim, store.get(claim.id))
    # --- end of the generated part ---


def _in(store: Store) -> Callable[[QCall | QPause], Any]:
    """How the queue's steps are performed on this face."""

    def perform(step: QCall | QPause) -> Any:
        if isinstance(step, QPause):
            return listen(step.since, step.seconds, step.ids)
        return getattr(store, step.method)(*step.args, **step.kwargs)

    return perform


def _settle(store: Store, queue: str, place: Place) -> None:
    """Give back the entry's ticket (and claims sent for it unanswered); never raises."""
    with contextlib.suppress(Exception):
        drive(abandon(queue, place), _in(store), QUEUE_ERRORS)


def _claim(store: Store, unit: Unit, me: str, ttl: float) -> ClaimResult:
    """The entry's claim (the async face's version also cleans up after a cancel)."""
    return store.claim(unit, holder=me, ttl=ttl)


def _give_up(store: Store, claim: Claim, me: str) -> None:
    """Release the hold when the block failed."""
    store.release(claim.id, holder=me, fence=claim.fence)


def _entry(resource: str, wait: float | None, holder: str) -> tuple[Unit, str]:
    """Check ``wait``; the conflict unit, and a holder unique to this entry."""
    if wait is not None and (isinstance(wait, bool) or not 0 <= wait < float("inf")):
        raise InvalidInput(
            f"wait must be seconds >= 0 or None, got {wait!r}", field="wait", value=wait
        )
    # A fresh holder per entry: the same holder re-claiming would be handed its
    # existing claim back (a natural-key replay), which would let two entries in.
    return Unit(resource, EXCLUSIVE_SLOT), f"{holder}:{uuid.uuid4().hex}"


def _pause(
    resource: str, started: float, wait: float | None, delay: float, least: float = 0.0
) -> float:
    """How long to sleep before the next try (from ``least`` to ``delay``, or to the end of
    the wait); raises ResourceBusy when the wait ran out."""
    waited = time.monotonic() - started
    if wait is not None and waited >= wait:
        raise ResourceBusy(
            f"{resource!r} stayed taken for {waited:.3g}s", resource=resource, waited=waited
        )
    # Full jitter: waiters spread out instead of retrying in lockstep.
    pause = random.uniform(least, delay)
    if wait is not None:
        pause = min(pause, max(0.0, wait - waited))
    return pause


def _check_lost(resource: str, claim: Claim, ended: Claim | None) -> None:
    """After the release at exit failed: raise HoldLost unless the block released it itself."""
    if ended is not None and ended.state is ClaimState.RELEASED:
        return
    reason = (
        HoldLostReason.TAKEN_OVER
        if ended is not None and ended.taken_over
        else HoldLostReason.EXPIRED
    )
    raise HoldLost(
        f"exclusive hold on {resource!r} was lost before the block ended ({reason})",
        claim_id=claim.id,
        reason=reason,
    )


def _zone(tz: str | tzinfo) -> tzinfo:
    if isinstance(tz, tzinfo):
        return tz
    try:
        return ZoneInfo(tz)
    except (ValueError, KeyError, TypeError) as exc:  # ZoneInfoNotFoundError is a KeyError
        raise InvalidInput(f"unknown time zone {tz!r}", field="tz", value=tz) from exc


def _aware(value: datetime, zone: tzinfo, name: str) -> datetime:
    if not isinstance(value, datetime):
        raise InvalidInput(f"{name} must be a datetime, got {value!r}", field=name, value=value)
    if value.tzinfo is None or value.utcoffset() is None:
        return value.replace(tzinfo=zone)
    return value
