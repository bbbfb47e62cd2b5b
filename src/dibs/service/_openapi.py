"""The OpenAPI 3.1 document of the service, written by hand, and its HTML rendering.

Hand-written so that it says exactly what the handlers do (statuses, error
codes, headers); ``tests/service/test_service_api.py`` checks that it validates, that
its paths are the app's routes, and schemathesis checks the live service
against it.
"""

from __future__ import annotations

import html
import json
from functools import cache
from typing import Any

from dibs.service._guard import KEY_PATTERN, MAX_KEY, MAX_KEY_HEADER, PROBLEM_JSON, PROBLEMS
from dibs.service._ids import WIRE_ID_PATTERN
from dibs.service._wire import (
    BOUND_PATTERN,
    MAX_BOUND,
    MAX_FENCE,
    MAX_NAME,
    MAX_TTL,
    MIN_TTL,
    NAME_PATTERN,
    RESERVED,
)

__all__ = ["openapi_document", "render_docs"]

# Every limit below comes from _wire (or _guard, _ids), where the parsers enforce it.
_NAME = {"type": "string", "minLength": 1, "maxLength": MAX_NAME, "pattern": NAME_PATTERN}
_SLOT = {**_NAME, "minLength": 0}
_RESOURCE = {
    **_NAME,
    "not": {"pattern": "^" + RESERVED.replace(".", "\\.")},
    "description": f"Names starting with `{RESERVED}` are reserved for the service.",
}
_BOUND = {
    "oneOf": [
        {"type": "number", "minimum": -MAX_BOUND, "maximum": MAX_BOUND},
        {"type": "string", "format": "date-time", "pattern": BOUND_PATTERN},
    ],
    "description": "A number, or an RFC 3339 time with an offset; both bounds of one kind.",
}
_TTL = {"type": "number", "minimum": MIN_TTL, "maximum": MAX_TTL}
_FENCE = {"type": "integer", "minimum": 1, "maximum": MAX_FENCE}
_TIME = {"type": ["string", "null"], "format": "date-time"}


def _ref(name: str) -> dict[str, str]:
    return {"$ref": f"#/components/schemas/{name}"}


def _json(schema: dict[str, Any], description: str, **headers: str) -> dict[str, Any]:
    answer: dict[str, Any] = {
        "description": description,
        "content": {"application/json": {"schema": schema}},
    }
    if headers:
        answer["headers"] = {
            name: {"description": text, "schema": {"type": "string"}}
            for name, text in headers.items()
        }
    return answer


def _error(description: str, **headers: str) -> dict[str, Any]:
    answer = _json(_ref("Error"), description, **headers)
    answer["content"] = {PROBLEM_JSON: answer["content"]["application/json"]}
    return answer


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
_MAP = {
    "401": _error("With `--private-map`: no valid API key."),
    "429": _COMMON["429"],
}
_CLAIM_ID = {
    "name": "claim_id",
    "in": "path",
    "required": True,
    "description": "The claim's opaque ID, as the API gave it.",
    "schema": {"type": "string", "pattern": WIRE_ID_PATTERN},
}
_SLOT_PARAM = {"name": "slot", "in": "path", "required": True, "schema": _NAME}
_KEY_HEADER = {
    "name": "Idempotency-Key",
    "in": "header",
    "required": False,
    "description": 'A Structured Field string, e.g. "4e1d…" (IETF draft), or a bare token: '
    f"a key of 1-{MAX_KEY} printable ASCII characters (the quotes and escapes do not count). "
    "Remembered for the store's request retention (24 h by default) from its first use.",
    "schema": {"type": "string", "maxLength": MAX_KEY_HEADER, "pattern": KEY_PATTERN},
}
_LOT = {"name": "lot", "in": "path", "required": True, "schema": _NAME}
_VEHICLE = {"name": "vehicle", "in": "path", "required": True, "schema": _NAME}
_NOT_FOUND = _error("No such claim of yours (another holder's claim is also 404).")
_HOLD_LOST = _error("The hold expired, was taken over or released, or the fence is stale.")


