"""The ``/v1`` JSON API: one method per operation, each mapping store answers to HTTP.

Every operation authenticates first (the holder always comes from the API
key), spends a token of the key's rate limit, reads a bounded body, then awaits
the async store (:mod:`dibs.service._stores`) under ``request_timeout``. Store
errors map to statuses in :meth:`Api.call`, in one place:

==================  ======  =============================================
store answer        status  body ``error``
==================  ======  =============================================
granted             201     (the claim)
taken               409     ``taken``, with ``taken``: the targets
InvalidInput        400     ``invalid``, with ``field``
RequestConflict     422     ``idempotency_key_reused``
ClaimNotFound       404     ``not_found``
NotHolder           404     ``not_found`` (existence does not leak)
HoldLost            409     ``hold_lost``, with ``reason``
StoreUnavailable    503     ``unavailable``, with ``Retry-After``
==================  ======  =============================================

Messages are the service's own: a store's message may name its claim IDs
(which the API keeps opaque) or how another holder uses a resource.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import math
import time
from collections.abc import Awaitable, Callable, Sequence
from datetime import datetime
from typing import Any, TypeVar

from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response

from dibs._model import Claim, ClaimResult, ClaimState, Span, Target, Unit, target_to_json
from dibs.aio import AsyncStore
from dibs.exceptions import (
    ClaimNotFound,
    HoldLost,
    HoldLostReason,
    InvalidInput,
    NotHolder,
    RequestConflict,
    SpanKindMismatch,
    StoreClosed,
    StoreUnavailable,
)
from dibs.service._config import ServiceConfig
from dibs.service._guard import (
    ApiError,
    JSONResponse,
    RateLimiter,
    invalid,
    parse_idempotency_key,
)
from dibs.service._ids import ClaimIds, stored_secret
from dibs.service._keys import ApiKey, KeyRing
from dibs.service._metrics import Metrics
from dibs.service._schema import Obj
from dibs.service._wire import (
    EXTEND_REQUEST,
    FENCE_REQUEST,
    RESERVED,
    claim_request,
    claim_to_wire,
    parse_fence,
    parse_json_object,
    parse_query_bound,
    parse_query_fence,
    parse_target,
    request_id_for,
    target_to_wire,
    time_to_wire,
)
from dibs.singleflight import AsyncSingleFlight

__all__ = ["Api", "body_digest"]

_T = TypeVar("_T")
_RETRY = {"Retry-After": "1"}


_HOLD_LOST = {
    HoldLostReason.EXPIRED: "the hold expired",
    HoldLostReason.TAKEN_OVER: "the hold expired and another claim took its targets",
    HoldLostReason.RELEASED: "the claim was released",
    HoldLostReason.FENCE: "the fence is not this claim's fence",
}


def _not_found() -> ApiError:
    return ApiError(404, "not_found", "you have no such claim")


_COMPACT = json.JSONEncoder(separators=(",", ":")).encode  # json.dumps's, built once


def body_digest(body: object) -> str:
    """The fingerprint of a request's meaning, to tell a duplicate from a reuse."""
    return hashlib.sha256(_COMPACT(body).encode()).hexdigest()


def _media_type_is_json(header: str | None) -> bool:
    """Whether a Content-Type is ``application/json`` (with at most ``charset=utf-8``)."""
    if header is None:
        return False
    media, *params = (part.strip().lower() for part in header.split(";"))
    if media != "application/json":
        return False
    return all(p.replace(" ", "") in ("charset=utf-8", 'charset="utf-8"') for p in params)


