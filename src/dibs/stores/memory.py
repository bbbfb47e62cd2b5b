"""``memory://``: an in-process store for threads. Everything is lost on exit.

Locking (docs/design.md, principle 7). Every key that a claim touches maps to one lock of a
striped table: a unit to the stripe of the unit, spans to the stripe of their
resource, a request ID to the stripe of the ID. An operation takes the stripes
of all its keys in ascending stripe index — one total order, intrinsic to the
keys — so no two operations can wait on each other in a cycle. No global lock
sits on the claim path.

What guards what:

* ``_units[unit]`` and the ``_spans[resource]`` list: the stripe of that key.
* ``_requests[request_id]``: the stripe of that request ID (any stripe may be
  shared by several keys; sharing only serializes more), taken together
  with the claim's stripes, so the record is written in the claim's atomic step.
* A claim record's fields: the stripes of *all* its targets for a live
  transition (confirm, extend, release, sweep). A claimant that takes over a
  dead hold holds only the stripe of the target it takes and writes only
  ``expired`` and ``taken_over``; a dead hold never becomes live again (the
  clock only moves forward), so that write commutes with every other. It is
  still serialized with the hold's own confirm, extend and release, which hold
  that stripe too.
* Which dict a holder's claims go into (``_by_holder[holder]`` being present):
  the holder's lock in ``_holder_locks``, a separate striped table taken
  innermost (after the claim's stripes) and never held while waiting for
  another lock, so it adds no cycle. The sweep drops a holder's empty dict
  under it, so a claim never adds to a dict the sweep has just dropped.
* The dicts themselves (``_claims``, ``_by_holder``, and the containers
  above) rely on CPython's atomic single-operation dict updates.

The reason rule (docs/stores.md): a hold that the sweep marked expired keeps
its unit and span entries until it is purged, so that a later claimant that
takes one of its targets can still mark it ``taken_over``.
"""

from __future__ import annotations

import itertools
import secrets
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Any, NamedTuple

from dibs._clock import Clock, SystemClock
from dibs._model import (
    Claim,
    ClaimResult,
    ClaimState,
    Span,
    SweepResult,
    Target,
    Unit,
    make_claim,
    make_result,
)
from dibs.exceptions import (
    HoldLost,
    HoldLostReason,
    InvalidInput,
    RequestConflict,
)
from dibs.stores.base import (
    DEFAULT_REQUEST_RETENTION,
    Store,
    claim_not_found,
    hold_lost,
    lost_reason,
    not_holder,
    span_kind_mismatch,
)
from dibs.stores.capabilities import ChangeFeed, ClaimLog, ClaimReader, UnchangingFeed
from dibs.stores.jobs import JobTable, MemoryJobs

__all__ = ["MemoryStore"]

_HELD = ClaimState.HELD
_CONFIRMED = ClaimState.CONFIRMED
_RELEASED = ClaimState.RELEASED
_EXPIRED = ClaimState.EXPIRED
_OCCUPYING = (_HELD, _CONFIRMED)
_HOLDER_LOCKS = 64
_fromtimestamp = datetime.fromtimestamp


