"""The etcd store's key layout, wire encoding, URL and limits: no I/O, no decisions.

Every key starts with the store's prefix and a one-letter table, then names
joined by NUL (names never contain NUL, so a prefix range over a table, a
resource or a holder is exact):

=======================================  =====================================================
key                                      value
=======================================  =====================================================
``<p>/c\\0<claim id>``                    the claim record (JSON); its ``create_revision`` is
                                         the fence
``<p>/o\\0<holder>\\0<claim id>``          the claim is live: exists from the grant until
                                         release, expiry or takeover; attached to the hold's
                                         lease; ``claims_of`` ranges over a holder's
``<p>/u\\0<resource>\\0<slot>``            ``<holder>\\0<claim id>`` of the exclusive claim that
                                         last took the unit and has not released it
``<p>/u\\0<resource>\\0<slot>\\0<claim id>`` a shared claim on the unit (value: its holder): the
                                         unit key and its readers make one range, so one
                                         range compare covers both
``<p>/g\\0<resource>``                     the span guard: rewritten by every span grant on the
                                         resource, so those grants serialize
``<p>/s\\0<resource>\\0<claim id>\\0<i>``   one span of a claim (JSON: holder, kind, bounds,
                                         and ``"m": "s"`` for a shared claim)
``<p>/r\\0<request id>``                   a request record (JSON: fingerprint, outcome, time)
=======================================  =====================================================
"""

from __future__ import annotations

import base64
import json
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qsl, unquote, urlsplit

from dibs._model import Span, Target, Unit, span_bound_to_number, target_from_json, target_to_json
from dibs.exceptions import InvalidInput

__all__ = [
    "DEFAULT_MAX_REQUEST_BYTES",
    "DEFAULT_MAX_TXN_OPS",
    "KV",
    "LEASE_TTL_MIN",
    "Keys",
    "Settings",
    "lease_seconds",
    "parse_url",
]

DEFAULT_MAX_TXN_OPS = 128
"""etcd's ``--max-txn-ops`` default: operations in one branch of a transaction."""
DEFAULT_MAX_REQUEST_BYTES = 1536 * 1024
"""etcd's ``--max-request-bytes`` default (1.5 MiB): one encoded request."""
LEASE_TTL_MIN = 2
"""etcd grants no lease shorter than 2 s (a TTL of 1 is silently granted as 2)."""
DEFAULT_PORT = 2379
_B64 = base64.b64encode
_UNB64 = base64.b64decode


def b64(data: bytes) -> str:
    return _B64(data).decode("ascii")


def lease_seconds(ttl: float) -> int:
    """The lease a hold of ``ttl`` seconds gets: rounded up to whole seconds, at least 2."""
    return max(LEASE_TTL_MIN, math.ceil(ttl))


@dataclass(frozen=True, slots=True)
class KV:
    """One key as the gateway returned it."""

    key: bytes
    value: bytes
    create: int
    mod: int
    lease: int

    @classmethod
    def of(cls, raw: dict[str, Any]) -> KV:
        return cls(
            _UNB64(raw.get("key", "")),
            _UNB64(raw.get("value", "")),
            int(raw.get("create_revision", 0)),
            int(raw.get("mod_revision", 0)),
            int(raw.get("lease", 0)),
        )


def kvs(response: dict[str, Any]) -> list[KV]:
    """The keys of a range response (the gateway leaves out an empty list)."""
    return [KV.of(raw) for raw in response.get("kvs", ())]


def revision(response: dict[str, Any]) -> int:
    return int(response["header"]["revision"])


def _next(key: bytes) -> bytes:
    """The end of the range of every key starting with ``key`` (its last byte +1)."""
    return key[:-1] + bytes([key[-1] + 1])


# --- transaction pieces, in the gateway's JSON -------------------------------------------------


def absent(key: bytes) -> dict[str, Any]:
    """Compare: the key does not exist (a missing key compares with revision 0)."""
    return {"key": b64(key), "target": "CREATE", "result": "EQUAL", "create_revision": "0"}


def range_empty(key: bytes, end: bytes) -> dict[str, Any]:
    """Compare: no key in ``[key, end)`` exists (etcd compares an empty range as one missing
    key, whose create revision is 0; a key that exists was created at a revision past 0)."""
    return {
        "key": b64(key), "range_end": b64(end), "target": "CREATE", "result": "EQUAL",
        "create_revision": "0",
    }  # fmt: skip


def range_unchanged(key: bytes, end: bytes, rev: int) -> dict[str, Any]:
    """Compare: no key in ``[key, end)`` was written after revision ``rev`` (keys deleted
    since then pass; a key created or rewritten since fails it)."""
    return {
        "key": b64(key), "range_end": b64(end), "target": "MOD", "result": "LESS",
        "mod_revision": str(rev + 1),
    }  # fmt: skip


def get_range(key: bytes, end: bytes) -> dict[str, Any]:
    return {"request_range": {"key": b64(key), "range_end": b64(end)}}


