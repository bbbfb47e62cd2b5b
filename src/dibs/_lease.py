"""The lease's policy, written once for both faces (:mod:`dibs.lease` drives it).

Each policy is a generator of *steps* (claim, extend, release, sleep...): a
face performs a step with blocking calls (:func:`_drive`) or awaits
(:func:`_adrive`) and sends back its answer, or throws back the errors the
policy decides on. So the rules (which request ID a retry carries, how long a
renewal retries, what counts as taken) exist once, and each face only does I/O.
"""

from __future__ import annotations

import contextlib
import logging
import random
import threading
import time
import uuid
from collections.abc import Callable, Coroutine, Generator
from dataclasses import dataclass
from typing import Any, TypeVar

from dibs._drive import adrive, drive
from dibs._model import Claim, ClaimResult, ClaimState, Target
from dibs._request import ClaimRequest
from dibs.exceptions import (
    ClaimNotFound,
    DibsError,
    HoldLost,
    HoldLostReason,
    InvalidInput,
    ResourceBusy,
    StoreClosed,
    StoreUnavailable,
)
from dibs.limits import TTL_MAX

_T = TypeVar("_T")

LEASE_TTL_MIN = 0.1
"""The shortest TTL a lease takes, in seconds: it renews three times per TTL, and each
renewal is a round trip to the store plus a thread or task switch. Production TTLs
should be seconds at least (see docs/leases.md)."""

RENEW_EVERY_MIN = 0.01
"""The shortest ``renew_every`` a lease takes, in seconds: shorter is a busy loop of extends."""

UNAVAILABLE_RETRY = 10.0
"""Seconds from entering the lease during which a claim meeting :class:`~dibs.StoreUnavailable`
is retried (``wait`` if longer; as long as it takes with ``wait=None``)."""

_RELEASE_TRIES = 3
_SHOWN_HOLDERS = 16  # ResourceBusy names the holders of at most this many taken targets
_FIRST_PAUSE = 0.005
_MAX_PAUSE = 0.25  # between claim attempts: an expiry frees a target without a change to see
_FEED_POLL = 0.01  # between reads of a change feed while waiting for taken targets

_logger = logging.getLogger("dibs.lease")


@dataclass(frozen=True, slots=True)
class _Terms:
    targets: tuple[Target, ...]
    holder: str
    ttl: float
    wait: float | None
    renew_every: float
    max_hold: float | None = None
    """Seconds after the claim was sent past which the lease renews no more (None: no limit)."""
    monotonic: Callable[[], float] = time.monotonic
    """The clock renewals, overdue holds and ``max_hold`` are timed on (tests inject a fake)."""

    @property
    def margin(self) -> float:
        """Seconds before the hold could expire at which an unrenewed lease counts as lost."""
        return self.ttl / 10


def _terms(
    targets: object,
    holder: object,
    ttl: object,
    wait: object,
    renew_every: object,
    max_hold: object = None,
    monotonic: Callable[[], float] | None = None,
) -> _Terms:
    """The lease's arguments, checked like ``claim()``'s; raises :class:`~dibs.InvalidInput`."""
    if (
        isinstance(ttl, bool)
        or not isinstance(ttl, int | float)
        or not LEASE_TTL_MIN <= ttl <= TTL_MAX
    ):
        raise InvalidInput(
            f"a lease's ttl must be a number of seconds from {LEASE_TTL_MIN:g} to {TTL_MAX:g}"
            f" (it is renewed while the block runs), got {ttl!r}",
            field="ttl",
            value=ttl,
        )
    request = ClaimRequest(targets, holder=holder, ttl=float(ttl))  # type: ignore[arg-type]
    checked, holder_name, seconds = request.targets, request.holder, request.ttl
    assert seconds is not None
    if wait is not None and (
        isinstance(wait, bool) or not isinstance(wait, int | float) or not 0 <= wait < float("inf")
    ):
        raise InvalidInput(
            f"wait must be seconds >= 0 or None, got {wait!r}", field="wait", value=wait
        )
    if renew_every is not None and (
        isinstance(renew_every, bool)
        or not isinstance(renew_every, int | float)
        or not RENEW_EVERY_MIN <= renew_every <= seconds / 2
    ):
        raise InvalidInput(
            f"renew_every must be seconds from {RENEW_EVERY_MIN:g} to half the ttl"
            f" ({seconds / 2:g}s), got {renew_every!r}",
            field="renew_every",
            value=renew_every,
        )
    if max_hold is not None and (
        isinstance(max_hold, bool)
        or not isinstance(max_hold, int | float)
        or not 0 < max_hold <= TTL_MAX
    ):
        raise InvalidInput(
            f"max_hold must be seconds above 0 and at most {TTL_MAX:g}, or None, got {max_hold!r}",
            field="max_hold",
            value=max_hold,
        )
    every = seconds / 3 if renew_every is None else float(renew_every)
    return _Terms(
        checked,
        holder_name,
        seconds,
        None if wait is None else float(wait),
        every,
        None if max_hold is None else float(max_hold),
        time.monotonic if monotonic is None else monotonic,
    )


