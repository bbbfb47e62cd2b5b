"""JSON on the wire: parse request bodies into targets and numbers, render claims.

Every parser raises :class:`~dibs.InvalidInput` naming the JSON field at fault
(``targets[2].slot``), which the API answers with ``400``. Limits here keep
every value inside what every store can represent, so no input can reach a
store and fail there.
"""

from __future__ import annotations

import json
import math
import re
from datetime import datetime
from typing import Any

from dibs._model import Claim, Span, Target, Unit
from dibs.exceptions import InvalidInput

__all__ = [
    "claim_to_wire",
    "parse_fence",
    "parse_json_object",
    "parse_targets",
    "parse_ttl",
    "target_to_wire",
]

MAX_ID = 200
MAX_TTL = 366 * 24 * 3600.0
MAX_FENCE = 2**63 - 1
MAX_BOUND = 2.0**53
# Control characters, and lone surrogates (not encodable as UTF-8, so no store can keep them).
_CONTROL = re.compile("[\\x00-\\x1f\\x7f-\\x9f\\ud800-\\udfff]")


def parse_json_object(raw: bytes) -> dict[str, Any]:
    """Decode a request body that must be a JSON object (an empty body is ``{}``)."""
    if not raw.strip():
        return {}
    try:
        value = json.loads(raw)
    except (ValueError, RecursionError):
        raise InvalidInput("request body is not valid JSON", field="body", value=None) from None
    if not isinstance(value, dict):
        raise InvalidInput("request body must be a JSON object", field="body", value=None)
    return value


def check_name(value: object, where: str, *, allow_empty: bool = False) -> str:
    """Return ``value`` if it is a printable string of at most 200 characters."""
    if (
        not isinstance(value, str)
        or (not value and not allow_empty)
        or len(value) > MAX_ID
        or _CONTROL.search(value) is not None
    ):
        raise InvalidInput(
            f"{where} must be a {'' if allow_empty else 'non-empty '}string of at most "
            f"{MAX_ID} characters without control characters",
            field=where,
            value=value,
        )
    return value


def _bound(value: object, where: str) -> int | float | datetime:
    if isinstance(value, bool):
        raise InvalidInput(
            f"{where} must be a number or an RFC 3339 time", field=where, value=value
        )
    if isinstance(value, int | float):
        if not math.isfinite(value) or abs(value) > MAX_BOUND:
            raise InvalidInput(f"{where} must be finite, at most 2**53", field=where, value=value)
        return value
    if isinstance(value, str) and len(value) <= 64:
        try:
            moment = datetime.fromisoformat(value)
        except ValueError:
            pass
        else:
            if moment.tzinfo is not None and moment.utcoffset() is not None:
                return moment
    raise InvalidInput(
        f"{where} must be a number or an RFC 3339 time with an offset", field=where, value=value
    )


def parse_target(item: object, where: str) -> Target:
    """Parse ``{"resource", "slot"}`` as a Unit, ``{"resource", "start", "end"}`` as a Span."""
    if not isinstance(item, dict):
        raise InvalidInput(f"{where} must be an object", field=where, value=None)
    unknown = set(item) - {"resource", "slot", "start", "end"}
    if unknown:
        name = sorted(unknown)[0]
        raise InvalidInput(
            f"{where} has unknown field {name!r}", field=f"{where}.{name}", value=None
        )
    resource = check_name(item.get("resource"), f"{where}.resource")
    if "start" in item or "end" in item:
        if "slot" in item:
            raise InvalidInput(
                f"{where} is a unit (slot) or a span (start, end), not both",
                field=f"{where}.slot",
                value=None,
            )
        start = _bound(item.get("start"), f"{where}.start")
        end = _bound(item.get("end"), f"{where}.end")
        try:
            return Span(resource, start, end)
        except InvalidInput as exc:
            raise InvalidInput(str(exc), field=f"{where}.end", value=None) from None
    return Unit(resource, check_name(item.get("slot", ""), f"{where}.slot", allow_empty=True))


def parse_targets(body: dict[str, Any], limit: int) -> list[Target]:
    """The body's ``targets``: a non-empty list of at most ``limit`` targets."""
    items = body.get("targets")
    if not isinstance(items, list) or not items:
        raise InvalidInput("targets must be a non-empty list", field="targets", value=None)
    if len(items) > limit:
        raise InvalidInput(f"at most {limit} targets per claim", field="targets", value=len(items))
    return [parse_target(item, f"targets[{i}]") for i, item in enumerate(items)]


def parse_ttl(body: dict[str, Any], *, required: bool) -> float | None:
    """The body's ``ttl`` in seconds: (0, 366 days], or null/absent when not required."""
    ttl = body.get("ttl")
    if ttl is None and not required:
        return None
    if (
        isinstance(ttl, bool)
        or not isinstance(ttl, int | float)
        or not math.isfinite(ttl)
        or not 0 < ttl <= MAX_TTL
    ):
        raise InvalidInput(
            f"ttl must be a number of seconds in (0, {MAX_TTL:.0f}]"
            + ("" if required else " or null"),
            field="ttl",
            value=ttl,
        )
    return float(ttl)


def parse_fence(value: object) -> int:
    """A fence: a positive integer below 2**63."""
    if isinstance(value, str) and value.isdigit() and len(value) < 20:
        value = int(value)
    elif isinstance(value, float) and value.is_integer() and 0 < value <= MAX_FENCE:
        value = int(value)  # JSON Schema counts 5.0 as an integer, so we do too
    if isinstance(value, bool) or not isinstance(value, int) or not 0 < value <= MAX_FENCE:
        raise InvalidInput("fence must be a positive integer", field="fence", value=value)
    return value


def _time(moment: datetime | None) -> str | None:
    return None if moment is None else moment.isoformat().replace("+00:00", "Z")


def _bound_to_wire(value: int | float | datetime) -> int | float | str:
    return _time(value) or "" if isinstance(value, datetime) else value


def target_to_wire(target: Target) -> dict[str, Any]:
    """A target as JSON: ``{"resource", "slot"}`` or ``{"resource", "start", "end"}``."""
    if isinstance(target, Unit):
        return {"resource": target.resource, "slot": target.slot}
    return {
        "resource": target.resource,
        "start": _bound_to_wire(target.start),
        "end": _bound_to_wire(target.end),
    }


def claim_to_wire(claim: Claim) -> dict[str, Any]:
    """A claim as JSON; the store's request ID is replaced by the caller's Idempotency-Key."""
    key = None
    if claim.request_id is not None:
        # request IDs are "<len(holder)>:<holder>:<key>", see request_id_for()
        size, _, rest = claim.request_id.partition(":")
        key = rest[int(size) + 1 :] if size.isdigit() else None
    return {
        "id": claim.id,
        "holder": claim.holder,
        "targets": [target_to_wire(t) for t in claim.targets],
        "state": str(claim.state),
        "fence": claim.fence,
        "expires_at": _time(claim.expires_at),
        "idempotency_key": key,
        "created_at": _time(claim.created_at),
        "updated_at": _time(claim.updated_at),
        "taken_over": claim.taken_over,
    }


def request_id_for(holder: str, key: str) -> str:
    """The store request ID for a holder's Idempotency-Key; holders' keys never collide.

    The holder's length prefixes it, so no (holder, key) pair can spell another's.
    """
    return f"{len(holder)}:{holder}:{key}"
