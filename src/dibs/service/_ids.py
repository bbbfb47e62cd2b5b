"""Opaque claim IDs on the wire: the store's claim ID under a keyed pseudorandom permutation.

SQL stores number their claims with the global fence counter, so a client that
saw two of those IDs could tell how many claims were made in between. The API
shows instead the store's ID encrypted with a 4-round Feistel network whose
round function is HMAC-SHA256 under a per-deployment secret (4 rounds of a
pseudorandom function make a strong pseudorandom permutation, Luby-Rackoff).
Being a permutation, it needs no lookup table: the service decrypts the ID a
client sends back. The plaintext starts with four fixed bytes, so an ID that
was tampered with decrypts to garbage and is refused before any store call
(a 404, like any claim that is not yours).

The secret is the deployment's: given (``--id-secret-file``), or else kept in
the store itself (:func:`stored_secret`, awaited on the service's async
store), so that every instance on one store agrees with no set-up. The first
instance to start claims a reserved unit with the secret in its holder name;
the claim's unique key makes it the only one, and every later instance reads
it back.

Plaintext layout: ``00 00 00 <kind>`` then, for kind 0, a store ID that is a
decimal integer below 2**63 as 8 big-endian bytes (a 16-character wire ID);
for kind 1, any other store ID as UTF-8, then ``0x80`` and zeros up to a
multiple of 12 bytes. Wire IDs are unpadded URL-safe base64.
"""

from __future__ import annotations

import base64
import functools
import hashlib
import hmac
import re
import secrets

from dibs._model import Unit
from dibs.aio import AsyncStore
from dibs.exceptions import StoreUnavailable

__all__ = ["SECRET_UNIT", "WIRE_ID_PATTERN", "ClaimIds", "stored_secret"]

SECRET_UNIT = Unit("dibs.service.id-secret", "")
"""The reserved unit whose one confirmed claim keeps the store's claim-ID secret."""
_SECRET_HOLDER = "dibs.id-secret:"

_MAGIC = b"\x00\x00\x00"
_ROUNDS = 4
_CACHED = 4096  # wire IDs remembered each way per instance
_MAX_STORE_ID = 255  # bytes; store IDs are far shorter (the library allows 1024)
WIRE_ID_MAX = 4 * (4 + _MAX_STORE_ID + 12) // 3
WIRE_ID_PATTERN = f"^[A-Za-z0-9_-]{{16,{WIRE_ID_MAX}}}$"
_WIRE_ID = re.compile(WIRE_ID_PATTERN)


