"""JSON on the wire: the limits, the body decoder, and the schema of every value and body.

This module is the one source of the wire format: each value is a schema
object (:mod:`dibs.service._schema`) that both parses it, enforcing its limits,
and renders it as JSON Schema for the OpenAPI document; the route table
(:mod:`dibs.service._routes`) names the bodies below. Every parser raises
:class:`~dibs.InvalidInput` naming the JSON field at fault (``targets[2].slot``),
which the API answers with ``400``. The limits keep every value inside what
every store can represent, so no input can reach a store and fail there;
messages never echo a Python repr. The answers' builders (``claim_to_wire``)
sit beside the schemas that describe them.
"""

from __future__ import annotations

import functools
import json
import math
import re
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from dibs._model import Claim, ClaimState, Span, Target, Unit
from dibs.exceptions import InvalidInput
from dibs.limits import RATE_LIMIT_MAX
from dibs.ratelimit import Rate
from dibs.semaphore import PERMITS_MAX
from dibs.service._ids import WIRE_ID_PATTERN
from dibs.service._schema import (
    Array,
    Boolean,
    Choice,
    Components,
    Enum,
    Integer,
    Json,
    Nullable,
    Number,
    Obj,
    OneOf,
    Prop,
    Raw,
    Schema,
    Text,
    Unstated,
)
from dibs.waitlist import OFFER_TTL

__all__ = [
    "BOUND",
    "BOUND_PATTERN",
    "CLAIM",
    "CLAIMED_TARGET",
    "EXTEND_REQUEST",
    "FENCE",
    "FENCE_REQUEST",
    "MAX_BOUND",
    "MAX_FENCE",
    "MAX_NAME",
    "MAX_TTL",
    "MIN_TTL",
    "NAME",
    "NAME_PATTERN",
    "PERMITS_REQUEST",
    "PERMIT_REQUEST",
    "RATE",
    "RATE_REQUEST",
    "RESERVED",
    "RESOURCE",
    "SLOT",
    "SPAN",
    "TARGET",
    "TIME",
    "UNIT",
    "WAITLIST_RELEASE_REQUEST",
    "WAITLIST_REQUEST",
    "claim_request",
    "claim_to_wire",
    "match_request",
    "park_request",
    "parse_fence",
    "parse_json_object",
    "parse_query_fence",
    "parse_target",
    "request_id_for",
    "target_to_wire",
]

MAX_NAME = 200
"""Characters in a resource, slot, vehicle or lot name (at most 800 UTF-8 bytes)."""
MIN_TTL = 0.001
MAX_TTL = 366 * 24 * 3600
MAX_FENCE = 2**63 - 1
MAX_BOUND = 2**53
"""Numeric span bounds lie in [-MAX_BOUND, MAX_BOUND], where floats are still exact integers."""
RESERVED = "dibs."
"""Resources starting with this are the service's own (match keys, lots): no client claims them."""
# Control characters; the schema refuses lone surrogates too (no UTF-8 store can keep them).
_CONTROL = "\\x00-\\x1f\\x7f-\\x9f"
NAME_PATTERN = f"^[^{_CONTROL}]*$"
# RFC 3339 date-time, ASCII digits only (``datetime.fromisoformat`` takes more than that).
BOUND_PATTERN = (
    "^[0-9]{4}-[0-9]{2}-[0-9]{2}[Tt][0-9]{2}:[0-9]{2}:[0-9]{2}(?:[.][0-9]{1,9})?"
    "(?:[Zz]|[+-][0-9]{2}:[0-9]{2})$"
)
_TIME = re.compile(BOUND_PATTERN)
# A JSON number, as text in a query string.
_NUMBER = re.compile(r"-?(?:0|[1-9][0-9]{0,30})(?:\.[0-9]{1,30})?(?:[eE][+-]?[0-9]{1,3})?")
_FENCE = re.compile(r"[1-9][0-9]{0,18}")
_BOM = b"\xef\xbb\xbf"
_MAX_DIGITS = 40


def _reject_constant(name: str) -> Any:
    raise InvalidInput(f"{name} is not a JSON number", field="body", value=None)


def _parse_int(text: str) -> int:
    if len(text) > _MAX_DIGITS:
        raise InvalidInput("a number in the body is too large", field="body", value=None)
    return int(text)


def _parse_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise InvalidInput("a number in the body is too large", field="body", value=None)
    return value


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    doc = dict(pairs)
    if len(doc) != len(pairs):
        seen: set[str] = set()
        name = next(k for k, _ in pairs if k in seen or seen.add(k))  # type: ignore[func-returns-value]
        raise InvalidInput(f"duplicate key {json.dumps(name)}", field="body", value=None)
    return doc