def check_on_lost(on_lost: object) -> Callable[[HoldLost], object] | None:
    """``on_lost`` if it is None or callable; raises :class:`~dibs.InvalidInput`."""
    if on_lost is not None and not callable(on_lost):
        raise InvalidInput(
            f"on_lost must be a callable taking the HoldLost, or None, got {on_lost!r}",
            field="on_lost",
            value=on_lost,
        )
    return on_lost


@dataclass(frozen=True, slots=True)
class _ClaimStep:
    request_id: str


@dataclass(frozen=True, slots=True)
class _ExtendStep:
    claim: Claim
    deadline: float
    """The lease clock's time past which an answer is too late (the async face stops waiting)."""


@dataclass(frozen=True, slots=True)
class _ReleaseStep:
    claim: Claim


@dataclass(frozen=True, slots=True)
class _GetStep:
    claim_id: str


@dataclass(frozen=True, slots=True)
class _HoldersStep:
    targets: tuple[Target, ...]


@dataclass(frozen=True, slots=True)
class _SleepStep:
    seconds: float
    renewal: bool = False
    """Whether this is the renewal's pause, which the block's end cuts short."""


@dataclass(frozen=True, slots=True)
class _ChangeStep:
    """Sleep ``seconds``, cut to at most ``hurried`` more once the store's change feed moves.

    A change only shortens the pause, never ends it: the waiter's own failed claims write
    (request records), and on PostgreSQL any write in the cluster moves the feed, so a
    waiter that woke on every change would retry as fast as it polls.
    """

    seconds: float
    hurried: float


_Step = _ClaimStep | _ExtendStep | _ReleaseStep | _GetStep | _HoldersStep | _SleepStep | _ChangeStep
_Policy = Generator[_Step, Any, _T]


@dataclass(slots=True)
class _Attempt:
    """What the claiming policy is doing, for the face that may have to abandon it."""

    unanswered: str | None = None
    """The request ID of a claim sent whose outcome is not known yet."""
    sent: float = 0.0
    """``clock()`` just before the current request ID was first sent."""
    clock: Callable[[], float] = time.monotonic
    """The lease's clock (``_Terms.monotonic``)."""


_random = random.Random()  # our own, so that a lease never moves the global random state


def _jitter(delay: float) -> float:
    # Full jitter: waiters spread out instead of retrying in lockstep.
    return _random.uniform(0, delay)