class ClaimIds:
    """Encrypt store claim IDs into wire IDs and back, under ``secret``."""

    def __init__(self, secret: bytes) -> None:
        if len(secret) < 16:
            raise ValueError("the claim ID secret must have at least 16 bytes")
        keys = (
            hmac.new(secret, b"dibs wire claim id, round %d" % i, hashlib.sha256).digest()
            for i in range(_ROUNDS)
        )
        # HMAC-SHA256 by its definition (RFC 2104), from one pair of SHA-256
        # states per round keyed once and copied per use: half the cost of
        # copying an hmac.HMAC (a Python object around the C one), same bytes.
        self._macs = tuple(_keyed(key) for key in keys)
        # A claim's ID crosses the wire again on each confirm, extend, get and
        # release: remember recent ones both ways (bounded; thread-safe).
        self.to_wire = functools.lru_cache(maxsize=_CACHED)(self.to_wire)  # type: ignore[method-assign]
        self.from_wire = functools.lru_cache(maxsize=_CACHED)(self.from_wire)  # type: ignore[method-assign]

    def to_wire(self, claim_id: str) -> str:
        """The wire ID of a store claim ID."""
        if claim_id.isascii() and claim_id.isdigit() and str(int(claim_id)) == claim_id:
            n = int(claim_id)
            if n < 2**63:
                return _b64(self._permute(_MAGIC + b"\x00" + n.to_bytes(8, "big"), forward=True))
        raw = claim_id.encode() + b"\x80"
        raw += b"\x00" * (-(len(_MAGIC) + 1 + len(raw)) % 12)
        return _b64(self._permute(_MAGIC + b"\x01" + raw, forward=True))

    def from_wire(self, wire_id: str) -> str | None:
        """The store claim ID behind a wire ID, or None when it is not one of ours."""
        if not _WIRE_ID.match(wire_id) or len(wire_id) % 16:
            return None
        try:
            data = base64.urlsafe_b64decode(wire_id)
        except ValueError:
            return None
        plain = self._permute(data, forward=False)
        if not plain.startswith(_MAGIC):
            return None
        kind, body = plain[3], plain[4:]
        if kind == 0 and len(body) == 8:
            n = int.from_bytes(body, "big")
            return str(n) if n < 2**63 else None
        if kind == 1:
            text = body.rstrip(b"\x00")
            if not text.endswith(b"\x80"):
                return None
            try:
                claim_id = text[:-1].decode()
            except UnicodeDecodeError:
                return None
            return claim_id or None
        return None

    def _permute(self, data: bytes, *, forward: bool) -> bytes:
        half = len(data) // 2
        left, right = data[:half], data[half:]
        rounds = range(_ROUNDS) if forward else reversed(range(_ROUNDS))
        for i in rounds:
            # Alternating rounds: even ones change the left half, odd ones the right.
            if i % 2 == 0:
                left = _xor(left, self._pad(i, right, len(left)))
            else:
                right = _xor(right, self._pad(i, left, len(right)))
        return left + right

    def _pad(self, i: int, source: bytes, size: int) -> bytes:
        """HMAC(round key i, block || source) for blocks 0, 1, … until ``size`` bytes."""
        inner_key, outer_key = self._macs[i]
        out = b""
        block = 0
        while len(out) < size:
            inner = inner_key.copy()
            inner.update(block.to_bytes(4, "big") + source)
            outer = outer_key.copy()
            outer.update(inner.digest())
            out += outer.digest()
            block += 1
        return out[:size]


def _keyed(key: bytes) -> tuple[hashlib._Hash, hashlib._Hash]:
    """SHA-256 states after HMAC's inner and outer padded keys (RFC 2104; ``key`` ≤ 64 bytes)."""
    padded = key.ljust(64, b"\x00")
    return (
        hashlib.sha256(bytes(b ^ 0x36 for b in padded)),
        hashlib.sha256(bytes(b ^ 0x5C for b in padded)),
    )


def _xor(data: bytes, pad: bytes) -> bytes:
    """``data`` XOR ``pad`` (same length), as one integer operation."""
    n = len(data)
    return (int.from_bytes(data, "big") ^ int.from_bytes(pad, "big")).to_bytes(n, "big")


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).decode().rstrip("=")


def _secret(holder: str | None) -> bytes | None:
    if holder is not None and holder.startswith(_SECRET_HOLDER):
        return holder.removeprefix(_SECRET_HOLDER).encode()
    return None  # released between the claim and the read (by hand): claim again


def _not_a_secret() -> StoreUnavailable:
    return StoreUnavailable(
        f"the claim-ID secret's unit {SECRET_UNIT} is held by something else; "
        "give the service a secret (--id-secret-file)"
    )


async def stored_secret(store: AsyncStore) -> bytes:
    """The claim-ID secret kept in ``store``, made now if it has none yet.

    Raises what the store raises; :class:`~dibs.StoreUnavailable` if the
    secret's unit is held by something that is not a secret (never, unless
    someone claimed the reserved unit outside the service).
    """
    mine = _SECRET_HOLDER + secrets.token_urlsafe(32)
    for _ in range(3):
        # Linearization point: this confirmed claim on the secret's unit. Of
        # instances starting together, exactly one wins; the rest read its holder.
        result = await store.claim(SECRET_UNIT, holder=mine, ttl=None)
        secret = _secret(mine if result else await store.holder_of(SECRET_UNIT))
        if secret is not None:
            return secret
    raise _not_a_secret()
