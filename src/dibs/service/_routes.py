"""The route table: every route's handler, inputs and answers, which the app is built from.

Each :class:`Operation` names its handler (``"api.create_claim"``: a method of
the service's ``api``, ``patterns`` or the service itself), the schema of each
input its handler parses (:mod:`dibs.service._wire`, ``_guard``) and each
status it answers with the schema of that answer. ``create_app`` builds its
routes from :func:`operations`, and ``openapi_document`` renders the same
table, so a route cannot be served without being documented, nor a limit
parsed without being shown.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from dibs.service._guard import ERROR, IDEMPOTENCY_KEY, IDEMPOTENCY_KEY_TEXT, PROBLEM_JSON
from dibs.service._ids import WIRE_ID_PATTERN
from dibs.service._schema import (
    Array,
    Boolean,
    Const,
    Enum,
    Integer,
    MapOf,
    Nullable,
    Number,
    Obj,
    Prop,
    Raw,
    Schema,
    Text,
)
from dibs.service._wire import (
    BOUND,
    CLAIM,
    EXTEND_REQUEST,
    FENCE,
    FENCE_REQUEST,
    MAX_TTL,
    NAME,
    PERMIT_REQUEST,
    PERMITS_REQUEST,
    RATE_REQUEST,
    RESOURCE,
    SLOT,
    TARGET,
    TIME,
    UNIT,
    WAITLIST_RELEASE_REQUEST,
    WAITLIST_REQUEST,
    claim_request,
    match_request,
    park_request,
)

__all__ = ["Answer", "Operation", "Param", "operations"]


@dataclass(frozen=True)
class Answer:
    """One status of an operation: its body's schema and media type, its headers, its links."""

    description: str
    schema: Schema | None = None
    media: str = "application/json"
    headers: Mapping[str, str] = field(default_factory=dict)
    """Each header's name and what it says."""
    links: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Param:
    """A path, query or header parameter, and the schema its handler parses it with."""

    name: str
    where: Literal["path", "query", "header"]
    schema: Schema
    required: bool = False
    description: str | None = None
    examples: Literal["lots", "showings", None] = None
    """Which of the service's configured names the document offers as examples."""


@dataclass(frozen=True)
class Operation:
    """One method of one path; ``operation_id=None`` keeps it out of the document."""

    method: str
    path: str
    handler: str
    operation_id: str | None = None
    summary: str = ""
    description: str | None = None
    security: bool = False
    params: tuple[Param, ...] = ()
    body: Schema | None = None
    body_required: bool = True
    answers: Mapping[str, Answer] = field(default_factory=dict)


def _error(description: str, **headers: str) -> Answer:
    return Answer(description, ERROR, PROBLEM_JSON, headers)


_RETRY = "Seconds to wait before retrying."
_COMMON = {
    "400": _error("Bad input; `field` names it."),
    "401": _error("No valid API key.", **{"WWW-Authenticate": "Bearer challenge."}),
    "408": _error("`timeout`: the request body arrived too slowly."),
    "413": _error("The request body is larger than the limit."),
    "415": _error("The request has a body that is not `application/json`."),
    "429": _error("This key's rate limit was exceeded.", **{"Retry-After": _RETRY}),
    "503": _error("The store did not answer in time or is unreachable.", **{"Retry-After": _RETRY}),
}
_READ = {k: v for k, v in _COMMON.items() if k not in ("408", "413", "415")}
# The seat map's routes need a key only with --private-map.
_MAP = {"401": _error("With `--private-map`: no valid API key."), "429": _COMMON["429"]}
_NOT_FOUND = _error("No such claim of yours (another holder's claim is also 404).")
_HOLD_LOST = _error("The hold expired, was taken over or released, or the fence is stale.")