def _claim_policy(terms: _Terms, attempt: _Attempt) -> _Policy[Claim]:
    """Claim the targets, waiting for them as ``terms.wait`` says; the claim made."""
    started = time.monotonic()
    deadline = None if terms.wait is None else started + terms.wait
    give_up = None if terms.wait is None else started + max(terms.wait, UNAVAILABLE_RETRY)
    delay = _FIRST_PAUSE
    while True:
        request_id = f"lease-{uuid.uuid4().hex}"
        result = yield from _claim_once(request_id, attempt, give_up)
        claim = result.claim
        if result and claim is not None and claim.request_id == request_id:
            if claim.state is ClaimState.HELD and not _dead_on_arrival(terms, attempt):
                return claim
            if claim.state is ClaimState.HELD:
                # Granted so long ago (the answer was lost, the retries met an outage) that
                # it may expire before its first renewal: never hand the block such a hold.
                yield from _drop(terms, claim)
            taken: tuple[Target, ...] = ()  # our replayed hold died meanwhile: claim again
        elif result:
            taken = terms.targets  # held by this holder under a claim the lease did not make
        else:
            taken = result.taken
        now = time.monotonic()
        if taken and deadline is not None and now >= deadline:
            holders: dict[Target, str | None] = {}
            with contextlib.suppress(StoreUnavailable):  # who holds them is for the message only
                holders = yield _HoldersStep(taken[:_SHOWN_HOLDERS])
            raise _busy(terms, taken, holders, now - started)
        pause = _jitter(delay)
        if deadline is not None:
            pause = min(pause, max(0.0, deadline - now))
        yield _ChangeStep(pause, _jitter(delay) / 4)
        delay = min(delay * 2, _MAX_PAUSE)


def _dead_on_arrival(terms: _Terms, attempt: _Attempt) -> bool:
    """Whether a hold granted to ``attempt`` already counts as overdue (see ``_Hold.overdue``)."""
    return terms.monotonic() >= attempt.sent + terms.ttl - terms.margin


def _drop(terms: _Terms, claim: Claim) -> _Policy[None]:
    """Release, fenced and best effort, a hold the lease will not use."""
    try:
        yield _ReleaseStep(claim)
    except (StoreUnavailable, HoldLost, ClaimNotFound) as exc:  # it expires by itself
        _logger.info("lease %s of %r: dropped hold not released (%s)", claim.id, terms.holder, exc)


def _claim_once(request_id: str, attempt: _Attempt, give_up: float | None) -> _Policy[ClaimResult]:
    """One claim, retried with the same request ID while the store is unavailable."""
    delay = _FIRST_PAUSE
    attempt.unanswered = request_id
    # Whichever try makes the hold, it expires no sooner than ttl after the first was sent
    # (on the lease's clock: ``attempt.clock``, which tests may fake).
    attempt.sent = attempt.clock()
    while True:
        try:
            result: ClaimResult = yield _ClaimStep(request_id)
        except StoreUnavailable:
            now = time.monotonic()
            if give_up is not None and now >= give_up:
                raise
            pause = _jitter(delay)
            if give_up is not None:
                pause = min(pause, give_up - now)
            yield _SleepStep(pause)
            delay = min(delay * 2, 1.0)
            continue
        attempt.unanswered = None
        return result


def _busy(
    terms: _Terms, taken: tuple[Target, ...], holders: dict[Target, str | None], waited: float
) -> ResourceBusy:
    named = sorted({h for h in holders.values() if h is not None})
    by = f" (held by {', '.join(map(repr, named))})" if named else ""
    return ResourceBusy(
        f"lease of {_describe(taken)} for {terms.holder!r}: taken{by}, waited {waited:.3g}s",
        resource=taken[0].resource,
        waited=waited,
        targets=terms.targets,
        taken=taken,
        holders=holders,
    )


def _describe(targets: tuple[Target, ...]) -> str:
    shown = ", ".join(map(repr, targets[:3]))
    return shown + (f" and {len(targets) - 3} more" if len(targets) > 3 else "")