def _body(schema: dict[str, Any], required: bool = True) -> dict[str, Any]:
    return {"required": required, "content": {"application/json": {"schema": schema}}}


def _schemas(max_targets: int) -> dict[str, Any]:
    return {
        "Unit": {
            "type": "object",
            "description": "One indivisible key, e.g. a seat for a showing.",
            "properties": {"resource": _RESOURCE, "slot": _SLOT},
            "required": ["resource"],
            "additionalProperties": False,
        },
        "Span": {
            "type": "object",
            "description": "A half-open interval [start, end) on a resource; start < end.",
            "properties": {"resource": _RESOURCE, "start": _BOUND, "end": _BOUND},
            "required": ["resource", "start", "end"],
            "additionalProperties": False,
        },
        "Target": {"oneOf": [_ref("Unit"), _ref("Span")]},
        "ClaimedTarget": {
            "description": "A target as stored: a unit, or a span (bounds: numbers or times).",
            "oneOf": [
                {
                    "type": "object",
                    "properties": {"resource": {"type": "string"}, "slot": {"type": "string"}},
                    "required": ["resource", "slot"],
                    "additionalProperties": False,
                },
                {
                    "type": "object",
                    "properties": {
                        "resource": {"type": "string"},
                        "start": {"type": ["number", "string"]},
                        "end": {"type": ["number", "string"]},
                    },
                    "required": ["resource", "start", "end"],
                    "additionalProperties": False,
                },
            ],
        },
        "ClaimRequest": {
            "type": "object",
            "properties": {
                "targets": {
                    "type": "array",
                    "items": _ref("Target"),
                    "minItems": 1,
                    "maxItems": max_targets,
                },
                "ttl": {
                    **_TTL,
                    "type": ["number", "null"],
                    "description": "Seconds to hold before confirming; null or absent: "
                    "confirmed now.",
                },
            },
            "required": ["targets"],
            "additionalProperties": False,
        },
        "FenceRequest": {
            "type": "object",
            "properties": {"fence": _FENCE},
            "required": ["fence"],
            "additionalProperties": False,
        },
        "ExtendRequest": {
            "type": "object",
            "properties": {"fence": _FENCE, "ttl": _TTL},
            "required": ["fence", "ttl"],
            "additionalProperties": False,
        },
        "Claim": {
            "type": "object",
            "properties": {
                "id": {"type": "string", "pattern": WIRE_ID_PATTERN},
                "holder": {"type": "string"},
                "targets": {"type": "array", "items": _ref("ClaimedTarget")},
                "state": {"enum": ["held", "confirmed", "released", "expired"]},
                "fence": {"type": "integer"},
                "expires_at": _TIME,
                "idempotency_key": {"type": ["string", "null"]},
                "created_at": {"type": "string", "format": "date-time"},
                "updated_at": {"type": "string", "format": "date-time"},
                "taken_over": {"type": "boolean"},
            },
            "required": [
                "id",
                "holder",
                "targets",
                "state",
                "fence",
                "expires_at",
                "idempotency_key",
                "created_at",
                "updated_at",
                "taken_over",
            ],
        },
        "Error": {
            "type": "object",
            "description": "An RFC 9457 problem details document; `error` and `message` "
            "are the service's own members (the code and the text clients read before).",
            "properties": {
                "type": {
                    "type": "string",
                    "format": "uri-reference",
                    "description": "The problem type: `/docs#problem-<error>` on this service.",
                },
                "title": {"type": "string", "description": "The same for every `error` code."},
                "status": {"type": "integer", "minimum": 400, "maximum": 599},
                "detail": {"type": "string"},
                "instance": {"type": "string", "format": "uri-reference"},
                "error": {
                    "type": "string",
                    "description": "A stable code: " + ", ".join(PROBLEMS) + ".",
                },
                "message": {"type": "string", "description": "The same text as `detail`."},
                "field": {"type": "string", "description": "With `invalid`: the field at fault."},
                "reason": {
                    "enum": ["expired", "taken_over", "released", "fence"],
                    "description": "With `hold_lost`.",
                },
                "taken": {
                    "type": "array",
                    "items": _ref("ClaimedTarget"),
                    "description": "With `taken`: your targets that someone else holds.",
                },
                "request_id": {"type": "string", "description": "With `internal`."},
            },
            "required": ["type", "title", "status", "detail", "error", "message"],
        },
        "Lot": {
            "type": "object",
            "properties": {"name": {"type": "string"}, "size": {"type": "integer"}},
            "required": ["name", "size"],
        },
        "Showing": {
            "type": "object",
            "properties": {
                "slot": {"type": "string"},
                "rows": {"type": "integer"},
                "cols": {"type": "integer"},
            },
            "required": ["slot", "rows", "cols"],
        },
        "ParkRequest": {
            "type": "object",
            "properties": {
                "vehicle": _NAME,
                "length": {"type": "integer", "minimum": 1, "default": 1},
            },
            "required": ["vehicle"],
            "additionalProperties": False,
        },
        "Parked": {
            "type": "object",
            "properties": {
                "lot": {"type": "string"},
                "vehicle": {"type": "string"},
                "position": {"type": "integer"},
                "length": {"type": "integer"},
            },
            "required": ["lot", "vehicle", "position"],
        },
        "LotMap": {
            "type": "object",
            "properties": {
                "snapshot": {"const": True},
                "name": {"type": "string"},
                "size": {"type": "integer"},
                "free": {"type": "integer"},
                "largest_free_run": {"type": "integer"},
                "slots": {
                    "type": "array",
                    "items": {
                        "type": "object",
                        "properties": {
                            "state": {"enum": ["free", "yours", "taken"]},
                            "vehicle": {"type": "string"},
                        },
                        "required": ["state"],
                    },
                },
            },
            "required": ["snapshot", "name", "size", "free", "largest_free_run", "slots"],
        },
        "MatchRequest": {
            "type": "object",
            "properties": {
                "candidates": {
                    "type": "array",
                    "items": _ref("Unit"),
                    "minItems": 1,
                    "maxItems": max_targets,
                },
                "ttl": {**_TTL, "type": ["number", "null"]},
            },
            "required": ["candidates"],
            "additionalProperties": False,
        },
        "Seat": {
            "type": "object",
            "properties": {"state": {"enum": ["free", "held", "confirmed"]}, "expires_at": _TIME},
            "required": ["state", "expires_at"],
        },
        "SeatMap": {
            "type": "object",
            "properties": {
                "slot": {"type": "string"},
                "rows": {"type": "integer"},
                "cols": {"type": "integer"},
                "snapshot": {"const": True},
                "now": {"type": "string", "format": "date-time"},
                "version": {"type": "integer"},
                "seats": {"type": "object", "additionalProperties": _ref("Seat")},
            },
            "required": ["slot", "rows", "cols", "snapshot", "now", "seats"],
        },
    }