def created_at(key: bytes, rev: int) -> dict[str, Any]:
    """Compare: the key exists and was created at ``rev`` (a fence check)."""
    return {"key": b64(key), "target": "CREATE", "result": "EQUAL", "create_revision": str(rev)}


def unchanged(key: bytes, rev: int) -> dict[str, Any]:
    """Compare: the key was last written at ``rev`` (0: it does not exist)."""
    if rev == 0:
        return absent(key)
    return {"key": b64(key), "target": "MOD", "result": "EQUAL", "mod_revision": str(rev)}


def value_is(key: bytes, value: bytes) -> dict[str, Any]:
    return {"key": b64(key), "target": "VALUE", "result": "EQUAL", "value": b64(value)}


def put(key: bytes, value: bytes, lease: int = 0) -> dict[str, Any]:
    body: dict[str, Any] = {"key": b64(key), "value": b64(value)}
    if lease:
        body["lease"] = str(lease)
    return {"request_put": body}


def delete(key: bytes) -> dict[str, Any]:
    return {"request_delete_range": {"key": b64(key)}}


def delete_prefix(prefix: bytes) -> dict[str, Any]:
    return {"request_delete_range": {"key": b64(prefix), "range_end": b64(_next(prefix))}}


def get(key: bytes) -> dict[str, Any]:
    return {"request_range": {"key": b64(key)}}


def get_prefix(prefix: bytes) -> dict[str, Any]:
    return {"request_range": {"key": b64(prefix), "range_end": b64(_next(prefix))}}


def scan(prefix: bytes, after: bytes | None, limit: int, *, keys_only: bool) -> dict[str, Any]:
    """A page of a prefix range, from just after ``after`` (None: the start)."""
    start = prefix if after is None else after + b"\0"
    body: dict[str, Any] = {"key": b64(start), "range_end": b64(_next(prefix)), "limit": limit}
    if keys_only:
        body["keys_only"] = True
    return body


def nested(compare: list[dict[str, Any]], success: list[dict[str, Any]]) -> dict[str, Any]:
    return {"request_txn": {"compare": compare, "success": success}}


def responses(response: dict[str, Any]) -> list[dict[str, Any]]:
    """The per-operation answers of a transaction, unwrapped."""
    out = []
    for item in response.get("responses", ()):
        (inner,) = item.values()
        out.append(inner)
    return out


def encoded_size(body: dict[str, Any]) -> int:
    """An upper bound of a transaction's size in etcd's own (protobuf) encoding.

    Keys and values travel base64-encoded in JSON; each costs its raw length
    there, plus a few bytes of framing per field that 16 per entry covers.
    """
    total = 64
    for part in ("compare", "success", "failure"):
        for entry in body.get(part, ()):
            total += 16 + _raw_size(entry)
    return total


def _raw_size(entry: object) -> int:
    if isinstance(entry, dict):
        size = 0
        for name, value in entry.items():
            if name in ("key", "value", "range_end") and isinstance(value, str):
                size += len(value) * 3 // 4 + 4
            else:
                size += _raw_size(value)
        return size
    if isinstance(entry, list):
        return sum(16 + _raw_size(e) for e in entry)
    return 8


# --- the key layout ----------------------------------------------------------------------------


class Keys:
    """Keys of one store, under its prefix; see the module docstring."""

    def __init__(self, prefix: str) -> None:
        p = prefix.encode() + b"/"
        self.records = p + b"c\0"
        self.lives = p + b"o\0"
        self.units = p + b"u\0"
        self.guards = p + b"g\0"
        self.spans = p + b"s\0"
        self.requests = p + b"r\0"
        self.root = p

    def record(self, claim_id: str) -> bytes:
        return self.records + claim_id.encode()

    def live(self, holder: str, claim_id: str) -> bytes:
        return self.lives + holder.encode() + b"\0" + claim_id.encode()

    def holder_lives(self, holder: str) -> bytes:
        return self.lives + holder.encode() + b"\0"

    def unit(self, unit: Unit) -> bytes:
        return self.units + unit.resource.encode() + b"\0" + unit.slot.encode()

    def unit_end(self, unit_key: bytes) -> bytes:
        """The end of the range of a unit key and its readers' keys (slots never hold NUL)."""
        return unit_key + b"\1"

    def reader(self, unit_key: bytes, claim_id: str) -> bytes:
        """A shared claim's key on a unit, next to the unit key."""
        return unit_key + b"\0" + claim_id.encode()

    def reader_id(self, unit_key: bytes, key: bytes) -> str:
        """The claim ID in a reader's key on the unit ``unit_key``."""
        return key[len(unit_key) + 1 :].decode()

    def guard(self, resource: str) -> bytes:
        return self.guards + resource.encode()

    def resource_spans(self, resource: str) -> bytes:
        return self.spans + resource.encode() + b"\0"

    def claim_spans(self, resource: str, claim_id: str) -> bytes:
        return self.resource_spans(resource) + claim_id.encode() + b"\0"

    def span(self, resource: str, claim_id: str, index: int) -> bytes:
        return self.claim_spans(resource, claim_id) + str(index).encode()

    def request(self, request_id: str) -> bytes:
        return self.requests + request_id.encode()

    def claim_of_entry(self, key: bytes) -> str:
        """The claim ID inside a span entry's key."""
        return key[len(self.spans) :].split(b"\0")[1].decode()

    def id_of_live(self, key: bytes) -> str:
        """The claim ID inside a live key."""
        return key[len(self.lives) :].split(b"\0")[1].decode()


