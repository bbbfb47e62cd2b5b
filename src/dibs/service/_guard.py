"""What stands in front of every API call: problem details, rate limits, request IDs and logs.

Every error the service answers is an RFC 9457 problem details document
(``application/problem+json``): ``type``, ``title``, ``status``, ``detail``,
and the service's own members beside them, ``error`` (a stable code, the one
clients matched before problem details) and ``message`` (the same text as
``detail``), plus facts such as ``field``, ``reason`` or ``taken``. The
``type`` is the code's entry on the service's own ``/docs`` page
(``/docs#problem-taken``), a URI relative to the request's.
"""

from __future__ import annotations

import http
import json
import logging
import math
import os
import re
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from starlette.responses import JSONResponse as _StarletteJSON

from dibs.exceptions import HoldLostReason, InvalidInput
from dibs.service._schema import (
    Array,
    Components,
    Enum,
    Integer,
    Json,
    Obj,
    Prop,
    Raw,
    Schema,
    Text,
    Unstated,
)
from dibs.service._wire import CLAIMED_TARGET

__all__ = [
    "ERROR",
    "IDEMPOTENCY_KEY",
    "IDEMPOTENCY_KEY_TEXT",
    "PROBLEMS",
    "PROBLEM_JSON",
    "ApiError",
    "JSONResponse",
    "JsonFormatter",
    "RateLimiter",
    "new_request_id",
    "parse_idempotency_key",
]

log = logging.getLogger("dibs.service")

_REQUEST_ID = re.compile(r"[A-Za-z0-9._:-]{1,128}")
# The header's whole value: a Structured Field string, or a bare token (lenient).
# The same pattern is in the OpenAPI document.
KEY_PATTERN = r'^(?:"(?:[ !#-\[\]-~]|\\["\\])+"|[!#-~]+)$'
_KEY = re.compile(KEY_PATTERN)
MAX_KEY = 255
"""Characters in a key; its header, quoted and escaped, may be up to MAX_KEY_HEADER."""
MAX_KEY_HEADER = 2 * MAX_KEY + 2


PROBLEM_JSON = "application/problem+json"

# Starlette's JSONResponse encoding, with the encoder built once instead of per response.
_ENCODE = json.JSONEncoder(ensure_ascii=False, allow_nan=False, separators=(",", ":")).encode


class JSONResponse(_StarletteJSON):
    """Starlette's ``JSONResponse``, byte for byte, with one encoder for every response."""

    def render(self, content: Any) -> bytes:
        return _ENCODE(content).encode("utf-8")


PROBLEMS: dict[str, tuple[str, str]] = {
    "invalid": ("Invalid input", "A value is not valid; `field` names it."),
    "unauthorized": ("No valid API key", "Send `Authorization: Bearer <API key>`."),
    "forbidden": ("Forbidden", "You can list only your own claims (`holder=me`)."),
    "not_found": (
        "Not found",
        "No such route, showing, lot or semaphore, or no such claim or vehicle of yours (another "
        "holder's answers the same).",
    ),
    "method_not_allowed": ("Method not allowed", "`Allow` lists the path's methods."),
    "taken": (
        "Targets taken",
        "Another holder has some of these targets; `taken` lists them, never who.",
    ),
    "hold_lost": (
        "Hold lost",
        "The hold expired, was taken over or released, or the fence is stale; see `reason`.",
    ),
    "in_progress": (
        "Request in progress",
        "A request with this Idempotency-Key is still running; retry after `Retry-After`.",
    ),
    "idempotency_key_reused": (
        "Idempotency-Key reused",
        "This Idempotency-Key was used with a different request body.",
    ),
    "too_large": ("Request body too large", "The body is larger than the service's limit."),
    "unsupported_media_type": (
        "Unsupported media type",
        "Send the body as `Content-Type: application/json`.",
    ),
    "rate_limited": ("Rate limit exceeded", "This key's rate limit; retry after `Retry-After`."),
    "timeout": (
        "Timed out",
        "The request body arrived too slowly (408), or the store did not answer in time (503).",
    ),
    "unavailable": ("Store unavailable", "The store is unreachable; retry after `Retry-After`."),
    "full": ("Lot full", "No run of `length` adjacent free slots now."),
    "already_parked": (
        "Vehicle already parked",
        "This vehicle is parked with another length; see `position` and `length`.",
    ),
    "vehicle_blocked": ("Vehicle blocked", "Another claim holds this vehicle's own unit."),
    "none_free": ("No candidate free", "Every candidate was taken."),
    "no_permit": (
        "No permit free",
        "Every permit of the semaphore is held (past `wait`); `permits` is its limit.",
    ),
    "over_limit": (
        "Over the rate limit",
        "The shared rate limit refused this cost now; retry after `retry_after` seconds "
        "(`Retry-After` rounds it up).",
    ),
    "bad_config": (
        "Bad waiting-list configuration",
        "The list's configuration in the store is not one the service wrote; "
        "`PUT /v1/waitlists/{key}` replaces it. `version` is the bad one.",
    ),
    "version_moved": (
        "Configuration version moved",
        "A `PUT` with `if_version` found another version in force; `version` is it.",
    ),
    "internal": ("Internal error", "An unexpected error; `request_id` finds it in the logs."),
}
"""Each error code's problem ``title`` (the same for every occurrence) and documentation."""

