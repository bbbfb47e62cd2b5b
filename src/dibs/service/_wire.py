"""JSON on the wire: the limits, the body decoder, the parsers of targets and numbers, claims.

This module is the one source of the wire format's limits: the parsers here
enforce them and ``_openapi.py`` builds its schemas from the same constants.
Every parser raises :class:`~dibs.InvalidInput` naming the JSON field at fault
(``targets[2].slot``), which the API answers with ``400``. The limits keep
every value inside what every store can represent, so no input can reach a
store and fail there; messages never echo a Python repr.
"""

from __future__ import annotations

import json
import math
import re
from datetime import UTC, datetime
from typing import Any

from dibs._model import Claim, Span, Target, Unit
from dibs.exceptions import InvalidInput

__all__ = [
    "BOUND_PATTERN",
    "MAX_BOUND",
    "MAX_FENCE",
    "MAX_NAME",
    "MAX_TTL",
    "MIN_TTL",
    "NAME_PATTERN",
    "RESERVED",
    "check_name",
    "check_resource",
    "claim_to_wire",
    "parse_fence",
    "parse_json_object",
    "parse_query_fence",
    "parse_target",
    "parse_targets",
    "parse_ttl",
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
NAME_PATTERN = "^[^\\x00-\\x1f\\x7f-\\x9f]*$"
# Control characters, and lone surrogates (not encodable as UTF-8, so no store can keep them).
_CONTROL = re.compile("[\\x00-\\x1f\\x7f-\\x9f\\ud800-\\udfff]")
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
        value = json.loads(
            text,
            object_pairs_hook=_unique_keys,
            parse_constant=_reject_constant,
            parse_int=_parse_int,
            parse_float=_parse_float,
        )
    except InvalidInput:
        raise
    except (ValueError, RecursionError):
        raise InvalidInput("the body is not valid JSON", field="body", value=None) from None
    if not isinstance(value, dict):
        raise InvalidInput("the body must be a JSON object", field="body", value=None)
    return value


def check_name(value: object, where: str, *, allow_empty: bool = False) -> str:
    """Return ``value`` if it is a string of at most MAX_NAME characters, none a control one."""
    if (
        not isinstance(value, str)
        or (not value and not allow_empty)
        or len(value) > MAX_NAME
        or _CONTROL.search(value) is not None
    ):
        raise InvalidInput(
            f"{where} must be a {'' if allow_empty else 'non-empty '}string of at most "
            f"{MAX_NAME} characters without control characters",
            field=where,
            value=None,
        )
    return value


def check_resource(value: object, where: str) -> str:
    """A resource a client may name: ``check_name``, and not in the service's own namespace."""
    resource = check_name(value, where)
    if resource.startswith(RESERVED):
        raise InvalidInput(
            f"{where}: resource names starting with {RESERVED!r} are reserved",
            field=where,
            value=None,
        )
    return resource


def _bound(value: object, where: str) -> int | float | datetime:
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
            raise InvalidInput(f"{where} is not a valid time", field=where, value=None) from None
    raise InvalidInput(
        f"{where} must be a number or an RFC 3339 time with an offset", field=where, value=None
    )


def _bound_text(value: int | float | datetime) -> str:
    return _time(value) if isinstance(value, datetime) else json.dumps(value)


def parse_target(item: object, where: str) -> Target:
    """Parse ``{"resource", "slot"}`` as a Unit, ``{"resource", "start", "end"}`` as a Span."""
    if not isinstance(item, dict):
        raise InvalidInput(f"{where} must be an object", field=where, value=None)
    unknown = sorted(set(item) - {"resource", "slot", "start", "end"})
    if unknown:
        raise InvalidInput(
            f"{where} has an unknown field {json.dumps(unknown[0])}",
            field=f"{where}.{unknown[0]}",
            value=None,
        )
    resource = check_resource(item.get("resource"), f"{where}.resource")
    if "start" in item or "end" in item:
        if "slot" in item:
            raise InvalidInput(
                f"{where} is a unit (slot) or a span (start, end), not both",
                field=f"{where}.slot",
                value=None,
            )
        start = _bound(item.get("start"), f"{where}.start")
        end = _bound(item.get("end"), f"{where}.end")
        if isinstance(start, datetime) != isinstance(end, datetime):
            raise InvalidInput(
                f"{where}: start and end must both be numbers or both be times",
                field=f"{where}.end",
                value=None,
            )
        if not start < end:  # type: ignore[operator]
            raise InvalidInput(
                f"{where}: start {_bound_text(start)} must be before end {_bound_text(end)}",
                field=f"{where}.end",
                value=None,
            )
        try:
            return Span(resource, start, end)
        except InvalidInput:
            raise InvalidInput(f"{where} is not a valid span", field=where, value=None) from None
    return Unit(resource, check_name(item.get("slot", ""), f"{where}.slot", allow_empty=True))


def parse_targets(body: dict[str, Any], limit: int, field: str = "targets") -> list[Target]:
    """The body's ``targets`` (or ``field``): a non-empty list of at most ``limit`` targets."""
    items = body.get(field)
    if not isinstance(items, list) or not items or len(items) > limit:
        raise InvalidInput(
            f"{field} must be a list of 1 to {limit} targets", field=field, value=None
        )
    return [parse_target(item, f"{field}[{i}]") for i, item in enumerate(items)]


def parse_ttl(body: dict[str, Any], *, required: bool) -> float | None:
    """The body's ``ttl`` in seconds, in [MIN_TTL, MAX_TTL]; null or absent when not required."""
    ttl = body.get("ttl")
    if ttl is None and not required:
        return None
    ok = (
        not isinstance(ttl, bool)
        and isinstance(ttl, int | float)
        # Compare before any float conversion: a huge int is simply out of range.
        and MIN_TTL <= ttl <= MAX_TTL
    )
    if not ok:
        raise InvalidInput(
            f"ttl must be a number of seconds from {MIN_TTL:g} to {MAX_TTL}"
            + ("" if required else ", or null"),
            field="ttl",
            value=None,
        )
    return float(ttl)  # type: ignore[arg-type]


def parse_fence(value: object) -> int:
    """A fence from a JSON body: a JSON integer from 1 to 2**63-1 (not a string, not 5.0)."""
    if isinstance(value, bool) or not isinstance(value, int) or not 0 < value <= MAX_FENCE:
        raise InvalidInput("fence must be an integer from 1 to 2**63-1", field="fence", value=None)
    return value


def parse_query_fence(text: str) -> int:
    """A fence from a query string: ASCII digits, no sign, no leading zero."""
    if not _FENCE.fullmatch(text) or int(text) > MAX_FENCE:
        raise InvalidInput("fence must be an integer from 1 to 2**63-1", field="fence", value=None)
    return int(text)


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
    }


def request_id_for(holder: str, key: str) -> str:
    """The store request ID for a holder's Idempotency-Key; holders' keys never collide.

    The holder's length prefixes it, so no (holder, key) pair can spell another's.
    """
    return f"{len(holder)}:{holder}:{key}"
