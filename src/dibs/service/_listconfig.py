"""A waiting list's configuration, kept in the store so that every service instance agrees.

What ``PUT /v1/waitlists/{key}`` sets (the units the list serves and its offer
TTL) is kept as a semaphore keeps its limit (:mod:`dibs.semaphore`): version
``v`` is a confirmed claim on the marker unit ``("dibs.waitlist.config:<name>",
"<v>")``, written once (the claim of the next version's marker is the
compare-and-set), so the versions are a prefix ``1..V``, found by galloping up
from the last one seen. When nothing changed, reading the configuration costs
one ``holder_of``: the next version's marker is still free.

The marker's holder, ``dibs.waitlist.config:<nonce>.<length>``, names the
version's payload: the configuration as compact JSON (the PUT body's wire form),
cut into chunks held as confirmed claims under that same holder, on the units
``("dibs.waitlist.config-data:<nonce>", "<index>.<chunk>")``. The payload is
written before the marker, so a marker never points at a partial payload; a
writer that loses the marker releases its payload (a crash leaves it behind:
garbage no reader looks at). A payload that does not parse as a PUT body (never
written by the service) is :class:`BadConfig`.

Two writers that race each write the next free version, so the later version
wins (last writer wins, in the versions' order); a writer whose configuration is
already the latest writes nothing. With ``if_version`` a write is a
compare-and-set instead: it is refused (:class:`VersionMoved`) unless the latest
version is that one when it writes. Versions are never removed (as a
semaphore's): each PUT that changes something keeps one more claim.
"""

from __future__ import annotations

import json
import re
import secrets
from dataclasses import dataclass
from typing import Any

from dibs._model import Claim, Unit
from dibs.aio import AsyncStore
from dibs.exceptions import InvalidInput
from dibs.service._wire import RESERVED, WAITLIST_REQUEST
from dibs.waitlist import OFFER_TTL

__all__ = ["NO_CONFIG", "BadConfig", "ListConfig", "VersionMoved", "read_config", "write_config"]

CONFIG_PREFIX = f"{RESERVED}waitlist.config:"
DATA_PREFIX = f"{RESERVED}waitlist.config-data:"
_CHUNK = 240  # characters: at most 960 bytes of UTF-8, so "<index>.<chunk>" is a valid slot
_PER_CLAIM = 100  # chunks per claim: within etcd's 128 operations per transaction
_HOLDER = re.compile(rf"^{re.escape(CONFIG_PREFIX)}([0-9a-f]{{32}})\.([0-9]{{1,9}})$")


@dataclass(frozen=True, slots=True)
class ListConfig:
    """One version of a list's configuration, as stored (version 0: none was ever PUT)."""

    version: int
    units: tuple[Unit, ...]
    offer_ttl: float


NO_CONFIG = ListConfig(0, (), OFFER_TTL)


class BadConfig(Exception):
    """Raised when a list's stored configuration is not one the service wrote."""

    def __init__(self, version: int, why: str) -> None:
        super().__init__(f"version {version} of the list's configuration is not valid: {why}")
        self.version = version


class VersionMoved(Exception):
    """Raised by a compare-and-set write when the latest version is not the one expected."""

    def __init__(self, version: int) -> None:
        super().__init__(f"the list's configuration is at version {version}")
        self.version = version


def _marker(name: str, version: int) -> Unit:
    return Unit(CONFIG_PREFIX + name, str(version))


def _as_body(units: tuple[Unit, ...], offer_ttl: float) -> dict[str, Any]:
    return {
        "units": [{"resource": u.resource, "slot": u.slot} for u in units],
        "offer_ttl": offer_ttl,
    }


async def _latest(store: AsyncStore, name: str, known: int) -> tuple[int, str | None]:
    """The newest version (0 if none) and its marker's holder (None if it is ``known``)."""
    holder = await store.holder_of(_marker(name, known + 1))
    if holder is None:
        return known, None
    low, low_holder, step = known + 1, holder, 1
    while True:  # the versions are a prefix: find a free one above
        high = low + step
        found = await store.holder_of(_marker(name, high))
        if found is None:
            break
        low, low_holder, step = high, found, step * 2
    while high - low > 1:  # low is written, high is not
        middle = (low + high) // 2
        found = await store.holder_of(_marker(name, middle))
        if found is None:
            high = middle
        else:
            low, low_holder = middle, found
    return low, low_holder