class _Hold:
    """The live state of one lease's hold, written by its renewal and read by the block."""

    def __init__(
        self,
        terms: _Terms,
        claim: Claim,
        sent: float,
        on_lost: Callable[[HoldLost], object] | None = None,
    ) -> None:
        self.terms = terms
        self.claim = claim
        self.began = sent  # max_hold counts from here: the hold began no sooner
        # The store set the expiry at least this late (it answered after we sent).
        self.alive_until = sent + terms.ttl
        self.renewals = 0
        self.error: HoldLost | None = None
        self.failure: BaseException | None = None  # the last renewal's error, if it failed
        self.ended = False  # released: time passing no longer makes it overdue
        self.ran_out = False  # max_hold reached: renewals stopped on purpose
        self.on_lost = on_lost
        self._told = False  # on_lost was called, or the exit was clean: never call it (again)
        self._lock = threading.Lock()  # guards error and _told: renewal, block and exit race
        self.telling = threading.Lock()
        """Held while the sync face runs ``on_lost``, so that its exit waits for the call."""

    def renewed(self, claim: Claim, sent: float) -> None:
        self.claim = claim
        self.alive_until = sent + self.terms.ttl
        self.renewals += 1
        self.failure = None

    def lose(self, error: HoldLost) -> bool:
        """Record the loss; True if this is the first news of it."""
        with self._lock:
            if self.error is not None:
                return False
            self.error = error
        # INFO: the block hears of it too (HoldLost), so this is a trace, not an alarm.
        _logger.info("lease %s of %r lost: %s", self.claim.id, self.terms.holder, error)
        return True

    def overdue(self) -> bool:
        """Whether the hold may have expired unrenewed (the renewal is stuck); latches a loss."""
        if (
            self.error is None
            and not self.ended
            and self.terms.monotonic() >= self.alive_until - self.terms.margin
        ):
            self.lose(self._expired())
        return self.error is not None

    def _expired(self) -> HoldLost:
        if self.ran_out:
            assert self.terms.max_hold is not None
            return _lost(
                self.claim.id,
                f"reached its max_hold of {self.terms.max_hold:g}s and was renewed no more",
            )
        lost = _lost(self.claim.id, "was not renewed in time and may have expired")
        lost.__cause__ = self.failure
        return lost

    def to_tell(self) -> HoldLost | None:
        """The loss to pass to ``on_lost``, the first time it is asked after a loss; else None."""
        with self._lock:
            if self._told or self.error is None or self.on_lost is None:
                return None
            self._told = True
            return self.error

    def clean(self) -> None:
        """The lease ended without a loss: ``on_lost`` is never called after this."""
        with self._lock:
            self._told = True


def _lost(claim_id: str, why: str, reason: HoldLostReason = HoldLostReason.EXPIRED) -> HoldLost:
    return HoldLost(f"lease {claim_id!r} {why}", claim_id=claim_id, reason=reason)


def _call_on_lost(on_lost: Callable[[HoldLost], object], lost: HoldLost) -> object:
    """Call ``on_lost``; its result (an awaitable, for the async face to await), or None.

    An exception from it is logged, never raised: the lease's own work goes on.
    """
    try:
        return on_lost(lost)
    except Exception:
        _logger.exception("lease %s: on_lost raised", lost.claim_id)
        return None


def _renewal_policy(hold: _Hold) -> _Policy[HoldLost]:
    """Extend the hold every ``renew_every`` seconds until it is lost; the loss.

    Each pause is also timed against the hold's deadline (``alive_until`` less the
    margin): a hold whose claim was granted late, or whose last renewal took long,
    is renewed when half the time it has left is gone, not ``renew_every`` later.
    Once ``max_hold`` has passed since the claim was sent, no renewal is sent: the
    hold runs out at its last TTL, and the lease counts it lost at the margin.
    """
    terms = hold.terms
    delay = _FIRST_PAUSE
    pause = _renewal_pause(hold)
    while True:
        yield _SleepStep(pause, renewal=True)
        if hold.error is not None:
            return hold.error  # check() found it overdue
        sent = terms.monotonic()
        if terms.max_hold is not None and sent >= hold.began + terms.max_hold:
            return (yield from _run_out(hold))
        try:
            claim = yield _ExtendStep(hold.claim, hold.alive_until - terms.margin)
        except HoldLost as exc:
            return exc
        except ClaimNotFound as exc:  # expired, and swept from the store since
            lost = _lost(hold.claim.id, "expired and is gone from the store")
            lost.__cause__ = exc
            return lost
        except StoreUnavailable as exc:
            hold.failure = exc
            left = hold.alive_until - terms.margin - terms.monotonic()
            if left <= 0:
                lost = _lost(hold.claim.id, f"could not be renewed before it could expire: {exc}")
                lost.__cause__ = exc
                return lost
            pause = min(_jitter(delay), left)
            delay = min(delay * 2, terms.renew_every)
            continue
        hold.renewed(claim, sent)
        pause = _renewal_pause(hold)
        delay = _FIRST_PAUSE