# Built once: json.loads with hooks builds a decoder per call (~2 us a body).
_DECODER = json.JSONDecoder(
    object_pairs_hook=_unique_keys,
    parse_constant=_reject_constant,
    parse_int=_parse_int,
    parse_float=_parse_float,
)


def parse_json_object(raw: bytes) -> dict[str, Any]:
    """Decode a request body that must be one JSON object, strictly.

    UTF-8 without a byte order mark; no duplicate keys, no NaN or Infinity,
    no number too large for a float. An empty body is ``{}``.
    """
    if not raw:
        return {}
    if raw.startswith(_BOM):
        raise InvalidInput(
            "the body must not start with a byte order mark", field="body", value=None
        )
    try:
        text = raw.decode("utf-8")
        value = _DECODER.decode(text)
    except InvalidInput:
        raise
    except (ValueError, RecursionError):
        raise InvalidInput("the body is not valid JSON", field="body", value=None) from None
    if not isinstance(value, dict):
        raise InvalidInput("the body must be a JSON object", field="body", value=None)
    return value


NAME = Text(
    min_length=1,
    max_length=MAX_NAME,
    forbidden=_CONTROL,
    message="{where} must be a non-empty string of at most "
    f"{MAX_NAME} characters without control characters",
)
"""A resource, vehicle, lot or showing name."""
SLOT = Text(
    max_length=MAX_NAME,
    forbidden=_CONTROL,
    message="{where} must be a string of at most "
    f"{MAX_NAME} characters without control characters",
)
"""A unit's slot: a name that may be empty."""
RESOURCE = Text(
    min_length=1,
    max_length=MAX_NAME,
    forbidden=_CONTROL,
    reserved=RESERVED,
    message=NAME.message,
    reserved_message="{where}: resource names starting with {reserved!r} are reserved",
    description=f"Names starting with `{RESERVED}` are reserved for the service.",
)
"""A resource a client may name: a name, not in the service's own namespace."""


class Bound(Schema):
    """A span bound: a number within ±MAX_BOUND, or an RFC 3339 time with an offset (in UTC)."""

    description = "A number, or an RFC 3339 time with an offset; both bounds of one kind."

    def parse(self, value: Any, where: str) -> int | float | datetime:
        if isinstance(value, bool):
            pass
        elif isinstance(value, int):
            if abs(value) <= MAX_BOUND:
                return value
            raise InvalidInput(f"{where} must be within ±2**53", field=where, value=None)
        elif isinstance(value, float):
            if math.isfinite(value) and abs(value) <= MAX_BOUND:
                return value
            raise InvalidInput(f"{where} must be within ±2**53", field=where, value=None)
        elif isinstance(value, str) and _TIME.match(value):
            try:
                moment = datetime.fromisoformat(value.upper())
                return moment.astimezone(UTC)
            except (ValueError, OverflowError):
                # The pattern and `format: date-time` admit what Python cannot
                # represent (a leap second, a year 1 time west of UTC).
                raise Unstated(f"{where} is not a valid time", field=where, value=None) from None
        raise InvalidInput(
            f"{where} must be a number or an RFC 3339 time with an offset", field=where, value=None
        )

    def body(self, components: Components) -> Json:
        return {
            "oneOf": [
                {"type": "number", "minimum": -MAX_BOUND, "maximum": MAX_BOUND},
                {"type": "string", "format": "date-time", "pattern": BOUND_PATTERN},
            ]
        }


BOUND = Bound()
TTL = Number(
    MIN_TTL, MAX_TTL, message="{where} must be a number of seconds from {minimum:g} to {maximum}"
)
"""A hold's time to live in seconds, on extend (required)."""
FENCE = Integer(1, MAX_FENCE, message="{where} must be an integer from 1 to 2**63-1")

UNIT = Obj(
    {"resource": RESOURCE, "slot": Prop(SLOT, required=False, default="")},
    name="Unit",
    description="One indivisible key, e.g. a seat for a showing.",
)
SPAN = Obj(
    {"resource": RESOURCE, "start": BOUND, "end": BOUND},
    name="Span",
    description="A half-open interval [start, end) on a resource; start < end.",
)