ERROR = Obj(
    {
        "type": Text(
            format="uri-reference",
            description="The problem type: `/docs#problem-<error>` on this service.",
        ),
        "title": Text(description="The same for every `error` code."),
        "status": Integer(400, 599),
        "detail": Text(),
        "instance": Prop(Text(format="uri-reference"), required=False),
        "error": Text(description="A stable code: " + ", ".join(PROBLEMS) + "."),
        "message": Text(description="The same text as `detail`."),
        "field": Prop(Text(description="With `invalid`: the field at fault."), required=False),
        "reason": Prop(
            Enum(tuple(str(r) for r in HoldLostReason), description="With `hold_lost`."),
            required=False,
        ),
        "taken": Prop(
            Array(
                CLAIMED_TARGET, description="With `taken`: your targets that someone else holds."
            ),
            required=False,
        ),
        "request_id": Prop(Text(description="With `internal`."), required=False),
        "position": Prop(
            Integer(description="With `already_parked`: where the vehicle is parked."),
            required=False,
        ),
        "length": Prop(
            Integer(description="With `already_parked`: how many slots it has."), required=False
        ),
        "permits": Prop(
            Integer(0, description="With `no_permit`: the semaphore's limit."), required=False
        ),
        "version": Prop(
            Integer(0, description="With `bad_config` and `version_moved`: the list's version."),
            required=False,
        ),
        "retry_after": Prop(
            Raw(
                {"type": "number", "minimum": 0},
                description="With `over_limit`: exact seconds (on the store's clock) until "
                "this cost may be admitted, if no one takes the room first.",
            ),
            required=False,
        ),
    },
    name="Error",
    description="An RFC 9457 problem details document; `error` and `message` "
    "are the service's own members (the code and the text clients read before).",
)
"""What :meth:`ApiError.body` makes."""


@dataclass
class ApiError(Exception):
    """An answer other than success: the status, the problem document, extra headers."""

    status: int
    error: str
    message: str
    extra: dict[str, Any] = field(default_factory=dict)
    headers: dict[str, str] = field(default_factory=dict)

    def body(self, root_path: str = "") -> dict[str, Any]:
        """The RFC 9457 problem document, with ``error`` (a stable code), ``message`` and facts.

        ``root_path`` is the path the service is mounted under, for ``type``.
        """
        title = PROBLEMS[self.error][0] if self.error in PROBLEMS else _phrase(self.status)
        return {
            "type": f"{root_path}/docs#problem-{self.error}",
            "title": title,
            "status": self.status,
            "detail": self.message,
            "error": self.error,
            "message": self.message,
            **self.extra,
        }

    def response(self, root_path: str = "") -> JSONResponse:
        """This error as an ``application/problem+json`` response."""
        return JSONResponse(
            self.body(root_path),
            status_code=self.status,
            headers=self.headers,
            media_type=PROBLEM_JSON,
        )


def _phrase(status: int) -> str:
    try:
        return http.HTTPStatus(status).phrase
    except ValueError:
        return "Error"


def invalid(exc: InvalidInput) -> ApiError:
    """``400`` naming the field at fault."""
    return ApiError(400, "invalid", str(exc), {"field": exc.field})