_CLAIM_ID = Param(
    "claim_id",
    "path",
    Text(pattern=WIRE_ID_PATTERN),
    required=True,
    description="The claim's opaque ID, as the API gave it.",
)
_KEY = Param("Idempotency-Key", "header", IDEMPOTENCY_KEY, description=IDEMPOTENCY_KEY_TEXT)
_LOT = Param("lot", "path", NAME, required=True, examples="lots")
_VEHICLE = Param("vehicle", "path", NAME, required=True)
_SHOWING = Param("slot", "path", NAME, required=True, examples="showings")
_SEMAPHORE = Param(
    "key", "path", NAME, required=True, description="The semaphore's name, shared by every key."
)
_RATE_KEY = Param(
    "key", "path", NAME, required=True, description="The limit's name, shared by every key."
)
_WAITLIST = Param(
    "key", "path", NAME, required=True, description="The list's name, shared by every key."
)
_OFFER_ID = Param(
    "claim_id",
    "path",
    Text(pattern=WIRE_ID_PATTERN),
    required=True,
    description="The offer's claim ID, as `GET /v1/waitlists/{key}/offers` gave it.",
)
_NO_OFFER = _error("No such offer of yours on this list (another holder's is also 404).")

# --- answers' shapes (the handlers beside them build them) ----------------------------------------

_TEXT = Text()
_SNAPSHOT = Const(True)
_INT = Integer()
LOT = Obj({"name": _TEXT, "size": _INT}, name="Lot")
SHOWING = Obj({"slot": _TEXT, "rows": _INT, "cols": _INT}, name="Showing")
PARKED = Obj(
    {"lot": _TEXT, "vehicle": _TEXT, "position": _INT, "length": Prop(_INT, required=False)},
    name="Parked",
)
LOT_MAP = Obj(
    {
        "snapshot": _SNAPSHOT,
        "name": _TEXT,
        "size": _INT,
        "free": _INT,
        "largest_free_run": _INT,
        "slots": Array(
            Obj(
                {
                    "state": Enum(("free", "yours", "taken")),
                    "vehicle": Prop(_TEXT, required=False),
                }
            )
        ),
    },
    name="LotMap",
)
SEAT = Obj(
    {"state": Enum(("free", "held", "confirmed")), "expires_at": Nullable(TIME)}, name="Seat"
)
SEAT_MAP = Obj(
    {
        "slot": _TEXT,
        "rows": _INT,
        "cols": _INT,
        "snapshot": _SNAPSHOT,
        "now": TIME,
        "version": Prop(_INT, required=False),
        "seats": MapOf(SEAT),
    },
    name="SeatMap",
)
_CLAIMS = Obj(
    {
        "snapshot": _SNAPSHOT,
        "holder": Text(description="Who you are: your API key's holder."),
        "claims": Array(CLAIM),
    }
)
_RELEASED = Obj({"released": Boolean(), "claim": Nullable(CLAIM)})
_RESOURCE_STATE = Obj(
    {
        "snapshot": _SNAPSHOT,
        "as_of": TIME,
        "target": TARGET,
        "state": Enum(("free", "yours", "taken")),
    }
)
_MATCHED = Obj({"candidate": UNIT, "claim": CLAIM})
SEMAPHORE = Obj(
    {
        "snapshot": _SNAPSHOT,
        "name": _TEXT,
        "permits": Integer(0, description="The limit in the store now."),
        "held": Integer(0, description="Live permits, everyone's (never whose)."),
        "yours": Integer(0, description="Live permits you hold."),
    },
    name="Semaphore",
)
PERMIT = Obj(
    {
        "semaphore": _TEXT,
        "slot": Integer(0, description="Which of the semaphore's slots the permit holds."),
        "permits": Integer(0, description="The limit the permit was granted under."),
        "claim": CLAIM,
    },
    name="Permit",
)
ADMITTED = Obj(
    {
        "allowed": Const(True),
        "key": _TEXT,
        "rate": Text(description="The rate, as the service reads it (`10/s`)."),
        "cost": Integer(1),
        "at": Nullable(TIME, description="When the store admitted it, on its own clock."),
    },
    name="Admitted",
)
WAITLIST = Obj(
    {
        "snapshot": _SNAPSHOT,
        "name": _TEXT,
        "waiting": Integer(0, description="How many wait (never who)."),
        "position": Nullable(Integer(1), description="Your place (1: the next offer is yours)."),
        "watching": Nullable(
            Integer(0),
            description="How many units the list serves (its stored configuration), or null "
            "if none was ever PUT.",
        ),
        "offer_ttl": Number(
            0, MAX_TTL, description="Seconds an offer is held, whichever instance makes it."
        ),
        "version": Integer(
            0,
            description="The version of the list's configuration (0: never PUT); each PUT "
            "that changes it writes the next. Send it as `if_version` to PUT only over it.",
        ),
    },
    name="Waitlist",
)
WAITLIST_ENTRY = Obj(
    {
        "name": _TEXT,
        "position": Integer(1, description="Your place now (1: the next offer is yours)."),
        "number": Integer(1, description="Your entry's ticket: entries are served in order."),
    },
    name="WaitlistEntry",
)
OFFER = Obj(
    {
        "unit": UNIT,
        "expires_at": Nullable(TIME, description="When the offer lapses, on the store's clock."),
        "claim": CLAIM,
    },
    name="Offer",
)
_OFFERS = Obj({"snapshot": _SNAPSHOT, "name": _TEXT, "offers": Array(OFFER)})
_ACCEPTED = Obj({"unit": UNIT, "claim": CLAIM})
_DECLINED = Obj(
    {
        "unit": UNIT,
        "declined": Const(True),
        "passed_on": Boolean(
            description="Whether this call offered it to the next in line (never who); "
            "a watcher may have done so first."
        ),
    }
)
_LEFT = Obj({"name": _TEXT, "left": Boolean(description="False: you were not on the list.")})
_RELEASED_TO_LIST = Obj(
    {
        "name": _TEXT,
        "released": Boolean(description="Whether this call released it."),
        "offered": Integer(
            0,
            description="How many of its units this call offered (never to whom); "
            "a watcher may have offered one first.",
        ),
    }
)
_BAD_CONFIG = {
    "409": _error(
        "`bad_config`: the list's configuration in the store is not one the service wrote; "
        "a PUT replaces it."
    )
}
_OFFER_ACTION = {
    "404": _NO_OFFER,
    "409": _error(
        "The offer lapsed, was declined or passed on, or the fence is stale; or `bad_config`."
    ),
    **_COMMON,
}