class TargetSchema(Schema):
    """A Unit (``{"resource", "slot"}``) or a Span (``{"resource", "start", "end"}``)."""

    name = "Target"

    def __init__(self, unit: Obj, span: Obj) -> None:
        self.unit, self.span = unit, span
        self._either = Obj({**unit.members, **span.members})
        self._resource = unit.members["resource"].schema
        self._slot = unit.members["slot"]
        self._start = span.members["start"].schema
        self._end = span.members["end"].schema

    def parse(self, item: Any, where: str) -> Target:
        if not isinstance(item, dict):
            raise InvalidInput(f"{where} must be an object", field=where, value=None)
        self._either.unknown(item, where)
        resource = self._resource.parse(item.get("resource"), f"{where}.resource")
        if "start" in item or "end" in item:
            if "slot" in item:
                raise InvalidInput(
                    f"{where} is a unit (slot) or a span (start, end), not both",
                    field=f"{where}.slot",
                    value=None,
                )
            start = self._start.parse(item.get("start"), f"{where}.start")
            end = self._end.parse(item.get("end"), f"{where}.end")
            if isinstance(start, datetime) != isinstance(end, datetime):
                raise Unstated(
                    f"{where}: start and end must both be numbers or both be times",
                    field=f"{where}.end",
                    value=None,
                )
            if not start < end:
                raise Unstated(
                    f"{where}: start {_bound_text(start)} must be before end {_bound_text(end)}",
                    field=f"{where}.end",
                    value=None,
                )
            try:
                return Span(resource, start, end)
            except InvalidInput:
                raise Unstated(f"{where} is not a valid span", field=where, value=None) from None
        slot = self._slot.schema.parse(item.get("slot", self._slot.default), f"{where}.slot")
        return Unit(resource, slot)

    def body(self, components: Components) -> Json:
        return {"oneOf": [components.render(self.unit), components.render(self.span)]}


TARGET = TargetSchema(UNIT, SPAN)


class Targets(Array):
    """A list of targets; ``units=True`` renders (and admits) units only."""

    def __init__(self, limit: int, *, units: bool = False) -> None:
        super().__init__(TARGET, 1, limit, message="{where} must be a list of 1 to {max} targets")
        self.units = units

    def body(self, components: Components) -> Json:
        return {
            **super().body(components),
            "items": components.render(UNIT if self.units else TARGET),
        }


def _only_units(parsed: dict[str, Any], where: str) -> None:
    # After every member (so a bad ttl is named first), as ever.
    if not all(isinstance(c, Unit) for c in parsed["candidates"]):
        raise InvalidInput("candidates are units", field="candidates", value=None)


@functools.cache
def claim_request(max_targets: int) -> Obj:
    """``POST /v1/claims``'s body, for a service with this many targets per claim."""
    ttl = Number(
        MIN_TTL,
        MAX_TTL,
        nullable=True,
        message=TTL.message,
        description="Seconds to hold before confirming; null or absent: confirmed now.",
    )
    return Obj(
        {
            "targets": Targets(max_targets),
            "ttl": Prop(ttl, required=False, default=None),
            "mode": Prop(MODE, required=False, default="exclusive"),
        },
        name="ClaimRequest",
    )


MODE = Choice(
    ("exclusive", "shared"),
    description=(
        "exclusive (the default): no other live claim on the targets; shared: a reader, "
        "beside other shared claims and no exclusive one. Stores without shared claims "
        "refuse shared with 400."
    ),
)


@functools.cache
def match_request(max_targets: int) -> Obj:
    """``POST /v1/match``'s body, for a service with this many candidates per match."""
    ttl = Number(MIN_TTL, MAX_TTL, nullable=True, message=TTL.message)
    return Obj(
        {
            "candidates": Targets(max_targets, units=True),
            "ttl": Prop(ttl, required=False, default=None),
        },
        name="MatchRequest",
        after=_only_units,
    )


@functools.cache
def park_request(size: int | None) -> Obj:
    """``POST /v1/lots/{lot}/vehicles``'s body, for a lot of ``size`` slots.

    The document cannot state a lot's size: its schema is any lot's.
    """
    length = Integer(
        1, size, stated=False, default=1, message="{where} must be an integer in 1..{maximum}"
    )
    return Obj(
        {"vehicle": NAME, "length": Prop(length, required=False, default=1)}, name="ParkRequest"
    )


FENCE_REQUEST = Obj({"fence": FENCE}, name="FenceRequest")
EXTEND_REQUEST = Obj({"fence": FENCE, "ttl": TTL}, name="ExtendRequest")

