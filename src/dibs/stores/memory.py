"""``memory://``: an in-process store for threads. Everything is lost on exit.

Locking (docs/design.md, principle 7). Every key that a claim touches maps to one lock of a
striped table: a unit to the stripe of the unit, spans to the stripe of their
resource, a request ID to the stripe of the ID. An operation takes the stripes
of all its keys in ascending stripe index — one total order, intrinsic to the
keys — so no two operations can wait on each other in a cycle. No global lock
sits on the claim path.

What guards what:

* ``_units[unit._key]``, ``_readers[unit._key]`` and the ``_spans[resource]``
  list: the stripe of that key (the unit's stripe).
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
  another lock, so it adds no cycle. The sweep, and a release that empties the
  dict, drop a holder's empty dict under it, so a claim never adds to a dict
  that has just been dropped.
* Reads: ``get`` and ``holder_of`` take the stripes of what they read, and
  ``claims_of`` the stripes of every claim in the holder's index, reading the
  clock inside: an answer drawn from several records is one moment's, never a
  mix of records read before and after a transition.
* ``_group_stripes[claim_id]``: written once when a claim on several targets is
  made, popped when it is purged; the targets never change, so neither does it.
* The dicts themselves (``_claims``, ``_by_holder``, and the containers
  above) rely on CPython's atomic single-operation dict updates.

The hot paths. ``claim`` of one unit or of a group of units, and ``confirm``,
``extend`` and ``release``, run inline in the public methods when the call is
well-formed on its face (a transition recognises its claim: an ID found here,
the claim's own holder and fence), taking the stripes by hand; anything else
goes through :class:`~dibs.stores.base.Store`'s input checks to the general
``_``-steps below, so every error is the same. A claim record is a plain dict
that a :class:`~dibs.Claim` snapshot copies in one step (see
``dibs._model.claim_from_micros``): its times stay integer microseconds until a
caller reads one.

Shared claims (``mode="shared"``): a unit's exclusive claim is ``_units[unit._key]``
and its shared ones are the list ``_readers[unit._key]``; a span entry carries its
record, whose ``mode`` key is set only for a shared claim. A claim is decided
under the same stripes whatever its mode, so readers and writers on one target
serialize there. The exclusive inline paths look at ``_readers`` only when it
is not empty.

The reason rule (docs/stores.md): a hold that the sweep marked expired keeps
its unit and span entries until it is purged, so that a later claimant that
takes one of its targets can still mark it ``taken_over``.
"""

from __future__ import annotations

import itertools
import secrets
import threading
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from operator import attrgetter
from typing import Any, NotRequired, TypedDict

from dibs._bell import ring
from dibs._clock import Clock, SystemClock
from dibs._model import (
    EXCLUSIVE,
    SHARED,
    Claim,
    ClaimResult,
    ClaimState,
    Span,
    SweepResult,
    Target,
    Unit,
    check_retention,
    claim_from_micros,
    conflicts,
    make_result,
)
from dibs._request import ClaimRequest
from dibs.exceptions import (
    HoldLost,
    HoldLostReason,
    InvalidInput,
    RequestConflict,
)
from dibs.limits import NAME_MAX_BYTES, TTL_MAX, TTL_MIN
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
from dibs.stores.durability import IN_MEMORY, Finding
from dibs.stores.jobs import JobTable, MemoryJobs

try:  # read by mypyc (docs/design.md, "Compiled core"); a no-op as Python
    from mypy_extensions import mypyc_attr
except ImportError:  # the core needs nothing outside the standard library

    def mypyc_attr(*_: object, **__: object) -> Any:  # type: ignore[misc]
        return lambda cls: cls


__all__ = ["MemoryStore"]

_HELD = ClaimState.HELD
_CONFIRMED = ClaimState.CONFIRMED
_RELEASED = ClaimState.RELEASED
_EXPIRED = ClaimState.EXPIRED
_OCCUPYING = (_HELD, _CONFIRMED)
_HOLDER_LOCKS = 64
_new = object.__new__
_time_ns = time.time_ns
_unit_key = attrgetter("resource", "slot")  # Unit's order, from C


# A claim record is the mutable dict that its Claim snapshots copy (see
# dibs._model.claim_from_micros): the Claim's fields with its three times kept
# as whole microseconds. A snapshot is then one dict copy, and no datetime is
# made unless a caller reads one. Its fields are guarded as the module
# docstring says. A field at the Claim's class default (``taken_over``,
# ``mode``) is left out until it changes, and ``_ttl`` is the TTL the claim
# asked for, which its request record needs (a snapshot carries it too, as a
# private attribute): ten keys fill the smallest dict table that holds them.
class _Record(TypedDict):
    id: str
    holder: str
    targets: tuple[Target, ...]
    state: ClaimState
    fence: int
    request_id: str | None
    _ttl: float | None
    _expires_at_us: int | None
    _created_at_us: int
    _updated_at_us: int
    taken_over: NotRequired[bool]  # set once a takeover marks the claim
    mode: NotRequired[str]  # set for a shared claim only


