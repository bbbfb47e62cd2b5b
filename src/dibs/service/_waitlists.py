"""``/v1/waitlists``: the waiting-list pattern over HTTP, with the service watching the units.

A list ``show-42`` is shared by every API key, as a semaphore is: it is
:class:`dibs.aio.Waitlist` on the key ``dibs.waitlist:show-42``, so every
instance on the store serves one list. A client joins, leaves, reads its own
place, its offers, accepts one (the store's fenced confirm: exactly once) or
declines it, always as its API key's holder; nobody learns who else waits.

``PUT /v1/waitlists/{key}`` names the units the list serves and its offer TTL,
and makes this instance run a :class:`dibs.aio.waitlist.Watcher` for the list
on the service's one async store, until the service stops (or the next PUT
replaces it): a seat freed by a plain ``DELETE /v1/claims/{id}`` or a hold
that lapses is offered to the head with no client action. Watchers on several
instances are safe (the claim of each unit decides); what a PUT set lives in
the instance it reached, so a restarted instance watches again once PUT again.
"""

from __future__ import annotations

import asyncio
import dataclasses
import math
import time
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from dibs._model import Claim, ClaimState, Unit
from dibs.aio.waitlist import Waitlist, Watcher
from dibs.service._api import Api
from dibs.service._guard import ApiError
from dibs.service._limits import _Handles, path_key
from dibs.service._wire import (
    FENCE_REQUEST,
    RESERVED,
    WAITLIST_RELEASE_REQUEST,
    WAITLIST_REQUEST,
    target_to_wire,
    time_to_wire,
)
from dibs.stores.capabilities import AsyncChangeFeed
from dibs.waitlist import FEED_POLL, OFFER_TTL, WATCH_EVERY, Offer

__all__ = ["Waitlists"]

WAITLIST_PREFIX = f"{RESERVED}waitlist:"
MAX_WATCHED = 1024
"""The most lists one instance watches at once: each is a task and a change feed's reads."""


def _not_found() -> ApiError:
    return ApiError(404, "not_found", "you have no such offer on this list")


class _SharedFeed:
    """The service's change feed, read at most once per :data:`FEED_POLL` for every watcher.

    Without it each watched list would read the store's feed 20 times a second.
    The service closes the feed it wraps; closing this does nothing.
    """

    def __init__(self, feed: AsyncChangeFeed) -> None:
        self._feed = feed
        self._token: object = None
        self._read_at = -math.inf
        self._lock = asyncio.Lock()

    async def read(self) -> object:
        async with self._lock:  # concurrent readers share one read of the store
            if time.monotonic() - self._read_at >= FEED_POLL:
                self._token = await self._feed.read()
                self._read_at = time.monotonic()
            return self._token

    async def close(self) -> None:
        pass


