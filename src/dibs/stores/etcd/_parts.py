"""What the etcd store's plans are made of: the request a plan yields, and the records it reads.

No I/O and no decisions: :mod:`dibs.stores.etcd._ops` holds the rules.
"""

from __future__ import annotations

import json
from collections.abc import Generator
from dataclasses import dataclass, field
from typing import Any, TypeAlias, TypeVar

from dibs._model import (
    EXCLUSIVE,
    SHARED,
    Claim,
    ClaimState,
    Span,
    Target,
    Unit,
    claim_from_micros,
    targets_from_text,
)
from dibs.stores.etcd._keys import KV

__all__ = [
    "Blocker",
    "Call",
    "ClaimPlan",
    "LeaseGone",
    "Plan",
    "Record",
    "View",
    "read_call",
    "txn_call",
]

_T = TypeVar("_T")
_STATES = {s.value: s for s in ClaimState}


@dataclass(frozen=True, slots=True)
class Call:
    """One request to the gateway.

    ``kind`` tells the driver what a failure means: ``read`` and ``grant`` may
    be sent again to another member, ``write`` may not once sent (its outcome
    is unknown: :class:`~dibs.StoreUnavailable`), and ``revoke`` is best effort
    (a lease left behind expires on its own).
    """

    kind: str
    path: str
    body: dict[str, Any]


class LeaseGone(Exception):
    """A transaction named a lease etcd no longer has (it expired while the caller stalled)."""


Plan: TypeAlias = Generator[Call, Any, _T]


def txn_call(
    compare: list[dict[str, Any]], success: list[dict[str, Any]], failure: list[dict[str, Any]]
) -> Call:
    return Call("write", "/v3/kv/txn", {"compare": compare, "success": success, "failure": failure})


def read_call(ops: list[dict[str, Any]]) -> Call:
    return Call("read", "/v3/kv/txn", {"success": ops})


@dataclass(slots=True)
class Record:
    """A claim record as stored, with the revisions that fence it."""

    id: str
    fence: int
    mod: int
    holder: str
    targets: str
    state: ClaimState
    request_id: str | None
    created: int
    updated: int
    expires: int | None
    taken_over: bool
    lease: int
    mode: str = EXCLUSIVE
    """Stored as ``"m": "s"`` for a shared claim only: an exclusive record is as it always was."""

    @classmethod
    def of(cls, kv: KV, claim_id: str) -> Record:
        d = json.loads(kv.value)
        return cls(
            claim_id, kv.create, kv.mod, d["h"], d["t"], _STATES[d["s"]], d["r"],
            d["c"], d["u"], d["x"], d["o"], d["l"], SHARED if "m" in d else EXCLUSIVE,
        )  # fmt: skip

    def value(self) -> bytes:
        data = {
            "h": self.holder, "t": self.targets, "s": self.state.value, "r": self.request_id,
            "c": self.created, "u": self.updated, "x": self.expires, "o": self.taken_over,
            "l": self.lease,
        }  # fmt: skip
        if self.mode == SHARED:
            data["m"] = "s"
        return json.dumps(data, ensure_ascii=False, separators=(",", ":")).encode()

    def claim(self, state: ClaimState) -> Claim:
        values = {
            "id": self.id, "holder": self.holder, "targets": targets_from_text(self.targets),
            "state": state, "fence": self.fence, "request_id": self.request_id,
            "taken_over": self.taken_over, "_expires_at_us": self.expires,
            "_created_at_us": self.created, "_updated_at_us": self.updated,
        }  # fmt: skip
        if self.mode == SHARED:
            values["mode"] = SHARED
        return claim_from_micros(values)

    @property
    def unit_list(self) -> list[Unit]:
        return [t for t in targets_from_text(self.targets) if isinstance(t, Unit)]

    @property
    def span_resources(self) -> list[str]:
        return sorted({t.resource for t in targets_from_text(self.targets) if isinstance(t, Span)})


@dataclass(slots=True)
class Blocker:
    """A claim found on a target, read after the view: live, or dead for good."""

    record: Record | None
    live: bool


@dataclass(slots=True)
class View:
    """What a claim's keys held at one revision."""

    units: list[KV | None]
    readers: list[list[KV]]
    """Each unit's readers' keys (read by an exclusive claim only: a reader ignores them)."""
    revision: int
    """The revision the view was read at."""
    request: KV | None
    guards: dict[str, KV | None]
    entries: dict[str, list[KV]]
    known: dict[str, Blocker] = field(default_factory=dict)
    """Claims read at the view's own revision (the owners this store last saw on the units)."""


@dataclass(slots=True)
class ClaimPlan:
    """Everything one claim call fixes before its first request."""

    targets: tuple[Target, ...]
    holder: str
    request_id: str | None
    ttl: float | None
    units: list[Unit]
    spans: list[Span]
    resources: list[str]
    unit_keys: list[bytes]
    request_key: bytes | None
    fingerprint: str | None
    claim_id: str
    shared: bool = False
    known_dead: set[tuple[bytes, int]] = field(default_factory=set)
    lease: int = 0
    lease_from: int = 0
    """When the lease grant was sent (µs, the store's clock): the lease ends no sooner than
    its TTL after this."""
    hints: list[tuple[str, str]] = field(default_factory=list)
    """The claims read with the last view (see :meth:`Operations._view_ops`)."""
