"""``/v1/waitlists``: the waiting-list pattern over HTTP, with the service watching the units.

A list ``show-42`` is shared by every API key, as a semaphore is: it is
:class:`dibs.aio.Waitlist` on the key ``dibs.waitlist:show-42``, so every
instance on the store serves one list. A client joins, leaves, reads its own
place, its offers, accepts one (the store's fenced confirm: exactly once) or
declines it, always as its API key's holder; nobody learns who else waits.

``PUT /v1/waitlists/{key}`` names the units the list serves and its offer TTL,
kept in the store (:mod:`dibs.service._listconfig`), so every instance agrees
on them. Every operation that makes an offer (``decline``, ``release``, a watch
round) or shows the configuration (``GET``) reads it first, one ``holder_of``
when it did not change (benchmarks/bench_waitlist_config.py), so its offers are
held for the stored ``offer_ttl`` even just after a PUT on another instance.
Join, leave, accept and reading one's offers make no offer and read nothing more.

Every instance watches every configured list: it learns of one from a PUT, from
a request that reads the configuration, or from the store's index of lists (read
at start and every :data:`INDEX_EVERY` seconds). One instance at a time sweeps a list: the one
holding the list's watch lease (a hold of :data:`LEAD_TTL` seconds, renewed each
round, released when the service stops); the others try to take it over each
round, so a dead leader's lists are swept again within :data:`LEAD_TTL` plus a
round. Two sweepers at once (a lease that lapsed under a slow round) are safe: the
claim of each unit decides, so a freed unit is one offer. A sweep passes lapsed
offers on and offers each free unit of the list to the head: a seat freed by a
plain ``DELETE /v1/claims/{id}`` or a hold that lapses needs no client action.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import math
import random
import time
import uuid
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from dibs._model import Claim, ClaimState, Unit
from dibs.aio.waitlist import Waitlist
from dibs.exceptions import ClaimNotFound, HoldLost, StoreClosed
from dibs.service._api import Api
from dibs.service._guard import ApiError
from dibs.service._limits import _Handles, path_key
from dibs.service._listconfig import (
    NO_CONFIG,
    BadConfig,
    ListConfig,
    VersionMoved,
    read_config,
    write_config,
)
from dibs.service._wire import (
    FENCE_REQUEST,
    RESERVED,
    WAITLIST_RELEASE_REQUEST,
    WAITLIST_REQUEST,
    target_to_wire,
    time_to_wire,
)
from dibs.stores.capabilities import AsyncChangeFeed
from dibs.waitlist import FEED_POLL, WATCH_EVERY, Offer

__all__ = ["Waitlists"]

WAITLIST_PREFIX = f"{RESERVED}waitlist:"
INDEX_HOLDER = f"{RESERVED}waitlist.index"
"""The holder of the index: one confirmed claim on ``(INDEX_HOLDER, name)`` per list ever PUT."""
LEAD_PREFIX = f"{RESERVED}waitlist.watch:"
MAX_WATCHED = 1024
"""The most lists one instance watches at once: each is a task and a change feed's reads."""
LEAD_TTL = 10.0
"""Seconds a list's watch lease lasts unrenewed: how soon another instance takes over."""
INDEX_EVERY = 5.0
"""Seconds between an instance's reads of the index of lists (±10 %)."""

_logger = logging.getLogger("dibs.service")


def _not_found() -> ApiError:
    return ApiError(404, "not_found", "you have no such offer on this list")


def _bad_config(bad: BadConfig) -> ApiError:
    return ApiError(
        409, "bad_config", f"{bad}; PUT the list's configuration again", {"version": bad.version}
    )


class _SharedFeed:
    """The service's change feed, read at most once per :data:`FEED_POLL` for every watcher.

    Without it each watched list would read the store's feed 20 times a second.
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


class _Watch:
    """This instance's watch of one list: a task that sweeps it while it holds the lease."""

    def __init__(self, lists: Waitlists, name: str) -> None:
        self.lists = lists
        self.name = name
        self.lead: Claim | None = None
        self.rounds = 0
        """Rounds this instance swept the list in (as the lease's holder)."""
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(
            self._run(), name=f"dibs service waitlist watch {self.name!r}"
        )

    async def close(self) -> None:
        """Stop the task, then give the lease back so another instance takes over at once."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        lead, self.lead = self.lead, None
        if lead is not None:
            with contextlib.suppress(Exception):  # it lapses by itself otherwise
                await self.lists.api.aio.release(
                    lead.id, holder=self.lists.instance, fence=lead.fence
                )

    async def _lead(self) -> bool:
        """Whether this instance holds the list's watch lease, renewed or taken now."""
        store, me = self.lists.api.aio, self.lists.instance
        if self.lead is not None:
            try:
                self.lead = await store.extend(
                    self.lead.id, holder=me, fence=self.lead.fence, ttl=LEAD_TTL
                )
                return True
            except (HoldLost, ClaimNotFound):
                self.lead = None  # lapsed (a round longer than LEAD_TTL): take it again
        unit = Unit(LEAD_PREFIX + self.name, "")
        if await store.holder_of(unit) is not None:
            return False  # a read first: a refused claim costs a write on SQL stores
        # The claim of the lease's unit decides which instance sweeps (a taken-over
        # lapsed lease included); a lost race is another instance's round.
        result = await store.claim(unit, holder=me, ttl=LEAD_TTL)
        self.lead = result.claim if result else None
        return self.lead is not None

    async def _round(self) -> None:
        config = await self.lists.load(self.name)
        if await self._lead():
            await self.lists.handle(self.name, config).sweep(config.units)
            self.rounds += 1

    async def _run(self) -> None:
        feed = self.lists.feed
        while True:
            # The token before the round: a change made during it brings another round.
            token = None if feed is None else await _read(feed)
            try:
                await self._round()
            except StoreClosed:
                return
            except Exception as exc:  # a watch outlives a store outage or a bad config: retry
                _logger.warning("waitlist %r: a watch round failed: %r", self.name, exc)
            end = time.monotonic() + WATCH_EVERY
            while (left := end - time.monotonic()) > 0:
                await asyncio.sleep(min(FEED_POLL, left))
                if feed is not None and await _read(feed) != token:
                    break


