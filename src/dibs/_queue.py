"""First come, first served: a queue of numbered tickets, each a claim, written once for both faces.

A queue is named by a string; its tickets are claims on the units ``(name, "1")``,
``(name, "2")``... all under the one holder ``name``, so ``store.claims_of(name)``
lists the live ones (a snapshot). A ticket's number is its place: the lowest live
number is the head.

Taking a ticket: claim the queue's counter unit ``(name, "next")`` as a short
hold (joiners take turns at it); its fence, larger than that of every earlier
claim on that unit, is the ticket's number. Claim the ticket's unit under that
number, check that no live ticket is above it, and release the counter. So a
joiner's ticket is claimed after every earlier joiner's is, and numbers never
repeat: **arrival order is the order in which the store granted the turns at the
counter.** (A joiner paused past the counter's TTL may find a later joiner's
ticket above its own: it releases its own and joins again, behind.)

Tickets are holds with a short TTL that the waiter renews while it waits: a
waiter killed with ``kill -9`` (or paused past the TTL) stops renewing, its
ticket expires, and the next one is head. A paused waiter that comes back finds
its ticket gone (the renewal raises :class:`~dibs.HoldLost`) and queues again at
the back.

The rules yield :class:`QCall` (one call of the store's public API, by name) and
:class:`QPause` steps; each face performs them with blocking calls or awaits.
"""

from __future__ import annotations

import contextlib
import hashlib
import random
import time
import uuid
from collections.abc import Generator
from dataclasses import dataclass, field
from typing import Any

from dibs._bell import rung
from dibs._model import Claim, ClaimResult, Unit
from dibs.exceptions import ClaimNotFound, HoldLost, StoreUnavailable

__all__ = [
    "BEHIND_MAX",
    "BEHIND_PAUSE",
    "FEED_POLL",
    "HEAD_POLL",
    "QUEUE_ERRORS",
    "TICKET_TTL",
    "Place",
    "QCall",
    "QPause",
    "Ticket",
    "abandon",
    "awaited",
    "behind",
    "join",
    "queue_name",
    "turn",
]

TICKET_TTL = 5.0
"""Seconds a waiter's ticket lives unrenewed: how long a killed waiter can hold up the queue."""

QUEUE_ERRORS = (HoldLost, ClaimNotFound, StoreUnavailable)
"""The errors the queue's rules decide on (a driver throws them back in)."""

_PREFIX = "dibs.queue-"  # under the service's reserved "dibs." names: no client claims one
_COUNTER = "next"  # the counter unit's slot; tickets' slots are their numbers (digits)
_TURN_TTL = 1.0  # seconds a joiner's turn at the counter lives: a cut-off joiner's blocks no longer
_FIRST_PAUSE = 0.001
_MAX_PAUSE = 0.05  # between tries at the counter: it is held for two round trips at most
_random = random.Random()  # our own: a queue never moves the global random state

FEED_POLL = 0.01
"""Seconds between a waiter's reads of the store's change feed."""
HEAD_POLL = 0.002
"""The same for the head of a queue: one per key, and the one whose wake-up is the hand-off."""
BEHIND_PAUSE = 0.25
"""The longest pause of a waiter behind the head, per ticket ahead of it (up to
:data:`BEHIND_MAX`). It wakes on the release of the tickets ahead (in this process:
:mod:`dibs._bell`; in others: the change feed, where watched), so the pause is for a
ticket ahead that expires (its waiter died) or a release unheard: the next in line
reads often, the ones further back seldom (each read costs the store a round trip)."""
BEHIND_MAX = 1.0


def queue_name(kind: str, key: str) -> str:
    """The queue's name (its tickets' resource and holder), bounded whatever ``key`` holds."""
    digest = hashlib.sha256(f"{kind}\x1f{key}".encode("utf-8", "surrogatepass")).hexdigest()
    return f"{_PREFIX}{kind}-{digest[:40]}"


@dataclass(frozen=True, slots=True)
class QCall:
    """Call ``store.<method>(*args, **kwargs)`` (awaited on the async face); its answer."""

    method: str
    args: tuple[Any, ...] = ()
    kwargs: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class QPause:
    """Wait up to ``seconds``; a release in this process ends it (:mod:`dibs._bell`), and a
    face that watches the store's change feed cuts it to ``hurried`` more once that moves."""

    seconds: float
    hurried: float = 0.0
    since: int | None = None
    """The bell's count before the waiter's last read: a ring past it ends the pause."""
    poll: float = FEED_POLL
    """Seconds between reads of the change feed, for a face that watches one."""
    ids: frozenset[str] | None = None
    """Only the release of all these claims ends the pause (None: of any claim)."""