class IdempotencyKey(Schema):
    """The Idempotency-Key header's value: a Structured Field string, or a bare token.

    The IETF draft makes it a Structured Field string (``"abc"``); a bare
    token is accepted too, since many clients send one. The bound is on the
    key, not on its serialization: the quotes and the escaping backslashes of
    a Structured Field string do not count, which the schema cannot state
    (it bounds the header at twice the key, quoted): :class:`Unstated`.
    """

    def parse(self, value: Any, where: str = "Idempotency-Key") -> str:
        text = value.strip() if isinstance(value, str) else ""
        key = ""
        if len(text) <= MAX_KEY_HEADER and _KEY.match(text):
            key = text
            if text.startswith('"'):
                key = text[1:-1]
                if "\\" in key:
                    key = re.sub(r"\\(.)", r"\1", key)
        if not key or len(key) > MAX_KEY:
            error = Unstated if key else InvalidInput
            raise error(
                f"Idempotency-Key must be a structured-field string of 1-{MAX_KEY} printable "
                'ASCII characters, e.g. "8e03978e-40d5-43e8-bc93-6894a57f9324"',
                field=where,
                value=None,
            )
        return key

    def body(self, components: Components) -> Json:
        return {"type": "string", "maxLength": MAX_KEY_HEADER, "pattern": KEY_PATTERN}


IDEMPOTENCY_KEY = IdempotencyKey()
IDEMPOTENCY_KEY_TEXT = (
    'A Structured Field string, e.g. "4e1d…" (IETF draft), or a bare token: '
    f"a key of 1-{MAX_KEY} printable ASCII characters (the quotes and escapes do not count). "
    "Remembered for the store's request retention (24 h by default) from its first use."
)


def parse_idempotency_key(header: str | list[str] | None) -> str | None:
    """The Idempotency-Key header's value (or its field lines), or None when absent.

    Raises :class:`ApiError` (400) for an empty, oversized or malformed key
    (:data:`IDEMPOTENCY_KEY`), and for a header sent twice (its lines combine
    into a list, not one string).
    """
    if isinstance(header, list):
        if not header:
            return None
        header = ", ".join(header)
    if header is None:
        return None
    try:
        return IDEMPOTENCY_KEY.parse(header)
    except InvalidInput as exc:
        raise invalid(exc) from None


def new_request_id(header: str | None) -> str:
    """The caller's ``X-Request-ID`` if it is sane, else a fresh one."""
    if header is not None and _REQUEST_ID.fullmatch(header):
        return header
    return os.urandom(16).hex()  # as random as uuid4().hex, without building a UUID


class RateLimiter:
    """A token bucket per API key: ``rate`` per second, at most ``burst`` at once.

    ``_lock`` guards ``_buckets``; it is held only for arithmetic.
    """

    def __init__(self, rate: float, burst: int, clock: Any = time.monotonic) -> None:
        self.rate = rate
        self.burst = float(burst)
        self._clock = clock
        self._lock = threading.Lock()
        self._buckets: dict[str, tuple[float, float]] = {}

    def take(self, key: str) -> float:
        """Spend one token of ``key``'s bucket; return 0, or the seconds until one is due."""
        now = self._clock()
        with self._lock:
            tokens, last = self._buckets.get(key, (self.burst, now))
            tokens = min(self.burst, tokens + (now - last) * self.rate)
            if tokens >= 1.0:
                self._buckets[key] = (tokens - 1.0, now)
                return 0.0
            self._buckets[key] = (tokens, now)
            return (1.0 - tokens) / self.rate if self.rate > 0 else math.inf


_ENCODE_LOG = json.JSONEncoder(default=str).encode  # json.dumps(doc, default=str), built once


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time, level, logger, message and the record's extras."""

    # uvicorn adds color_message: the message again, with ANSI colour codes for terminals.
    _STANDARD = frozenset(vars(logging.makeLogRecord({}))) | {"color_message"}

    # The formatted second of the last record: an access-log line per request
    # would otherwise format the same second again and again (~3 us each).
    _second: tuple[int, str] = (-1, "")

    def format(self, record: logging.LogRecord) -> str:
        second = int(record.created)
        if self._second[0] != second:
            self._second = (second, self.formatTime(record, "%Y-%m-%dT%H:%M:%S"))
        doc: dict[str, Any] = {
            "time": f"{self._second[1]}.{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        for name, value in vars(record).items():
            if name not in self._STANDARD and not name.startswith("_"):
                doc[name] = value
        if record.exc_info:
            doc["exception"] = self.formatException(record.exc_info)
        return _ENCODE_LOG(doc)

    def converter(self, seconds: float | None) -> time.struct_time:
        """Times in UTC."""
        return time.gmtime(seconds)
