""":class:`dibs.Waitlist` for asyncio: the same list and rules, awaited on an async store.

The part of :class:`Waitlist` between the markers below is the one
implementation of both faces: ``scripts/unasync.py`` generates
:class:`dibs.Waitlist`'s from it. The rules live in :class:`dibs.waitlist._Rules`.
"""

from __future__ import annotations

from typing import Any

from dibs._drive import adrive
from dibs._model import Claim, Unit
from dibs._queue import QCall
from dibs.stores.base_async import AsyncStore
from dibs.waitlist import _DECIDED, OFFER_TTL, Entry, Offer, _Rules

__all__ = ["Waitlist"]


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

    async def sweep(self) -> list[Offer]:
        """Pass lapsed offers on to the next in line; the new offers. Safe to run anywhere."""
        made: list[Offer] = await adrive(self._sweep_rule(), self._perform, _DECIDED)
        return made

    async def _perform(self, step: QCall) -> Any:
        return await getattr(self.store, step.method)(*step.args, **step.kwargs)

    # --- end of the shared part ---

    def __repr__(self) -> str:
        return f"<dibs.aio.Waitlist {self.key!r}>"