async def _read(feed: _SharedFeed) -> object:
    try:
        return await feed.read()
    except Exception:  # "maybe changed": a needless round, never a missed one
        return object()


class Waitlists:
    """The handlers of ``/v1/waitlists``, and the watches this instance runs."""

    def __init__(self, api: Api, feed: AsyncChangeFeed | None) -> None:
        self.api = api
        self.feed = None if feed is None else _SharedFeed(feed)
        self.instance = f"{RESERVED}waitlist.watcher:{uuid.uuid4().hex}"
        """This instance's holder of watch leases."""
        self._configs: _Handles[ListConfig] = _Handles()
        self._lists: _Handles[Waitlist] = _Handles()
        self._watches: dict[str, _Watch] = {}
        self._closed = False

    _name = staticmethod(path_key)

    async def load(self, name: str) -> ListConfig:
        """The list's stored configuration (``NO_CONFIG`` if never PUT); BadConfig if not ours.

        A read per call, one ``holder_of`` when nothing changed: a PUT on another
        instance counts from the next operation on this one.
        """
        config = await read_config(self.api.aio, name, self._configs.get(name, NO_CONFIG))
        return self._remember(name, config)

    def _remember(self, name: str, config: ListConfig) -> ListConfig:
        """Keep ``config`` as the list's last one read (replacing the older one); return it."""
        self._configs.pop(name, None)
        return self._configs.get_or_make(name, lambda: config)

    def handle(self, name: str, config: ListConfig) -> Waitlist:
        """The list's handle for this configuration's offer TTL."""
        return self._lists.get_or_make(
            (name, config.offer_ttl),
            lambda: Waitlist(self.api.aio, WAITLIST_PREFIX + name, offer_ttl=config.offer_ttl),
        )

    async def _list(self, name: str) -> Waitlist:
        """The list's handle under its stored configuration; watched here once configured."""
        try:
            config = await self.api.call("waitlist_config", self.load(name))
        except BadConfig as bad:
            raise _bad_config(bad) from None
        if config.version:
            self._watch(name)
        return self.handle(name, config)

    def _seen(self, name: str) -> Waitlist:
        """The list's handle for what makes no offer (join, leave, read, accept): no read.

        Its offer TTL is the last one this instance read, and unused: the
        configuration is read only where an offer is made (and by ``GET``).
        """
        return self.handle(name, self._configs.get(name, NO_CONFIG))

    def _watch(self, name: str) -> bool:
        """Watch the list on this instance (if not already); False when at MAX_WATCHED."""
        if name in self._watches:
            return True
        if self._closed or len(self._watches) >= MAX_WATCHED:
            return False
        watch = self._watches[name] = _Watch(self, name)
        watch.start()
        return True

    async def run(self) -> None:
        """Watch every list in the store's index, reading it every INDEX_EVERY seconds."""
        while True:
            try:
                for claim in await self.api.aio.claims_of(INDEX_HOLDER):
                    for unit in claim.units:
                        if unit.resource == INDEX_HOLDER and not self._watch(unit.slot):
                            _logger.warning("waitlists: %d lists watched already", MAX_WATCHED)
            except StoreClosed:
                return
            except Exception as exc:  # the next read tries again
                _logger.warning("waitlists: reading the index failed: %r", exc)
            await asyncio.sleep(INDEX_EVERY * random.uniform(0.9, 1.1))

    async def close(self) -> None:
        """Stop every watch and give its lease back (at shutdown)."""
        self._closed = True
        watches, self._watches = list(self._watches.values()), {}
        for watch in watches:
            await watch.close()

    def _offer_to_wire(self, offer: Offer) -> dict[str, Any]:
        return {
            "unit": target_to_wire(offer.unit),
            "expires_at": time_to_wire(offer.expires_at),
            "claim": self.api.claim_to_wire(offer.claim),
        }

    async def _view(self, name: str, holder: str, config: ListConfig | None = None) -> Response:
        if config is None:
            wl = await self._list(name)
            config = self._configs.get(name, NO_CONFIG)
        else:
            wl = self.handle(name, config)
        entries = await self.api.call("waitlist_entries", wl.entries())
        mine = next((entry for entry in entries if entry.holder == holder), None)
        return JSONResponse(
            {
                "snapshot": True,
                "name": name,
                "waiting": len(entries),
                "position": None if mine is None else mine.position,
                "watching": len(config.units) if config.version else None,
                "offer_ttl": config.offer_ttl,
                "version": config.version,
            }
        )

    # --- the list ---------------------------------------------------------------------------------

    async def waitlist(self, request: Request) -> Response:
        """``GET /v1/waitlists/{key}``: how many wait, your place, the list's configuration."""
        key = self.api.authorize(request)
        return await self._view(self._name(request), key.holder)

    async def configure(self, request: Request) -> Response:
        """``PUT /v1/waitlists/{key}``: the list's units and offer TTL, for every instance."""
        key = self.api.authorize(request)
        name = self._name(request)
        parsed = self.api.parse(WAITLIST_REQUEST, await self.api.read_body(request))
        units = tuple(Unit(item["resource"], item["slot"]) for item in parsed["units"])
        if name not in self._watches and len(self._watches) >= MAX_WATCHED:
            raise ApiError(
                409, "too_many", f"this instance watches {MAX_WATCHED} lists already", {}
            )
        store = self.api.aio

        async def configure() -> ListConfig:
            config = await write_config(
                store,
                name,
                units,
                float(parsed["offer_ttl"]),
                known=self._configs.get(name, NO_CONFIG),
                if_version=parsed.get("if_version"),
            )
            # The index, so instances that never see a request for the list watch it too.
            await store.claim(Unit(INDEX_HOLDER, name), holder=INDEX_HOLDER, ttl=None)
            return config

        try:
            config = await self.api.call("waitlist_configure", configure())
        except VersionMoved as moved:
            raise ApiError(
                409,
                "version_moved",
                f"the list's configuration is at version {moved.version}, not "
                f"{parsed.get('if_version')}: read it and PUT again",
                {"version": moved.version},
            ) from None
        self._remember(name, config)
        self._watch(name)
        return await self._view(name, key.holder, config)

    async def join(self, request: Request) -> Response:
        """``POST /v1/waitlists/{key}/entries``: join at the back (or find your entry)."""
        key = self.api.authorize(request)
        name = self._name(request)
        entry = await self.api.call("waitlist_join", self._seen(name).join(key.holder))
        return JSONResponse({"name": name, "position": entry.position, "number": entry.number})

    async def leave(self, request: Request) -> Response:
        """``DELETE /v1/waitlists/{key}/entries``: take your entry off the list."""
        key = self.api.authorize(request)
        name = self._name(request)
        left = await self.api.call("waitlist_leave", self._seen(name).leave(key.holder))
        return JSONResponse({"name": name, "left": left})

    # --- offers -----------------------------------------------------------------------------------

    async def offers(self, request: Request) -> Response:
        """``GET /v1/waitlists/{key}/offers``: the open offers made to you (a snapshot)."""
        key = self.api.authorize(request)
        name = self._name(request)
        await self.api.load_ids()
        found = await self.api.call("waitlist_offers", self._seen(name).offers(key.holder))
        return JSONResponse(
            {
                "snapshot": True,
                "name": name,
                "offers": [self._offer_to_wire(offer) for offer in found],
            }
        )

    async def _offer(
        self, request: Request, holder: str, *, offering: bool
    ) -> tuple[Waitlist, Offer]:
        """The list, and the caller's offer in the path under the body's fence; else 404.

        ``offering``: the list under its stored configuration, to make offers with.
        """
        name = self._name(request)
        fence = self.api.parse(FENCE_REQUEST, await self.api.read_body(request))["fence"]
        claim_id = (await self.api.load_ids()).from_wire(request.path_params["claim_id"])
        if claim_id is None:
            raise _not_found()
        wl = await self._list(name) if offering else self._seen(name)
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
        wl, offer = await self._offer(request, key.holder, offering=False)
        # The linearization point: the store's fenced confirm of the held unit.
        claim = await self.api.call("waitlist_accept", wl.accept(offer), [offer.unit])
        self.api.changed(claim.targets)
        return JSONResponse(
            {"unit": target_to_wire(offer.unit), "claim": self.api.claim_to_wire(claim)}
        )

    async def decline(self, request: Request) -> Response:
        """``POST /v1/waitlists/{key}/offers/{claim_id}/decline``: pass the unit on."""
        key = self.api.authorize(request)
        wl, offer = await self._offer(request, key.holder, offering=True)

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
        wl = await self._list(name)

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
