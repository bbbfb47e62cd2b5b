"""A waiting list: a freed unit is offered to the head of the queue as a hold.

``dibs.Waitlist(store, key)`` keeps a first come, first served list of holders
(pretix-style: people waiting for a sold-out show). The side that frees a unit
calls :meth:`Waitlist.release` (or :meth:`Waitlist.offer` for a unit already
free): the unit is claimed at once as a hold of ``offer_ttl`` seconds *for the
holder at the head of the list*, whose entry is used up by the offer. Nobody
outside the list can take an offered unit (it is held). The head
:meth:`~Waitlist.accept`\\s (a fenced confirm: the unit is theirs, exactly once)
or :meth:`~Waitlist.decline`\\s, or lets the offer expire; then the unit is
offered to the next in line (:meth:`~Waitlist.sweep` passes on lapsed offers).

Everything is a claim, on the store's public API:

* an **entry** is a confirmed claim, under the list's own holder, on two units at
  once: its number ``(list, "n")`` (see :mod:`dibs._queue` for how numbers are
  taken: the surviving claims' order is the arrival order) and its holder
  ``(list-who, holder)``, so one holder is in the list once;
* an **offer** is a hold on the freed unit under the head's holder. It counts
  only once the head's entry is released by the offerer: that release is the
  decision (``release`` answers True to one caller), so one entry gets at most
  one offer, and the unit's claim means one unit goes to at most one offer;
* a **record** of each open offer (a confirmed claim on ``(list-offers, offer id)``)
  lets :meth:`~Waitlist.sweep` find lapsed offers; whoever releases the record
  (again one caller) passes the unit on.

:mod:`dibs.aio.waitlist` is the async face; the part of its class between the
markers is the one implementation of both.
"""

from __future__ import annotations

import contextlib
import logging
import random
import threading
import time
import uuid
from collections.abc import Generator, Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from dibs._bell import listen
from dibs._drive import drive
from dibs._model import (
    Claim,
    ClaimResult,
    ClaimState,
    Unit,
    check_holder,
    check_seconds,
    check_ttl,
    shown,
)
from dibs._queue import QCall, QPause, queue_name
from dibs.exceptions import ClaimNotFound, HoldLost, HoldLostReason, InvalidInput, StoreClosed
from dibs.stores.base import Store
from dibs.stores.capabilities import ChangeFeed, UnchangingFeed

__all__ = ["OFFER_TTL", "WATCH_EVERY", "Entry", "Offer", "Waitlist", "Watcher"]

OFFER_TTL = 900.0
"""Seconds an offer is held for the head of the list, unless ``offer_ttl`` says otherwise."""

WATCH_EVERY = 1.0
"""Seconds between a watcher's rounds when the store's change feed does not move."""
WATCH_EVERY_MIN = 0.001
WATCH_EVERY_MAX = 86_400.0
FEED_POLL = 0.05
"""Seconds between a watcher's reads of the change feed, and so at least between its rounds."""

_DECIDED = (HoldLost, ClaimNotFound)
_random = random.Random()  # our own: a watcher never moves the global random state
_logger = logging.getLogger("dibs.waitlist")
_Rule = Generator[QCall | QPause, Any, Any]
_FIRST_PAUSE = 0.001
_MAX_PAUSE = 0.05
"""Seconds a joiner that lost its number waits at most before trying the next one."""
_PROBES = 4
"""Numbers a joiner tries, each the one after the number it lost, before reading the list again."""


@dataclass(frozen=True, slots=True)
class Entry:
    """A holder's place in a waiting list."""

    holder: str
    position: int
    """1 for the head of the list (the next offer goes to it), 2 for the next..."""
    number: int
    """The entry's ticket number: entries are served in increasing numbers."""
    claim: Claim
    """The entry's claim (confirmed, under the list's holder)."""