class _Record:
    """The mutable claim behind :class:`~dibs.Claim` snapshots."""

    __slots__ = (
        "created_at",
        "expires_at",
        "fence",
        "holder",
        "id",
        "request_id",
        "state",
        "stripes",
        "taken_over",
        "targets",
        "updated_at",
    )

    def __init__(
        self,
        id: str,
        holder: str,
        targets: tuple[Target, ...],
        state: ClaimState,
        fence: int,
        expires_at: int | None,
        request_id: str | None,
        now: int,
        stripes: tuple[int, ...],
    ) -> None:
        self.id = id
        self.holder = holder
        self.targets = targets
        self.state = state
        self.fence = fence
        self.expires_at = expires_at
        self.request_id = request_id
        self.created_at = now
        self.updated_at = now
        self.taken_over = False
        self.stripes = stripes

    def live(self, now: int) -> bool:
        state = self.state
        if state is _CONFIRMED:
            return True
        return state is _HELD and self.expires_at > now  # type: ignore[operator]

    def snapshot(self, now: int) -> Claim:
        state = self.state
        if state is _HELD and self.expires_at <= now:  # type: ignore[operator]
            state = _EXPIRED  # dead before a sweep marked it: derive on read
        created = _fromtimestamp(self.created_at / 1e6, UTC)
        return make_claim(
            self.id,
            self.holder,
            self.targets,
            state,
            self.fence,
            None if self.expires_at is None else _fromtimestamp(self.expires_at / 1e6, UTC),
            self.request_id,
            created,
            created
            if self.updated_at == self.created_at
            else _fromtimestamp(self.updated_at / 1e6, UTC),
            self.taken_over,
        )

    def kill(self, now: int, *, taken_over: bool) -> None:
        """Mark a dead hold expired (idempotent; see the module docstring)."""
        self.state = _EXPIRED
        self.taken_over = self.taken_over or taken_over
        self.updated_at = now

    def takeable(self) -> bool:
        """Whether a claim granted on a target of this dead record takes it over."""
        state = self.state
        return state is _HELD or (state is _EXPIRED and not self.taken_over)

    def indexed(self) -> bool:
        """Whether the unit and span indexes must keep this record (the reason rule)."""
        state = self.state
        return state in _OCCUPYING or (state is _EXPIRED and not self.taken_over)


class _Request(NamedTuple):
    """A request record; a named tuple because one is made per claim with an ID."""

    holder: str
    targets: tuple[Target, ...]
    ttl: float | None
    claim_id: str | None
    taken: tuple[Target, ...]
    created_at: int