MAX_WAIT = 60.0
"""The longest ``wait`` for a permit; the request timeout cuts it shorter (docs/service.md)."""
PERMIT_REQUEST = Obj(
    {
        "ttl": TTL,
        "wait": Prop(
            Number(
                0,
                MAX_WAIT,
                message="{where} must be a number of seconds from {minimum:g} to {maximum:g}",
                description="Seconds to wait for a free permit (default 0: answer at once).",
            ),
            required=False,
            default=0.0,
        ),
    },
    name="PermitRequest",
)
MAX_PERMITS = 256
"""The most permits a semaphore takes over HTTP (the library takes up to PERMITS_MAX).

Reading a semaphore, and acquiring under a lowered limit, reads each slot up to
the highest limit it ever had: bounded here, so that no key can make every
other key's requests read ten thousand slots."""
assert MAX_PERMITS <= PERMITS_MAX
MAX_WAITLIST_UNITS = 100
"""The most units one waiting list watches over HTTP: as many as a claim's targets, so the
longest such body stays under the body limit (and a round reads each unit while people wait)."""
WAITLIST_REQUEST = Obj(
    {
        "units": Array(
            UNIT,
            0,
            MAX_WAITLIST_UNITS,
            message="{where} must be a list of at most {max} units",
            description="The units the service offers to the list's head when they come free.",
        ),
        "offer_ttl": Prop(
            Number(
                MIN_TTL,
                MAX_TTL,
                message="{where} must be a number of seconds from {minimum:g} to {maximum}",
                description="Seconds an offer is held for its holder (default 900).",
            ),
            required=False,
            default=OFFER_TTL,
        ),
        "if_version": Prop(
            Integer(
                0,
                MAX_FENCE,
                message="{where} must be an integer from 0 to 2**63-1",
                description="Write only if the list's configuration is at this version now "
                "(0: none was ever PUT); else `409 version_moved`. Without it the last PUT wins.",
            ),
            required=False,
        ),
    },
    name="WaitlistRequest",
)
_WIRE_ID = re.compile(WIRE_ID_PATTERN)


@dataclass(eq=False)
class WireId(Text):
    """A claim's wire ID in a body: the pattern is enforced, not only rendered."""

    pattern: str | None = WIRE_ID_PATTERN
    message: str = "{where} must be a claim ID as the API gave it"

    def parse(self, value: Any, where: str) -> str:
        if not isinstance(value, str) or not _WIRE_ID.fullmatch(value):
            raise InvalidInput(self.message.format(where=where), field=where, value=None)
        return value


WAITLIST_RELEASE_REQUEST = Obj({"claim_id": WireId(), "fence": FENCE}, name="WaitlistRelease")
PERMITS_REQUEST = Obj(
    {
        "permits": Integer(
            0, MAX_PERMITS, message="{where} must be an integer from {minimum} to {maximum}"
        )
    },
    name="PermitsRequest",
)

_SPACE = "[ \\t]*"
RATE_PATTERN = (
    f"^{_SPACE}[0-9]{{1,30}}{_SPACE}(/|[ \\t]+[Pp][Ee][Rr][ \\t]+){_SPACE}"
    f"([0-9]{{1,30}}([.][0-9]{{1,30}})?)?{_SPACE}[A-Za-z]{{1,20}}{_SPACE}$"
)
_RATE_SHAPE = re.compile(RATE_PATTERN.removeprefix("^").removesuffix("$"))


class RateText(Schema):
    """A rate such as ``"10/s"`` (:meth:`dibs.Rate.parse`'s text, spaces and tabs only).

    The pattern states its shape; the units it names and the limits of its
    count and window are :class:`Unstated` (JSON Schema cannot state them).
    """

    name = "Rate"
    description = (
        "`<limit>/<unit>`, `<limit>/<number><unit>` or `<limit> per [<number>] <unit>`; "
        f"units us, ms, s, m, h, d (or their names); limit 1 to {RATE_LIMIT_MAX}, "
        "window 0.001 s to 366 days in whole microseconds."
    )

    def parse(self, value: Any, where: str) -> Rate:
        if not isinstance(value, str) or _RATE_SHAPE.fullmatch(value) is None:
            raise InvalidInput(
                f"{where} must be a rate such as '10/s', '100/minute' or '3 per hour'",
                field=where,
                value=None,
            )
        try:
            return Rate.parse(value)
        except InvalidInput:
            raise Unstated(
                f"{where} names an unknown unit, or a limit or window out of range",
                field=where,
                value=None,
            ) from None

    def body(self, components: Components) -> Json:
        return {"type": "string", "pattern": RATE_PATTERN, "examples": ["10/s", "100/minute"]}


RATE = RateText()


def _cost_within(parsed: dict[str, Any], where: str) -> None:
    if parsed["cost"] > parsed["rate"].limit:
        raise Unstated(
            f"cost must be at most the rate's limit {parsed['rate'].limit}",
            field="cost",
            value=None,
        )