_CLAIM_OK = Answer("The claim as stored now.", CLAIM)
# For stateful testing (and readers): what a new claim's ID and fence lead to.
_CLAIM_ID_LINK = {"claim_id": "$response.body#/id"}
_CLAIM_LINKS = {
    "GetClaim": {"operationId": "getClaim", "parameters": _CLAIM_ID_LINK},
    "ConfirmClaim": {
        "operationId": "confirmClaim",
        "parameters": _CLAIM_ID_LINK,
        "requestBody": {"fence": "$response.body#/fence"},
    },
    "ExtendClaim": {
        "operationId": "extendClaim",
        "parameters": _CLAIM_ID_LINK,
        "requestBody": {"fence": "$response.body#/fence", "ttl": 60},
    },
    "ReleaseClaim": {
        "operationId": "releaseClaim",
        "parameters": {**_CLAIM_ID_LINK, "fence": "$response.body#/fence"},
    },
}
_PARKED_LINKS = {
    name: {
        "operationId": op,
        "parameters": {"lot": "$request.path.lot", "vehicle": "$response.body#/vehicle"},
    }
    for name, op in (("GetVehicle", "getVehicle"), ("UnparkVehicle", "unparkVehicle"))
}
_LOCATION = "The claim's URL."
_PERMIT_ID = {"claim_id": "$response.body#/claim/id"}
_PERMIT_LINKS = {
    "GetClaim": {"operationId": "getClaim", "parameters": _PERMIT_ID},
    "ExtendClaim": {
        "operationId": "extendClaim",
        "parameters": _PERMIT_ID,
        "requestBody": {"fence": "$response.body#/claim/fence", "ttl": 60},
    },
    "ReleaseClaim": {
        "operationId": "releaseClaim",
        "parameters": {**_PERMIT_ID, "fence": "$response.body#/claim/fence"},
    },
}