def _run_out(hold: _Hold) -> _Policy[HoldLost]:
    """Renew no more (``max_hold`` passed): wait until the hold counts as overdue; the loss."""
    hold.ran_out = True
    # In short pauses, against the lease's clock: a faked clock moved on is seen soon.
    while not hold.overdue():
        left = hold.alive_until - hold.terms.margin - hold.terms.monotonic()
        yield _SleepStep(max(0.0, min(left, hold.terms.renew_every)), renewal=True)
    assert hold.error is not None
    return hold.error


def _renewal_pause(hold: _Hold) -> float:
    """Seconds to the next renewal: ``renew_every``, or half the time the hold has left."""
    left = hold.alive_until - hold.terms.margin - hold.terms.monotonic()
    return min(hold.terms.renew_every, max(0.0, left / 2))


def _release_policy(hold: _Hold) -> _Policy[HoldLost | None]:
    """Release the hold, fenced; the loss it reveals (the hold ended before the block), if any."""
    claim = hold.claim
    released = False
    unanswered = False  # whether an earlier try may have released it, its answer lost
    gone = False
    for tries_left in reversed(range(_RELEASE_TRIES)):
        try:
            released = yield _ReleaseStep(claim)
        except HoldLost as exc:
            return exc  # a fence that is not ours any more
        except ClaimNotFound:
            gone = True  # it expired and the store has swept it since
            break
        except StoreClosed as exc:
            _logger.warning("lease %s: could not release (%s); it expires by itself", claim.id, exc)
            return None
        except StoreUnavailable as exc:
            if not tries_left:
                _logger.warning(
                    "lease %s: could not release (%s); it expires by itself", claim.id, exc
                )
                return None
            unanswered = True
            yield _SleepStep(_jitter(0.05))
            continue
        break
    if released:
        return None
    if gone:
        return (yield from _gone(hold))
    try:
        ended: Claim | None = yield _GetStep(claim.id)
    except StoreUnavailable:
        return _lost(claim.id, "expired before the block ended")
    if ended is None:
        return (yield from _gone(hold))
    if ended is not None and ended.state is ClaimState.RELEASED:
        if unanswered and ended.fence == claim.fence:
            return None  # our own earlier try released it; only its answer was lost
        return _lost(claim.id, "was released by someone else", HoldLostReason.RELEASED)
    if ended is not None and ended.taken_over:
        return _lost(claim.id, "expired and was taken over", HoldLostReason.TAKEN_OVER)
    return _lost(claim.id, "expired before the block ended")


def _gone(hold: _Hold) -> _Policy[HoldLost]:
    """The loss of a hold the store no longer knows: expired, then swept (and maybe taken)."""
    claim = hold.claim
    holders: dict[Target, str | None] = {}
    with contextlib.suppress(StoreUnavailable):  # who holds them now only sharpens the reason
        holders = yield _HoldersStep(hold.terms.targets[:_SHOWN_HOLDERS])
    if any(h is not None for h in holders.values()):
        return _lost(
            claim.id, "expired and was taken over (swept since)", HoldLostReason.TAKEN_OVER
        )
    return _lost(claim.id, "expired before the block ended (swept since)")


def _unexpected(claim_id: str, exc: BaseException) -> HoldLost:
    """A renewal that failed for another reason (the store was closed...): the hold will expire."""
    if not isinstance(exc, DibsError):
        _logger.error("lease %s: renewal failed", claim_id, exc_info=exc)
    lost = _lost(claim_id, f"could not be renewed: {exc!r}")
    lost.__cause__ = exc
    return lost


_DECIDED = (StoreUnavailable, HoldLost, StoreClosed, ClaimNotFound)
"""The errors a step answers that go back into its policy; any other propagates."""


def _drive(policy: _Policy[_T], perform: Callable[[_Step], Any]) -> _T:
    """Run a policy with blocking calls: its steps' answers and errors go back into it."""
    return drive(policy, perform, _DECIDED)


async def _adrive(policy: _Policy[_T], perform: Callable[[_Step], Coroutine[Any, Any, Any]]) -> _T:
    """:func:`_drive` with awaits."""
    return await adrive(policy, perform, _DECIDED)