class MemoryStore(Store):
    """Claims in this process's memory, safe for many threads; lost on exit."""

    scheme = "memory"
    in_process = True
    local_clock = True

    def __init__(
        self,
        *,
        clock: Clock | None = None,
        request_retention: float = DEFAULT_REQUEST_RETENTION,
        stripes: int = 1024,
    ) -> None:
        super().__init__(clock=clock, request_retention=request_retention)
        if isinstance(stripes, bool) or not isinstance(stripes, int) or stripes < 1:
            raise InvalidInput(
                f"stripes must be a positive integer, got {stripes!r}",
                field="stripes",
                value=stripes,
            )
        self._locks = [threading.Lock() for _ in range(stripes)]
        self._nstripes = stripes
        self._units: dict[Unit, _Record] = {}
        self._spans: dict[str, list[tuple[Span, _Record]]] = {}
        self._requests: dict[str, _Request] = {}
        self._claims: dict[str, _Record] = {}
        self._by_holder: dict[str, dict[str, _Record]] = {}
        self._holder_locks = [threading.Lock() for _ in range(_HOLDER_LOCKS)]
        # next() on itertools.count is atomic under the GIL; it is only called
        # with the claim's stripes held, so a later claim on the same target
        # (which must take the same stripe) draws a larger fence.
        self._fences = itertools.count(1)
        self._newest_fence = 0
        self._id_prefix = secrets.token_hex(4)
        # The claim path reads the clock once per claim; skip a call layer.
        self._clock_now = time.time if type(self.clock) is SystemClock else self.clock.now
        # Store times are whole microseconds, as on the SQL stores, so that every store
        # judges an expiry at the same instant (a float sum can land an ulp either side).
        self._retention_us = round(self.request_retention * 1_000_000)
        self._jobs = MemoryJobs(self._clock_now)  # durable mode's rows live as long as this object

    @classmethod
    def from_url(cls, url: str, **options: Any) -> MemoryStore:
        """Open from ``memory://`` (the URL carries no options)."""
        rest = url.split("://", 1)[1]
        if rest not in ("", "/"):
            raise InvalidInput(
                f"memory:// takes no path or options, got {url!r}", field="url", value=url
            )
        return cls(**options)

    @classmethod
    def exists(cls, url: str, **options: Any) -> bool:
        """Never: a memory:// store is born empty in the process that opens it."""
        return False

    def _now_us(self) -> int:
        return round(self._clock_now() * 1_000_000)

    # --- locking ------------------------------------------------------------------------------

    def _stripe(self, key: object) -> int:
        return hash(key) % self._nstripes

    def _target_stripes(self, targets: tuple[Target, ...]) -> tuple[int, ...]:
        n = self._nstripes
        if len(targets) == 1 and type(targets[0]) is Unit:
            return (hash(targets[0]) % n,)
        return tuple(
            sorted(
                {
                    hash(t) % n if isinstance(t, Unit) else hash(("span", t.resource)) % n
                    for t in targets
                }
            )
        )

    def _acquire(self, stripes: tuple[int, ...]) -> None:
        # `stripes` is sorted ascending: the one global order (module docstring).
        locks = self._locks
        for i in stripes:
            locks[i].acquire()

    def _release_locks(self, stripes: tuple[int, ...]) -> None:
        locks = self._locks
        for i in reversed(stripes):
            locks[i].release()

    @contextmanager
    def _locked(self, stripes: tuple[int, ...]) -> Iterator[None]:
        self._acquire(stripes)
        try:
            yield
        finally:
            self._release_locks(stripes)

    # --- claim --------------------------------------------------------------------------------

    def _claim(
        self, targets: tuple[Target, ...], holder: str, request_id: str | None, ttl: float | None
    ) -> ClaimResult:
        n = self._nstripes
        if len(targets) == 1 and type(targets[0]) is Unit:
            stripes: tuple[int, ...] = (hash(targets[0]) % n,)
        else:
            stripes = self._target_stripes(targets)
        if request_id is not None:
            rstripe = hash(request_id) % n
            if len(stripes) == 1:
                only = stripes[0]
                if rstripe != only:
                    stripes = (only, rstripe) if only < rstripe else (rstripe, only)
            elif rstripe not in stripes:
                stripes = tuple(sorted((*stripes, rstripe)))
        # The claim path takes its locks by hand: a generator context manager
        # costs more than the rest of an uncontended claim.
        locks = self._locks
        for i in stripes:
            locks[i].acquire()
        try:
            # Linearization point: everything below runs with every stripe the
            # claim touches held, so the check and the set are one step.
            now = round(self._clock_now() * 1_000_000)
            if request_id is not None:
                prior = self._requests.get(request_id)
                if prior is not None and prior.created_at + self._retention_us > now:
                    if (prior.holder, prior.targets, prior.ttl) != (holder, targets, ttl):
                        raise RequestConflict(
                            f"request ID {request_id!r} was already used with different input",
                            request_id=request_id,
                        )
                    return self._replay(prior, now)
            result = self._decide(targets, holder, request_id, ttl, stripes, now)
            if request_id is not None:
                self._requests[request_id] = _Request(
                    holder,
                    targets,
                    ttl,
                    result.claim.id if result.claim is not None else None,
                    result.taken,
                    now,
                )
            return result
        finally:
            for i in reversed(stripes):
                locks[i].release()

    def _replay(self, prior: _Request, now: int) -> ClaimResult:
        if prior.claim_id is None:
            return make_result(False, None, prior.taken, replayed=True)
        record = self._claims.get(prior.claim_id)
        claim = record.snapshot(now) if record is not None else None
        return make_result(True, claim, (), replayed=True)

    def _decide(
        self,
        targets: tuple[Target, ...],
        holder: str,
        request_id: str | None,
        ttl: float | None,
        stripes: tuple[int, ...],
        now: int,
    ) -> ClaimResult:
        units = self._units
        # Allocated only when needed: throwaway objects on the hot path cost
        # more in garbage collection than in their own construction.
        taken: list[Target] | None = None
        blockers: set[_Record] | None = None
        dead: list[_Record] | None = None
        for target in targets:
            if type(target) is Unit or isinstance(target, Unit):
                current = units.get(target)
                if current is None:
                    continue
                if current.live(now):
                    if taken is None or blockers is None:
                        taken, blockers = [], set()
                    taken.append(target)
                    blockers.add(current)
                elif current.takeable():
                    if dead is None:
                        dead = []
                    dead.append(current)
            else:
                assert isinstance(target, Span)
                for span, current in self._spans.get(target.resource, ()):
                    # A span of the other kind would block any span here had it
                    # been live, so a dead one is taken over like an overlap.
                    switch = span.kind != target.kind
                    if not switch and not span.overlaps(target):
                        continue
                    if current.live(now):
                        if switch:
                            raise span_kind_mismatch(target, span.kind)
                        if taken is None or blockers is None:
                            taken, blockers = [], set()
                        if target not in taken:
                            taken.append(target)
                        blockers.add(current)
                    elif current.takeable():
                        if dead is None:
                            dead = []
                        dead.append(current)
        if taken:
            assert blockers is not None
            if len(blockers) == 1:
                (mine,) = blockers
                # Natural key: the holder re-claiming exactly what it holds.
                if mine.holder == holder and mine.targets == targets:
                    return make_result(True, mine.snapshot(now), (), replayed=True)
            return make_result(False, None, tuple(taken))

        fence = self._newest_fence = next(self._fences)
        record = _Record(
            f"{self._id_prefix}-{fence}",
            holder,
            targets,
            _CONFIRMED if ttl is None else _HELD,
            fence,
            None if ttl is None else now + round(ttl * 1_000_000),
            request_id,
            now,
            stripes,
        )
        if dead is not None:
            for old in dead:
                old.kill(now, taken_over=True)
                self._forget_holder(old)
        for target in targets:
            if type(target) is Unit or isinstance(target, Unit):
                units[target] = record
            else:
                entries = self._spans.get(target.resource)
                if entries is None:
                    self._spans[target.resource] = [(target, record)]
                else:
                    # Drop ended entries while we hold the resource's stripe; dead
                    # holds stay until a claimant takes them over or a sweep purges them.
                    entries[:] = [e for e in entries if e[1].indexed()]
                    entries.append((target, record))
        self._claims[record.id] = record
        with self._holder_locks[hash(holder) % _HOLDER_LOCKS]:
            held_by = self._by_holder.get(holder)
            if held_by is None:
                held_by = self._by_holder[holder] = {}
            held_by[record.id] = record
        return make_result(True, record.snapshot(now))

    def _forget_holder(self, record: _Record) -> None:
        mine = self._by_holder.get(record.holder)
        if mine is not None:
            mine.pop(record.id, None)

    # --- transitions on one claim ---------------------------------------------------------------

    def _owned(self, claim_id: str, holder: str) -> _Record:
        record = self._claims.get(claim_id)
        if record is None:
            raise claim_not_found(claim_id)
        if record.holder != holder:
            raise not_holder(claim_id, holder)
        return record

    def _require_live(self, record: _Record, fence: int, now: int) -> None:
        """Raise HoldLost unless ``record`` is live and ``fence`` is its fence."""
        # A dead hold is judged, not written: the sweep or a takeover marks it.
        reason = lost_reason(
            real_fence=record.fence,
            fence=fence,
            state=record.state,
            dead=record.state is _HELD and record.expires_at <= now,  # type: ignore[operator]
            taken_over=record.taken_over,
        )
        if reason is not None:
            raise hold_lost(record.id, reason, fence)

    def _confirm(self, claim_id: str, holder: str, fence: int) -> Claim:
        record = self._owned(claim_id, holder)
        with self._locked(record.stripes):
            # Linearization point: the state check and write under all stripes.
            now = self._now_us()
            self._require_live(record, fence, now)
            if record.state is _HELD:
                record.state = _CONFIRMED
                record.expires_at = None
                record.updated_at = now
            return record.snapshot(now)

    def _extend(self, claim_id: str, holder: str, fence: int, ttl: float) -> Claim:
        record = self._owned(claim_id, holder)
        with self._locked(record.stripes):
            now = self._now_us()
            self._require_live(record, fence, now)
            if record.state is _HELD:
                record.expires_at = now + round(ttl * 1_000_000)
                record.updated_at = now
            return record.snapshot(now)

    def _release(self, claim_id: str, holder: str, fence: int) -> bool:
        record = self._owned(claim_id, holder)
        with self._locked(record.stripes):
            now = self._now_us()
            try:
                self._require_live(record, fence, now)
            except HoldLost as lost:
                if lost.reason is HoldLostReason.FENCE:
                    raise
                return False
            record.state = _RELEASED
            record.expires_at = None
            record.updated_at = now
            self._detach(record, now)
            return True

    def _detach(self, record: _Record, now: int) -> None:
        """Remove an ended record from the indexes; caller holds all its stripes."""
        for target in record.targets:
            if isinstance(target, Unit):
                if self._units.get(target) is record:
                    del self._units[target]
            else:
                entries = self._spans.get(target.resource)
                if entries is not None:
                    entries[:] = [e for e in entries if e[1] is not record and e[1].indexed()]
                    if not entries:
                        del self._spans[target.resource]
        self._forget_holder(record)

    # --- reads ----------------------------------------------------------------------------------

    def _get(self, claim_id: str) -> Claim | None:
        record = self._claims.get(claim_id)
        if record is None:
            return None
        with self._locked(record.stripes):
            return record.snapshot(self._now_us())

    def _holder_of(self, target: Unit | Span) -> str | None:
        now = self._now_us()
        if isinstance(target, Unit):
            record = self._units.get(target)
            return record.holder if record is not None and record.live(now) else None
        for span, record in list(self._spans.get(target.resource, ())):
            if span.overlaps(target) and record.live(now):
                return record.holder
        return None

    def _claims_of(self, holder: str) -> list[Claim]:
        now = self._now_us()
        records = list(self._by_holder.get(holder, {}).copy().values())
        return [r.snapshot(now) for r in sorted(records, key=lambda r: r.fence) if r.live(now)]

    # --- housekeeping ---------------------------------------------------------------------------

    def _sweep(self) -> SweepResult:
        expired = purged_claims = purged_requests = 0
        now = self._now_us()
        retention = self._retention_us
        for record in list(self._claims.copy().values()):
            if record.state is _HELD and record.expires_at <= now:  # type: ignore[operator]
                with self._locked(record.stripes):
                    now = self._now_us()
                    if record.state is _HELD and record.expires_at <= now:  # type: ignore[operator]
                        record.kill(now, taken_over=False)
                        # Its unit and span entries stay until the purge, so that
                        # a later claimant can still take it over (the reason rule).
                        self._forget_holder(record)
                        expired += 1
            elif (
                record.state in (_RELEASED, _EXPIRED)
                and record.updated_at + retention <= now
                # Like every store, keep the newest claim (see SQLiteStore).
                and record.fence != self._newest_fence
            ):
                with self._locked(record.stripes):
                    # A takeover may have marked it since (and moved updated_at).
                    if record.updated_at + retention <= now:
                        self._detach(record, now)
                        self._claims.pop(record.id, None)
                        purged_claims += 1
        for request_id, request in list(self._requests.copy().items()):
            if request.created_at + self._retention_us <= now:
                stripe = hash(request_id) % self._nstripes
                with self._locked((stripe,)):
                    current = self._requests.get(request_id)
                    if current is not None and current.created_at + self._retention_us <= now:
                        del self._requests[request_id]
                        purged_requests += 1
        for holder, mine in list(self._by_holder.copy().items()):
            if not mine:
                # Under the holder's lock, so no claim is adding to this dict now.
                with self._holder_locks[hash(holder) % _HOLDER_LOCKS]:
                    if not mine and self._by_holder.get(holder) is mine:
                        del self._by_holder[holder]
        return SweepResult(
            expired=expired, purged_requests=purged_requests, purged_claims=purged_claims
        )

    # --- capabilities ---------------------------------------------------------------------------

    def job_table(self) -> JobTable:
        """Job rows in this object's memory: durable mode for the threads of one process."""
        return self._jobs

    def change_feed(self) -> ChangeFeed:
        """A feed that never moves: only this process changes a memory store."""
        return UnchangingFeed()

    def claim_log(self) -> ClaimLog:
        """Every claim this object keeps, read in place."""
        return ClaimReader(self._log)

    def _log(self) -> list[Claim]:
        # list() copies the values in one step under the GIL; no stripe is taken,
        # so a claim in flight may be seen half-written: read a quiet store.
        records = sorted(list(self._claims.values()), key=lambda r: r.fence)
        return [r.snapshot(_BEFORE_ANY_EXPIRY) for r in records]

    def _close(self) -> None:
        self._units.clear()
        self._spans.clear()
        self._requests.clear()
        self._claims.clear()
        self._by_holder.clear()


_BEFORE_ANY_EXPIRY = -(2**62)
"""A "now" no hold has expired by, so snapshots keep the stored state (held, not derived)."""
