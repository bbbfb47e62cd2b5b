"""``/v1/semaphores`` and ``/v1/rate-limits``: the semaphore and rate-limit patterns over HTTP.

Both are shared by every API key: a semaphore ``payments`` or a rate limit
``geocoder`` is one limit for every client of the service, as it is for every
process on the store. Their units live under the reserved prefix ``dibs.``
(``dibs.semaphore:<name>``, ``dibs.rate-limit:<name>``), which
``POST /v1/claims`` refuses, so no client can hold or block a slot except
through these routes.

A permit over HTTP is a plain fenced hold, not a lease: no client connection
can run the lease's renewal, so the client extends the permit's claim
(``POST /v1/claims/{id}/extend``) and releases it (``DELETE``) itself, and a
permit it stops extending lapses at its ttl. The admission is the semaphore's
own rule (:mod:`dibs.semaphore`), driven here with a claim for each slot it
enters instead of a lease. The service never declares a semaphore's limit
on acquiring (``PUT`` sets it): two clients asking with other limits would
otherwise flip it back and forth.

A rate limit is :class:`dibs.aio.RateLimit` as is: the limit is the pair of key
and rate, as in the library, so a client sending another rate for a key has
another limit (documented). Handles are kept per key (an LRU of
``_HANDLES``): a semaphore's remembers the limit's version, a rate limit's its
hint of which slots are free; neither decides anything (the store does).
"""

from __future__ import annotations

import contextlib
import math
from collections import OrderedDict
from collections.abc import Callable
from typing import Any, TypeVar

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from dibs._drive import adrive
from dibs._model import Claim, Unit
from dibs._queue import QUEUE_ERRORS
from dibs.aio import RateLimit, Semaphore
from dibs.exceptions import HoldLost, InvalidInput, ResourceBusy
from dibs.semaphore import _Enter, _Exit, _Step
from dibs.service._api import Api, body_digest
from dibs.service._guard import ApiError, invalid, parse_idempotency_key
from dibs.service._wire import (
    MIN_TTL,
    NAME,
    PERMIT_REQUEST,
    PERMITS_REQUEST,
    RATE_REQUEST,
    RESERVED,
    request_id_for,
    time_to_wire,
)

__all__ = ["Limits"]

SEMAPHORE_PREFIX = f"{RESERVED}semaphore:"
RATE_PREFIX = f"{RESERVED}rate-limit:"
REQUEST_RESOURCE = f"{RESERVED}semaphore.request"
"""The resource of the unit that stands for one keyed permit request (held with the permit)."""
BODY_RESOURCE = f"{RESERVED}semaphore.body"
"""The resource of the units whose request records remember each permit key's body."""
_HANDLES = 1024
_WAIT_SHARE = 0.8  # of the request timeout: a wait ends in an answer, not a 503

_H = TypeVar("_H")


class _Replayed(Exception):
    """Raised inside the admission rule: this key's earlier request holds ``claim``."""

    def __init__(self, claim: Claim) -> None:
        super().__init__(claim.id)
        self.claim = claim


def path_key(request: Request) -> str:
    """The ``{key}`` of a limit's or list's path, checked as a name (400 naming it if bad)."""
    try:
        name: str = NAME.parse(request.path_params["key"], "key")
        return name
    except InvalidInput as exc:
        raise invalid(exc) from None


class _Handles(OrderedDict[Any, _H]):
    """The most recently used handles, at most ``_HANDLES``."""

    def get_or_make(self, key: Any, make: Callable[[], _H]) -> _H:
        handle = self.get(key)
        if handle is None:
            handle = self[key] = make()
            if len(self) > _HANDLES:
                self.popitem(last=False)
        else:
            self.move_to_end(key)
        return handle