def owner_value(holder: str, claim_id: str) -> bytes:
    """A unit key's value: who took it, by which claim."""
    return holder.encode() + b"\0" + claim_id.encode()


def parse_owner(value: bytes) -> tuple[str, str]:
    holder, _, claim_id = value.partition(b"\0")
    return holder.decode(), claim_id.decode()


def entry_value(holder: str, span: Span, shared: bool = False) -> bytes:
    tag, _, start, end = target_to_json(span)
    data = {"h": holder, "k": tag, "a": start, "b": end}
    if shared:
        data["m"] = "s"
    return json.dumps(data, ensure_ascii=False).encode()


def parse_entry(resource: str, value: bytes) -> tuple[str, Span, bool]:
    """A span entry's holder, span, and whether its claim is shared."""
    data = json.loads(value)
    span = target_from_json([data["k"], resource, data["a"], data["b"]])
    assert isinstance(span, Span)
    return data["h"], span, "m" in data


def targets_value(targets: Sequence[Target]) -> str:
    """Targets as compact JSON text, non-ASCII kept as UTF-8 (the record's size counts)."""
    return json.dumps(
        [target_to_json(t) for t in targets], ensure_ascii=False, separators=(",", ":")
    )


def span_sort(span: Span) -> tuple[str, int | float]:
    return (span.resource, span_bound_to_number(span.start))


# --- the URL ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Settings:
    """What an ``etcd://`` URL says: the members, the prefix, timeouts and etcd's limits."""

    endpoints: tuple[str, ...]
    prefix: str = "dibs"
    timeout: float = 5.0
    connect_timeout: float = 1.0
    max_txn_ops: int = DEFAULT_MAX_TXN_OPS
    max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES
    request_retention: float | None = None


def _positive(kind: Callable[[str], Any], low: float) -> Callable[[str], Any]:
    def convert(text: str) -> Any:
        value = kind(text)
        if not (low <= value < float("inf")):  # NaN fails both
            raise ValueError(text)
        return value

    convert.__name__ = f"{kind.__name__} of at least {low:g}"
    return convert


_OPTIONS: dict[str, Callable[[str], Any]] = {
    "timeout": _positive(float, 0.01),
    "connect_timeout": _positive(float, 0.01),
    "max_txn_ops": _positive(int, 8),
    "max_request_bytes": _positive(int, 64 * 1024),
    "request_retention": float,
}


def parse_url(url: str) -> Settings:
    """Parse ``etcd://host:port[,host:port...][/prefix][?option=value...]``.

    Raises :class:`~dibs.InvalidInput` naming what is wrong.
    """
    scheme, sep, rest = url.partition("://")
    if scheme.lower() != "etcd" or not sep:
        raise InvalidInput(f"not an etcd:// URL: {url!r}", field="url", value=url)
    rest, _, query = rest.partition("?")
    netloc, _, path = rest.partition("/")
    endpoints = []
    for part in netloc.split(","):
        host, colon, port = part.strip().rpartition(":")
        if not colon:
            host, port = port, str(DEFAULT_PORT)
        if host.startswith("[") and host.endswith("]"):
            host_ok = len(host) > 2
        else:
            host_ok = bool(host) and all(c.isalnum() or c in "-._" for c in host)
        if not (host_ok and port.isdigit() and 0 < int(port) < 65536):
            raise InvalidInput(
                f"etcd:// URL needs host:port members separated by commas, got {part!r} in {url!r}",
                field="url",
                value=url,
            )
        endpoints.append(f"{host}:{int(port)}")
    prefix = unquote(path.strip("/")) or "dibs"
    if "\x00" in prefix:
        raise InvalidInput("the etcd key prefix must not contain NUL", field="url", value=url)
    options: dict[str, Any] = {}
    try:
        pairs = parse_qsl(query, keep_blank_values=True, strict_parsing=bool(query))
    except ValueError:
        raise InvalidInput(f"malformed options in {url!r}", field="url", value=url) from None
    for key, text in pairs:
        convert = _OPTIONS.get(key)
        if convert is None:
            raise InvalidInput(
                f"unknown etcd:// option {key!r}; known: {', '.join(sorted(_OPTIONS))}",
                field=key,
                value=text,
            )
        try:
            options[key] = convert(text)
        except ValueError:
            raise InvalidInput(
                f"{key} in the etcd:// URL must be a {convert.__name__}, got {text!r}",
                field=key,
                value=text,
            ) from None
    urlsplit("http://" + endpoints[0])  # a malformed host raises here, before any I/O
    return Settings(endpoints=tuple(endpoints), prefix=prefix, **options)
