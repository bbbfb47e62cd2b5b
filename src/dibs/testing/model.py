"""A pure model of the claim rules, to check stores against.

The model is deliberately naive (lists and linear scans, no locks, no
indexes) so that it can be read against docs/design.md's principles line by line.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from dibs._model import EXCLUSIVE, ClaimState, Span, Target, Unit, conflicts
from dibs.exceptions import (
    ClaimNotFound,
    HoldLost,
    HoldLostReason,
    NotHolder,
    RequestConflict,
    SpanKindMismatch,
)

__all__ = ["ModelClaim", "ModelOutcome", "ModelStore", "us"]


def us(seconds: float) -> int:
    """Seconds as whole microseconds, rounded to the nearest, as the stores keep time."""
    return round(seconds * 1_000_000)


@dataclass
class ModelClaim:
    """One claim as the model keeps it."""

    key: int
    holder: str
    targets: tuple[Target, ...]
    state: ClaimState
    fence: int
    expires_at: int | None  # whole µs since the epoch, as every store keeps time
    taken_over: bool = False
    updated_at: int = 0
    purged: bool = False
    mode: str = EXCLUSIVE

    def live(self, now: int) -> bool:
        return self.state is ClaimState.CONFIRMED or (
            self.state is ClaimState.HELD and self.expires_at is not None and self.expires_at > now
        )

    def dead_hold(self, now: int) -> bool:
        return self.state is ClaimState.HELD and not self.live(now)

    def covers(self, target: Target) -> bool:
        return any(_conflicts(mine, target) for mine in self.targets)

    def excludes(self, target: Target, mode: str) -> bool:
        """Whether this claim, live, blocks a claim of ``target`` in ``mode`` (readers share)."""
        return conflicts(mode, self.mode) and self.covers(target)

    def would_block(self, target: Target, mode: str = EXCLUSIVE) -> bool:
        """Whether this claim, were it live, would block a claim of ``target`` in ``mode``.

        Wider than :meth:`excludes`: any span of the other kind on the same
        resource blocks (a live one raises SpanKindMismatch), whatever the modes.
        """
        return any(
            (conflicts(mode, self.mode) and _conflicts(mine, target)) or _kind_switch(mine, target)
            for mine in self.targets
        )

    def takeable(self) -> bool:
        """Whether a later grant that it would have blocked takes it over (the reason rule)."""
        if self.purged:
            return False
        return self.state is ClaimState.HELD or (
            self.state is ClaimState.EXPIRED and not self.taken_over
        )

    def observed_state(self, now: int) -> ClaimState:
        return ClaimState.EXPIRED if self.dead_hold(now) else self.state


def _conflicts(a: Target, b: Target) -> bool:
    if isinstance(a, Unit) or isinstance(b, Unit):
        return a == b
    return a.overlaps(b)


def _kind_switch(a: Target, b: Target) -> bool:
    return (
        isinstance(a, Span)
        and isinstance(b, Span)
        and a.resource == b.resource
        and a.kind != b.kind
    )


@dataclass
class ModelOutcome:
    """What the model says a claim returns: granted key or taken targets, and replayed."""

    granted: bool
    key: int | None
    taken: tuple[Target, ...]
    replayed: bool


@dataclass
class ModelStore:
    """The claim rules on plain lists; ``now`` is passed in by the caller.

    Each method takes ``now`` in seconds and judges time in whole microseconds,
    rounded to the nearest, as every store does: a hold of ``ttl`` seconds
    claimed at ``now`` is live while ``us(now') < us(now) + us(ttl)``.
    """

    retention: float
    claims: list[ModelClaim] = field(default_factory=list)
    requests: dict[str, tuple[Any, ModelOutcome, int]] = field(default_factory=dict)
    last_fence: int = 0

    def claim(
        self,
        targets: tuple[Target, ...],
        holder: str,
        request_id: str | None,
        ttl: float | None,
        now: float,
        mode: str = EXCLUSIVE,
    ) -> ModelOutcome:
        return self._claim(targets, holder, request_id, ttl, us(now), mode)

    def _claim(
        self,
        targets: tuple[Target, ...],
        holder: str,
        request_id: str | None,
        ttl: float | None,
        now: int,
        mode: str = EXCLUSIVE,
    ) -> ModelOutcome:
        if request_id is not None and request_id in self.requests:
            fp, outcome, at = self.requests[request_id]
            if at + us(self.retention) > now:
                if fp != (holder, targets, ttl, mode):
                    raise RequestConflict("conflict", request_id=request_id)
                return ModelOutcome(outcome.granted, outcome.key, outcome.taken, True)
        outcome = self._decide(targets, holder, ttl, now, mode)
        if request_id is not None:
            self.requests[request_id] = ((holder, targets, ttl, mode), outcome, now)
        return outcome

    def _decide(
        self,
        targets: tuple[Target, ...],
        holder: str,
        ttl: float | None,
        now: int,
        mode: str = EXCLUSIVE,
    ) -> ModelOutcome:
        for target in targets:
            if isinstance(target, Span):
                for other in self.claims:
                    if other.live(now) and any(
                        isinstance(s, Span)
                        and s.resource == target.resource
                        and s.kind != target.kind
                        for s in other.targets
                    ):
                        raise SpanKindMismatch("mixed", field="targets", value=target)
        taken = tuple(
            t for t in targets if any(c.live(now) and c.excludes(t, mode) for c in self.claims)
        )
        if taken:
            blockers = {
                c.key for t in taken for c in self.claims if c.live(now) and c.excludes(t, mode)
            }
            if len(blockers) == 1:
                mine = self.claims[blockers.pop()]
                if mine.holder == holder and mine.targets == targets and mine.mode == mode:
                    return ModelOutcome(True, mine.key, (), True)
            return ModelOutcome(False, None, taken, False)
        # The reason rule: every dead hold this grant would have been blocked
        # by, had it been live, is taken over, whether or not a sweep marked it.
        for other in self.claims:
            if (
                not other.live(now)
                and other.takeable()
                and any(other.would_block(t, mode) for t in targets)
            ):
                other.state = ClaimState.EXPIRED
                other.taken_over = True
                other.updated_at = now
        self.last_fence += 1
        claim = ModelClaim(
            key=len(self.claims),
            holder=holder,
            targets=targets,
            state=ClaimState.CONFIRMED if ttl is None else ClaimState.HELD,
            fence=self.last_fence,
            expires_at=None if ttl is None else now + us(ttl),
            updated_at=now,
            mode=mode,
        )
        self.claims.append(claim)
        return ModelOutcome(True, claim.key, (), False)

    def _live_or_raise(self, key: int, holder: str, fence: int, now: int) -> ModelClaim:
        claim = self.claims[key]
        if claim.purged:
            raise ClaimNotFound("purged", claim_id=str(key))
        if claim.holder != holder:
            raise NotHolder("not holder", claim_id=str(key), holder=holder)
        if claim.fence != fence:
            raise HoldLost("fence", claim_id=str(key), reason=HoldLostReason.FENCE)
        if claim.state is ClaimState.RELEASED:
            raise HoldLost("released", claim_id=str(key), reason=HoldLostReason.RELEASED)
        if claim.state is ClaimState.EXPIRED or claim.dead_hold(now):
            reason = HoldLostReason.TAKEN_OVER if claim.taken_over else HoldLostReason.EXPIRED
            raise HoldLost("lost", claim_id=str(key), reason=reason)
        return claim

    def confirm(self, key: int, holder: str, fence: int, seconds: float) -> ModelClaim:
        now = us(seconds)
        claim = self._live_or_raise(key, holder, fence, now)
        if claim.state is ClaimState.HELD:
            claim.state, claim.expires_at, claim.updated_at = ClaimState.CONFIRMED, None, now
        return claim

    def extend(self, key: int, holder: str, fence: int, ttl: float, seconds: float) -> ModelClaim:
        now = us(seconds)
        claim = self._live_or_raise(key, holder, fence, now)
        if claim.state is ClaimState.HELD:
            claim.expires_at, claim.updated_at = now + us(ttl), now
        return claim

    def release(self, key: int, holder: str, fence: int, seconds: float) -> bool:
        now = us(seconds)
        try:
            claim = self._live_or_raise(key, holder, fence, now)
        except HoldLost as lost:
            if lost.reason is HoldLostReason.FENCE:
                raise
            return False
        claim.state, claim.expires_at, claim.updated_at = ClaimState.RELEASED, None, now
        return True

    def holder_of(self, target: Target, seconds: float) -> str | None:
        now = us(seconds)
        for claim in self.claims:
            if claim.live(now) and claim.covers(target):
                return claim.holder
        return None

    def state_of(self, key: int, seconds: float) -> ClaimState:
        """The state a read of claim ``key`` reports at ``seconds`` (a dead hold reads expired)."""
        return self.claims[key].observed_state(us(seconds))

    def sweep(self, seconds: float) -> int:
        now = us(seconds)
        expired = 0
        for claim in self.claims:
            if claim.dead_hold(now):
                claim.state, claim.updated_at = ClaimState.EXPIRED, now
                expired += 1
            elif (
                claim.state in (ClaimState.RELEASED, ClaimState.EXPIRED)
                and claim.updated_at + us(self.retention) <= now
                and claim.fence != self.last_fence  # the newest claim is kept
            ):
                claim.purged = True
        self.requests = {
            rid: rec for rid, rec in self.requests.items() if rec[2] + us(self.retention) > now
        }
        return expired