class Limits:
    """The handlers of ``/v1/semaphores`` and ``/v1/rate-limits``."""

    def __init__(self, api: Api) -> None:
        self.api = api
        self._semaphores: _Handles[Semaphore] = _Handles()
        self._rates: _Handles[RateLimit] = _Handles()

    _name = staticmethod(path_key)

    def _semaphore(self, name: str) -> Semaphore:
        def make() -> Semaphore:
            sem = Semaphore(self.api.aio, SEMAPHORE_PREFIX + name, permits=0)
            # Follow the store's limit, never declare one: only PUT sets it.
            sem._declared = True
            return sem

        return self._semaphores.get_or_make(name, make)

    async def _limit(self, sem: Semaphore) -> int:
        """The semaphore's limit now; 404 when none was ever set."""
        permits = await self.api.call("semaphore_permits", sem.current_permits())
        if sem._limit.version == 0:
            raise ApiError(404, "not_found", "no such semaphore: PUT its permits first")
        return permits

    async def _view(self, name: str, sem: Semaphore, holder: str) -> Response:
        permits = await self._limit(sem)
        holders = await self.api.call("semaphore_holders", sem.holders())
        return JSONResponse(
            {
                "snapshot": True,
                "name": name,
                "permits": permits,
                "held": len(holders),
                "yours": holders.count(holder),
            }
        )

    async def semaphore(self, request: Request) -> Response:
        """``GET /v1/semaphores/{key}``: the limit, and how many hold (never who)."""
        key = self.api.authorize(request)
        name = self._name(request)
        return await self._view(name, self._semaphore(name), key.holder)

    async def set_permits(self, request: Request) -> Response:
        """``PUT /v1/semaphores/{key}``: set the limit for every client."""
        key = self.api.authorize(request)
        name = self._name(request)
        permits = self.api.parse(PERMITS_REQUEST, await self.api.read_body(request))["permits"]
        sem = self._semaphore(name)
        await self.api.call("semaphore_set", sem.set_permits(permits))
        return await self._view(name, sem, key.holder)

    async def acquire_permit(self, request: Request) -> Response:
        """``POST /v1/semaphores/{key}/permits``: hold a permit for ``ttl`` seconds."""
        key = self.api.authorize(request)
        idempotency_key = parse_idempotency_key(request.headers.getlist("idempotency-key"))
        name = self._name(request)
        parsed = self.api.parse(PERMIT_REQUEST, await self.api.read_body(request))
        ttl, wait = parsed["ttl"], parsed["wait"]
        wait = min(wait, self.api.config.request_timeout * _WAIT_SHARE)
        holder = key.holder
        sem = self._semaphore(name)
        await self.api.load_ids()
        await self._limit(sem)

        digest = body_digest([name, ttl, parsed["wait"]])

        async def acquire(request_id: str | None) -> tuple[Claim | None, int, bool]:
            """The permit's claim (None: every permit held), the limit, whether replayed."""
            request_unit = None if request_id is None else Unit(REQUEST_RESOURCE, request_id)
            try:
                claim, permits = await self._hold(sem, holder, ttl, wait, request_unit)
            except _Replayed as replay:
                return replay.claim, sem._limit.permits, True
            except ResourceBusy as exc:
                # Answered here: ResourceBusy is a TimeoutError, which Api.call reads as its own.
                return None, int(getattr(exc, "permits", 0)), False
            return claim, permits, False

        async def keyed() -> tuple[Claim | None, int, bool]:
            assert idempotency_key is not None
            request_id = request_id_for(holder, idempotency_key)
            # Another body under this key is a RequestConflict (422), on every
            # instance: the store's request record of a short hold whose unit
            # spells the body's digest, as for match keys.
            await self.api.call(
                "permit_key",
                self.api.aio.claim(
                    Unit(BODY_RESOURCE, f"{digest}:{request_id}"),
                    holder=holder,
                    request_id=f"{BODY_RESOURCE}:{request_id}",
                    ttl=MIN_TTL,
                ),
            )
            return await self.api.call("permit", acquire(request_id))

        if idempotency_key is None:
            claim, permits, replayed = await self.api.call("permit", acquire(None))
        else:
            answer, shared = await self.api.once("permit", holder, idempotency_key, digest, keyed)
            claim, permits, replayed = answer
            replayed = replayed or shared
        if claim is None:
            raise ApiError(
                409,
                "no_permit",
                f"all {permits} permits of this semaphore are held",
                {"permits": permits},
            )
        slot = next(
            int(t.slot) for t in claim.targets if isinstance(t, Unit) and t.resource == sem.key
        )
        wire = self.api.claim_to_wire(claim)
        headers = {"Location": f"/v1/claims/{wire['id']}"}
        if replayed:
            headers["Idempotent-Replayed"] = "true"
        return JSONResponse(
            {"semaphore": name, "slot": slot, "permits": permits, "claim": wire},
            status_code=201,
            headers=headers,
        )

    async def _hold(
        self, sem: Semaphore, holder: str, ttl: float, wait: float, request_unit: Unit | None
    ) -> tuple[Claim, int]:
        """One permit as a plain hold, admitted by the semaphore's rule; the claim and limit.

        Raises ResourceBusy when every permit stays held past ``wait``, and
        :class:`_Replayed` when ``request_unit`` is held by this key's earlier
        request.
        """
        aio = self.api.aio

        async def perform(step: _Step) -> Any:
            match step:
                case _Enter(unit):
                    targets = [unit] if request_unit is None else [unit, request_unit]
                    # The linearization point: the store grants this slot (with the
                    # request's own unit) to one claim at most.
                    result = await aio.claim(targets, holder=holder, ttl=ttl)
                    if result.granted and not result.replayed:
                        return result.claim
                    if request_unit is not None:
                        if result.granted and result.claim is not None:
                            raise _Replayed(result.claim)  # this very slot, this request's
                        if request_unit in result.taken:
                            for claim in await aio.claims_of(holder):
                                if request_unit in claim.targets:
                                    raise _Replayed(claim)
                    # Taken, or held by this holder under another permit's claim.
                    return None
                case _Exit(claim):
                    # The limit moved while this slot was claimed: give it back, judge again.
                    with contextlib.suppress(HoldLost):  # lapsed already: nothing to give back
                        await aio.release(claim.id, holder=holder, fence=claim.fence)
                    return None
            return await sem._perform(step)

        # QUEUE_ERRORS: a waiter's ticket lost (paused) or gone is the queue's to decide on.
        claim, limit = await adrive(sem._acquire_rule(holder, wait), perform, QUEUE_ERRORS)
        assert isinstance(claim, Claim)
        return claim, limit.permits

    # --- rate limits ------------------------------------------------------------------------------

    async def acquire_rate(self, request: Request) -> Response:
        """``POST /v1/rate-limits/{key}/acquire``: admit ``cost`` now, or 429 with when to retry."""
        self.api.authorize(request)
        if request.headers.getlist("idempotency-key"):
            raise ApiError(
                400,
                "invalid",
                "a rate decision takes no Idempotency-Key: it is never replayed",
                {"field": "Idempotency-Key"},
            )
        name = self._name(request)
        parsed = self.api.parse(RATE_REQUEST, await self.api.read_body(request))
        rate, cost = parsed["rate"], parsed["cost"]
        limit = self._rates.get_or_make(
            (name, rate), lambda: RateLimit(self.api.aio, RATE_PREFIX + name, rate)
        )
        decision = await self.api.call("rate", limit.acquire(cost))
        if not decision:
            raise ApiError(
                429,
                "over_limit",
                f"over the limit {rate} on this key now; retry after {decision.retry_after:.6g} s",
                {"retry_after": decision.retry_after},
                {"Retry-After": str(max(1, math.ceil(decision.retry_after)))},
            )
        return JSONResponse(
            {
                "allowed": True,
                "key": name,
                "rate": str(rate),
                "cost": cost,
                "at": time_to_wire(decision.at),
            }
        )
