""":class:`dibs.Waitlist` for asyncio: the same list and rules, awaited on an async store.

The part of :class:`Waitlist` between the markers below is the one
implementation of both faces: ``scripts/unasync.py`` generates
:class:`dibs.Waitlist`'s from it. The rules live in :class:`dibs.waitlist._Rules`.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterable
from typing import Any

from dibs._bell import alisten
from dibs._drive import adrive
from dibs._model import Claim, Unit
from dibs._queue import QCall, QPause
from dibs.exceptions import StoreClosed
from dibs.stores.base_async import AsyncStore
from dibs.stores.capabilities import AsyncChangeFeed, UnchangingFeed
from dibs.waitlist import (
    _DECIDED,
    FEED_POLL,
    OFFER_TTL,
    WATCH_EVERY,
    Entry,
    Offer,
    _Rules,
    check_every,
    check_units,
)

__all__ = ["Waitlist", "Watcher"]

_logger = logging.getLogger("dibs.waitlist")


class Waitlist(_Rules):
    """:class:`dibs.Waitlist` on an :class:`~dibs.aio.AsyncStore`: its methods are coroutines.

    Sync and async lists of one key, in any process, are one list.
    """

    def __init__(self, store: AsyncStore, key: str, *, offer_ttl: float = OFFER_TTL) -> None:
        super().__init__(key, offer_ttl)
        self.store = store

    # --- shared with the sync face: scripts/unasync.py makes it from this part ---

    async def join(self, holder: str) -> Entry:
        """Put ``holder`` at the back of the list (or find its entry, if it is in it already)."""
        entry: Entry = await adrive(self._join_rule(holder), self._perform, _DECIDED)
        return entry

    async def leave(self, holder: str) -> bool:
        """Take ``holder`` off the list; False if it was not in it."""
        left: bool = await adrive(self._leave_rule(holder), self._perform, _DECIDED)
        return left

    async def position(self, holder: str) -> int | None:
        """``holder``'s place in the list (1: the next offer is theirs), or None (a snapshot)."""
        entry: Entry | None = await adrive(self._entry_rule(holder), self._perform, _DECIDED)
        return None if entry is None else entry.position

    async def entries(self) -> list[Entry]:
        """The list, head first (a snapshot)."""
        found: list[Entry] = await adrive(self._entries_rule(), self._perform, _DECIDED)
        return found

    async def offer(self, unit: Unit) -> Offer | None:
        """Hold the free ``unit`` for the head of the list; the offer, or None.

        None when no one waits or the unit is not free. The head's entry is used up.
        """
        made: Offer | None = await adrive(self._offer_rule(unit), self._perform, _DECIDED)
        return made

    async def release(self, claim_id: str, *, holder: str, fence: int) -> list[Offer]:
        """Release a claim (as ``store.release``) and offer each of its freed units; the offers."""
        made: list[Offer] = await adrive(
            self._release_rule(claim_id, holder, fence), self._perform, _DECIDED
        )
        return made

    async def offers(self, holder: str) -> list[Offer]:
        """The open offers made to ``holder`` by this list (a snapshot)."""
        found: list[Offer] = await adrive(self._offers_rule(holder), self._perform, _DECIDED)
        return found

    async def accept(self, offer: Offer) -> Claim:
        """Take the offered unit: a fenced confirm, so exactly once; the confirmed claim.

        Raises :class:`~dibs.HoldLost` if the offer lapsed (and maybe went to the next).
        """
        claim: Claim = await adrive(self._accept_rule(offer), self._perform, _DECIDED)
        return claim

    async def decline(self, offer: Offer) -> Offer | None:
        """Turn the offer down; the unit goes to the next in line (that offer, or None)."""
        made: Offer | None = await adrive(self._decline_rule(offer), self._perform, _DECIDED)
        return made

    async def sweep(self, units: Iterable[Unit] | Unit = ()) -> list[Offer]:
        """Pass lapsed offers on, then offer each free unit of ``units``; the new offers.

        Safe to run in any number of processes at once: the claim of each unit
        decides, so one freed unit is one offer. Raises :class:`~dibs.InvalidInput`
        for something other than units.
        """
        made: list[Offer] = await adrive(self._sweep_rule(units), self._perform, _DECIDED)
        return made

    def watch(self, units: Iterable[Unit] | Unit, *, every: float = WATCH_EVERY) -> Watcher:
        """A :class:`Watcher` that offers ``units`` to the list as they come free, once started.

        Raises :class:`~dibs.InvalidInput` for bad units or a bad ``every``.
        """
        return Watcher(self, units, every=every)

    async def _perform(self, step: QCall | QPause) -> Any:
        if isinstance(step, QPause):
            return await alisten(None, step.seconds)
        return await getattr(self.store, step.method)(*step.args, **step.kwargs)

    # --- end of the shared part ---

    def __repr__(self) -> str:
        return f"<dibs.aio.Waitlist {self.key!r}>"


