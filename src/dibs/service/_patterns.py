"""``/v1/lots`` and ``/v1/match``: the lot and match patterns over HTTP.

Both patterns name their holder themselves (a lot's vehicle ID is the holder
of its claim; a match is keyed by a request ID), so the service namespaces
those names by the caller's holder exactly as it does Idempotency-Keys: alice's
``car-1`` and bob's ``car-1`` are two vehicles, and neither can see or move
the other's. Every decision is still the store's group claim.

Their internal units live under the reserved resource prefix ``dibs.``, which
``POST /v1/claims`` refuses: lots are ``dibs.lot:<name>``, match keys
``dibs.match``. Vehicle holders start with ``dibs.`` too, which no API key's
holder may, so no client can claim, hold or block another client's internals.

Both run as :mod:`dibs.aio`'s :class:`~dibs.aio.Lot` and
:func:`~dibs.aio.match` on the service's one async store, awaited under the
request timeout like any store call. A park or remove cut short by the timeout
ends holding nothing it took (the async lot gives a cut-off park's claim back).
"""

from __future__ import annotations

import json
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from dibs._model import Unit, target_to_json
from dibs.aio import Lot, match
from dibs.exceptions import InvalidInput
from dibs.lot import AlreadyParked, NotParked, VehicleBlocked
from dibs.matching import REQUEST_RESOURCE, Match
from dibs.service._api import Api, body_digest
from dibs.service._config import LotSpec
from dibs.service._guard import ApiError, invalid, parse_idempotency_key
from dibs.service._wire import (
    MIN_TTL,
    NAME,
    RESERVED,
    match_request,
    park_request,
    request_id_for,
)

# The match pattern's own units must be in the reserved namespace, or a client
# could claim another's match key through POST /v1/claims.
assert REQUEST_RESOURCE.startswith(RESERVED)
BODY_RESOURCE = f"{RESERVED}match.body"
"""The resource of the units whose request records remember each match key's body."""

__all__ = ["Patterns"]