_CLAIM_OK = _json(_ref("Claim"), "The claim as stored now.")
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


def _named(param: dict[str, Any], names: tuple[str, ...]) -> dict[str, Any]:
    """A path parameter that names one of this service's lots or showings."""
    if not names:
        return param
    return {**param, "schema": {**param["schema"], "examples": list(names)}, "example": names[0]}


def _paths(lots: tuple[str, ...], showings: tuple[str, ...]) -> dict[str, Any]:
    auth: list[dict[str, list[str]]] = [{"bearer": []}]
    lot, slot = _named(_LOT, lots), _named(_SLOT_PARAM, showings)
    parked_links = {
        name: {
            "operationId": op,
            "parameters": {"lot": "$request.path.lot", "vehicle": "$response.body#/vehicle"},
        }
        for name, op in (("GetVehicle", "getVehicle"), ("UnparkVehicle", "unparkVehicle"))
    }
    return {
        "/v1/claims": {
            "post": {
                "summary": "Claim every target or none",
                "description": "All-or-nothing. With `ttl` the claim is a hold to confirm "
                "before it expires; without, it is confirmed at once. Send an "
                "`Idempotency-Key` to make retries safe: the same key and body replay the "
                "first answer (`Idempotent-Replayed: true`); a concurrent duplicate waits "
                "for the first request's answer, and one with another body waits for the "
                "first to end and is then `422`. Re-claiming exactly the targets of a "
                "live claim of yours answers that claim with `200` (the natural key).",
                "operationId": "createClaim",
                "security": auth,
                "parameters": [_KEY_HEADER],
                "requestBody": _body(_ref("ClaimRequest")),
                "responses": {
                    "201": {
                        **_json(
                            _ref("Claim"),
                            "Granted (or this Idempotency-Key's replay).",
                            Location="The claim's URL.",
                            **{
                                "Idempotent-Replayed": "`true` when this Idempotency-Key "
                                "answered before."
                            },
                        ),
                        "links": _CLAIM_LINKS,
                    },
                    "200": {
                        **_json(
                            _ref("Claim"),
                            "You already hold exactly these targets: that claim.",
                            Location="The claim's URL.",
                        ),
                        "links": _CLAIM_LINKS,
                    },
                    "409": _error(
                        "`taken`: someone else holds some targets (listed, never who); or "
                        "`in_progress`: a request with this key is still running.",
                        **{"Retry-After": "With `in_progress`."},
                    ),
                    "422": _error("This Idempotency-Key was used with a different body."),
                    **_COMMON,
                },
            },
            "get": {
                "summary": "Your live claims (a snapshot)",
                "operationId": "listClaims",
                "security": auth,
                "parameters": [
                    {
                        "name": "holder",
                        "in": "query",
                        "required": False,
                        "schema": {"type": "string", "default": "me"},
                        "description": "`me` (or your own holder name).",
                    }
                ],
                "responses": {
                    "200": _json(
                        {
                            "type": "object",
                            "properties": {
                                "snapshot": {"const": True},
                                "holder": {
                                    "type": "string",
                                    "description": "Who you are: your API key's holder.",
                                },
                                "claims": {"type": "array", "items": _ref("Claim")},
                            },
                            "required": ["snapshot", "holder", "claims"],
                        },
                        "Who you are, and your held and confirmed claims.",
                    ),
                    "403": _error("`holder` names someone else."),
                    **_READ,
                },
            },
        },
        "/v1/claims/{claim_id}": {
            "get": {
                "summary": "One of your claims",
                "operationId": "getClaim",
                "security": auth,
                "parameters": [_CLAIM_ID],
                "responses": {"200": _CLAIM_OK, "404": _NOT_FOUND, **_READ},
            },
            "delete": {
                "summary": "Release your claim",
                "description": "Idempotent: releasing a claim of yours that already ended "
                "(released or expired) answers `200` with `released: false`, until the "
                "sweeper purges it. The fence goes in the body or in `?fence=`.",
                "operationId": "releaseClaim",
                "security": auth,
                "parameters": [
                    _CLAIM_ID,
                    {
                        "name": "fence",
                        "in": "query",
                        "required": False,
                        "schema": _FENCE,
                    },
                ],
                "requestBody": _body(_ref("FenceRequest"), required=False),
                "responses": {
                    "200": _json(
                        {
                            "type": "object",
                            "properties": {
                                "released": {"type": "boolean"},
                                "claim": {"oneOf": [_ref("Claim"), {"type": "null"}]},
                            },
                            "required": ["released", "claim"],
                        },
                        "Whether this call released it, and the claim now.",
                    ),
                    "404": _NOT_FOUND,
                    "409": _HOLD_LOST,
                    **_COMMON,
                },
            },
        },
        "/v1/claims/{claim_id}/confirm": {
            "post": {
                "summary": "Confirm your live hold",
                "operationId": "confirmClaim",
                "security": auth,
                "parameters": [_CLAIM_ID],
                "requestBody": _body(_ref("FenceRequest")),
                "responses": {"200": _CLAIM_OK, "404": _NOT_FOUND, "409": _HOLD_LOST, **_COMMON},
            }
        },
        "/v1/claims/{claim_id}/extend": {
            "post": {
                "summary": "Extend your live hold by `ttl` seconds from now",
                "operationId": "extendClaim",
                "security": auth,
                "parameters": [_CLAIM_ID],
                "requestBody": _body(_ref("ExtendRequest")),
                "responses": {"200": _CLAIM_OK, "404": _NOT_FOUND, "409": _HOLD_LOST, **_COMMON},
            }
        },
        "/v1/resources/{resource}": {
            "get": {
                "summary": "Is a unit (or a span) free now? A snapshot for display",
                "description": "`?slot=` asks about a unit; `?start=&end=` about a span. "
                "Never names another holder.",
                "operationId": "getResource",
                "security": auth,
                "parameters": [
                    {"name": "resource", "in": "path", "required": True, "schema": _RESOURCE},
                    {"name": "slot", "in": "query", "required": False, "schema": _SLOT},
                    {"name": "start", "in": "query", "required": False, "schema": _BOUND},
                    {"name": "end", "in": "query", "required": False, "schema": _BOUND},
                ],
                "responses": {
                    "200": _json(
                        {
                            "type": "object",
                            "properties": {
                                "snapshot": {"const": True},
                                "as_of": {"type": "string", "format": "date-time"},
                                "target": _ref("Target"),
                                "state": {"enum": ["free", "yours", "taken"]},
                            },
                            "required": ["snapshot", "as_of", "target", "state"],
                        },
                        "The state now.",
                    ),
                    **_READ,
                },
            }
        },
        "/v1/lots": {
            "get": {
                "summary": "The parking lots this service serves",
                "operationId": "listLots",
                "security": auth,
                "responses": {
                    "200": _json(
                        {
                            "type": "object",
                            "properties": {"lots": {"type": "array", "items": _ref("Lot")}},
                            "required": ["lots"],
                        },
                        "Names and sizes.",
                    ),
                    **_READ,
                },
            }
        },
        "/v1/lots/{lot}": {
            "get": {
                "summary": "Each slot of a lot: free, yours or taken (a snapshot)",
                "operationId": "getLot",
                "security": auth,
                "parameters": [lot],
                "responses": {
                    "200": _json(_ref("LotMap"), "The slots now; never whose."),
                    "404": _error("No such lot."),
                    **_READ,
                },
            }
        },
        "/v1/lots/{lot}/vehicles": {
            "post": {
                "summary": "Park a vehicle in `length` adjacent slots the lot picks",
                "description": "Parking a vehicle of yours that is already parked with the "
                "same length answers its position again. Vehicle names are yours: another "
                "holder's `car-1` is another vehicle.",
                "operationId": "parkVehicle",
                "security": auth,
                "parameters": [lot],
                "requestBody": _body(_ref("ParkRequest")),
                "responses": {
                    "201": {
                        **_json(_ref("Parked"), "Parked; `position` is the first slot."),
                        "links": parked_links,
                    },
                    "404": _error("No such lot."),
                    "409": _error(
                        "`full`: no run of `length` free slots now; `already_parked`: "
                        "this vehicle is parked with another length; `vehicle_blocked`: "
                        "another claim holds this vehicle's own unit."
                    ),
                    **_COMMON,
                },
            }
        },
        "/v1/lots/{lot}/vehicles/{vehicle}": {
            "get": {
                "summary": "Where your vehicle is parked",
                "operationId": "getVehicle",
                "security": auth,
                "parameters": [lot, _VEHICLE],
                "responses": {
                    "200": _json(_ref("Parked"), "Its first slot."),
                    "404": _error("No such lot, or no such vehicle of yours parked there."),
                    **_READ,
                },
            },
            "delete": {
                "summary": "Free every slot of your vehicle at once",
                "operationId": "unparkVehicle",
                "security": auth,
                "parameters": [lot, _VEHICLE],
                "responses": {
                    "200": _json(_ref("Parked"), "Where it was."),
                    "404": _error("No such lot, or no such vehicle of yours parked there."),
                    **_READ,
                },
            },
        },
        "/v1/match": {
            "post": {
                "summary": "Claim the first free candidate, in order of preference",
                "description": "For dispatch: tries each candidate unit, a few rounds with "
                "jittered backoff. The Idempotency-Key is required: a retry answers the "
                "candidate the first try got; the same key with another body is `422`.",
                "operationId": "match",
                "security": auth,
                "parameters": [{**_KEY_HEADER, "required": True}],
                "requestBody": _body(_ref("MatchRequest")),
                "responses": {
                    "201": _json(
                        {
                            "type": "object",
                            "properties": {"candidate": _ref("Unit"), "claim": _ref("Claim")},
                            "required": ["candidate", "claim"],
                        },
                        "The candidate claimed, and its claim (which also holds the "
                        "dispatch's own unit).",
                        **{"Idempotent-Replayed": "`true` when an earlier try answered."},
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
            }
        },
        "/v1/showings": {
            "get": {
                "summary": "The showings this service draws seat maps for",
                "operationId": "listShowings",
                "responses": {
                    "200": _json(
                        {
                            "type": "object",
                            "properties": {"showings": {"type": "array", "items": _ref("Showing")}},
                            "required": ["showings"],
                        },
                        "Slots and grid sizes.",
                    ),
                    **_MAP,
                },
            }
        },
        "/v1/showings/{slot}": {
            "get": {
                "summary": "Every seat of a showing now (a snapshot)",
                "operationId": "getShowing",
                "parameters": [slot],
                "responses": {
                    "200": _json(_ref("SeatMap"), "Seat states; never who holds them."),
                    "404": _error("No such showing."),
                    "503": _COMMON["503"],
                    **_MAP,
                },
            }
        },
        "/v1/showings/{slot}/events": {
            "get": {
                "summary": "The seat map as server-sent events",
                "description": "A `seats` event with a SeatMap at once and after every change "
                "(from any client or service instance); comments keep the stream alive.",
                "operationId": "showingEvents",
                "parameters": [slot],
                "responses": {
                    "200": {
                        "description": "An event stream.",
                        "content": {"text/event-stream": {"schema": {"type": "string"}}},
                    },
                    "404": _error("No such showing."),
                    **_MAP,
                },
            }
        },
        "/healthz": {
            "get": {
                "summary": "Liveness: the process answers",
                "operationId": "health",
                "responses": {
                    "200": _json(
                        {
                            "type": "object",
                            "properties": {"status": {"const": "ok"}},
                            "required": ["status"],
                        },
                        "Alive.",
                    )
                },
            }
        },
        "/readyz": {
            "get": {
                "summary": "Readiness: the store answers",
                "operationId": "readiness",
                "responses": {
                    "200": _json(
                        {
                            "type": "object",
                            "properties": {
                                "status": {"const": "ready"},
                                "store": {"type": "string", "description": "The URL scheme."},
                            },
                            "required": ["status", "store"],
                        },
                        "Ready.",
                    ),
                    "503": _COMMON["503"],
                },
            }
        },
        "/metrics": {
            "get": {
                "summary": "Prometheus metrics",
                "operationId": "metrics",
                "responses": {
                    "200": {
                        "description": "Text exposition format.",
                        "content": {"text/plain": {"schema": {"type": "string"}}},
                    }
                },
            }
        },
    }


@cache
def _document_text(max_targets: int, lots: tuple[str, ...], showings: tuple[str, ...]) -> str:
    return json.dumps(
        {
            "openapi": "3.1.0",
            "info": {
                "title": "dibs",
                "version": "1",
                "description": "Claim a named, indivisible thing exactly once. The holder is "
                "always the API key's; another holder's claims answer 404.",
            },
            "paths": _paths(lots, showings),
            "components": {
                "schemas": _schemas(max_targets),
                "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
            },
        }
    )


def openapi_document(
    max_targets: int = 100, lots: tuple[str, ...] = (), showings: tuple[str, ...] = ()
) -> dict[str, Any]:
    """A fresh copy of the OpenAPI document of a service with these limits, lots and showings."""
    doc: dict[str, Any] = json.loads(_document_text(max_targets, lots, showings))
    return doc


def render_docs(doc: dict[str, Any]) -> str:
    """The document as one self-contained HTML page (no scripts, no CDN)."""
    esc = html.escape
    parts = [
        "<!doctype html><meta charset=utf-8><title>dibs API</title>",
        "<style>body{font:15px/1.45 system-ui,sans-serif;max-width:60em;margin:2em auto;"
        "padding:0 1em}code,pre{background:#f4f4f4;padding:.1em .3em}pre{padding:.6em;"
        "overflow:auto}h2{border-top:1px solid #ddd;padding-top:.8em}.m{font-weight:bold;"
        "text-transform:uppercase;margin-right:.5em}</style>",
        f"<h1>{esc(doc['info']['title'])} API v{esc(doc['info']['version'])}</h1>",
        f"<p>{esc(doc['info']['description'])}</p>",
        '<p>Machine-readable: <a href="/openapi.json">/openapi.json</a>.</p>',
    ]
    for path, item in doc["paths"].items():
        for method, op in item.items():
            parts.append(
                f"<h2 id={esc(op['operationId'])}><span class=m>{esc(method)}</span>"
                f"<code>{esc(path)}</code></h2><p><b>{esc(op['summary'])}</b></p>"
            )
            if "description" in op:
                parts.append(f"<p>{esc(op['description'])}</p>")
            if op.get("security"):
                parts.append("<p>Needs <code>Authorization: Bearer &lt;API key&gt;</code>.</p>")
            for param in op.get("parameters", []):
                parts.append(
                    f"<p>{esc(param['in'])} <code>{esc(param['name'])}</code>"
                    f"{' (required)' if param.get('required') else ''} "
                    f"{esc(param.get('description', ''))}</p>"
                )
            if "requestBody" in op:
                schema = op["requestBody"]["content"]["application/json"]["schema"]
                name = schema.get("$ref", "").rsplit("/", 1)[-1]
                body = doc["components"]["schemas"].get(name, schema)
                parts.append(
                    f"<p>Body <code>{esc(name)}</code>:</p>"
                    f"<pre>{esc(json.dumps(body, indent=1))}</pre>"
                )
            parts.append("<ul>")
            for status, answer in op["responses"].items():
                parts.append(f"<li><code>{esc(status)}</code> {esc(answer['description'])}</li>")
            parts.append("</ul>")
    parts.append(
        "<h2 id=problems>Problems</h2><p>Every error is an RFC 9457 problem "
        "details document (<code>application/problem+json</code>); its "
        "<code>type</code> links here.</p>"
    )
    for code, (title, text) in PROBLEMS.items():
        parts.append(
            f"<h3 id=problem-{esc(code)}><code>{esc(code)}</code>: {esc(title)}</h3>"
            f"<p>{esc(text)}</p>"
        )
    parts.append("<h2>Schemas</h2>")
    for name, schema in doc["components"]["schemas"].items():
        parts.append(
            f"<h3 id={esc(name)}>{esc(name)}</h3><pre>{esc(json.dumps(schema, indent=1))}</pre>"
        )
    return "".join(parts)