@dataclass(frozen=True, slots=True)
class Offer:
    """A unit held for a holder of the list until ``expires_at``: accept or decline it."""

    unit: Unit
    holder: str
    claim: Claim
    """The hold on ``unit`` under ``holder``; ``accept`` confirms it, fenced."""

    @property
    def id(self) -> str:
        """The hold's claim ID."""
        return self.claim.id

    @property
    def fence(self) -> int:
        """The hold's fence token."""
        return self.claim.fence

    @property
    def expires_at(self) -> datetime | None:
        """When the offer lapses, on the store's clock."""
        return self.claim.expires_at


def _check_unit(unit: object) -> Unit:
    if not isinstance(unit, Unit):
        raise InvalidInput(
            f"a waiting list offers units (dibs.Unit), got {shown(unit)}", field="unit", value=unit
        )
    return unit


def check_units(units: object) -> tuple[Unit, ...]:
    """``units`` (one unit, or an iterable of them) without repeats, or InvalidInput."""
    if isinstance(units, Unit):
        return (units,)
    if isinstance(units, str | bytes) or not isinstance(units, Iterable):
        raise InvalidInput(
            f"units must be dibs.Unit objects (one, or an iterable of them), got {shown(units)}",
            field="units",
            value=units,
        )
    found: dict[Unit, None] = {}
    for unit in units:
        if not isinstance(unit, Unit):
            raise InvalidInput(
                f"units must be dibs.Unit objects, got {shown(unit)} among them",
                field="units",
                value=unit,
            )
        found[unit] = None
    return tuple(found)


def check_every(every: object) -> float:
    """A watcher's period in seconds, or :class:`~dibs.InvalidInput`."""
    return check_seconds(every, "every", WATCH_EVERY_MIN, WATCH_EVERY_MAX)


def _check_offer(offer: object) -> Offer:
    if not isinstance(offer, Offer):
        raise InvalidInput(
            f"expected an Offer from Waitlist.offers(), got {shown(offer)}",
            field="offer",
            value=offer,
        )
    return offer


