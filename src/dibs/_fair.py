"""Fair waiting for a lease (``wait=`` other than 0): first come, first served per key.

A waiter whose targets are taken takes a ticket in the queue of its *first*
target (in the order the store keeps them: a unit's queue is the unit's, a
span's is its resource's) and claims the targets only when its ticket is the
head; it renews its ticket while it waits, and releases it once it holds the
targets, gives up (``wait`` ran out) or is cut off (cancelled, interrupted).
See :mod:`dibs._queue` for how tickets are numbered and what arrival order is.

The uncontended path pays one read: a lease that waits first reads whether
anyone queues for its key, and only if no one does tries the targets at once
(a newcomer never barges past a queue). ``wait=0`` never queues and never
reads: its path is unchanged.
"""

from __future__ import annotations

import contextlib
import time
import uuid
from collections.abc import Generator
from dataclasses import dataclass, field
from typing import Any, TypeVar

from dibs._bell import rung
from dibs._lease import (
    _FIRST_PAUSE,
    _MAX_PAUSE,
    _SHOWN_HOLDERS,
    UNAVAILABLE_RETRY,
    _Attempt,
    _busy,
    _claim_once,
    _claim_policy,
    _dead_on_arrival,
    _drop,
    _HoldersStep,
    _random,
    _Terms,
)
from dibs._model import Claim, ClaimState, Span, Target, Unit
from dibs._queue import (
    FEED_POLL,
    HEAD_POLL,
    Place,
    QCall,
    QPause,
    awaited,
    behind,
    queue_name,
)
from dibs._queue import join as join_queue
from dibs._queue import leave as leave_queue
from dibs._queue import live as live_tickets
from dibs._queue import position as queue_position
from dibs._queue import renew as renew_ticket
from dibs.exceptions import StoreUnavailable

_T = TypeVar("_T")
_Policy = Generator[Any, Any, _T]

__all__ = ["FairAttempt", "fair_claim_policy", "lease_queue"]


@dataclass(slots=True)
class FairAttempt(_Attempt):
    """An attempt that may hold a ticket, for the face to give back if it is cut off."""

    queue: str = ""
    place: Place = field(default_factory=Place)


def lease_queue(target: Target) -> str:
    """The queue that waiters for ``target`` (a lease's first target) line up in."""
    if isinstance(target, Span):
        return queue_name("span", target.resource)
    assert isinstance(target, Unit)
    return queue_name("unit", f"{target.resource}\x1f{target.slot}")


def fair_claim_policy(terms: _Terms, attempt: FairAttempt) -> _Policy[Claim]:
    """Claim the targets as ``terms.wait`` says, serving waiters in arrival order."""
    if terms.wait == 0:
        return (yield from _claim_policy(terms, attempt))
    started = time.monotonic()
    deadline = None if terms.wait is None else started + terms.wait
    give_up = None if terms.wait is None else started + max(terms.wait, UNAVAILABLE_RETRY)
    queue = attempt.queue = lease_queue(terms.targets[0])
    place = attempt.place
    delay = _FIRST_PAUSE
    taken: tuple[Target, ...] = terms.targets
    tried = False  # whether the head has claimed and been refused since it became the head
    joined = None  # the ticket just taken, whose place the join read
    while True:
        since = rung()  # before the reads: a release while they run ends the pause below
        try:
            if place.ticket is None:
                if not (yield from live_tickets(queue)):  # no one queues: try at once
                    claim, taken = yield from _try(terms, attempt, give_up)
                    if claim is not None:
                        return claim
                joined = yield from join_queue(queue, place, until=deadline)
                delay = _FIRST_PAUSE
            ticket = place.ticket
            if ticket is not None:  # None: no turn at the counter before the deadline
                if not (yield from renew_ticket(ticket)):
                    place.ticket = None  # expired (we were paused): queue again at the back
                    continue
                # The join read where its ticket stands; after that, each turn reads it.
                fresh, joined = ticket is joined, None
                ahead = len(ticket.ahead) if fresh else (yield from queue_position(ticket))
                if ahead is None:
                    place.ticket = None
                    continue
                # The head: only it may claim the targets. Once refused, it reads whether
                # the first target it was refused is free before claiming again (a refused
                # claim writes its request's record on some stores).
                if ahead == 0 and (
                    not tried or not taken or (yield QCall("holder_of", (taken[0],))) is None
                ):
                    first, tried = not tried, True
                    claim, taken = yield from _try(terms, attempt, give_up)
                    if claim is not None:
                        # Cut off while leaving the queue: the face releases the hold too.
                        attempt.unanswered = claim.request_id
                        yield from leave_queue(ticket)
                        place.ticket = attempt.unanswered = None
                        return claim
                    if first:
                        # Refused on its first try as the head: from here it waits on
                        # reads, and the release may have come while the claim ran.
                        delay = _FIRST_PAUSE
                        continue
        except StoreUnavailable:
            if give_up is not None and time.monotonic() >= give_up:
                raise
        now = time.monotonic()
        if deadline is not None and now >= deadline:
            if place.ticket is not None:
                ticket, place.ticket = place.ticket, None
                yield from leave_queue(ticket)
            holders: dict[Target, str | None] = {}
            with contextlib.suppress(StoreUnavailable):  # who holds them is for the message only
                holders = yield _HoldersStep(taken[:_SHOWN_HOLDERS])
            raise _busy(terms, taken or terms.targets, holders, now - started)
        # The pause ends when a release in this process rings the bell, or when the
        # store's change feed moves (other processes'): a waiter's next step is a read,
        # so it goes at once. The pause itself is for an expiry, which frees a target or
        # a ticket without a change to see: the head backs off, and one behind it (a
        # ticket ahead expires TICKET_TTL after its waiter died) waits long.
        ids = awaited(place)
        longest = delay if ids is None else behind(ids)
        pause = _random.uniform(0.0 if ids is None else longest / 2, longest)
        if deadline is not None:
            pause = min(pause, max(0.0, deadline - now))
        yield QPause(pause, 0.0, since, HEAD_POLL if ids is None else FEED_POLL, ids)
        delay = min(delay * 2, _MAX_PAUSE)


def _try(
    terms: _Terms, attempt: _Attempt, give_up: float | None
) -> _Policy[tuple[Claim | None, tuple[Target, ...]]]:
    """One claim of the targets (retried while the store is unavailable); the hold, or the taken."""
    request_id = f"lease-{uuid.uuid4().hex}"
    result = yield from _claim_once(request_id, attempt, give_up)
    claim = result.claim
    if result and claim is not None and claim.request_id == request_id:
        if claim.state is ClaimState.HELD and not _dead_on_arrival(terms, attempt):
            return claim, ()
        if claim.state is ClaimState.HELD:
            yield from _drop(terms, claim)
        return None, ()
    if result:
        return None, terms.targets  # held by this holder under a claim the lease did not make
    return None, result.taken