async def _load(store: AsyncStore, version: int, holder: str) -> ListConfig:
    """Version ``version`` from its payload under ``holder``; raises :class:`BadConfig`."""
    match = _HOLDER.fullmatch(holder)
    if match is None:
        raise BadConfig(version, f"its marker is held by {holder!r}")
    resource, length = DATA_PREFIX + match[1], int(match[2])
    chunks: dict[int, str] = {}
    for claim in await store.claims_of(holder):
        for unit in claim.units:
            index, _, chunk = unit.slot.partition(".")
            if unit.resource == resource and index.isdigit():
                chunks[int(index)] = chunk
    text = "".join(chunks[i] for i in sorted(chunks))
    if sorted(chunks) != list(range(len(chunks))) or len(text) != length:
        raise BadConfig(version, "its payload is incomplete")
    try:
        parsed = WAITLIST_REQUEST.parse(json.loads(text))
    except (ValueError, InvalidInput) as exc:  # JSONDecodeError is a ValueError
        raise BadConfig(version, str(exc)) from None
    units = tuple(Unit(item["resource"], item["slot"]) for item in parsed["units"])
    return ListConfig(version, units, float(parsed["offer_ttl"]))


async def read_config(store: AsyncStore, name: str, known: ListConfig = NO_CONFIG) -> ListConfig:
    """The list's configuration now: ``known`` itself when no newer version was written.

    Raises :class:`BadConfig` for a stored version the service did not write, and
    what the store raises.
    """
    version, holder = await _latest(store, name, known.version)
    if holder is None:
        return known
    return await _load(store, version, holder)


async def write_config(
    store: AsyncStore,
    name: str,
    units: tuple[Unit, ...],
    offer_ttl: float,
    *,
    known: ListConfig = NO_CONFIG,
    if_version: int | None = None,
) -> ListConfig:
    """Make ``units`` and ``offer_ttl`` the list's configuration; the version now in force.

    Writes nothing when they are the latest version already. Raises
    :class:`VersionMoved` when ``if_version`` is given and is not the latest
    version, and what the store raises.
    """
    text = json.dumps(
        _as_body(units, offer_ttl), ensure_ascii=False, separators=(",", ":"), allow_nan=False
    )
    version, holder = await _latest(store, name, known.version)
    while True:
        if if_version is not None and version != if_version:
            raise VersionMoved(version)
        if version:
            try:
                latest = known if holder is None else await _load(store, version, holder)
            except BadConfig:
                latest = NO_CONFIG  # a bad version is replaced, never kept
            if latest.version == version and (latest.units, latest.offer_ttl) == (units, offer_ttl):
                return latest
        nonce = secrets.token_hex(16)
        mine = f"{CONFIG_PREFIX}{nonce}.{len(text)}"
        data = [
            Unit(DATA_PREFIX + nonce, f"{i}.{text[at : at + _CHUNK]}")
            for i, at in enumerate(range(0, max(len(text), 1), _CHUNK))
        ]
        payload: list[Claim] = []
        for at in range(0, len(data), _PER_CLAIM):
            result = await store.claim(data[at : at + _PER_CLAIM], holder=mine, ttl=None)
            assert result.claim is not None  # units of a fresh nonce are free
            payload.append(result.claim)
        # The linearization point: the claim of the next version's marker, one writer each.
        if await store.claim(_marker(name, version + 1), holder=mine, ttl=None):
            return ListConfig(version + 1, units, offer_ttl)
        for claim in payload:  # lost the version: the payload is no one's
            await store.release(claim.id, holder=mine, fence=claim.fence)
        version, holder = await _latest(store, name, version)
        known = NO_CONFIG