class Watcher:
    """Runs :meth:`Waitlist.sweep` over ``units`` whenever the store changes, as a task.

    A round runs at once, then whenever the store's change feed moves (read
    every :data:`~dibs.waitlist.FEED_POLL` seconds), and at least every ``every``
    seconds: a hold that lapses moves no feed, and memory:// has none. A round
    that fails is logged and tried again after ``every``; the watcher stops on
    :meth:`close`, on the cancellation of its task, or once the store is
    closed. Start it with ``async with waitlist.watch(units):``, or
    :meth:`start` it (a task on the running loop), or await :meth:`run` in a
    task of your own. Any number of watchers of one list, in any processes,
    make one offer per freed unit.
    """

    def __init__(
        self,
        waitlist: Waitlist,
        units: Iterable[Unit] | Unit,
        *,
        every: float = WATCH_EVERY,
        feed: AsyncChangeFeed | None = None,
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
        self._task: asyncio.Task[None] | None = None

    async def __aenter__(self) -> Watcher:
        self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    def start(self) -> None:
        """Run the watcher as a task of the running loop; RuntimeError if it runs already."""
        if self._task is not None:
            raise RuntimeError("this watcher was started already")
        self._task = asyncio.get_running_loop().create_task(
            self.run(), name=f"dibs waitlist watcher {self.waitlist.key!r}"
        )

    @property
    def running(self) -> bool:
        """Whether the watcher's task is running."""
        return self._task is not None and not self._task.done()

    async def close(self) -> None:
        """Stop the watcher and wait for its task to end (a round in flight is cancelled)."""
        task = self._task
        if task is None or task.done():
            return
        task.cancel()
        try:
            await task
        except asyncio.CancelledError:
            current = asyncio.current_task()
            if current is not None and current.cancelling():
                raise  # the caller itself is being cancelled, not only the watcher

    async def run(self) -> None:
        """Watch until cancelled (or the store is closed)."""
        await self._watch()

    async def _pause(self, seconds: float) -> None:
        await asyncio.sleep(seconds)

    # --- shared with the sync face: scripts/unasync.py makes it from this part ---

    async def _watch(self) -> None:
        feed = self.feed if self.feed is not None else self._open_feed()
        try:
            while True:
                # The token before the round: a change made during it brings another round.
                token = None if feed is None else await self._read(feed)
                try:
                    made = await self.waitlist.sweep(self.units)
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
                    await self._pause(self.every)
                    continue
                self.rounds += 1
                self.offered += len(made)
                end = time.monotonic() + self.every
                while (left := end - time.monotonic()) > 0:
                    await self._pause(min(FEED_POLL, left))
                    if feed is not None and await self._read(feed) != token:
                        break
        finally:
            if feed is not None and feed is not self.feed:
                await _close_feed(feed)

    def _open_feed(self) -> AsyncChangeFeed | None:
        try:
            feed = self.waitlist.store.change_feed()
        except Exception:  # the feed only hurries a round; the period does without it
            _logger.debug("waitlist: no change feed; rounds every %gs", self.every, exc_info=True)
            return None
        if isinstance(feed, UnchangingFeed):
            return None  # nothing to watch: rounds come with the period
        return feed

    async def _read(self, feed: AsyncChangeFeed) -> object:
        try:
            return await feed.read()
        except Exception:  # "maybe changed": a needless round, never a missed one
            _logger.debug("waitlist: change feed read failed", exc_info=True)
            return object()

    # --- end of the shared part ---


async def _close_feed(feed: AsyncChangeFeed) -> None:
    try:
        await asyncio.shield(feed.close())
    except Exception:  # closing only frees a connection
        _logger.debug("waitlist: closing the change feed failed", exc_info=True)