# A request record: (holder, targets, ttl, claim ID or None, taken, created at µs, mode).
_Request = tuple[str, tuple[Target, ...], float | None, str | None, tuple[Target, ...], int, str]
# What _requests keeps: a request that an inline path granted keeps the claim's
# own record (its holder, targets, _ttl, id and created time are the request's
# and never change), so a claim with a request ID makes no object of its own for
# the request, which the garbage collector would walk for as long as it is kept.
# Any other request keeps a _Request. _request() reads either as a _Request.
_RequestEntry = _Request | _Record


def _request(entry: _RequestEntry) -> _Request:
    if type(entry) is tuple:
        return entry
    record: _Record = entry  # type: ignore[assignment]
    return (
        record["holder"],
        record["targets"],
        record["_ttl"],
        record["id"],
        (),
        record["_created_at_us"],
        EXCLUSIVE,  # the inline paths claim exclusively
    )


def _live(record: _Record, now: int) -> bool:
    state = record["state"]
    if state is _CONFIRMED:
        return True
    return state is _HELD and record["_expires_at_us"] > now  # type: ignore[operator]


def _snapshot(record: _Record, now: int) -> Claim:
    claim = claim_from_micros(record)  # type: ignore[arg-type]
    if record["state"] is _HELD and record["_expires_at_us"] <= now:  # type: ignore[operator]
        claim.__dict__["state"] = _EXPIRED  # dead before a sweep marked it: derive on read
    return claim


def _kill(record: _Record, now: int, *, taken_over: bool) -> None:
    """Mark a dead hold expired (idempotent; see the module docstring)."""
    record["state"] = _EXPIRED
    if taken_over:
        record["taken_over"] = True
    record["_updated_at_us"] = now


def _takeable(record: _Record) -> bool:
    """Whether a claim granted on a target of this dead record takes it over."""
    state = record["state"]
    return state is _HELD or (state is _EXPIRED and not record.get("taken_over", False))


def _indexed(record: _Record) -> bool:
    """Whether the unit and span indexes must keep this record (the reason rule)."""
    state = record["state"]
    return state in _OCCUPYING or (state is _EXPIRED and not record.get("taken_over", False))


def _granted(claim: Claim) -> ClaimResult:
    """``ClaimResult(True, claim)``; ``taken`` and ``replayed`` read the class defaults."""
    result: ClaimResult = _new(ClaimResult)
    values = result.__dict__
    values["granted"] = True
    values["claim"] = claim
    return result