class _Rules:
    """What both faces share: the list's names and its rules, as steps (sans-io)."""

    def __init__(self, key: object, offer_ttl: object) -> None:
        if not isinstance(key, str) or not key:
            raise InvalidInput(
                f"a waiting list's key must be a non-empty string, got {shown(key)}",
                field="key",
                value=key,
            )
        try:
            Unit(key, "")
        except InvalidInput as exc:
            raise InvalidInput(
                f"a waiting list's key {exc.message.removeprefix('resource ')}",
                field="key",
                value=key,
            ) from None
        ttl = check_ttl(offer_ttl, allow_none=False)
        assert ttl is not None
        self.key = key
        self.offer_ttl = ttl
        self._list = queue_name("waitlist", key)
        self._who = queue_name("waitlist-who", key)
        self._records = queue_name("waitlist-offers", key)
        self._offer_prefix = f"{self._list}-offer-"

    # --- reading ----------------------------------------------------------------------

    def _entries_rule(self) -> _Rule:
        claims: list[Claim] = yield QCall("claims_of", (self._list,))
        found: list[tuple[int, str, Claim]] = []
        for claim in claims:
            number = holder = None
            for target in claim.targets:
                if isinstance(target, Unit) and target.resource == self._list:
                    number = int(target.slot)
                elif isinstance(target, Unit) and target.resource == self._who:
                    holder = target.slot
            if number is not None and holder is not None:
                found.append((number, holder, claim))
        found.sort(key=lambda item: item[0])
        return [
            Entry(holder, place, number, claim)
            for place, (number, holder, claim) in enumerate(found, 1)
        ]

    def _entry_rule(self, holder: str) -> _Rule:
        entries: list[Entry] = yield from self._entries_rule()
        return next((entry for entry in entries if entry.holder == holder), None)

    def _offers_rule(self, holder: object) -> _Rule:
        holder = check_holder(holder)
        claims: list[Claim] = yield QCall("claims_of", (holder,))
        held = [
            claim
            for claim in claims
            if claim.state is ClaimState.HELD
            and (claim.request_id or "").startswith(self._offer_prefix)
        ]
        if not held:
            return []
        # Only a recorded hold is an offer: the record is made once the head's entry is
        # used up, so a hold its offerer may still give back (it lost the entry) is not one.
        records: list[Claim] = yield QCall("claims_of", (self._records,))
        recorded = {
            target.slot
            for record in records
            for target in record.targets
            if isinstance(target, Unit)
        }
        return [
            Offer(claim.targets[0], holder, claim)  # type: ignore[arg-type]
            for claim in held
            if claim.id in recorded
        ]

    # --- joining and leaving ----------------------------------------------------------

    def _join_rule(self, holder: object) -> _Rule:
        holder = check_holder(holder)
        who = Unit(self._who, holder)
        pause = _FIRST_PAUSE
        misses = _PROBES  # numbers tried since the list was last read
        number = 0
        while True:
            if misses >= _PROBES:
                entries: list[Entry] = yield from self._entries_rule()
                for entry in entries:
                    if entry.holder == holder:
                        return entry  # in the list already: one entry per holder
                number = max((entry.number for entry in entries), default=0) + 1
                misses = 0
            request_id = f"{self._list}-join-{uuid.uuid4().hex}"
            # Linearization point: the claim of the number's unit (with the holder's).
            result: ClaimResult = yield QCall(
                "claim",
                ([Unit(self._list, str(number)), who],),
                {"holder": self._list, "request_id": request_id},
            )
            claim = result.claim
            if not result or claim is None or claim.request_id != request_id:
                if who in result.taken:
                    misses = _PROBES  # this holder's entry came first: read it
                    continue
                # Another joiner took the number. In a crowd every joiner read the same
                # list: reading it again after each loss makes a join cost a read of the
                # whole list per joiner ahead (cubic in all). Try the next number instead,
                # after a random pause that doubles, as the queue's joiners do; read the
                # list again only after a few misses in a row.
                number += 1
                misses += 1
                yield QPause(_random.uniform(0, pause))
                pause = min(pause * 2, _MAX_PAUSE)
                continue
            after: list[Entry] = yield from self._entries_rule()
            if any(entry.number > number for entry in after):
                # The number was freed meanwhile and a later joiner is above it: go behind.
                yield from self._release(claim, self._list)
                misses = _PROBES
                continue
            return next(entry for entry in after if entry.claim.id == claim.id)

    def _leave_rule(self, holder: object) -> _Rule:
        holder = check_holder(holder)
        entry: Entry | None = yield from self._entry_rule(holder)
        if entry is None:
            return False
        return (yield from self._release(entry.claim, self._list))

    # --- offering ---------------------------------------------------------------------

    def _offer_rule(self, unit: object) -> _Rule:
        unit = _check_unit(unit)
        while True:
            entries: list[Entry] = yield from self._entries_rule()
            if not entries:
                return None  # no one waits: the unit stays free
            head = entries[0]
            request_id = f"{self._offer_prefix}{uuid.uuid4().hex}"
            result: ClaimResult = yield QCall(
                "claim",
                (unit,),
                {"holder": head.holder, "ttl": self.offer_ttl, "request_id": request_id},
            )
            hold = result.claim
            if not result or hold is None or hold.request_id != request_id:
                return None  # the unit is not free: nothing to offer
            # Linearization point: the release of the head's entry (True for one caller).
            if (yield from self._release(head.claim, self._list)):
                record = Unit(self._records, hold.id)
                yield QCall("claim", (record,), {"holder": self._records})
                return Offer(unit, head.holder, hold)
            # Another offer used this entry first: give the unit back and try the next.
            yield from self._release(hold, head.holder)

    def _release_rule(self, claim_id: object, holder: object, fence: object) -> _Rule:
        claim: Claim | None = yield QCall("get", (claim_id,))
        released = yield QCall("release", (claim_id,), {"holder": holder, "fence": fence})
        offers: list[Offer] = []
        if not released or claim is None:
            return offers
        for target in claim.targets:
            if isinstance(target, Unit):
                offer = yield from self._offer_rule(target)
                if offer is not None:
                    offers.append(offer)
        return offers

    def _accept_rule(self, offer: object) -> _Rule:
        offer = _check_offer(offer)
        # Linearization point: the fenced confirm of the held unit.
        claim: Claim = yield QCall(
            "confirm", (offer.claim.id,), {"holder": offer.holder, "fence": offer.claim.fence}
        )
        yield from self._close_record(offer.claim.id)
        return claim

    def _decline_rule(self, offer: object) -> _Rule:
        offer = _check_offer(offer)
        yield from self._release(offer.claim, offer.holder)  # a forged offer raises here
        if (yield from self._close_record(offer.claim.id)):
            return (yield from self._offer_rule(offer.unit))
        return None  # a sweep passed it on already

    def _sweep_rule(self, units: object = ()) -> _Rule:
        watched = check_units(units)
        records: list[Claim] = yield QCall("claims_of", (self._records,))
        offers: list[Offer] = []
        for record in records:
            target = record.targets[0]
            assert isinstance(target, Unit)
            hold: Claim | None = yield QCall("get", (target.slot,))
            if hold is not None and hold.state is ClaimState.HELD:
                live: list[Claim] = yield QCall("claims_of", (hold.holder,))
                if any(claim.id == hold.id for claim in live):
                    continue  # still open
            # Accepted, declined or lapsed: whoever closes the record passes a lapsed one on.
            if not (yield from self._release(record, self._records)):
                continue
            if hold is not None and hold.state is not ClaimState.CONFIRMED:
                unit = hold.targets[0]
                assert isinstance(unit, Unit)
                offer = yield from self._offer_rule(unit)
                if offer is not None:
                    offers.append(offer)
        if not watched:
            return offers
        waiting: list[Entry] = yield from self._entries_rule()
        left = len(waiting)
        # Shuffled: watchers in several processes then try different units first, and
        # fewer of their claims collide (a collision costs a round trip, never an offer).
        for unit in _random.sample(watched, len(watched)):
            if left <= 0:
                break  # no one left to offer to: the rest stay free
            holder: str | None = yield QCall("holder_of", (unit,))
            if holder is not None:
                continue
            # The claim in the offer decides: one freed unit is one offer, whoever watches.
            offer = yield from self._offer_rule(unit)
            if offer is not None:
                offers.append(offer)
                left -= 1
        return offers

    # --- helpers ----------------------------------------------------------------------

    def _close_record(self, offer_id: str) -> _Rule:
        records: list[Claim] = yield QCall("claims_of", (self._records,))
        for record in records:
            if record.targets == (Unit(self._records, offer_id),):
                return (yield from self._release(record, self._records))
        return False

    def _release(self, claim: Claim, holder: str) -> _Rule:
        """Release ``claim``, fenced; True if this call released it.

        Gone already (lapsed, released, taken over) is False. A fence that is not
        the claim's is no claim of this list's (a forged offer): ``HoldLost``, and
        nothing changes; ``NotHolder`` likewise for another holder.
        """
        try:
            released: bool = yield QCall(
                "release", (claim.id,), {"holder": holder, "fence": claim.fence}
            )
        except HoldLost as lost:
            if lost.reason is HoldLostReason.FENCE:
                raise
            return False
        except ClaimNotFound:
            return False
        return released