RATE_REQUEST = Obj(
    {
        "rate": RATE,
        "cost": Prop(
            Integer(
                1,
                RATE_LIMIT_MAX,
                default=1,
                message="{where} must be an integer from {minimum} to the rate's limit",
            ),
            required=False,
            default=1,
        ),
    },
    name="RateRequest",
    after=_cost_within,
)
"""``POST /v1/rate-limits/{key}/acquire``'s body."""


def _bound_text(value: int | float | datetime) -> str:
    return _time(value) if isinstance(value, datetime) else json.dumps(value)


def parse_target(item: object, where: str) -> Target:
    """Parse ``{"resource", "slot"}`` as a Unit, ``{"resource", "start", "end"}`` as a Span."""
    return TARGET.parse(item, where)


def parse_fence(value: object) -> int:
    """A fence from a JSON body: a JSON integer from 1 to 2**63-1 (not a string, not 5.0)."""
    return FENCE.parse(value, "fence")


def parse_query_fence(text: str) -> int:
    """A fence from a query string: ASCII digits, no sign, no leading zero."""
    if _FENCE.fullmatch(text):
        return FENCE.parse(int(text), "fence")
    # Any other number ("5.0", "5e0") or text is refused as in a body.
    return FENCE.parse(parse_query_bound(text), "fence")


def parse_query_bound(text: str) -> object:
    """A span bound from a query string: a JSON number, else the text (a time, or bad)."""
    if _NUMBER.fullmatch(text):
        number = json.loads(text)
        if isinstance(number, float) and not math.isfinite(number):
            return text
        return number
    return text


def _time(moment: datetime) -> str:
    return moment.astimezone(UTC).isoformat().replace("+00:00", "Z")


def time_to_wire(moment: datetime | None) -> str | None:
    """An RFC 3339 time in UTC (``…Z``), or None."""
    return None if moment is None else _time(moment)


def _bound_to_wire(value: int | float | datetime) -> int | float | str:
    return _time(value) if isinstance(value, datetime) else value


def target_to_wire(target: Target) -> dict[str, Any]:
    """A target as JSON: ``{"resource", "slot"}`` or ``{"resource", "start", "end"}``."""
    if isinstance(target, Unit):
        return {"resource": target.resource, "slot": target.slot}
    return {
        "resource": target.resource,
        "start": _bound_to_wire(target.start),
        "end": _bound_to_wire(target.end),
    }


TIME = Text(format="date-time")
_ANY_TEXT = Text()
_NUMBER_OR_TEXT = Raw({"type": ["number", "string"]})
CLAIMED_TARGET = OneOf(
    (
        Obj({"resource": _ANY_TEXT, "slot": _ANY_TEXT}),
        Obj({"resource": _ANY_TEXT, "start": _NUMBER_OR_TEXT, "end": _NUMBER_OR_TEXT}),
    ),
    description="A target as stored: a unit, or a span (bounds: numbers or times).",
).named("ClaimedTarget")
"""What :func:`target_to_wire` makes."""
CLAIM = Obj(
    {
        "id": Text(pattern=WIRE_ID_PATTERN),
        "holder": _ANY_TEXT,
        "targets": Array(CLAIMED_TARGET),
        "state": Enum(tuple(str(s) for s in ClaimState)),
        "fence": Integer(),
        "expires_at": Nullable(TIME),
        "idempotency_key": Nullable(_ANY_TEXT),
        "created_at": TIME,
        "updated_at": TIME,
        "taken_over": Boolean(),
        "mode": Enum(("exclusive", "shared")),
    },
    name="Claim",
)
"""What :func:`claim_to_wire` makes."""


def claim_to_wire(claim: Claim, wire_id: str) -> dict[str, Any]:
    """A claim as JSON, under its wire ID; the store's request ID becomes the Idempotency-Key."""
    key = None
    if claim.request_id is not None:
        # request IDs are "<len(holder)>:<holder>:<key>", see request_id_for()
        size, _, rest = claim.request_id.partition(":")
        key = rest[int(size) + 1 :] if size.isascii() and size.isdigit() else None
    return {
        "id": wire_id,
        "holder": claim.holder,
        "targets": [target_to_wire(t) for t in claim.targets],
        "state": str(claim.state),
        "fence": claim.fence,
        "expires_at": time_to_wire(claim.expires_at),
        "idempotency_key": key,
        "created_at": time_to_wire(claim.created_at),
        "updated_at": time_to_wire(claim.updated_at),
        "taken_over": claim.taken_over,
        "mode": claim.mode,
    }


def request_id_for(holder: str, key: str) -> str:
    """The store request ID for a holder's Idempotency-Key; holders' keys never collide.

    The holder's length prefixes it, so no (holder, key) pair can spell another's.
    """
    return f"{len(holder)}:{holder}:{key}"
