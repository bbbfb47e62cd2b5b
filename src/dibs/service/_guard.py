"""What stands in front of every API call: errors as JSON, rate limits, request IDs and logs."""

from __future__ import annotations

import json
import logging
import math
import os
import re
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from dibs.exceptions import InvalidInput

__all__ = [
    "ApiError",
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


@dataclass
class ApiError(Exception):
    """An answer other than success: the status, the JSON body, extra headers."""

    status: int
    error: str
    message: str
    extra: dict[str, Any] = field(default_factory=dict)
    headers: dict[str, str] = field(default_factory=dict)

    def body(self) -> dict[str, Any]:
        """The JSON error document: ``error`` (a stable code), ``message``, and facts."""
        return {"error": self.error, "message": self.message, **self.extra}


def invalid(exc: InvalidInput) -> ApiError:
    """``400`` naming the field at fault."""
    return ApiError(400, "invalid", str(exc), {"field": exc.field})


def parse_idempotency_key(header: str | None) -> str | None:
    """The Idempotency-Key header's value, or None when absent.

    The IETF draft makes it a Structured Field string (``"abc"``); a bare
    token is accepted too, since many clients send one. Raises
    :class:`ApiError` (400) for an empty, oversized or malformed key.
    """
    if header is None:
        return None
    text = header.strip()
    key = ""
    # The bound is on the key, not on its serialization: the quotes and the
    # escaping backslashes of a Structured Field string do not count.
    if len(text) <= MAX_KEY_HEADER and _KEY.match(text):
        key = text
        if text.startswith('"'):
            key = text[1:-1]
            if "\\" in key:
                key = re.sub(r"\\(.)", r"\1", key)
    if not key or len(key) > MAX_KEY:
        raise ApiError(
            400,
            "invalid",
            f"Idempotency-Key must be a structured-field string of 1-{MAX_KEY} printable "
            'ASCII characters, e.g. "8e03978e-40d5-43e8-bc93-6894a57f9324"',
            {"field": "Idempotency-Key"},
        )
    return key


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


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time, level, logger, message and the record's extras."""

    # uvicorn adds color_message: the message again, with ANSI colour codes for terminals.
    _STANDARD = frozenset(vars(logging.makeLogRecord({}))) | {"color_message"}

    def format(self, record: logging.LogRecord) -> str:
        doc: dict[str, Any] = {
            "time": self.formatTime(record, "%Y-%m-%dT%H:%M:%S") + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        for name, value in vars(record).items():
            if name not in self._STANDARD and not name.startswith("_"):
                doc[name] = value
        if record.exc_info:
            doc["exception"] = self.formatException(record.exc_info)
        return json.dumps(doc, default=str)

    def converter(self, seconds: float | None) -> time.struct_time:
        """Times in UTC."""
        return time.gmtime(seconds)