class Waitlist(_Rules):
    """A first come, first served waiting list for freed units: see :mod:`dibs.waitlist`.

    ``key`` names the list (any non-empty name); ``offer_ttl`` is how long an
    offer is held for the head (seconds, on the store's clock). Raises
    :class:`~dibs.InvalidInput` for a bad key or TTL. Share one instance among threads.
    """

    def __init__(self, store: Store, key: str, *, offer_ttl: float = OFFER_TTL) -> None:
        super().__init__(key, offer_ttl)
        self.store = store

    # --- generated from dibs/aio/waitlist.py (scripts/unasync.py): edit that, then run it ---

    def join(self, holder: str) -> Entry:
        """Put ``holder`` at the back of the list (or find its entry, if it is in it already)."""
        entry: Entry = drive(self._join_rule(holder), self._perform, _DECIDED)
        return entry

    def leave(self, holder: str) -> bool:
        """Take ``holder`` off the list; False if it was not in it."""
        left: bool = drive(self._leave_rule(holder), self._perform, _DECIDED)
        return left

    def position(self, holder: str) -> int | None:
        """``holder``'s place in the list (1: the next offer is theirs), or None (a snapshot)."""
        entry: Entry | None = drive(self._entry_rule(holder), self._perform, _DECIDED)
        return None if entry is None else entry.position

    def entries(self) -> list[Entry]:
        """The list, head first (a snapshot)."""
        found: list[Entry] = drive(self._entries_rule(), self._perform, _DECIDED)
        return found

    def offer(self, unit: Unit) -> Offer | None:
        """Hold the free ``unit`` for the head of the list; the offer, or None.

        None when no one waits or the unit is not free. The head's entry is used up.
        """
        made: Offer | None = drive(self._offer_rule(unit), self._perform, _DECIDED)
        return made

    def release(self, claim_id: str, *, holder: str, fence: int) -> list[Offer]:
        """Release a claim (as ``store.release``) and offer each of its freed units; the offers."""
        made: list[Offer] = drive(
            self._release_rule(claim_id, holder, fence), self._perform, _DECIDED
        )
        return made

    def offers(self, holder: str) -> list[Offer]:
        """The open offers made to ``holder`` by this list (a snapshot)."""
        found: list[Offer] = drive(self._offers_rule(holder), self._perform, _DECIDED)
        return found

    def accept(self, offer: Offer) -> Claim:
        """Take the offered unit: a fenced confirm, so exactly once; the confirmed claim.

        Raises :class:`~dibs.HoldLost` if the offer lapsed (and maybe went to the next).
        """
        claim: Claim = drive(self._accept_rule(offer), self._perform, _DECIDED)
        return claim

    def decline(self, offer: Offer) -> Offer | None:
        """Turn the offer down; the unit goes to the next in line (that offer, or None)."""
        made: Offer | None = drive(self._decline_rule(offer), self._perform, _DECIDED)
        return made

    def sweep(self, units: Iterable[Unit] | Unit = ()) -> list[Offer]:
        """Pass lapsed offers on, then offer each free unit of ``units``; the new offers.

        Safe to run in any number of processes at once: the claim of each unit
        decides, so one freed unit is one offer. Raises :class:`~dibs.InvalidInput`
        for something other than units.
        """
        made: list[Offer] = drive(self._sweep_rule(units), self._perform, _DECIDED)
        return made

    def watch(self, units: Iterable[Unit] | Unit, *, every: float = WATCH_EVERY) -> Watcher:
        """A :class:`Watcher` that offers ``units`` to the list as they come free, once started.

        Raises :class:`~dibs.InvalidInput` for bad units or a bad ``every``.
        """
        return Watcher(self, units, every=every)

    def _perform(self, step: QCall | QPause) -> Any:
        if isinstance(step, QPause):
            return listen(None, step.seconds)
        return getattr(self.store, step.method)(*step.args, **step.kwargs)

    # --- end of the generated part ---

    def __repr__(self) -> str:
        return f"<Waitlist {self.key!r}>"