class Waitlists:
    """The handlers of ``/v1/waitlists``, and the watchers this instance runs."""

    def __init__(self, api: Api, feed: AsyncChangeFeed | None) -> None:
        self.api = api
        self._feed = None if feed is None else _SharedFeed(feed)
        self._lists: _Handles[Waitlist] = _Handles()
        self._watchers: dict[str, Watcher] = {}

    _name = staticmethod(path_key)

    def _list(self, name: str) -> Waitlist:
        """The list's handle: the watched one's (with its offer TTL), else a default one."""
        watcher = self._watchers.get(name)
        if watcher is not None:
            return watcher.waitlist
        return self._lists.get_or_make(
            name, lambda: Waitlist(self.api.aio, WAITLIST_PREFIX + name, offer_ttl=OFFER_TTL)
        )

    async def close(self) -> None:
        """Stop every watcher (at shutdown)."""
        watchers, self._watchers = list(self._watchers.values()), {}
        for watcher in watchers:
            await watcher.close()

    def _offer_to_wire(self, offer: Offer) -> dict[str, Any]:
        return {
            "unit": target_to_wire(offer.unit),
            "expires_at": time_to_wire(offer.expires_at),
            "claim": self.api.claim_to_wire(offer.claim),
        }

    async def _view(self, name: str, holder: str) -> Response:
        wl = self._list(name)
        entries = await self.api.call("waitlist_entries", wl.entries())
        mine = next((entry for entry in entries if entry.holder == holder), None)
        watcher = self._watchers.get(name)
        return JSONResponse(
            {
                "snapshot": True,
                "name": name,
                "waiting": len(entries),
                "position": None if mine is None else mine.position,
                "watching": None if watcher is None else len(watcher.units),
                "offer_ttl": wl.offer_ttl,
            }
        )

    # --- the list ---------------------------------------------------------------------------------

    async def waitlist(self, request: Request) -> Response:
        """``GET /v1/waitlists/{key}``: how many wait, your place, what this instance watches."""
        key = self.api.authorize(request)
        return await self._view(self._name(request), key.holder)

    async def configure(self, request: Request) -> Response:
        """``PUT /v1/waitlists/{key}``: the units this instance watches for the list, its TTL."""
        key = self.api.authorize(request)
        name = self._name(request)
        parsed = self.api.parse(WAITLIST_REQUEST, await self.api.read_body(request))
        units = [Unit(item["resource"], item["slot"]) for item in parsed["units"]]
        if name not in self._watchers and len(self._watchers) >= MAX_WATCHED:
            raise ApiError(
                409, "too_many", f"this instance watches {MAX_WATCHED} lists already", {}
            )
        wl = Waitlist(self.api.aio, WAITLIST_PREFIX + name, offer_ttl=parsed["offer_ttl"])
        watcher = Watcher(wl, units, every=WATCH_EVERY, feed=self._feed)
        old = self._watchers.pop(name, None)
        self._watchers[name] = watcher
        self._lists.pop(name, None)
        if old is not None:
            await old.close()
        watcher.start()
        return await self._view(name, key.holder)

    async def join(self, request: Request) -> Response:
        """``POST /v1/waitlists/{key}/entries``: join at the back (or find your entry)."""
        key = self.api.authorize(request)
        name = self._name(request)
        entry = await self.api.call("waitlist_join", self._list(name).join(key.holder))
        return JSONResponse({"name": name, "position": entry.position, "number": entry.number})

    async def leave(self, request: Request) -> Response:
        """``DELETE /v1/waitlists/{key}/entries``: take your entry off the list."""
        key = self.api.authorize(request)
        name = self._name(request)
        left = await self.api.call("waitlist_leave", self._list(name).leave(key.holder))
        return JSONResponse({"name": name, "left": left})

    # --- offers -----------------------------------------------------------------------------------

    async def offers(self, request: Request) -> Response:
        """``GET /v1/waitlists/{key}/offers``: the open offers made to you (a snapshot)."""
        key = self.api.authorize(request)
        name = self._name(request)
        await self.api.load_ids()
        found = await self.api.call("waitlist_offers", self._list(name).offers(key.holder))
        return JSONResponse(
            {
                "snapshot": True,
                "name": name,
                "offers": [self._offer_to_wire(offer) for offer in found],
            }
        )

    async def _offer(self, request: Request, holder: str) -> tuple[Waitlist, Offer]:
        """The list, and the caller's offer in the path under the body's fence; else 404."""
        name = self._name(request)
        fence = self.api.parse(FENCE_REQUEST, await self.api.read_body(request))["fence"]
        claim_id = (await self.api.load_ids()).from_wire(request.path_params["claim_id"])
        if claim_id is None:
            raise _not_found()
        wl = self._list(name)
        claim: Claim | None = await self.api.call("get", self.api.aio.get(claim_id))
        if (
            claim is None
            or claim.holder != holder
            or claim.state is ClaimState.RELEASED
            or not (claim.request_id or "").startswith(wl._offer_prefix)
            or len(claim.targets) != 1
            or not isinstance(claim.targets[0], Unit)
        ):
            raise _not_found()
        return wl, Offer(claim.targets[0], holder, dataclasses.replace(claim, fence=fence))

    async def accept(self, request: Request) -> Response:
        """``POST /v1/waitlists/{key}/offers/{claim_id}/accept``: take it (a fenced confirm)."""
        key = self.api.authorize(request)
        wl, offer = await self._offer(request, key.holder)
        # The linearization point: the store's fenced confirm of the held unit.
        claim = await self.api.call("waitlist_accept", wl.accept(offer), [offer.unit])
        self.api.changed(claim.targets)
        return JSONResponse(
            {"unit": target_to_wire(offer.unit), "claim": self.api.claim_to_wire(claim)}
        )

    async def decline(self, request: Request) -> Response:
        """``POST /v1/waitlists/{key}/offers/{claim_id}/decline``: pass the unit on."""
        key = self.api.authorize(request)
        wl, offer = await self._offer(request, key.holder)

        async def decline() -> Offer | None:
            # The fenced release first, so a stale fence or a lapsed offer is the
            # store's own 409; the list then passes the unit on (its claim decides).
            await self.api.aio.release(offer.id, holder=key.holder, fence=offer.fence)
            following = await wl.decline(offer)
            return following if following is not None else await wl.offer(offer.unit)

        following = await self.api.call("waitlist_decline", decline(), [offer.unit])
        self.api.changed((offer.unit,))
        return JSONResponse(
            {
                "unit": target_to_wire(offer.unit),
                "declined": True,
                "passed_on": following is not None,
            }
        )

    async def release(self, request: Request) -> Response:
        """``POST /v1/waitlists/{key}/release``: release your claim; offer its units to the list."""
        key = self.api.authorize(request)
        name = self._name(request)
        parsed = self.api.parse(WAITLIST_RELEASE_REQUEST, await self.api.read_body(request))
        claim_id = (await self.api.load_ids()).from_wire(parsed["claim_id"])
        if claim_id is None:
            raise ApiError(404, "not_found", "you have no such claim")
        claim: Claim | None = await self.api.call("get", self.api.aio.get(claim_id))
        if claim is None or claim.holder != key.holder or claim.state is ClaimState.RELEASED:
            raise ApiError(404, "not_found", "you have no such claim")
        if any(target.resource.startswith(RESERVED) for target in claim.targets):
            # A permit's slot or a lot's: the service's own units, which no list hands out.
            raise ApiError(409, "not_offerable", "this claim holds the service's own units")
        wl = self._list(name)

        async def release() -> tuple[bool, list[Offer]]:
            released = await self.api.aio.release(
                claim_id, holder=key.holder, fence=parsed["fence"]
            )
            offers = []
            for target in claim.targets if released else ():
                if isinstance(target, Unit) and (offer := await wl.offer(target)) is not None:
                    offers.append(offer)
            return released, offers

        released, offers = await self.api.call("waitlist_release", release(), claim.targets)
        if released:
            self.api.changed(claim.targets)
        return JSONResponse({"name": name, "released": released, "offered": len(offers)})