@dataclass(slots=True)
class Ticket:
    """A waiter's live ticket: its claim, number, and when it was last renewed (monotonic)."""

    queue: str
    claim: Claim
    number: int
    renewed: float
    ttl: float = TICKET_TTL
    head: bool = False
    """Seen at the head: it stays there (every later ticket is numbered above it) while it lives."""
    ahead: frozenset[str] = frozenset()
    """The claim IDs of the tickets ahead of it when last read: once all are released, it is
    the head (one of them expiring is seen at the next read)."""

    @property
    def due(self) -> bool:
        """Whether a third of the TTL has passed since the ticket was claimed or renewed."""
        return time.monotonic() >= self.renewed + self.ttl / 3


@dataclass(slots=True)
class Place:
    """A waiter's ticket and its claims sent unanswered, for its face to give back if cut off."""

    ticket: Ticket | None = None
    pending: dict[str, tuple[Unit, float]] = field(default_factory=dict)
    """Request ID -> (unit, ttl) of each claim sent whose answer has not come yet."""


_Rule = Generator[QCall | QPause, Any, Any]


def live(queue: str) -> _Rule:
    """The queue's live tickets as ``{number: claim}`` (a snapshot)."""
    claims: list[Claim] = yield QCall("claims_of", (queue,))
    found: dict[int, Claim] = {}
    for claim in claims:
        for target in claim.targets:
            if isinstance(target, Unit) and target.resource == queue and target.slot.isdigit():
                found[int(target.slot)] = claim
    return found


def join(queue: str, place: Place, ttl: float = TICKET_TTL, until: float | None = None) -> _Rule:
    """Take a ticket at the back of ``queue``; the :class:`Ticket` (also left in ``place``).

    None if ``until`` (``time.monotonic()``) passes while waiting for a turn at the counter.
    """
    counter = Unit(queue, _COUNTER)
    pause = _FIRST_PAUSE
    while True:
        since = rung()
        turn_id = f"queue-{uuid.uuid4().hex}"
        # The counter is held while the ticket is claimed: joins are one at a time, and
        # its fence (larger than every earlier claim's on it) is the ticket's number.
        # The turn stays in ``place.pending`` until released, for a cut-off face to release.
        taken: ClaimResult = yield from _claim(queue, place, counter, _TURN_TTL, turn_id)
        turn = taken.claim
        if not taken or turn is None or turn.request_id != turn_id:
            del place.pending[turn_id]
            if until is not None and time.monotonic() >= until:
                return None
            yield QPause(_random.uniform(0, pause), since=since)  # the counter's release rings
            pause = min(pause * 2, _MAX_PAUSE)
            continue
        number = turn.fence
        request_id = f"queue-{uuid.uuid4().hex}"
        sent = time.monotonic()
        # Linearization point: the claim of the ticket's unit, under the counter.
        result = yield from _claim(queue, place, Unit(queue, str(number)), ttl, request_id)
        del place.pending[request_id]
        claim = result.claim
        if result and claim is not None and claim.request_id == request_id:
            place.ticket = Ticket(queue, claim, number, sent, ttl)
            after = yield from live(queue)
            _place(place.ticket, after)  # where it stands, from the same read
            if any(other > number for other in after):
                # Our turn at the counter expired (we were paused) and a later joiner
                # went in above us: go behind it.
                yield from leave(place.ticket)
                place.ticket = None
        # Not in a finally: a rule cut off (cancelled) cannot yield; its face releases it.
        with contextlib.suppress(HoldLost, ClaimNotFound, StoreUnavailable):
            yield QCall("release", (turn.id,), {"holder": queue, "fence": turn.fence})
        del place.pending[turn_id]
        if place.ticket is not None:
            return place.ticket


def _claim(queue: str, place: Place, unit: Unit, ttl: float, request_id: str) -> _Rule:
    """Claim ``unit`` for the queue, noted in ``place.pending`` (the caller clears it)."""
    place.pending[request_id] = (unit, ttl)
    result: ClaimResult = yield QCall(
        "claim", (unit,), {"holder": queue, "ttl": ttl, "request_id": request_id}
    )
    return result


