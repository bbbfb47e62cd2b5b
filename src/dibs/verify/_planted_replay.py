"""Planted bugs that the log replay catches on its own, without the linearizability search.

The search catches each of these too, but only where it finishes; the replay
(:func:`dibs.verify._log.replay_log`) is one pass, so a history too large to
search still catches them. Each plant breaks one promise of docs/design.md:

* ``grant-targets`` — a group claim is granted on fewer targets than asked
  (the last one is dropped), and answered "granted";
* ``fence-ignored`` — confirm, extend and release use the claim's own fence
  in place of the one given, so a stale fence is accepted (principle 4);
* ``extend-revives`` — extend checks a hold's state but not its expiry: a dead
  hold nobody took over comes back to life (principle 4);
* ``replay-reclaims`` — a remembered refusal is claimed afresh when its
  request ID comes again, as if only grants were remembered (principle 3);
* ``request-input-ignored`` — a request ID reused with different input
  replays the first outcome instead of raising ``RequestConflict`` (principle 3).
"""

from __future__ import annotations

import threading
from typing import Any

from dibs._model import Claim, ClaimResult
from dibs._request import ClaimRequest
from dibs.exceptions import RequestConflict
from dibs.stores.base import Store
from dibs.stores.memory import MemoryStore
from dibs.stores.sqlite import SQLiteStore

__all__ = ["REPLAY_PLANTS", "replay_plant"]

REPLAY_PLANTS = (
    "grant-targets",
    "fence-ignored",
    "extend-revives",
    "replay-reclaims",
    "request-input-ignored",
)

# The mixins below sit before a concrete store in the MRO; ``super()`` is that store.
# mypy sees only the abstract Store: hence the safe-super ignores.


class _FewerTargets(Store):
    def _claim(self, request: ClaimRequest) -> ClaimResult:
        # BUG: the last target of a group is never claimed, and the grant says nothing.
        targets = request.targets
        kept = targets[:-1] if len(targets) > 1 else targets
        return super()._claim(  # type: ignore[safe-super]
            ClaimRequest.of(kept, request.holder, request.request_id, request.ttl)
        )


class _FenceIgnored(Store):
    def _own_fence(self, claim_id: str, holder: str, fence: int) -> int:
        claim = self._get(claim_id)
        # BUG: the claim's fence replaces the caller's, so a stale fence passes.
        return claim.fence if claim is not None and claim.holder == holder else fence

    def _confirm(self, claim_id: str, holder: str, fence: int) -> Claim:
        fence = self._own_fence(claim_id, holder, fence)
        return super()._confirm(claim_id, holder, fence)  # type: ignore[safe-super]

    def _extend(self, claim_id: str, holder: str, fence: int, ttl: float) -> Claim:
        fence = self._own_fence(claim_id, holder, fence)
        return super()._extend(claim_id, holder, fence, ttl)  # type: ignore[safe-super]

    def _release(self, claim_id: str, holder: str, fence: int) -> bool:
        fence = self._own_fence(claim_id, holder, fence)
        return super()._release(claim_id, holder, fence)  # type: ignore[safe-super]


class _ReplayReclaims(Store):
    def _claim(self, request: ClaimRequest) -> ClaimResult:
        result = super()._claim(request)  # type: ignore[safe-super]
        if result.replayed and not result.granted:
            # BUG: a refusal is not worth remembering: try again, as a new claim.
            again = ClaimRequest.of(request.targets, request.holder, None, request.ttl)
            return super()._claim(again)  # type: ignore[safe-super]
        return result


class _InputIgnored(Store):
    def _claim(self, request: ClaimRequest) -> ClaimResult:
        first = self.__dict__.setdefault("_first_input", {})
        if request.request_id is not None:
            first.setdefault(request.request_id, request)
        try:
            return super()._claim(request)  # type: ignore[safe-super]
        except RequestConflict:
            # BUG: the first input's outcome, replayed, for a request with other input.
            return super()._claim(first[request.request_id])  # type: ignore[safe-super]


_extending = threading.local()
"""Set while a thread runs a planted ``extend-revives`` extend."""


class _ReviveMemory(MemoryStore):
    def _extend(self, claim_id: str, holder: str, fence: int, ttl: float) -> Claim:
        _extending.on = True
        try:
            return super()._extend(claim_id, holder, fence, ttl)
        finally:
            _extending.on = False

    def _require_live(self, record: Any, fence: int, now: int) -> None:
        # BUG: extend judges the hold as of the epoch, so an expired hold is live.
        super()._require_live(record, fence, 0 if getattr(_extending, "on", False) else now)


class _ReviveSQLite(SQLiteStore):
    def _extend(self, claim_id: str, holder: str, fence: int, ttl: float) -> Claim:
        _extending.on = True
        try:
            return super()._extend(claim_id, holder, fence, ttl)
        finally:
            _extending.on = False

    def _owned(self, conn: Any, claim_id: str, holder: str, fence: int, now: int) -> Any:
        # BUG: extend judges the hold as of the epoch, so an expired hold is live.
        return super()._owned(
            conn, claim_id, holder, fence, 0 if getattr(_extending, "on", False) else now
        )


_MIXINS: dict[str, type] = {
    "grant-targets": _FewerTargets,
    "fence-ignored": _FenceIgnored,
    "replay-reclaims": _ReplayReclaims,
    "request-input-ignored": _InputIgnored,
}


def replay_plant(plant: str, base: type[Store]) -> type[Store] | None:
    """The store class ``base`` with the replay plant ``plant``, or None if it has none."""
    if plant == "extend-revives":
        revive: dict[type[Store], type[Store]] = {
            MemoryStore: _ReviveMemory,
            SQLiteStore: _ReviveSQLite,
        }
        return revive.get(base)
    mixin = _MIXINS.get(plant)
    if mixin is None:
        return None
    planted: type[Store] = type(f"{mixin.__name__.lstrip('_')}{base.__name__}", (mixin, base), {})
    return planted