class Api:
    """The handlers of ``/v1``, bound to one store, key ring and configuration."""

    def __init__(
        self,
        aio: AsyncStore,
        keys: KeyRing,
        config: ServiceConfig,
        metrics: Metrics,
        on_change: Callable[[tuple[Target, ...]], None],
    ) -> None:
        self.aio = aio
        """The service's one store: every store call awaits it (:meth:`call`)."""
        self.keys = keys
        self.config = config
        self.metrics = metrics
        self.limiter = RateLimiter(config.rate, config.burst)
        # Without a configured secret, the one kept in the store: every instance
        # on the store reads the same (docs/service.md), on first need.
        self._ids = None if config.id_secret is None else ClaimIds(config.id_secret)
        self._ids_lock = asyncio.Lock()
        # Claims are frozen dataclasses: share them, no copies.
        self.flights: AsyncSingleFlight = AsyncSingleFlight(copy=None)
        # The body digest of each (operation, holder, key) in flight, and an
        # event set when it ends; only the event loop's thread touches it.
        self._running: dict[tuple[str, str, str], _Running] = {}
        self._on_change = on_change

    # --- the steps every operation takes ----------------------------------------------------------

    def authorize(self, request: Request) -> ApiKey:
        """The caller's key; raises 401 without a valid bearer token, 429 over its rate."""
        scheme, _, token = request.headers.get("authorization", "").partition(" ")
        key = self.keys.authenticate(token.strip()) if scheme.lower() == "bearer" else None
        # A hand-edited keys file must not hand out the service's own holders.
        if key is None or key.holder.startswith(RESERVED):
            raise ApiError(
                401,
                "unauthorized",
                "send an API key: Authorization: Bearer dibs_...",
                headers={"WWW-Authenticate": 'Bearer realm="dibs"'},
            )
        request.scope["dibs.holder"] = key.holder
        wait = self.limiter.take(key.id)
        if wait > 0:
            self.metrics.rate_limited.inc()
            raise ApiError(
                429,
                "rate_limited",
                f"this key is limited to {self.config.rate:g} requests/s",
                headers={"Retry-After": str(max(1, math.ceil(wait)))},
            )
        return key

    async def read_body(self, request: Request) -> dict[str, Any]:
        """The request's JSON object body (none is ``{}``).

        Raises 413 past ``max_body``, 408 if it arrives too slowly, 415 for a
        body that is not ``application/json``, 400 for one that is not a
        strict JSON object.
        """
        limit = self.config.max_body
        declared = request.headers.get("content-length")
        if declared is not None and (
            not declared.isascii() or not declared.isdigit() or int(declared) > limit
        ):
            raise ApiError(413, "too_large", f"request bodies are limited to {limit} bytes")

        async def read() -> bytes:
            # What request.stream() does, without an async generator per request.
            chunks: list[bytes] = []
            size = 0
            receive = request.receive
            while True:
                message = await receive()
                kind = message["type"]
                if kind == "http.request":
                    chunk = message.get("body", b"")
                    size += len(chunk)
                    if size > limit:
                        raise ApiError(
                            413, "too_large", f"request bodies are limited to {limit} bytes"
                        )
                    chunks.append(chunk)
                    if not message.get("more_body", False):
                        return chunks[0] if len(chunks) == 1 else b"".join(chunks)
                elif kind == "http.disconnect":
                    raise ClientDisconnect()

        try:
            # asyncio.timeout, not wait_for: no task per request on the hot path.
            async with asyncio.timeout(self.config.body_timeout):
                raw = await read()
        except TimeoutError:
            raise ApiError(408, "timeout", "the request body arrived too slowly") from None
        if raw and not _media_type_is_json(request.headers.get("content-type")):
            raise ApiError(
                415, "unsupported_media_type", "send the body as Content-Type: application/json"
            )
        try:
            return parse_json_object(raw)
        except InvalidInput as exc:
            raise invalid(exc) from None

    async def call(self, operation: str, work: Awaitable[_T], targets: Sequence[Target] = ()) -> _T:
        """Await one store call (``work``, not yet started), bounded by ``request_timeout``.

        Translates the store's errors into :class:`ApiError` (see the module
        table); ``targets`` are the request's, to name the one at fault. A call
        cut short (timeout, or the request's task cancelled) leaves what the
        async store promises: no claim, or one a retry with the same
        Idempotency-Key learns about.
        """
        started = time.perf_counter()
        try:
            async with asyncio.timeout(self.config.request_timeout):
                return await work
        except TimeoutError:
            raise ApiError(
                503, "timeout", "the store did not answer in time; retry", headers=_RETRY
            ) from None
        except (StoreUnavailable, StoreClosed):
            raise ApiError(
                503, "unavailable", "the store is unavailable; retry", headers=_RETRY
            ) from None
        except RequestConflict:
            raise ApiError(
                422,
                "idempotency_key_reused",
                "this Idempotency-Key was used with a different request",
            ) from None
        except (ClaimNotFound, NotHolder):
            raise _not_found() from None
        except HoldLost as exc:
            reason = HoldLostReason(exc.reason)
            self.metrics.hold_lost.labels(operation, str(reason)).inc()
            if reason is HoldLostReason.TAKEN_OVER:
                self.metrics.holds_taken_over.inc()
            raise ApiError(409, "hold_lost", _HOLD_LOST[reason], {"reason": str(reason)}) from None
        except SpanKindMismatch as exc:
            # A live span of the other kind (numbers or times) blocks the
            # resource like an overlap would: the same answer as any loss, so
            # nothing tells how another holder uses the resource.
            blocked = [t for t in targets if t == exc.value] or targets
            raise ApiError(
                409,
                "taken",
                "another holder has some of these targets",
                {"taken": [target_to_wire(t) for t in blocked if isinstance(t, Span)]},
            ) from None
        except InvalidInput as exc:
            # Every input was checked before the call; a store that still
            # refuses one gets a message of ours, not its repr of the value.
            raise ApiError(
                400, "invalid", f"{exc.field} is not valid here", {"field": exc.field}
            ) from None
        finally:
            self.metrics.observe_store(operation, time.perf_counter() - started)

    def changed(self, targets: tuple[Target, ...]) -> None:
        """Tell the seat maps that these targets changed hands."""
        self._on_change(targets)

    @staticmethod
    def fields(body: dict[str, Any], schema: Obj) -> None:
        """Raise 400 naming the first field of ``body`` that ``schema`` does not have."""
        try:
            schema.unknown(body, "")
        except InvalidInput as exc:
            raise invalid(exc) from None

    @staticmethod
    def parse(schema: Obj, body: dict[str, Any]) -> dict[str, Any]:
        """``body`` parsed by its route's ``schema``; raises 400 naming a bad field."""
        try:
            return schema.parse(body)
        except InvalidInput as exc:
            raise invalid(exc) from None

    async def once(
        self,
        operation: str,
        holder: str,
        key: str,
        digest: str,
        work: Callable[[], Awaitable[_T]],
    ) -> tuple[_T, bool]:
        """Run ``work`` for a holder's Idempotency-Key, one request of that key at a time.

        Return its value and whether it was another request's answer, shared.
        A duplicate of the in-flight request (same ``digest`` of the body)
        waits for its answer; a request with another body waits until it
        ends and then runs, so the store's request record answers it (422) and
        the first request completes as if alone. Either wait is bounded by
        ``idempotency_wait``, then raises 409 ``in_progress``.
        """
        flight = (operation, holder, key)

        def lead() -> Awaitable[_T]:
            # Called by the flight's leader when it starts the work, with no
            # await in between: whoever sees the flight also sees its digest.
            entry = self._running[flight] = _Running(digest)

            async def run() -> _T:
                try:
                    return await work()
                finally:
                    if self._running.get(flight) is entry:
                        del self._running[flight]
                    entry.finish()

            return run()

        deadline = asyncio.get_running_loop().time() + self.config.idempotency_wait
        waited = False
        try:
            while (running := self._running.get(flight)) is not None and running.digest != digest:
                waited = True
                async with asyncio.timeout_at(deadline):
                    await running.wait()
            if running is None:
                answer = await self.flights.call(flight, lead)
            else:
                waited = True
                async with asyncio.timeout_at(deadline):
                    answer = await self.flights.call(flight, lead)
        except TimeoutError:
            self.metrics.idempotency_waits.labels("gave_up").inc()
            raise ApiError(
                409,
                "in_progress",
                "a request with this Idempotency-Key is still in progress; retry",
                headers=_RETRY,
            ) from None
        if waited:
            self.metrics.idempotency_waits.labels("answered").inc()
        return answer.value, answer.shared

    @property
    def ids(self) -> ClaimIds:
        """The claim-ID permutation, once :meth:`load_ids` has read it (handlers await that).

        Raises RuntimeError before then: the secret is read through the async
        store, on the serving loop.
        """
        if self._ids is None:
            raise RuntimeError("the claim-ID secret is not read yet: await Api.load_ids() first")
        return self._ids

    async def load_ids(self) -> ClaimIds:
        """The claim-ID permutation, its secret read from (or made in) the store on first need.

        Raises 503 when the store does not answer, like any store call.
        """
        if self._ids is None:
            async with self._ids_lock:
                if self._ids is None:
                    self._ids = ClaimIds(await self.call("id_secret", stored_secret(self.aio)))
        return self._ids

    async def _claim_id(self, request: Request) -> str:
        """The store claim ID behind the path's wire ID; 404 for one that is not ours."""
        claim_id = (await self.load_ids()).from_wire(request.path_params["claim_id"])
        if claim_id is None:
            raise _not_found()
        return claim_id

    def claim_to_wire(self, claim: Claim) -> dict[str, Any]:
        """A claim as JSON, under its opaque wire ID."""
        return claim_to_wire(claim, self.ids.to_wire(claim.id))

    # --- claims -----------------------------------------------------------------------------------

    async def create_claim(self, request: Request) -> Response:
        """``POST /v1/claims``: claim every target or none."""
        key = self.authorize(request)
        idempotency_key = parse_idempotency_key(request.headers.getlist("idempotency-key"))
        parsed = self.parse(claim_request(self.config.max_targets), await self.read_body(request))
        targets, ttl, mode = parsed["targets"], parsed["ttl"], parsed["mode"]
        holder = key.holder
        request_id = None if idempotency_key is None else request_id_for(holder, idempotency_key)
        await self.load_ids()  # before the claim: a claim made must get its answer

        async def claim() -> ClaimResult:
            return await self.call(
                "claim",
                self.aio.claim(targets, holder=holder, request_id=request_id, ttl=ttl, mode=mode),
                targets,
            )

        shared = False
        if idempotency_key is None:
            result = await claim()
        else:
            # An exclusive claim's digest is the one the service always made.
            digest = body_digest(
                [
                    [target_to_json(t) for t in targets],
                    ttl,
                    *([mode] if mode != "exclusive" else []),
                ]
            )
            result, shared = await self.once("claim", holder, idempotency_key, digest, claim)
        # Idempotent-Replayed says only "this key answered before": a waiter
        # that shared the first request's flight, or the store's request record
        # for this key. The store also answers a holder re-claiming exactly what
        # it holds with that claim (the natural key); that is no replay of this
        # key, and answers 200 (nothing was created).
        natural = (
            result.replayed
            and result.claim is not None
            and (request_id is None or result.claim.request_id != request_id)
        )
        replayed = shared or (result.replayed and not natural)
        fresh = not (replayed or natural)
        headers = {"Idempotent-Replayed": "true"} if replayed else {}
        if not fresh:
            self.metrics.claimed("replayed")
        if not result:
            if fresh:
                self.metrics.claimed("taken")
            return ApiError(
                409,
                "taken",
                "another holder has some of these targets",
                {"taken": [target_to_wire(t) for t in result.taken]},
                headers,
            ).response(request.scope.get("root_path", ""))
        assert result.claim is not None
        if fresh:
            self.metrics.claimed("granted")
            self._on_change(result.claim.targets)
        wire = self.claim_to_wire(result.claim)
        headers["Location"] = f"/v1/claims/{wire['id']}"
        return JSONResponse(wire, status_code=200 if natural else 201, headers=headers)

    async def get_claim(self, request: Request) -> Response:
        """``GET /v1/claims/{id}``: one of the caller's claims."""
        key = self.authorize(request)
        claim_id = await self._claim_id(request)
        claim = await self.call("get", self.aio.get(claim_id))
        # A released claim is gone, as DELETE promised; an expired one stays
        # readable so its holder can learn why (until the sweeper purges it).
        if claim is None or claim.holder != key.holder or claim.state is ClaimState.RELEASED:
            raise _not_found()
        return JSONResponse(self.claim_to_wire(claim))

    async def list_claims(self, request: Request) -> Response:
        """``GET /v1/claims?holder=me``: the caller's holder name and live claims, a snapshot."""
        key = self.authorize(request)
        self.parameters(request, {"holder"})
        wanted = request.query_params.get("holder", "me")
        if wanted not in ("me", key.holder):
            raise ApiError(403, "forbidden", "you can list only your own claims (holder=me)")
        await self.load_ids()
        claims = await self.call("claims_of", self.aio.claims_of(key.holder))
        # The holder is the caller's own name (the seat map shows "you are ...").
        return JSONResponse(
            {
                "snapshot": True,
                "holder": key.holder,
                "claims": [self.claim_to_wire(c) for c in claims],
            }
        )

    async def confirm(self, request: Request) -> Response:
        """``POST /v1/claims/{id}/confirm``: turn the caller's live hold into a claim."""
        key = self.authorize(request)
        claim_id = await self._claim_id(request)
        fence = self.parse(FENCE_REQUEST, await self.read_body(request))["fence"]
        claim = await self.call(
            "confirm", self.aio.confirm(claim_id, holder=key.holder, fence=fence)
        )
        self._on_change(claim.targets)
        return JSONResponse(self.claim_to_wire(claim))

    async def extend(self, request: Request) -> Response:
        """``POST /v1/claims/{id}/extend``: push the caller's live hold's expiry."""
        key = self.authorize(request)
        claim_id = await self._claim_id(request)
        parsed = self.parse(EXTEND_REQUEST, await self.read_body(request))
        fence, ttl = parsed["fence"], parsed["ttl"]
        claim = await self.call(
            "extend",
            self.aio.extend(claim_id, holder=key.holder, fence=fence, ttl=ttl),
        )
        self._on_change(claim.targets)
        return JSONResponse(self.claim_to_wire(claim))

    async def release(self, request: Request) -> Response:
        """``DELETE /v1/claims/{id}``: give up the caller's claim (fence in body or query).

        Idempotent: a claim that already ended answers ``released: false``.
        """
        key = self.authorize(request)
        claim_id = await self._claim_id(request)
        body = await self.read_body(request)
        self.fields(body, FENCE_REQUEST)
        self.parameters(request, {"fence"})
        query = request.query_params.get("fence")
        if "fence" in body and query is not None:
            raise ApiError(
                400,
                "invalid",
                "give the fence in the body or the query, not both",
                {"field": "fence"},
            )
        try:
            fence = parse_fence(body.get("fence")) if query is None else parse_query_fence(query)
        except InvalidInput as exc:
            raise invalid(exc) from None

        async def release() -> tuple[bool, Claim | None]:
            released = await self.aio.release(claim_id, holder=key.holder, fence=fence)
            return released, await self.aio.get(claim_id)

        released, claim = await self.call("release", release())
        if released and claim is not None:
            self._on_change(claim.targets)
        return JSONResponse(
            {"released": released, "claim": None if claim is None else self.claim_to_wire(claim)}
        )

    @staticmethod
    def parameters(request: Request, allowed: set[str]) -> None:
        """Raise 400 naming the first query parameter not in ``allowed``, or a repeated one."""
        params = request.query_params
        unknown = sorted(set(params) - allowed)
        if unknown:
            raise ApiError(
                400, "invalid", f"unknown parameter {json.dumps(unknown[0])}", {"field": unknown[0]}
            )
        for name in params:
            if len(params.getlist(name)) > 1:
                raise ApiError(400, "invalid", f"{name} is given twice", {"field": name})

    # --- availability -----------------------------------------------------------------------------

    async def resource(self, request: Request) -> Response:
        """``GET /v1/resources/{resource}?slot=…`` or ``?start=…&end=…``: free or not, now."""
        key = self.authorize(request)
        self.parameters(request, {"slot", "start", "end"})
        params = request.query_params
        item: dict[str, Any] = {"resource": request.path_params["resource"]}
        if "start" in params or "end" in params:
            item["start"] = parse_query_bound(params.get("start", ""))
            item["end"] = parse_query_bound(params.get("end", ""))
        else:
            item["slot"] = params.get("slot", "")
        try:
            target = parse_target(item, "query")
        except InvalidInput as exc:
            field = exc.field.removeprefix("query.")
            raise ApiError(
                400, "invalid", str(exc).replace("query.", ""), {"field": field}
            ) from None
        assert isinstance(target, Unit | Span)

        async def read() -> tuple[str | None, datetime]:
            return await self.aio.holder_of(target), await self.aio.now()

        holder, now = await self.call("holder_of", read(), [target])
        state = "free" if holder is None else "yours" if holder == key.holder else "taken"
        return JSONResponse(
            {
                "snapshot": True,
                "as_of": time_to_wire(now),
                "target": target_to_wire(target),
                "state": state,
            }
        )


class _Running:
    """A key's request in flight: its body's digest, and an event made for the first waiter.

    Most requests run alone, so the event (an :class:`asyncio.Event` costs more
    than the rest of this bookkeeping) is made only when another body waits.
    """

    __slots__ = ("digest", "done", "finished")

    def __init__(self, digest: str) -> None:
        self.digest = digest
        self.done: asyncio.Event | None = None
        self.finished = False

    async def wait(self) -> None:
        """Return once the request has finished (at once if it has)."""
        if self.finished:
            return
        if self.done is None:
            self.done = asyncio.Event()
        await self.done.wait()

    def finish(self) -> None:
        """Mark the request finished and wake its waiters."""
        self.finished = True
        if self.done is not None:
            self.done.set()