class _Stopped(BaseException):
    """Raised in a watcher's thread once :meth:`Watcher.close` was called (never escapes)."""


class Watcher:
    """Runs :meth:`Waitlist.sweep` over ``units`` whenever the store changes, on a thread.

    A round runs at once, then whenever the store's change feed moves (read
    every :data:`FEED_POLL` seconds), and at least every ``every`` seconds: a
    hold that lapses moves no feed, and memory:// has none. A round that fails
    is logged and tried again after ``every``; the watcher stops on
    :meth:`close` (which waits for a round in flight to end) or once the store
    is closed. Start it with ``with waitlist.watch(units):`` or :meth:`start`.
    Any number of watchers of one list, in any processes, make one offer per
    freed unit.
    """

    def __init__(
        self,
        waitlist: Waitlist,
        units: Iterable[Unit] | Unit,
        *,
        every: float = WATCH_EVERY,
        feed: ChangeFeed | None = None,
    ) -> None:
        self.waitlist = waitlist
        self.units = check_units(units)
        self.every = check_every(every)
        self.feed = feed
        """A change feed to read instead of opening the store's (its owner closes it)."""
        self.rounds = 0
        """Rounds done (a round that failed is not counted)."""
        self.offered = 0
        """Offers the rounds made."""
        self._stopped = threading.Event()
        self._thread: threading.Thread | None = None

    def __enter__(self) -> Watcher:
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def start(self) -> None:
        """Run the watcher on a daemon thread; RuntimeError if it was started already."""
        if self._thread is not None:
            raise RuntimeError("this watcher was started already")
        self._thread = threading.Thread(
            target=self._main, name=f"dibs waitlist watcher {self.waitlist.key!r}", daemon=True
        )
        self._thread.start()

    @property
    def running(self) -> bool:
        """Whether the watcher's thread is running."""
        return self._thread is not None and self._thread.is_alive()

    def close(self) -> None:
        """Stop the watcher and wait for its thread to end (after the round in flight)."""
        self._stopped.set()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join()

    def _main(self) -> None:
        with contextlib.suppress(_Stopped):
            self._watch()

    def _pause(self, seconds: float) -> None:
        if self._stopped.wait(seconds):
            raise _Stopped

    # --- generated from dibs/aio/waitlist.py (scripts/unasync.py): edit that, then run it ---

    def _watch(self) -> None:
        feed = self.feed if self.feed is not None else self._open_feed()
        try:
            while True:
                # The token before the round: a change made during it brings another round.
                token = None if feed is None else self._read(feed)
                try:
                    made = self.waitlist.sweep(self.units)
                except StoreClosed:
                    _logger.debug(
                        "waitlist %r: the store closed; the watcher stops", self.waitlist.key
                    )
                    return
                except Exception as exc:  # a watcher outlives a store outage: retry
                    _logger.warning(
                        "waitlist %r: a watch round failed, retrying in %gs: %r",
                        self.waitlist.key,
                        self.every,
                        exc,
                    )
                    self._pause(self.every)
                    continue
                self.rounds += 1
                self.offered += len(made)
                end = time.monotonic() + self.every
                while (left := end - time.monotonic()) > 0:
                    self._pause(min(FEED_POLL, left))
                    if feed is not None and self._read(feed) != token:
                        break
        finally:
            if feed is not None and feed is not self.feed:
                _close_feed(feed)

    def _open_feed(self) -> ChangeFeed | None:
        try:
            feed = self.waitlist.store.change_feed()
        except Exception:  # the feed only hurries a round; the period does without it
            _logger.debug("waitlist: no change feed; rounds every %gs", self.every, exc_info=True)
            return None
        if isinstance(feed, UnchangingFeed):
            return None  # nothing to watch: rounds come with the period
        return feed

    def _read(self, feed: ChangeFeed) -> object:
        try:
            return feed.read()
        except Exception:  # "maybe changed": a needless round, never a missed one
            _logger.debug("waitlist: change feed read failed", exc_info=True)
            return object()

    # --- end of the generated part ---


def _close_feed(feed: ChangeFeed) -> None:
    try:
        feed.close()
    except Exception:  # closing only frees a connection
        _logger.debug("waitlist: closing the change feed failed", exc_info=True)