@functools.cache
def operations(max_targets: int = 100) -> tuple[Operation, ...]:
    """Every route of a service with this many targets per claim, in the router's order.

    The claim path's routes come first: the router tries them in order.
    """
    return (
        Operation(
            "POST",
            "/v1/claims",
            "api.create_claim",
            "createClaim",
            "Claim every target or none",
            "All-or-nothing. With `ttl` the claim is a hold to confirm "
            "before it expires; without, it is confirmed at once. Send an "
            "`Idempotency-Key` to make retries safe: the same key and body replay the "
            "first answer (`Idempotent-Replayed: true`); a concurrent duplicate waits "
            "for the first request's answer, and one with another body waits for the "
            "first to end and is then `422`. Re-claiming exactly the targets of a "
            "live claim of yours answers that claim with `200` (the natural key).",
            security=True,
            params=(_KEY,),
            body=claim_request(max_targets),
            answers={
                "201": Answer(
                    "Granted (or this Idempotency-Key's replay).",
                    CLAIM,
                    headers={
                        "Location": _LOCATION,
                        "Idempotent-Replayed": "`true` when this Idempotency-Key answered before.",
                    },
                    links=_CLAIM_LINKS,
                ),
                "200": Answer(
                    "You already hold exactly these targets: that claim.",
                    CLAIM,
                    headers={"Location": _LOCATION},
                    links=_CLAIM_LINKS,
                ),
                "409": _error(
                    "`taken`: someone else holds some targets (listed, never who); or "
                    "`in_progress`: a request with this key is still running.",
                    **{"Retry-After": "With `in_progress`."},
                ),
                "422": _error("This Idempotency-Key was used with a different body."),
                **_COMMON,
            },
        ),
        Operation(
            "GET",
            "/v1/claims",
            "api.list_claims",
            "listClaims",
            "Your live claims (a snapshot)",
            security=True,
            params=(
                Param(
                    "holder",
                    "query",
                    Text(default="me"),
                    description="`me` (or your own holder name).",
                ),
            ),
            answers={
                "200": Answer("Who you are, and your held and confirmed claims.", _CLAIMS),
                "403": _error("`holder` names someone else."),
                **_READ,
            },
        ),
        Operation(
            "GET",
            "/v1/claims/{claim_id}",
            "api.get_claim",
            "getClaim",
            "One of your claims",
            security=True,
            params=(_CLAIM_ID,),
            answers={"200": _CLAIM_OK, "404": _NOT_FOUND, **_READ},
        ),
        Operation(
            "DELETE",
            "/v1/claims/{claim_id}",
            "api.release",
            "releaseClaim",
            "Release your claim",
            "Idempotent: releasing a claim of yours that already ended "
            "(released or expired) answers `200` with `released: false`, until the "
            "sweeper purges it. The fence goes in the body or in `?fence=`.",
            security=True,
            params=(_CLAIM_ID, Param("fence", "query", FENCE)),
            body=FENCE_REQUEST,
            body_required=False,
            answers={
                "200": Answer("Whether this call released it, and the claim now.", _RELEASED),
                "404": _NOT_FOUND,
                "409": _HOLD_LOST,
                **_COMMON,
            },
        ),
        Operation(
            "POST",
            "/v1/claims/{claim_id}/confirm",
            "api.confirm",
            "confirmClaim",
            "Confirm your live hold",
            security=True,
            params=(_CLAIM_ID,),
            body=FENCE_REQUEST,
            answers={"200": _CLAIM_OK, "404": _NOT_FOUND, "409": _HOLD_LOST, **_COMMON},
        ),
        Operation(
            "POST",
            "/v1/claims/{claim_id}/extend",
            "api.extend",
            "extendClaim",
            "Extend your live hold by `ttl` seconds from now",
            security=True,
            params=(_CLAIM_ID,),
            body=EXTEND_REQUEST,
            answers={"200": _CLAIM_OK, "404": _NOT_FOUND, "409": _HOLD_LOST, **_COMMON},
        ),
        Operation(
            "GET",
            "/v1/resources/{resource}",
            "api.resource",
            "getResource",
            "Is a unit (or a span) free now? A snapshot for display",
            "`?slot=` asks about a unit; `?start=&end=` about a span. Never names another holder.",
            security=True,
            params=(
                Param("resource", "path", RESOURCE, required=True),
                Param("slot", "query", SLOT),
                Param("start", "query", BOUND),
                Param("end", "query", BOUND),
            ),
            answers={"200": Answer("The state now.", _RESOURCE_STATE), **_READ},
        ),
        Operation("GET", "/", "service.page"),
        Operation(
            "GET",
            "/healthz",
            "service.health",
            "health",
            "Liveness: the process answers",
            answers={"200": Answer("Alive.", Obj({"status": Const("ok")}))},
        ),
        Operation(
            "GET",
            "/readyz",
            "service.readiness",
            "readiness",
            "Readiness: the store answers",
            answers={
                "200": Answer(
                    "Ready.",
                    Obj({"status": Const("ready"), "store": Text(description="The URL scheme.")}),
                ),
                "503": _COMMON["503"],
            },
        ),
        Operation(
            "GET",
            "/metrics",
            "service.metrics_page",
            "metrics",
            "Prometheus metrics",
            answers={"200": Answer("Text exposition format.", _TEXT, "text/plain")},
        ),
        Operation("GET", "/openapi.json", "service.openapi"),
        Operation("GET", "/docs", "service.docs"),
        Operation(
            "GET",
            "/v1/lots",
            "patterns.list_lots",
            "listLots",
            "The parking lots this service serves",
            security=True,
            answers={"200": Answer("Names and sizes.", Obj({"lots": Array(LOT)})), **_READ},
        ),
        Operation(
            "GET",
            "/v1/lots/{lot}",
            "patterns.lot",
            "getLot",
            "Each slot of a lot: free, yours or taken (a snapshot)",
            security=True,
            params=(_LOT,),
            answers={
                "200": Answer("The slots now; never whose.", LOT_MAP),
                "404": _error("No such lot."),
                **_READ,
            },
        ),
        Operation(
            "POST",
            "/v1/lots/{lot}/vehicles",
            "patterns.park",
            "parkVehicle",
            "Park a vehicle in `length` adjacent slots the lot picks",
            "Parking a vehicle of yours that is already parked with the "
            "same length answers its position again. Vehicle names are yours: another "
            "holder's `car-1` is another vehicle. `length` is at most the lot's size.",
            security=True,
            params=(_LOT,),
            body=park_request(None),
            answers={
                "201": Answer("Parked; `position` is the first slot.", PARKED, links=_PARKED_LINKS),
                "404": _error("No such lot."),
                "409": _error(
                    "`full`: no run of `length` free slots now; `already_parked`: "
                    "this vehicle is parked with another length; `vehicle_blocked`: "
                    "another claim holds this vehicle's own unit."
                ),
                **_COMMON,
            },
        ),
        Operation(
            "GET",
            "/v1/lots/{lot}/vehicles/{vehicle}",
            "patterns.vehicle",
            "getVehicle",
            "Where your vehicle is parked",
            security=True,
            params=(_LOT, _VEHICLE),
            answers={
                "200": Answer("Its first slot.", PARKED),
                "404": _error("No such lot, or no such vehicle of yours parked there."),
                **_READ,
            },
        ),
        Operation(
            "DELETE",
            "/v1/lots/{lot}/vehicles/{vehicle}",
            "patterns.unpark",
            "unparkVehicle",
            "Free every slot of your vehicle at once",
            security=True,
            params=(_LOT, _VEHICLE),
            answers={
                "200": Answer("Where it was.", PARKED),
                "404": _error("No such lot, or no such vehicle of yours parked there."),
                **_READ,
            },
        ),
        Operation(
            "POST",
            "/v1/match",
            "patterns.match",
            "match",
            "Claim the first free candidate, in order of preference",
            "For dispatch: tries each candidate unit, a few rounds with "
            "jittered backoff. The Idempotency-Key is required: a retry answers the "
            "candidate the first try got; the same key with another body is `422`.",
            security=True,
            params=(Param(_KEY.name, "header", _KEY.schema, True, _KEY.description),),
            body=match_request(max_targets),
            answers={
                "201": Answer(
                    "The candidate claimed, and its claim (which also holds the "
                    "dispatch's own unit).",
                    _MATCHED,
                    headers={"Idempotent-Replayed": "`true` when an earlier try answered."},
                ),
                "409": _error(
                    "`none_free`: every candidate was taken; or `in_progress`: a "
                    "request with this key is still running.",
                    **{"Retry-After": "With `in_progress`."},
                ),
                "422": _error(
                    "This Idempotency-Key was used with other candidates or another ttl."
                ),
                **_COMMON,
            },
        ),
        Operation(
            "POST",
            "/v1/semaphores/{key}/permits",
            "limits.acquire_permit",
            "acquirePermit",
            "Hold one of a semaphore's permits for `ttl` seconds",
            "At most the semaphore's `permits` live holds, across every key and "
            "instance. The permit is a fenced hold you extend "
            "(`POST /v1/claims/{id}/extend`) before its `ttl` ends and release "
            "(`DELETE /v1/claims/{id}`) when done; an HTTP client runs no renewal, "
            "so a permit not extended lapses at its ttl. `wait` waits for a free "
            "permit, never past the request timeout. Send an `Idempotency-Key` to "
            "make retries safe: while the permit lives, the same key and body answer "
            "it again (`Idempotent-Replayed: true`); another body is `422`.",
            security=True,
            params=(_SEMAPHORE, _KEY),
            body=PERMIT_REQUEST,
            answers={
                "201": Answer(
                    "A permit: its slot, the limit, and its claim (a hold).",
                    PERMIT,
                    headers={
                        "Location": _LOCATION,
                        "Idempotent-Replayed": "`true` when this Idempotency-Key answered before.",
                    },
                    links=_PERMIT_LINKS,
                ),
                "404": _error("No such semaphore: none has set its permits."),
                "409": _error(
                    "`no_permit`: every permit is held (`permits`: the limit); or "
                    "`in_progress`: a request with this key is still running.",
                    **{"Retry-After": "With `in_progress`."},
                ),
                "422": _error("This Idempotency-Key was used with a different body."),
                **_COMMON,
            },
        ),
        Operation(
            "GET",
            "/v1/semaphores/{key}",
            "limits.semaphore",
            "getSemaphore",
            "A semaphore's limit and how many hold its permits (a snapshot)",
            security=True,
            params=(_SEMAPHORE,),
            answers={
                "200": Answer("The limit and the counts now; never who holds.", SEMAPHORE),
                "404": _error("No such semaphore: none has set its permits."),
                **_READ,
            },
        ),
        Operation(
            "PUT",
            "/v1/semaphores/{key}",
            "limits.set_permits",
            "setPermits",
            "Set a semaphore's limit, for every client",
            "Creates the semaphore, or changes its limit at run time: a lowered "
            "limit takes no permit back and admits no one new until fewer hold. "
            "Every API key may set it.",
            security=True,
            params=(_SEMAPHORE,),
            body=PERMITS_REQUEST,
            answers={"200": Answer("The semaphore now.", SEMAPHORE), **_COMMON},
        ),
        Operation(
            "POST",
            "/v1/rate-limits/{key}/acquire",
            "limits.acquire_rate",
            "acquireRate",
            "Spend `cost` of a shared rate limit now, or learn when to retry",
            "In any window of the rate's length on the store's clock, the costs "
            "admitted under one key and rate sum to at most its limit, across every "
            "API key and instance. The limit is the pair of `key` and `rate`: "
            "callers sending another rate for the same key have another limit. "
            "Takes no Idempotency-Key (a decision is never replayed): a retry is a "
            "new decision.",
            security=True,
            params=(_RATE_KEY,),
            body=RATE_REQUEST,
            answers={
                **_COMMON,
                "200": Answer("Admitted.", ADMITTED),
                "429": _error(
                    "`over_limit`: the shared limit refused this cost now (`retry_after`: "
                    "exact seconds); or `rate_limited`: this API key's own request rate.",
                    **{"Retry-After": "Whole seconds, rounded up."},
                ),
            },
        ),
        Operation(
            "PUT",
            "/v1/waitlists/{key}",
            "waitlists.configure",
            "setWaitlist",
            "Name the units a waiting list serves, and its offer TTL, for every instance",
            "The list is shared by every API key and instance, and so is what a PUT sets: "
            "it is kept in the store, and every instance on the store uses it from its "
            "next operation on the list (restarted ones too). From now on a unit of "
            "`units` freed by anyone (a release, a hold that lapses, a declined or lapsed "
            "offer) is held for the head of the list for `offer_ttl` seconds, with no "
            "client action; one instance at a time watches (a lease, taken over when it "
            "dies). Two PUTs at once: the later version wins, unless `if_version` makes "
            "each a compare-and-set.",
            security=True,
            params=(_WAITLIST,),
            body=WAITLIST_REQUEST,
            answers={
                "200": Answer("The list now.", WAITLIST),
                "409": _error(
                    "`too_many`: this instance watches as many lists as it may; or "
                    "`version_moved`: `if_version` is not the version in force."
                ),
                **_COMMON,
            },
        ),
        Operation(
            "GET",
            "/v1/waitlists/{key}",
            "waitlists.waitlist",
            "getWaitlist",
            "How many wait, and your place (a snapshot)",
            security=True,
            params=(_WAITLIST,),
            answers={
                "200": Answer("The list now; never who waits.", WAITLIST),
                **_BAD_CONFIG,
                **_READ,
            },
        ),
        Operation(
            "POST",
            "/v1/waitlists/{key}/entries",
            "waitlists.join",
            "joinWaitlist",
            "Join a waiting list at the back",
            "One entry per holder: joining again answers your entry, unmoved. "
            "Entries are served first come, first served.",
            security=True,
            params=(_WAITLIST,),
            body_required=False,
            answers={"200": Answer("Your entry.", WAITLIST_ENTRY), **_COMMON},
        ),
        Operation(
            "DELETE",
            "/v1/waitlists/{key}/entries",
            "waitlists.leave",
            "leaveWaitlist",
            "Leave a waiting list",
            security=True,
            params=(_WAITLIST,),
            answers={"200": Answer("Whether you were on it.", _LEFT), **_READ},
        ),
        Operation(
            "GET",
            "/v1/waitlists/{key}/offers",
            "waitlists.offers",
            "listOffers",
            "The open offers this list made to you (a snapshot)",
            "An offer is a hold on the unit under your holder: accept it before "
            "`expires_at`, or decline it.",
            security=True,
            params=(_WAITLIST,),
            answers={"200": Answer("Your open offers.", _OFFERS), **_READ},
        ),
        Operation(
            "POST",
            "/v1/waitlists/{key}/offers/{claim_id}/accept",
            "waitlists.accept",
            "acceptOffer",
            "Take the offered unit: a fenced confirm, exactly once",
            security=True,
            params=(_WAITLIST, _OFFER_ID),
            body=FENCE_REQUEST,
            answers={
                "200": Answer("The unit, and your confirmed claim.", _ACCEPTED),
                **_OFFER_ACTION,
            },
        ),
        Operation(
            "POST",
            "/v1/waitlists/{key}/offers/{claim_id}/decline",
            "waitlists.decline",
            "declineOffer",
            "Turn an offer down: the unit goes to the next in line",
            security=True,
            params=(_WAITLIST, _OFFER_ID),
            body=FENCE_REQUEST,
            answers={"200": Answer("Declined.", _DECLINED), **_OFFER_ACTION},
        ),
        Operation(
            "POST",
            "/v1/waitlists/{key}/release",
            "waitlists.release",
            "releaseToWaitlist",
            "Release your claim and offer each of its units to the list's head",
            "The release is `DELETE /v1/claims/{id}`'s (fenced); each freed unit is "
            "then held for the head of the list, one unit per entry.",
            security=True,
            params=(_WAITLIST,),
            body=WAITLIST_RELEASE_REQUEST,
            answers={
                "200": Answer(
                    "Whether it was released, and how many units were offered.", _RELEASED_TO_LIST
                ),
                "404": _NOT_FOUND,
                "409": _error(
                    "The hold expired or the fence is stale; or `not_offerable`: the claim "
                    "holds the service's own units (a permit); or `bad_config`."
                ),
                **_COMMON,
            },
        ),
        Operation(
            "GET",
            "/v1/showings",
            "service.showings",
            "listShowings",
            "The showings this service draws seat maps for",
            answers={
                "200": Answer("Slots and grid sizes.", Obj({"showings": Array(SHOWING)})),
                **_MAP,
            },
        ),
        Operation(
            "GET",
            "/v1/showings/{slot}",
            "service.showing",
            "getShowing",
            "Every seat of a showing now (a snapshot)",
            params=(_SHOWING,),
            answers={
                "200": Answer("Seat states; never who holds them.", SEAT_MAP),
                "404": _error("No such showing."),
                "503": _COMMON["503"],
                **_MAP,
            },
        ),
        Operation(
            "GET",
            "/v1/showings/{slot}/events",
            "service.events",
            "showingEvents",
            "The seat map as server-sent events",
            "A `seats` event with a SeatMap at once and after every change "
            "(from any client or service instance); comments keep the stream alive.",
            params=(_SHOWING,),
            answers={
                "200": Answer("An event stream.", Raw({"type": "string"}), "text/event-stream"),
                "404": _error("No such showing."),
                **_MAP,
            },
        ),
    )