class Patterns:
    """The handlers of ``/v1/lots`` and ``/v1/match``."""

    def __init__(self, api: Api, lots: tuple[LotSpec, ...]) -> None:
        self.api = api
        self.lots = {
            spec.name: Lot(
                api.aio, spec.name, spec.size, fit=spec.fit, resource=f"{RESERVED}lot:{spec.name}"
            )
            for spec in lots
        }

    def _lot(self, request: Request) -> Lot:
        lot = self.lots.get(request.path_params["lot"])
        if lot is None:
            raise ApiError(404, "not_found", "no such lot")
        return lot

    @staticmethod
    def _vehicle(value: object) -> str:
        try:
            result: str = NAME.parse(value, "vehicle")
            return result
        except InvalidInput as exc:
            raise invalid(exc) from None

    @staticmethod
    def _holder(holder: str, vehicle: str) -> str:
        """The store holder of a caller's vehicle: reserved, and namespaced by the caller."""
        return RESERVED + request_id_for(holder, vehicle)

    async def list_lots(self, request: Request) -> Response:
        """``GET /v1/lots``: the lots this service parks in."""
        self.api.authorize(request)
        return JSONResponse(
            {"lots": [{"name": lot.name, "size": lot.size} for lot in self.lots.values()]}
        )

    async def lot(self, request: Request) -> Response:
        """``GET /v1/lots/{lot}``: each slot free, yours or taken; a snapshot."""
        key = self.api.authorize(request)
        lot = self._lot(request)
        occupancy = await self.api.call("lot_occupancy", lot.occupancy())
        mine = self._holder(key.holder, "")
        slots: list[dict[str, Any]] = []
        for vehicle in occupancy.slots:
            if vehicle is None:
                slots.append({"state": "free"})
            elif vehicle.startswith(mine):
                slots.append({"state": "yours", "vehicle": vehicle[len(mine) :]})
            else:
                slots.append({"state": "taken"})
        return JSONResponse(
            {
                "snapshot": True,
                "name": lot.name,
                "size": lot.size,
                "free": occupancy.free,
                "largest_free_run": occupancy.largest_free_run,
                "slots": slots,
            }
        )

    async def park(self, request: Request) -> Response:
        """``POST /v1/lots/{lot}/vehicles``: park in ``length`` adjacent slots the lot picks."""
        key = self.api.authorize(request)
        lot = self._lot(request)
        parsed = self.api.parse(park_request(lot.size), await self.api.read_body(request))
        vehicle, length = parsed["vehicle"], parsed["length"]
        who = self._holder(key.holder, vehicle)
        try:
            position = await self.api.call("park", lot.park(who, length))
        except AlreadyParked as exc:
            raise ApiError(
                409,
                "already_parked",
                "this vehicle is parked here with another length",
                {"position": exc.position, "length": exc.parked_length},
            ) from None
        except VehicleBlocked:
            raise ApiError(
                409, "vehicle_blocked", "this vehicle cannot park here now; try again later"
            ) from None
        if position is None:
            raise ApiError(
                409, "full", f"no {length} adjacent free slots in {json.dumps(lot.name)} now"
            )
        return JSONResponse(
            {"lot": lot.name, "vehicle": vehicle, "position": position, "length": length},
            status_code=201,
        )

    async def vehicle(self, request: Request) -> Response:
        """``GET /v1/lots/{lot}/vehicles/{vehicle}``: where your vehicle is parked."""
        key = self.api.authorize(request)
        lot = self._lot(request)
        vehicle = self._vehicle(request.path_params["vehicle"])
        who = self._holder(key.holder, vehicle)
        position = await self.api.call("lot_position", lot.position_of(who))
        if position is None:
            raise ApiError(404, "not_found", "you have no such vehicle in this lot")
        return JSONResponse({"lot": lot.name, "vehicle": vehicle, "position": position})

    async def unpark(self, request: Request) -> Response:
        """``DELETE /v1/lots/{lot}/vehicles/{vehicle}``: free every slot of your vehicle."""
        key = self.api.authorize(request)
        lot = self._lot(request)
        vehicle = self._vehicle(request.path_params["vehicle"])
        who = self._holder(key.holder, vehicle)
        try:
            position = await self.api.call("unpark", lot.remove(who))
        except NotParked:
            raise ApiError(404, "not_found", "you have no such vehicle in this lot") from None
        return JSONResponse({"lot": lot.name, "vehicle": vehicle, "position": position})

    async def match(self, request: Request) -> Response:
        """``POST /v1/match``: claim the first free candidate (Idempotency-Key required)."""
        key = self.api.authorize(request)
        idempotency_key = parse_idempotency_key(request.headers.getlist("idempotency-key"))
        if idempotency_key is None:
            raise ApiError(
                400,
                "invalid",
                "POST /v1/match needs an Idempotency-Key",
                {"field": "Idempotency-Key"},
            )
        parsed = self.api.parse(
            match_request(self.api.config.max_targets), await self.api.read_body(request)
        )
        units: list[Unit] = parsed["candidates"]
        ttl = parsed["ttl"]
        holder = key.holder
        request_id = request_id_for(holder, idempotency_key)
        digest = body_digest([[target_to_json(c) for c in units], ttl])
        await self.api.load_ids()

        async def dispatch() -> Match:
            # The key's body is remembered by the store's request record of a
            # claim whose unit spells the digest: another body under this key
            # is a RequestConflict (422), across instances and for the store's
            # request_retention, like the key of a claim. Its hold ends at once.
            record = Unit(BODY_RESOURCE, f"{digest}:{request_id}")
            await self.api.call(
                "match_key",
                self.api.aio.claim(
                    record, holder=holder, request_id=f"{BODY_RESOURCE}:{request_id}", ttl=MIN_TTL
                ),
            )
            return await self.api.call(
                "match",
                match(
                    self.api.aio,
                    units,
                    holder=holder,
                    request_id=request_id,
                    ttl=ttl,
                    attempts=3,
                    backoff=0.02,
                    max_backoff=0.1,
                ),
            )

        found, shared = await self.api.once("match", holder, idempotency_key, digest, dispatch)
        if not found:
            raise ApiError(409, "none_free", "every candidate is taken")
        assert found.claim is not None and found.candidate is not None
        replayed = found.replayed or shared
        if not replayed:
            self.api.changed(found.claim.targets)
        headers = {"Idempotent-Replayed": "true"} if replayed else {}
        return JSONResponse(
            {
                "candidate": {"resource": found.candidate.resource, "slot": found.candidate.slot},
                "claim": self.api.claim_to_wire(found.claim),
            },
            status_code=201,
            headers=headers,
        )