def turn(queue: str, place: Place, tried: bool, until: float | None = None) -> _Rule:
    """Whether this waiter may try now: no one queues and it has not tried yet, or its ticket
    is the head. Joins the queue (once it has tried) and renews its ticket as it goes."""
    joined = None  # the ticket just taken, whose place the join read
    while True:
        if place.ticket is None:
            if not tried and not (yield from live(queue)):
                return True  # no one queues: try at once, without a ticket
            if (joined := (yield from join(queue, place, until=until))) is None:
                return False  # no turn at the counter before ``until``
        ticket = place.ticket
        assert ticket is not None
        if not (yield from renew(ticket)):
            place.ticket = None  # expired while we were paused: queue again at the back
            tried = True
            continue
        fresh, joined = ticket is joined, None
        ahead = len(ticket.ahead) if fresh else (yield from position(ticket))
        if ahead is None:
            place.ticket = None
            tried = True
            continue
        return ahead == 0


def awaited(place: Place) -> frozenset[str] | None:
    """The claims whose release together ends a waiter's pause: the tickets ahead of its own;
    None (any release) for the head, or a waiter without a ticket."""
    ticket = place.ticket
    if ticket is None or ticket.head:
        return None
    return ticket.ahead


def behind(ids: frozenset[str]) -> float:
    """The longest pause of a waiter with the tickets ``ids`` ahead of it (see BEHIND_PAUSE)."""
    return min(BEHIND_PAUSE * len(ids), BEHIND_MAX)


def abandon(queue: str, place: Place) -> _Rule:
    """Give back what a cut-off waiter holds: its ticket, and any claim it sent unanswered.

    A claim whose answer was lost is replayed with its request ID (the store answers
    its outcome, or makes it now) and released. Best effort: all of it expires anyway.
    """
    for request_id, (unit, ttl) in list(place.pending.items()):
        with contextlib.suppress(HoldLost, ClaimNotFound, StoreUnavailable):
            result: ClaimResult = yield QCall(
                "claim", (unit,), {"holder": queue, "ttl": ttl, "request_id": request_id}
            )
            claim = result.claim
            if result and claim is not None and claim.request_id == request_id:
                yield QCall("release", (claim.id,), {"holder": queue, "fence": claim.fence})
    place.pending.clear()
    if place.ticket is not None:
        ticket, place.ticket = place.ticket, None
        yield from leave(ticket)


def position(ticket: Ticket) -> _Rule:
    """How many live tickets are ahead of ``ticket`` (0: it is the head); None if it is gone.

    Read until the ticket is seen at the head, then no more: every ticket taken later is
    numbered above it, and a joiner paused past its turn that claims a lower number leaves
    again at once (:func:`join`). Its loss (expired while paused) shows in :func:`renew`.
    """
    if ticket.head:
        return 0
    numbers = yield from live(ticket.queue)
    mine = numbers.get(ticket.number)
    if mine is None or mine.id != ticket.claim.id:
        return None
    _place(ticket, numbers)
    return len(ticket.ahead)


def _place(ticket: Ticket, numbers: dict[int, Claim]) -> None:
    """Note where ``ticket`` stands among the live ``numbers``."""
    ticket.ahead = frozenset(c.id for number, c in numbers.items() if number < ticket.number)
    ticket.head = not ticket.ahead


def renew(ticket: Ticket) -> _Rule:
    """Extend the ticket if it is due; False if it is lost (expired, taken over, swept)."""
    if not ticket.due:
        return True
    sent = time.monotonic()
    try:
        claim: Claim = yield QCall(
            "extend",
            (ticket.claim.id,),
            {"holder": ticket.queue, "fence": ticket.claim.fence, "ttl": ticket.ttl},
        )
    except (HoldLost, ClaimNotFound):
        return False
    except StoreUnavailable:
        return True  # tried again on the next turn; it lives a whole TTL
    ticket.claim, ticket.renewed = claim, sent
    return True


def leave(ticket: Ticket) -> _Rule:
    """Release the ticket, best effort (it expires by itself)."""
    with contextlib.suppress(HoldLost, ClaimNotFound, StoreUnavailable):
        yield QCall(
            "release", (ticket.claim.id,), {"holder": ticket.queue, "fence": ticket.claim.fence}
        )