# A compiled build (setup.py) keeps this class open to subclasses written in Python
# (dibs verify's planted bugs, the tests' reference store). The public methods take
# their arguments as Any: compiled code would check a declared type on entry and
# raise TypeError where every store raises InvalidInput.
@mypyc_attr(allow_interpreted_subclasses=True)
class MemoryStore(Store):
    """Claims in this process's memory, safe for many threads; lost on exit."""

    scheme = "memory"
    shared_holds = True
    in_process = True
    local_clock = True

    def __init__(
        self,
        *,
        clock: Clock | None = None,
        request_retention: Any = DEFAULT_REQUEST_RETENTION,
        stripes: Any = 1024,
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
        # Keyed by Unit._key: a str key is looked up without a Python-level hash call.
        self._units: dict[str, _Record] = {}
        self._readers: dict[str, list[_Record]] = {}
        self._spans: dict[str, list[tuple[Span, _Record]]] = {}
        self._requests: dict[str, _RequestEntry] = {}
        self._claims: dict[str, _Record] = {}
        self._by_holder: dict[str, dict[str, _Record]] = {}
        self._holder_locks = [threading.Lock() for _ in range(_HOLDER_LOCKS)]
        # The sorted stripes of each claim on several targets, made once (the
        # targets never change); dropped when the claim is purged.
        self._group_stripes: dict[str, tuple[int, ...]] = {}
        # next() on itertools.count is atomic under the GIL; it is only called
        # with the claim's stripes held, so a later claim on the same target
        # (which must take the same stripe) draws a larger fence.
        self._fences = itertools.count(1)
        self._newest_fence = 0
        self._id_prefix = secrets.token_hex(4) + "-"
        # Store times are whole microseconds, as on the SQL stores, so that every store
        # judges an expiry at the same instant (a float sum can land an ulp either side).
        # The system clock is read as integer nanoseconds, rounded to the nearest µs as
        # on every store: no float on the hot path.
        self._system_clock = type(self.clock) is SystemClock
        self._clock_now = self.clock.now
        self._retention_us = round(self.request_retention * 1_000_000)
        self._jobs = MemoryJobs(self._clock_now)  # durable mode's rows live as long as this object
        # The public claim, confirm, extend and release below do the common
        # well-formed call inline. A subclass that overrides the backend step
        # (dibs verify's planted bugs do) keeps its override on every call.
        cls = type(self)
        self._fast_claim = cls._claim is MemoryStore._claim
        self._fast_confirm = cls._confirm is MemoryStore._confirm
        self._fast_extend = cls._extend is MemoryStore._extend
        self._fast_release = cls._release is MemoryStore._release

    @classmethod
    def from_url(cls, url: str, **options: Any) -> MemoryStore:
        """Open from ``memory://`` (the URL carries no options)."""
        cls.check_url(url)
        return cls(**options)

    @classmethod
    def check_url(cls, url: str, **options: Any) -> None:
        """Refuse a ``memory://`` URL with a path or options (:class:`~dibs.InvalidInput`)."""
        rest = url.split("://", 1)[1]
        if rest not in ("", "/"):
            raise InvalidInput(
                f"memory:// takes no path or options, got {url!r}", field="url", value=url
            )
        if "request_retention" in options:
            check_retention(options["request_retention"])

    @classmethod
    def durability(cls, url: str, *, timeout: float = 5.0) -> list[Finding]:
        """Keeps nothing across a restart: :meth:`dibs.Store.durability`."""
        return [IN_MEMORY]

    @classmethod
    def exists(cls, url: str, **options: Any) -> bool:
        """Never: a memory:// store is born empty in the process that opens it."""
        cls.check_url(url, **options)  # a URL opening would refuse is refused, not "missing"
        return False

    def _now_us(self) -> int:
        if self._system_clock:
            return (_time_ns() + 500) // 1000
        return round(self._clock_now() * 1_000_000)

    # --- locking ------------------------------------------------------------------------------

    def _stripe(self, key: object) -> int:
        return hash(key) % self._nstripes

    def _target_stripes(self, targets: tuple[Target, ...]) -> tuple[int, ...]:
        n = self._nstripes
        if len(targets) == 1 and type(targets[0]) is Unit:
            return (targets[0]._hash % n,)
        stripes = set()
        for t in targets:
            stripes.add(t._hash % n if isinstance(t, Unit) else hash(("span", t.resource)) % n)
        return tuple(sorted(stripes))

    def _stripes_of(self, record: _Record) -> tuple[int, ...]:
        """The stripes of all a claim's targets: what a live transition holds."""
        stripes = self._group_stripes.get(record["id"])
        return self._target_stripes(record["targets"]) if stripes is None else stripes

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
        # Off the hot paths only: a generator context manager costs more than an
        # uncontended confirm.
        self._acquire(stripes)
        try:
            yield
        finally:
            self._release_locks(stripes)

    # --- the public calls, inline for the common case -------------------------------------------

    def claim(
        self,
        targets: Target | Iterable[Target],
        *,
        holder: Any,
        request_id: Any = None,
        ttl: Any = None,
        mode: Any = EXCLUSIVE,
    ) -> ClaimResult:
        # One exclusive unit, a plain ASCII holder and request ID, a TTL in range: everything
        # inline. Any other call (and any bad input) takes Store.claim, which
        # checks the input and raises the same errors on every store.
        if not (
            type(holder) is str
            and holder
            and len(holder) <= NAME_MAX_BYTES
            and holder.isascii()
            and "\x00" not in holder
            and (
                request_id is None
                or (
                    type(request_id) is str
                    and request_id
                    and len(request_id) <= NAME_MAX_BYTES
                    and request_id.isascii()
                    and "\x00" not in request_id
                )
            )
            and (
                ttl is None
                or ((type(ttl) is float or type(ttl) is int) and TTL_MIN <= ttl <= TTL_MAX)
            )
            and self._fast_claim
            and not self._closed
            and mode == EXCLUSIVE
        ):
            return super().claim(targets, holder=holder, request_id=request_id, ttl=ttl, mode=mode)
        if type(targets) is not Unit:
            if (
                (type(targets) is list or type(targets) is tuple)
                and targets
                and type(targets[0]) is Unit
                and len(set(map(type, targets))) == 1
            ):
                # A group of units (seats, a parking row): normalized as
                # normalize_targets does, sorted and without duplicates.
                units = tuple(sorted(set(targets), key=_unit_key))
                return self._claim_units(units, holder, request_id, ttl)
            return super().claim(targets, holder=holder, request_id=request_id, ttl=ttl)
        locks = self._locks
        n = self._nstripes
        stripe = targets._hash % n
        first = locks[stripe]
        second = None
        if request_id is not None:
            # Both stripes, in ascending order (module docstring).
            rstripe = hash(request_id) % n
            if rstripe < stripe:
                first, second = locks[rstripe], first
            elif rstripe > stripe:
                second = locks[rstripe]
        first.acquire()
        if second is not None:
            second.acquire()
        try:
            # Linearization point: the check and the set below run with the
            # unit's stripe (and the request ID's) held.
            key = targets._key
            current = self._units.get(key)
            if (
                current is not None
                and current["state"] is _CONFIRMED
                and request_id is None
                and current["holder"] != holder
            ):
                # Confirmed by another holder: lost whatever the time, so the
                # clock is not read (most attempts in a race end here).
                lost: ClaimResult = _new(ClaimResult)
                values = lost.__dict__
                values["granted"] = False
                values["taken"] = (targets,)
                return lost
            now = (
                (_time_ns() + 500) // 1000
                if self._system_clock
                else round(self._clock_now() * 1000000)
            )
            if request_id is not None and request_id in self._requests:
                # A replay or a conflict: the general step decides.
                return self._claim_locked((targets,), holder, request_id, ttl, now)
            claimed = (targets,)
            if current is not None:
                state = current["state"]
                if request_id is not None or not (
                    state is _CONFIRMED or (state is _HELD and current["_expires_at_us"] > now)  # type: ignore[operator]
                ):
                    # A request to record, or a dead hold to take over: the general step.
                    return self._claim_locked(claimed, holder, request_id, ttl, now)
                if current["holder"] == holder and current["targets"] == claimed:
                    # Natural key: the holder re-claiming exactly what it holds.
                    return make_result(True, _snapshot(current, now), (), replayed=True)
                lost = _new(ClaimResult)
                values = lost.__dict__
                values["granted"] = False
                values["taken"] = claimed
                return lost
            if self._readers and key in self._readers:
                return self._claim_locked(claimed, holder, request_id, ttl, now)  # readers
            fence = self._newest_fence = next(self._fences)
            claim_id = self._id_prefix + str(fence)
            record: _Record = {
                "id": claim_id,
                "holder": holder,
                "targets": claimed,
                "state": _CONFIRMED if ttl is None else _HELD,
                "fence": fence,
                "request_id": request_id,
                "_ttl": ttl,
                "_expires_at_us": None if ttl is None else now + round(ttl * 1_000_000),
                "_created_at_us": now,
                "_updated_at_us": now,
            }
            self._units[key] = record
            self._claims[claim_id] = record
            # The holder's index, under the holder's lock: the sweep drops an
            # empty dict under it (module docstring).
            holder_lock = self._holder_locks[hash(holder) % _HOLDER_LOCKS]
            holder_lock.acquire()
            try:
                held_by = self._by_holder.get(holder)
                if held_by is None:
                    held_by = self._by_holder[holder] = {}
                held_by[claim_id] = record
            finally:
                holder_lock.release()
            if request_id is not None:
                self._requests[request_id] = record
            claim: Claim = _new(Claim)
            claim.__dict__.update(record)
        finally:
            if second is not None:
                second.release()
            first.release()
        result: ClaimResult = _new(ClaimResult)
        values = result.__dict__
        values["granted"] = True
        values["claim"] = claim
        return result

    def _claim_units(
        self, units: tuple[Unit, ...], holder: str, request_id: str | None, ttl: float | None
    ) -> ClaimResult:
        """A group claim of units, input checked: the uncontended case inline."""
        n = self._nstripes
        stripes = {unit._hash % n for unit in units}
        mine = tuple(sorted(stripes))  # the claim's own: what its transitions take
        if request_id is not None:
            stripes.add(hash(request_id) % n)
            order = sorted(stripes)
        else:
            order = list(mine)
        locks = self._locks
        for i in order:
            locks[i].acquire()
        try:
            # Linearization point: every stripe of the claim is held.
            now = (
                (_time_ns() + 500) // 1000
                if self._system_clock
                else round(self._clock_now() * 1000000)
            )
            index = self._units
            readers = self._readers
            if request_id is not None and request_id in self._requests:
                return self._claim_locked(units, holder, request_id, ttl, now)  # replay
            for unit in units:
                if unit._key in index or (readers and unit._key in readers):
                    # Taken, or a dead hold to take over: the general step decides.
                    return self._claim_locked(units, holder, request_id, ttl, now)
            fence = self._newest_fence = next(self._fences)
            claim_id = self._id_prefix + str(fence)
            record: _Record = {
                "id": claim_id,
                "holder": holder,
                "targets": units,
                "state": _CONFIRMED if ttl is None else _HELD,
                "fence": fence,
                "request_id": request_id,
                "_ttl": ttl,
                "_expires_at_us": None if ttl is None else now + round(ttl * 1_000_000),
                "_created_at_us": now,
                "_updated_at_us": now,
            }
            for unit in units:
                index[unit._key] = record
            self._claims[claim_id] = record
            self._group_stripes[claim_id] = mine
            holder_lock = self._holder_locks[hash(holder) % _HOLDER_LOCKS]
            holder_lock.acquire()
            try:
                held_by = self._by_holder.get(holder)
                if held_by is None:
                    held_by = self._by_holder[holder] = {}
                held_by[claim_id] = record
            finally:
                holder_lock.release()
            if request_id is not None:
                self._requests[request_id] = record
            claim: Claim = _new(Claim)
            claim.__dict__.update(record)
        finally:
            for i in reversed(order):
                locks[i].release()
        return _granted(claim)

    def _claim_checked(self, units: tuple[Unit, ...], holder: str) -> ClaimResult:
        """:meth:`Store._claim_checked`: input checked already, so straight to the group step."""
        if self._fast_claim and not self._closed:
            return self._claim_units(units, holder, None, None)
        return self.claim(units, holder=holder)

    def confirm(self, claim_id: Any, *, holder: Any, fence: Any) -> Claim:
        # The common call inline: the ID is one of ours, the holder and the fence
        # are the claim's, so all three are known well-formed. Anything else
        # takes Store.confirm, which checks the input first.
        record = self._claims.get(claim_id) if type(claim_id) is str else None
        if (
            record is None
            or type(holder) is not str
            or record["holder"] != holder
            or type(fence) is not int
            or record["fence"] != fence
            or not self._fast_confirm
            or self._closed
        ):
            return super().confirm(claim_id, holder=holder, fence=fence)
        targets = record["targets"]
        if len(targets) != 1 or type(targets[0]) is not Unit:
            try:
                return self._confirm(claim_id, holder, fence)
            except HoldLost as exc:
                self._log_lost("confirm", exc)
                raise
        lock = self._locks[targets[0]._hash % self._nstripes]
        lock.acquire()
        try:
            # Linearization point: the state check and write under the stripe.
            now = (
                (_time_ns() + 500) // 1000
                if self._system_clock
                else round(self._clock_now() * 1000000)
            )
            state = record["state"]
            if state is _HELD and record["_expires_at_us"] > now:  # type: ignore[operator]
                record["state"] = _CONFIRMED
                record["_expires_at_us"] = None
                record["_updated_at_us"] = now
            elif state is not _CONFIRMED:
                try:
                    self._require_live(record, fence, now)  # raises HoldLost with the reason
                except HoldLost as exc:
                    self._log_lost("confirm", exc)
                    raise
            claim: Claim = _new(Claim)
            claim.__dict__.update(record)
        finally:
            lock.release()
        return claim

    def extend(self, claim_id: Any, *, holder: Any, fence: Any, ttl: Any) -> Claim:
        record = self._claims.get(claim_id) if type(claim_id) is str else None
        if (
            record is None
            or type(holder) is not str
            or record["holder"] != holder
            or type(fence) is not int
            or record["fence"] != fence
            or not ((type(ttl) is float or type(ttl) is int) and TTL_MIN <= ttl <= TTL_MAX)
            or not self._fast_extend
            or self._closed
        ):
            return super().extend(claim_id, holder=holder, fence=fence, ttl=ttl)
        targets = record["targets"]
        if len(targets) != 1 or type(targets[0]) is not Unit:
            try:
                return self._extend(claim_id, holder, fence, float(ttl))
            except HoldLost as exc:
                self._log_lost("extend", exc)
                raise
        lock = self._locks[targets[0]._hash % self._nstripes]
        lock.acquire()
        try:
            now = (
                (_time_ns() + 500) // 1000
                if self._system_clock
                else round(self._clock_now() * 1000000)
            )
            state = record["state"]
            if state is _HELD and record["_expires_at_us"] > now:  # type: ignore[operator]
                record["_expires_at_us"] = now + round(ttl * 1_000_000)
                record["_updated_at_us"] = now
            elif state is not _CONFIRMED:
                try:
                    self._require_live(record, fence, now)  # raises HoldLost with the reason
                except HoldLost as exc:
                    self._log_lost("extend", exc)
                    raise
            claim: Claim = _new(Claim)
            claim.__dict__.update(record)
        finally:
            lock.release()
        return claim

    def release(self, claim_id: Any, *, holder: Any, fence: Any) -> bool:
        record = self._claims.get(claim_id) if type(claim_id) is str else None
        if (
            record is None
            or type(holder) is not str
            or record["holder"] != holder
            or type(fence) is not int
            or record["fence"] != fence
            or not self._fast_release
            or self._closed
        ):
            return super().release(claim_id, holder=holder, fence=fence)
        targets = record["targets"]
        if len(targets) != 1 or type(targets[0]) is not Unit or "mode" in record:
            return self._release_group(record)
        unit = targets[0]
        lock = self._locks[unit._hash % self._nstripes]
        lock.acquire()
        try:
            now = (
                (_time_ns() + 500) // 1000
                if self._system_clock
                else round(self._clock_now() * 1000000)
            )
            state = record["state"]
            if not (
                state is _CONFIRMED or (state is _HELD and record["_expires_at_us"] > now)  # type: ignore[operator]
            ):
                # Released, expired or taken over: a no-op (the fence is the claim's).
                return False
            record["state"] = _RELEASED
            record["_expires_at_us"] = None
            record["_updated_at_us"] = now
            units = self._units
            if units.get(unit._key) is record:
                del units[unit._key]
            mine = self._by_holder.get(holder)
            if mine is not None:
                mine.pop(claim_id, None)
                if not mine:
                    self._drop_holder(holder, mine)
            return True
        finally:
            lock.release()
            ring(claim_id)  # a waiter in this process wakes now, not at the end of its pause

    def _release_group(self, record: _Record) -> bool:
        """Release a claim on several targets, its holder and fence checked."""
        stripes = self._stripes_of(record)
        locks = self._locks
        for i in stripes:
            locks[i].acquire()
        try:
            now = (
                (_time_ns() + 500) // 1000
                if self._system_clock
                else round(self._clock_now() * 1000000)
            )
            if not _live(record, now):
                return False  # released, expired or taken over: a no-op
            record["state"] = _RELEASED
            record["_expires_at_us"] = None
            record["_updated_at_us"] = now
            index = self._units
            for target in record["targets"]:
                if type(target) is not Unit or "mode" in record:
                    self._detach(record)  # spans or readers: the general way
                    break
                if index.get(target._key) is record:
                    del index[target._key]
            else:
                mine = self._by_holder.get(record["holder"])
                if mine is not None:
                    mine.pop(record["id"], None)
                    if not mine:
                        self._drop_holder(record["holder"], mine)
            return True
        finally:
            for i in reversed(stripes):
                locks[i].release()
            ring(record["id"])

    # --- claim --------------------------------------------------------------------------------

    def _claim(self, request: ClaimRequest) -> ClaimResult:
        targets, holder, request_id, ttl = (
            request.targets,
            request.holder,
            request.request_id,
            request.ttl,
        )
        n = self._nstripes
        stripes = self._target_stripes(targets)
        if request_id is not None:
            rstripe = hash(request_id) % n
            if rstripe not in stripes:
                stripes = tuple(sorted((*stripes, rstripe)))
        # Locks taken by hand: a generator context manager costs more than the
        # rest of an uncontended claim.
        locks = self._locks
        for i in stripes:
            locks[i].acquire()
        try:
            return self._claim_locked(
                targets, holder, request_id, ttl, self._now_us(), request.mode
            )
        finally:
            for i in reversed(stripes):
                locks[i].release()

    def _claim_locked(
        self,
        targets: tuple[Target, ...],
        holder: str,
        request_id: str | None,
        ttl: float | None,
        now: int,
        mode: str = EXCLUSIVE,
    ) -> ClaimResult:
        """Decide a claim and record its request; the caller holds all its stripes.

        Linearization point: everything here runs with every stripe the claim
        touches held (its targets' and its request ID's), so the check and the
        set are one step.
        """
        if request_id is not None:
            entry = self._requests.get(request_id)
            prior = None if entry is None else _request(entry)
            if prior is not None and prior[5] + self._retention_us > now:
                if (prior[0], prior[1], prior[2], prior[6]) != (holder, targets, ttl, mode):
                    raise RequestConflict(
                        f"request ID {request_id!r} was already used with different input",
                        request_id=request_id,
                    )
                return self._replay(prior, now)
        result = self._decide(targets, holder, request_id, ttl, now, mode)
        if request_id is not None:
            self._requests[request_id] = (
                holder,
                targets,
                ttl,
                result.claim.id if result.claim is not None else None,
                result.taken,
                now,
                mode,
            )
        return result

    def _replay(self, prior: _Request, now: int) -> ClaimResult:
        if prior[3] is None:
            return make_result(False, None, prior[4], replayed=True)
        record = self._claims.get(prior[3])
        claim = _snapshot(record, now) if record is not None else None
        return make_result(True, claim, (), replayed=True)

    def _decide(
        self,
        targets: tuple[Target, ...],
        holder: str,
        request_id: str | None,
        ttl: float | None,
        now: int,
        mode: str = EXCLUSIVE,
    ) -> ClaimResult:
        units = self._units
        readers = self._readers
        exclusive = mode == EXCLUSIVE
        # Allocated only when needed: throwaway objects on the hot path cost
        # more in garbage collection than in their own construction.
        taken: list[Target] | None = None
        blockers: dict[str, _Record] | None = None
        dead: list[_Record] | None = None
        for target in targets:
            if type(target) is Unit or isinstance(target, Unit):
                # The unit's exclusive claim excludes any claim; its readers, a writer.
                writer = units.get(target._key)
                around = readers.get(target._key, ()) if exclusive and readers else ()
                for other in (writer, *around) if around else (writer,):
                    if other is None:
                        continue
                    if _live(other, now):
                        if taken is None or blockers is None:
                            taken, blockers = [], {}
                        if target not in taken:
                            taken.append(target)
                        blockers[other["id"]] = other
                    elif _takeable(other):
                        if dead is None:
                            dead = []
                        dead.append(other)
            else:
                assert isinstance(target, Span)
                for span, current in self._spans.get(target.resource, ()):
                    # A span of the other kind would block any span here had it
                    # been live, so a dead one is taken over like an overlap.
                    switch = span.kind != target.kind
                    if not switch and not (
                        span.overlaps(target) and conflicts(mode, current.get("mode", EXCLUSIVE))
                    ):
                        continue
                    if _live(current, now):
                        if switch:
                            raise span_kind_mismatch(target, span.kind)
                        if taken is None or blockers is None:
                            taken, blockers = [], {}
                        if target not in taken:
                            taken.append(target)
                        blockers[current["id"]] = current
                    elif _takeable(current):
                        if dead is None:
                            dead = []
                        dead.append(current)
        if taken:
            assert blockers is not None
            if len(blockers) == 1:
                (mine,) = blockers.values()
                # Natural key: the holder re-claiming exactly what it holds.
                if (
                    mine["holder"] == holder
                    and mine["targets"] == targets
                    and mine.get("mode", EXCLUSIVE) == mode
                ):
                    return make_result(True, _snapshot(mine, now), (), replayed=True)
            return make_result(False, None, tuple(taken))

        fence = self._newest_fence = next(self._fences)
        claim_id = self._id_prefix + str(fence)
        record: _Record = {
            "id": claim_id,
            "holder": holder,
            "targets": targets,
            "state": _CONFIRMED if ttl is None else _HELD,
            "fence": fence,
            "request_id": request_id,
            "_ttl": ttl,
            "_expires_at_us": None if ttl is None else now + round(ttl * 1_000_000),
            "_created_at_us": now,
            "_updated_at_us": now,
        }
        if not exclusive:
            record["mode"] = SHARED
        if dead is not None:
            for old in dead:
                _kill(old, now, taken_over=True)
                self._forget_holder(old)
                self._log_takeover(old["id"])
        for target in targets:
            if type(target) is Unit or isinstance(target, Unit):
                if exclusive:
                    units[target._key] = record
                    if readers:
                        # Every reader here was dead and is now taken over.
                        readers.pop(target._key, None)
                    continue
                writer = units.get(target._key)
                if writer is not None and not _indexed(writer):
                    del units[target._key]  # a dead writer this reader took over
                others = readers.get(target._key)
                if others is None:
                    readers[target._key] = [record]
                else:
                    others[:] = [e for e in others if _indexed(e)]
                    others.append(record)
            else:
                entries = self._spans.get(target.resource)
                if entries is None:
                    self._spans[target.resource] = [(target, record)]
                else:
                    # Drop ended entries while we hold the resource's stripe; dead
                    # holds stay until a claimant takes them over or a sweep purges them.
                    entries[:] = [e for e in entries if _indexed(e[1])]
                    entries.append((target, record))
        self._claims[claim_id] = record
        if len(targets) > 1:
            self._group_stripes[claim_id] = self._target_stripes(targets)
        self._index_holder(holder, claim_id, record)
        return _granted(claim_from_micros(record))  # type: ignore[arg-type]

    def _index_holder(self, holder: str, claim_id: str, record: _Record) -> None:
        # Under the holder's lock: the sweep drops an empty dict under it.
        lock = self._holder_locks[hash(holder) % _HOLDER_LOCKS]
        lock.acquire()
        try:
            held_by = self._by_holder.get(holder)
            if held_by is None:
                held_by = self._by_holder[holder] = {}
            held_by[claim_id] = record
        finally:
            lock.release()

    def _drop_holder(self, holder: str, mine: dict[str, _Record]) -> None:
        """Drop a holder's index once it is empty (a holder per vehicle or per request).

        Under the holder's lock, as the sweep does: a claim adds to the dict under
        it, so the dict is still empty when it goes.
        """
        with self._holder_locks[hash(holder) % _HOLDER_LOCKS]:
            if not mine and self._by_holder.get(holder) is mine:
                del self._by_holder[holder]

    def _forget_holder(self, record: _Record) -> None:
        mine = self._by_holder.get(record["holder"])
        if mine is not None:
            mine.pop(record["id"], None)

    # --- transitions on one claim ---------------------------------------------------------------

    def _owned(self, claim_id: str, holder: str) -> _Record:
        record = self._claims.get(claim_id)
        if record is None:
            raise claim_not_found(claim_id)
        if record["holder"] != holder:
            raise not_holder(claim_id, holder)
        return record

    def _require_live(self, record: _Record, fence: int, now: int) -> None:
        """Raise HoldLost unless ``record`` is live and ``fence`` is its fence."""
        # A dead hold is judged, not written: the sweep or a takeover marks it.
        state = record["state"]
        reason = lost_reason(
            real_fence=record["fence"],
            fence=fence,
            state=state,
            dead=state is _HELD and record["_expires_at_us"] <= now,  # type: ignore[operator]
            taken_over=record.get("taken_over", False),
        )
        if reason is not None:
            raise hold_lost(record["id"], reason, fence)

    # The general transitions: a claim on several targets, or a call that did
    # not match the inline case (the public methods above have checked the input).

    def _confirm(self, claim_id: str, holder: str, fence: int) -> Claim:
        record = self._owned(claim_id, holder)
        stripes = self._stripes_of(record)
        self._acquire(stripes)
        try:
            # Linearization point: the state check and write under all stripes.
            now = self._now_us()
            self._require_live(record, fence, now)
            if record["state"] is _HELD:
                record["state"] = _CONFIRMED
                record["_expires_at_us"] = None
                record["_updated_at_us"] = now
            return _snapshot(record, now)
        finally:
            self._release_locks(stripes)

    def _extend(self, claim_id: str, holder: str, fence: int, ttl: float) -> Claim:
        record = self._owned(claim_id, holder)
        stripes = self._stripes_of(record)
        self._acquire(stripes)
        try:
            now = self._now_us()
            self._require_live(record, fence, now)
            if record["state"] is _HELD:
                record["_expires_at_us"] = now + round(ttl * 1_000_000)
                record["_updated_at_us"] = now
            return _snapshot(record, now)
        finally:
            self._release_locks(stripes)

    def _release(self, claim_id: str, holder: str, fence: int) -> bool:
        record = self._owned(claim_id, holder)
        stripes = self._stripes_of(record)
        self._acquire(stripes)
        try:
            now = self._now_us()
            if not (record["fence"] == fence and _live(record, now)):
                try:
                    self._require_live(record, fence, now)
                except HoldLost as lost:
                    if lost.reason is HoldLostReason.FENCE:
                        raise
                return False
            record["state"] = _RELEASED
            record["_expires_at_us"] = None
            record["_updated_at_us"] = now
            self._detach(record)
            return True
        finally:
            self._release_locks(stripes)

    def _detach(self, record: _Record) -> None:
        """Remove an ended record from the indexes; caller holds all its stripes."""
        for target in record["targets"]:
            if isinstance(target, Unit):
                if self._units.get(target._key) is record:
                    del self._units[target._key]
                readers = self._readers.get(target._key)
                if readers is not None:
                    readers[:] = [e for e in readers if e is not record and _indexed(e)]
                    if not readers:
                        del self._readers[target._key]
            else:
                entries = self._spans.get(target.resource)
                if entries is not None:
                    entries[:] = [e for e in entries if e[1] is not record and _indexed(e[1])]
                    if not entries:
                        del self._spans[target.resource]
        self._forget_holder(record)

    # --- reads ----------------------------------------------------------------------------------

    def _get(self, claim_id: str) -> Claim | None:
        record = self._claims.get(claim_id)
        if record is None:
            return None
        with self._locked(self._stripes_of(record)):
            return _snapshot(record, self._now_us())

    def _holder_of(self, target: Unit | Span) -> str | None:
        # Under the target's stripe, with the clock read inside it: a span's answer
        # looks at several records, and reading them unlocked (or judging them
        # against a clock read before a stall) could see none live at a moment
        # when one always was: one released after another, overlapping, was granted.
        stripes = self._target_stripes((target,))
        self._acquire(stripes)
        try:
            now = self._now_us()
            if isinstance(target, Unit):
                record = self._units.get(target._key)
                if record is not None and _live(record, now):
                    return record["holder"]
                # Readers: the oldest live one answers.
                for record in self._readers.get(target._key, ()):
                    if _live(record, now):
                        return record["holder"]
                return None
            for span, record in self._spans.get(target.resource, ()):
                if span.overlaps(target) and _live(record, now):
                    return record["holder"]
            return None
        finally:
            self._release_locks(stripes)

    def _claims_of(self, holder: str) -> list[Claim]:
        # One snapshot of the holder's claims: with the stripes of every claim in
        # its index held (no transition, takeover or sweep can change one of them),
        # the index copied under the holder's lock (taken innermost, as a grant
        # does), and the clock read inside. Read unlocked, record by record, a
        # claim released after a later one was granted could be missing from both.
        # A claim granted after the copy has not returned yet (a grant indexes its
        # claim with its stripes held), so the read comes before it.
        holder_lock = self._holder_locks[hash(holder) % _HOLDER_LOCKS]
        stripes: tuple[int, ...] = ()
        while True:
            self._acquire(stripes)
            try:
                with holder_lock:
                    records = list(self._by_holder.get(holder, {}).copy().values())
                needed = set(stripes)
                for record in records:
                    needed.update(self._stripes_of(record))
                if needed.issubset(stripes):
                    now = self._now_us()
                    records.sort(key=lambda r: r["fence"])
                    return [_snapshot(r, now) for r in records if _live(r, now)]
            finally:
                self._release_locks(stripes)
            stripes = tuple(sorted(needed))  # the index grew: take the new stripes too

    # --- housekeeping ---------------------------------------------------------------------------

    def _sweep(self) -> SweepResult:
        expired = purged_claims = purged_requests = 0
        now = self._now_us()
        retention = self._retention_us
        for record in list(self._claims.copy().values()):
            state = record["state"]
            if state is _HELD and record["_expires_at_us"] <= now:  # type: ignore[operator]
                with self._locked(self._stripes_of(record)):
                    now = self._now_us()
                    if record["state"] is _HELD and record["_expires_at_us"] <= now:  # type: ignore[operator]
                        _kill(record, now, taken_over=False)
                        # Its unit and span entries stay until the purge, so that
                        # a later claimant can still take it over (the reason rule).
                        self._forget_holder(record)
                        expired += 1
            elif (
                state in (_RELEASED, _EXPIRED)
                and record["_updated_at_us"] + retention <= now
                # Like every store, keep the newest claim (see SQLiteStore).
                and record["fence"] != self._newest_fence
            ):
                with self._locked(self._stripes_of(record)):
                    # A takeover may have marked it since (and moved updated_at).
                    if record["_updated_at_us"] + retention <= now:
                        self._detach(record)
                        self._claims.pop(record["id"], None)
                        self._group_stripes.pop(record["id"], None)
                        purged_claims += 1
        for request_id, entry in list(self._requests.copy().items()):
            if _request(entry)[5] + self._retention_us <= now:
                stripe = hash(request_id) % self._nstripes
                with self._locked((stripe,)):
                    current = self._requests.get(request_id)
                    if current is not None and _request(current)[5] + self._retention_us <= now:
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
        records = sorted(list(self._claims.values()), key=lambda r: r["fence"])
        return [_snapshot(r, _BEFORE_ANY_EXPIRY) for r in records]

    def _close(self) -> None:
        self._jobs.store_closed()  # its rows go with the store: later calls raise StoreClosed
        # Every stripe, then every holder lock (the global order): a call already past
        # its closed check finishes its atomic step before the indexes go, never
        # meets a half-cleared one (a KeyError deleting what it just found).
        stripes = tuple(range(self._nstripes))
        self._acquire(stripes)
        try:
            for lock in self._holder_locks:
                lock.acquire()
            try:
                self._clear()
            finally:
                for lock in reversed(self._holder_locks):
                    lock.release()
        finally:
            self._release_locks(stripes)

    def _clear(self) -> None:
        self._units.clear()
        self._readers.clear()
        self._spans.clear()
        self._requests.clear()
        self._claims.clear()
        self._by_holder.clear()
        self._group_stripes.clear()


_BEFORE_ANY_EXPIRY = -(2**62)
"""A "now" no hold has expired by, so snapshots keep the stored state (held, not derived)."""
