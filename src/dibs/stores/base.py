"""The store interface every backend implements, and the input checks they share.

A store is the one place dibs does I/O. Each public method validates its input
here, once, then calls the backend's ``_``-method with normalized values, so
every backend gets the same errors for the same bad input.
"""

from __future__ import annotations

import abc
import inspect
import logging
import threading
import warnings
from collections.abc import Callable, Iterable
from datetime import UTC, datetime
from types import TracebackType
from typing import TYPE_CHECKING, Any, ClassVar, Self, TypeVar

from dibs._bell import ring
from dibs._clock import Clock, SystemClock
from dibs._model import (
    Claim,
    ClaimResult,
    ClaimState,
    Span,
    SweepResult,
    Target,
    Unit,
    check_claim_id,
    check_fence,
    check_holder,
    check_retention,
    check_ttl,
    make_claim,
    targets_from_text,
)
from dibs._request import ClaimRequest
from dibs.exceptions import (
    ClaimNotFound,
    DibsError,
    HoldLost,
    HoldLostReason,
    InvalidInput,
    NotHolder,
    SpanKindMismatch,
    StoreClosed,
)
from dibs.limits import NUMBER_MAX

if TYPE_CHECKING:
    from dibs.lease import Lease
    from dibs.stores.capabilities import ChangeFeed, ClaimLog
    from dibs.stores.durability import Finding
    from dibs.stores.jobs import JobTable

__all__ = ["DEFAULT_REQUEST_RETENTION", "Store"]

_T = TypeVar("_T")

DEFAULT_REQUEST_RETENTION = 24 * 3600.0
"""Seconds a request-ID record (and an ended claim) is kept before sweep() purges it."""


class Store(abc.ABC):
    """A claim store: claims, holds, fences and request records on one backend.

    Every method is safe to call from many threads; stores whose docs say so
    are also safe across processes and hosts.

    A backend implements :meth:`from_url` and the ``_``-methods (the claim
    contract), and may offer optional capabilities by overriding
    :meth:`job_table`, :meth:`change_feed` and :meth:`claim_log` (see
    :mod:`dibs.stores.capabilities`); code outside the store asks for those and
    never looks at a store's scheme or private attributes.
    """

    scheme: ClassVar[str]
    """The URL scheme this store is registered under, for display (logs, metrics)."""

    in_process: ClassVar[bool] = False
    """True when the claims live in this process only: another process opening the same
    URL gets a different, empty store (memory://). Tools then run their callers as threads."""

    local_clock: ClassVar[bool] = False
    """True when the store judges time on this machine's clock and the calling process does
    the writes (memory://, sqlite://): a caller killed mid-call leaves nothing running."""

    holds_outlive_ttl: ClassVar[bool] = False
    """True when a hold may stay live past its ``expires_at`` (never end before it): an etcd
    lease restarts its TTL on a leader change. ``dibs verify`` then judges such a hold
    live or dead at any time after its expiry, and still never taken over before it."""

    least_hold: ClassVar[float] = 0.001
    """The shortest hold the store keeps as asked, in seconds: a shorter TTL is kept this
    long (etcd leases are whole seconds, at least 2). ``dibs verify`` refuses a workload
    with shorter holds, whose expiries the store would not honour as the model reads them."""

    client_stamps: ClassVar[bool] = False
    """True when the times a store records (``created_at``, ``updated_at``) are read from
    the writing client's clock before its write reaches the store (etcd has no server
    clock): such a time lies inside its call, but two of them need not follow the order
    the writes took. ``dibs verify`` then orders writes by when their calls ran."""

    async_store: ClassVar[str | None] = None
    """``module:Class`` of this store's native async twin (a :class:`dibs.aio.AsyncStore`
    with ``from_url``), or None: :func:`dibs.aio.open` then runs this store on threads."""

    verify_faults: ClassVar[frozenset[str]] = frozenset()
    """Faults ``dibs verify`` may inject beyond kill, pause and skew: ``integrity`` (check
    the store's file after each kill), ``terminate`` and ``restart`` (server sessions that
    verify names per client, lists and ends, and a server it can restart)."""

    shared_holds: ClassVar[bool] = False
    """Whether this store takes ``mode="shared"`` claims; one that does not refuses them
    with :class:`~dibs.InvalidInput` (never treats a reader as a writer, or the reverse)."""

    _lease_class: ClassVar[type[Lease]]
    """What :meth:`lease` builds: :class:`dibs.lease.Lease`, set when :mod:`dibs.lease` loads
    (``import dibs`` loads it). The lease is a pattern built on this interface, so the store
    layer names it without importing it."""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        adapt_old_claim(cls)

    def __init__(
        self, *, clock: Clock | None = None, request_retention: float = DEFAULT_REQUEST_RETENTION
    ) -> None:
        self.request_retention = check_retention(request_retention)
        self.clock: Clock = clock if clock is not None else SystemClock()
        self._closed = False
        self._made: dict[str, object] = {}
        self._made_lock = threading.Lock()  # guards _made
        self._logger = logging.getLogger(_logger_name(type(self)))

    @classmethod
    @abc.abstractmethod
    def from_url(cls, url: str, **options: Any) -> Self:
        """Open a store from its URL; how :func:`dibs.open` makes every store.

        ``url`` is the whole URL, scheme included (``dibs.open`` has already
        chosen this class by its scheme). Keyword ``options`` come from the
        caller (``clock=``, ``request_retention=`` and the backend's own) and
        win over options in the URL. Raises :class:`~dibs.InvalidInput` for a
        malformed URL or option, :class:`~dibs.StoreUnavailable` when the store
        cannot be reached, :class:`~dibs.SchemaError` for a schema newer than
        the code.
        """

    @classmethod
    def check_url(cls, url: str, **options: Any) -> None:
        """Refuse, without I/O, what :meth:`from_url` would refuse of ``url`` and ``options``.

        ``dibs doctor`` asks this before it reads a store, so that a URL
        :func:`dibs.open` refuses is refused with the same
        :class:`~dibs.InvalidInput`. The built-in stores run the checks their
        ``from_url`` runs before its first I/O; the default checks nothing (a
        plug-in store's URL is then checked only by opening it).
        """
        return

    @classmethod
    def durability(cls, url: str, *, timeout: float = 5.0) -> list[Finding] | None:
        """What in the store's settings at ``url`` could lose an acknowledged claim.

        ``dibs doctor`` asks this (see :mod:`dibs.stores.durability`): each
        built-in store reads its own settings; None (the default) means the
        store does not know its own. Raises
        :class:`~dibs.StoreMisconfigured` or :class:`~dibs.StoreUnavailable`
        when the settings cannot be read.
        """
        return None

    @classmethod
    def exists(cls, url: str, **options: Any) -> bool | None:
        """Whether a store already exists at ``url``, found without creating anything.

        ``dibs.open(url, create=False)`` and ``dibs sweep`` ask this first, so that
        what only reads or maintains a store refuses to make a new, empty one.
        None (the default) means this store cannot tell; it is then opened as
        usual. Raises like :meth:`from_url` when the store cannot be reached.
        """
        return None

    # --- the contract ---------------------------------------------------------------------------

    def claim(
        self,
        targets: Target | Iterable[Target],
        *,
        holder: str,
        request_id: str | None = None,
        ttl: float | None = None,
        mode: str = "exclusive",
    ) -> ClaimResult:
        """Claim every target or none, atomically, and answer who won.

        With ``ttl=None`` the claim is confirmed at once; with a TTL in seconds
        it is a hold that must be confirmed before it expires. A request ID
        makes the call replayable: the same ID with the same input returns the
        first outcome with ``replayed=True``. ``mode="shared"`` makes a reader's
        claim: it coexists with other shared claims on its targets, while an
        exclusive claim (the default) excludes every live claim on them.

        Raises :class:`~dibs.InvalidInput` for bad input,
        :class:`~dibs.RequestConflict` when ``request_id`` was used with
        different input, :class:`~dibs.StoreUnavailable` when the store could
        not be reached (retry with the same request ID to learn the outcome).
        """
        if self._closed:
            self._check_open()
        request = ClaimRequest(targets, holder=holder, request_id=request_id, ttl=ttl, mode=mode)
        if request.mode != "exclusive" and not self.shared_holds:
            raise shared_refused(self.scheme)
        try:
            return self._claim(request)
        except Exception as exc:
            self._closed_under(exc)
            raise

    def confirm(self, claim_id: str, *, holder: str, fence: int) -> Claim:
        """Turn a live hold into a confirmed claim (idempotent on a confirmed one).

        Raises :class:`~dibs.ClaimNotFound`, :class:`~dibs.NotHolder`, or
        :class:`~dibs.HoldLost` when the hold expired, was taken over or
        released, or ``fence`` is not the claim's.
        """
        self._check_open()
        args = transition_args(claim_id, holder, fence)
        try:
            return self._confirm(*args)
        except HoldLost as exc:
            self._log_lost("confirm", exc)
            raise
        except Exception as exc:
            self._closed_under(exc)
            raise

    def extend(self, claim_id: str, *, holder: str, fence: int, ttl: float) -> Claim:
        """Push a live hold's expiry to ``ttl`` seconds from now on the store's clock.

        A confirmed claim does not expire and is returned unchanged. Raises
        like :meth:`confirm`, and :class:`~dibs.InvalidInput` for a bad TTL.
        """
        self._check_open()
        args = extend_args(claim_id, holder, fence, ttl)
        try:
            return self._extend(*args)
        except HoldLost as exc:
            self._log_lost("extend", exc)
            raise
        except Exception as exc:
            self._closed_under(exc)
            raise

    def release(self, claim_id: str, *, holder: str, fence: int) -> bool:
        """Give up a live hold or confirmed claim; True if this call released it.

        Releasing a claim that is already released, expired or taken over is a
        no-op that returns False. Raises :class:`~dibs.ClaimNotFound`,
        :class:`~dibs.NotHolder`, and :class:`~dibs.HoldLost` (reason
        ``fence``) when ``fence`` is not the claim's.
        """
        self._check_open()
        args = transition_args(claim_id, holder, fence)
        try:
            released = self._release(*args)
        except HoldLost as exc:
            self._log_lost("release", exc)
            raise
        except Exception as exc:
            self._closed_under(exc)
            raise
        ring(claim_id)  # a waiter in this process wakes now, not at the end of its pause
        return released

    def lease(
        self,
        targets: Target | Iterable[Target],
        *,
        holder: str,
        ttl: float,
        wait: float | None = 0.0,
        renew_every: float | None = None,
        on_lost: Callable[[HoldLost], object] | None = None,
        max_hold: float | None = None,
    ) -> Lease:
        """Hold the targets for a ``with`` block, renewing the hold: a :class:`~dibs.lease.Lease`.

        Entering claims them as a hold of ``ttl`` seconds; a thread extends it
        (fenced) every ``renew_every`` seconds, ``ttl / 3`` by default; exiting
        releases it. Entering raises :class:`~dibs.ResourceBusy` when the
        targets stay taken for ``wait`` seconds (0: at once; None: wait as
        long as it takes). :class:`~dibs.HoldLost` comes from ``lease.check()``
        as soon as renewal fails, and from the ``with`` statement when the
        block ends. Raises :class:`~dibs.InvalidInput` here for bad arguments,
        for a ``ttl`` under :data:`dibs.lease.LEASE_TTL_MIN`, and for a
        ``renew_every`` under :data:`dibs.lease.RENEW_EVERY_MIN` or over ``ttl / 2``.
        ``on_lost(HoldLost)`` is called once, from the renewal thread, when the hold is
        lost (never after a clean exit); with ``max_hold`` seconds the lease stops
        renewing that long after its claim was sent, and the hold then runs out.
        """
        self._check_open()
        return self._lease_class(
            self,
            targets,
            holder=holder,
            ttl=ttl,
            wait=wait,
            renew_every=renew_every,
            on_lost=on_lost,
            max_hold=max_hold,
        )

    def get(self, claim_id: str) -> Claim | None:
        """Return the claim with this ID as stored now, or None."""
        self._check_open()
        checked = check_claim_id(claim_id)
        try:
            return self._get(checked)
        except Exception as exc:
            self._closed_under(exc)
            raise

    def holder_of(self, target: Unit | Span) -> str | None:
        """Return who holds this unit (or a span overlapping this span) now, or None.

        A snapshot for display: it may be stale the moment it returns, so never
        decide a claim with it; claim and read the answer instead.
        """
        self._check_open()
        checked = target_arg(target)
        try:
            return self._holder_of(checked)
        except Exception as exc:
            self._closed_under(exc)
            raise

    def claims_of(self, holder: str) -> list[Claim]:
        """Return the holder's live claims (held and unexpired, or confirmed); a snapshot."""
        self._check_open()
        checked = check_holder(holder)
        try:
            return self._claims_of(checked)
        except Exception as exc:
            self._closed_under(exc)
            raise

    def sweep(self) -> SweepResult:
        """Mark dead holds expired; purge request records and ended claims past retention.

        The newest claim is never purged, so that no store can hand out its
        fence again.

        Safe to run at any time, concurrently with claims and with other sweeps
        in any number of processes.
        """
        self._check_open()
        try:
            result = self._sweep()
        except Exception as exc:
            self._closed_under(exc)
            raise
        log_sweep(self._logger, result)
        return result

    def close(self) -> None:
        """Release the store's resources; later calls raise :class:`~dibs.StoreClosed`."""
        if not self._closed:
            self._closed = True
            self._close()

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` was called."""
        return self._closed

    def now(self) -> datetime:
        """The store's current time (the clock that judges expiry), as aware UTC.

        Raises :class:`~dibs.StoreClosed` once the store is closed, as every call does.
        """
        self._check_open()
        try:
            return datetime.fromtimestamp(self._now(), UTC)
        except Exception as exc:
            self._closed_under(exc)
            raise

    # --- optional capabilities: None means "this store does not offer it" ----------------------

    def job_table(self) -> JobTable | None:
        """The durable job table that lives next to this store's claims, or None.

        :mod:`dibs.tasks` durable mode needs one; it raises
        :class:`~dibs.InvalidInput` for a store that answers None. The same
        object is returned on every call; closing the store closes it.
        """
        return None

    def change_feed(self) -> ChangeFeed | None:
        """A cheap token that moves whenever anyone may have changed this store, or None.

        Live views (the service's seat map) poll it to know when to refresh;
        without one they recompute on every poll. The caller closes it.
        """
        return None

    def claim_log(self) -> ClaimLog | None:
        """Every claim row this store keeps, for ``dibs verify``'s log replay, or None."""
        return None

    def integrity_check(self) -> str | None:
        """Check the store's own storage; ``"ok"``, what is wrong, or None if it cannot.

        ``dibs verify``'s ``integrity`` fault runs it after each kill (a store that
        offers it lists ``integrity`` in :attr:`verify_faults`).
        """
        return None

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    # --- for backends ---------------------------------------------------------------------------

    def _log_lost(self, operation: str, exc: HoldLost) -> None:
        log_lost(self._logger, operation, exc)

    def _log_takeover(self, claim_id: str) -> None:
        # DEBUG: abandoned holds are routine (a customer walks away), so a takeover
        # is one line per claim at worst; the sweep's INFO line gives the counts.
        self._logger.debug("hold %s expired and was taken over", claim_id)

    def _check_open(self) -> None:
        if self._closed:
            raise StoreClosed(f"this {type(self).__name__} is closed")

    def _closed_under(self, exc: Exception) -> None:
        """Raise :class:`~dibs.StoreClosed` for a driver's error met because close() came.

        A call that passed its closed check and then met the resources close()
        was taking away (a closed pool, client or connection) gets the error
        every later call gets, never the driver's; a dibs error is an answer and
        stands.
        """
        closed_under(self._closed, type(self).__name__, exc)

    def _once(self, key: str, make: Callable[[], _T]) -> _T:
        """``make()``'s result, made on the first call for ``key`` only (a capability object)."""
        with self._made_lock:
            if key not in self._made:
                self._made[key] = make()
            return self._made[key]  # type: ignore[return-value]  # the key fixes the type

    def _now(self) -> float:
        """Seconds since the epoch on the store's clock."""
        return self.clock.now()

    def _claim_checked(self, units: tuple[Unit, ...], holder: str) -> ClaimResult:
        """Claim units a pattern built from checked names, confirmed at once (``dibs.Lot``'s park).

        For callers inside dibs only: ``units`` are sorted by ``(resource, slot)``
        and unique, ``holder`` is a non-empty :func:`~dibs._model.is_plain_name`.
        The result is :meth:`claim`'s for the same call; a store with an inline
        path for such a group (memory://) overrides this to skip checking again.
        """
        return self.claim(units, holder=holder)

    @abc.abstractmethod
    def _claim(self, request: ClaimRequest) -> ClaimResult:
        """Claim the request's targets; one atomic step decides and records the request.

        ``request`` is checked and normalized (:class:`~dibs.ClaimRequest`); its
        :attr:`~dibs.ClaimRequest.fingerprint` is what a request ID replays against.
        """

    @abc.abstractmethod
    def _confirm(self, claim_id: str, holder: str, fence: int) -> Claim: ...

    @abc.abstractmethod
    def _extend(self, claim_id: str, holder: str, fence: int, ttl: float) -> Claim: ...

    @abc.abstractmethod
    def _release(self, claim_id: str, holder: str, fence: int) -> bool: ...

    @abc.abstractmethod
    def _get(self, claim_id: str) -> Claim | None: ...

    @abc.abstractmethod
    def _holder_of(self, target: Unit | Span) -> str | None: ...

    @abc.abstractmethod
    def _claims_of(self, holder: str) -> list[Claim]: ...

    @abc.abstractmethod
    def _sweep(self) -> SweepResult: ...

    @abc.abstractmethod
    def _close(self) -> None: ...


# --- the input checks and log lines both faces share (sync Store, dibs.aio.AsyncStore) ---------


def transition_args(claim_id: object, holder: object, fence: object) -> tuple[str, str, int]:
    """``confirm()``'s and ``release()``'s arguments, checked."""
    return check_claim_id(claim_id), check_holder(holder), check_fence(fence)


def extend_args(
    claim_id: object, holder: object, fence: object, ttl: object
) -> tuple[str, str, int, float]:
    """``extend()``'s arguments, checked; the TTL may not be None."""
    ttl_seconds = check_ttl(ttl, allow_none=False)
    assert ttl_seconds is not None
    return check_claim_id(claim_id), check_holder(holder), check_fence(fence), ttl_seconds


def target_arg(target: object) -> Unit | Span:
    """``holder_of()``'s argument: a Unit or a Span."""
    if not isinstance(target, Unit | Span):
        raise InvalidInput(
            f"holder_of() takes a Unit or a Span, got {target!r}", field="target", value=target
        )
    return target


def closed_under(closed: bool, store: str, exc: Exception) -> None:
    """Raise :class:`~dibs.StoreClosed` from ``exc`` if ``closed`` and it is not a dibs error."""
    if closed and not isinstance(exc, DibsError):
        raise StoreClosed(f"this {store} was closed during the call ({exc!r})") from exc


def log_lost(logger: logging.Logger, operation: str, exc: HoldLost) -> None:
    """DEBUG: a lost hold is the caller's to handle, and may come once per claim."""
    logger.debug("%s of claim %s: hold lost (%s)", operation, exc.claim_id, exc.reason)


def log_sweep(logger: logging.Logger, result: SweepResult) -> None:
    """INFO for a sweep that did something, DEBUG for one that did not."""
    if result.expired or result.purged_requests or result.purged_claims:
        logger.info(
            "sweep: expired %d dead holds, purged %d request records and %d ended claims",
            result.expired,
            result.purged_requests,
            result.purged_claims,
        )
    else:
        logger.debug("sweep: nothing to do")


def _logger_name(cls: type[Store]) -> str:
    """``dibs.stores.<package>`` for a built-in store, ``dibs.stores.<scheme>`` for a plug-in."""
    for klass in cls.__mro__:  # a subclass of a built-in store logs as that store
        module = klass.__module__
        if module.startswith("dibs.stores.") and klass is not Store:
            return module
    return f"dibs.stores.{getattr(cls, 'scheme', 'plugin')}"


def adapt_old_claim(cls: type) -> None:
    """Let a store written for ``_claim(targets, holder, request_id, ttl)`` keep working.

    Stores take one :class:`~dibs.ClaimRequest` since 0.2; a class that still
    defines the four-argument form gets it wrapped, with a DeprecationWarning
    naming the class.
    """
    method = cls.__dict__.get("_claim")
    if method is None or getattr(method, "__isabstractmethod__", False):
        return
    try:
        parameters = inspect.signature(method).parameters
    except (TypeError, ValueError):  # a callable without a signature: leave it be
        return
    if list(parameters)[1:] != ["targets", "holder", "request_id", "ttl"]:
        return
    warnings.warn(
        f"{cls.__module__}.{cls.__qualname__}._claim(targets, holder, request_id, ttl) is the "
        "old form: take one dibs.ClaimRequest (request.targets, .holder, .request_id, .ttl)",
        DeprecationWarning,
        stacklevel=3,
    )
    old = method
    adapted: Callable[..., Any]
    if inspect.iscoroutinefunction(old):

        async def adapted(self: Any, request: ClaimRequest) -> ClaimResult:
            return await old(self, request.targets, request.holder, request.request_id, request.ttl)  # type: ignore[no-any-return]

    else:

        def adapted(self: Any, request: ClaimRequest) -> ClaimResult:
            return old(self, request.targets, request.holder, request.request_id, request.ttl)  # type: ignore[no-any-return]

    adapted.__qualname__ = f"{cls.__qualname__}._claim"
    cls._claim = adapted  # type: ignore[attr-defined]


# --- errors every backend raises, worded once -------------------------------------------------


def shared_refused(scheme: str) -> InvalidInput:
    """The error for ``mode="shared"`` on a store that does not take shared claims."""
    return InvalidInput(
        f"{scheme}:// does not take mode='shared' claims", field="mode", value="shared"
    )


def claim_not_found(claim_id: str) -> ClaimNotFound:
    """The error for an unknown claim ID."""
    return ClaimNotFound(f"no claim with ID {claim_id!r}", claim_id=claim_id)


def not_holder(claim_id: str, holder: str) -> NotHolder:
    """The error for a transition attempted by someone other than the holder."""
    return NotHolder(
        f"claim {claim_id!r} is not held by {holder!r}", claim_id=claim_id, holder=holder
    )


def hold_lost(claim_id: str, reason: HoldLostReason, fence: int) -> HoldLost:
    """The error for a confirm, extend or release that found no live hold."""
    message = {
        HoldLostReason.FENCE: f"fence {fence} is not the fence of claim {claim_id!r}",
        HoldLostReason.RELEASED: f"claim {claim_id!r} was released",
        HoldLostReason.EXPIRED: f"hold {claim_id!r} expired",
        HoldLostReason.TAKEN_OVER: f"hold {claim_id!r} expired and was taken over",
    }[reason]
    return HoldLost(message, claim_id=claim_id, reason=reason)


def lost_reason(
    *, real_fence: int, fence: int, state: ClaimState, dead: bool, taken_over: bool
) -> HoldLostReason | None:
    """Why a claim is not the caller's live hold, or None if it is.

    ``dead`` says whether a claim still marked held has passed its expiry on
    the store's clock. The order of the checks is part of the contract.
    """
    if real_fence != fence:
        return HoldLostReason.FENCE
    if state is ClaimState.RELEASED:
        return HoldLostReason.RELEASED
    if state is ClaimState.EXPIRED or (state is ClaimState.HELD and dead):
        return HoldLostReason.TAKEN_OVER if taken_over else HoldLostReason.EXPIRED
    return None


def span_kind_mismatch(span: Span, kind: str) -> SpanKindMismatch:
    """The error for a span of one kind claimed on a resource holding live spans of the other."""
    return SpanKindMismatch(
        f"resource {span.resource!r} holds {kind} spans; cannot claim {span!r}",
        field="targets",
        value=span,
    )


def check_seconds(name: str, value: object) -> float:
    """A positive, finite number of seconds as a float; raises :class:`~dibs.InvalidInput`."""
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not (0 < value < float("inf"))
    ):
        raise InvalidInput(
            f"{name} must be a positive number of seconds, got {value!r}", field=name, value=value
        )
    return float(value)


def stored_claim(
    id: str,
    holder: str,
    targets: str,
    state: str,
    fence: int,
    expires_at: datetime | None,
    request_id: str | None,
    created_at: datetime,
    updated_at: datetime,
    taken_over: bool,
    *,
    dead: bool,
    mode: str | None = None,
) -> Claim:
    """A SQL store's claim row as a :class:`Claim`; ``dead`` says a held row's expiry passed.

    A hold that died before a sweep marked it reads as expired (derived on read).
    """
    claim_state = ClaimState(state)
    if claim_state is ClaimState.HELD and dead:
        claim_state = ClaimState.EXPIRED
    return make_claim(
        id, holder, targets_from_text(targets), claim_state, fence, expires_at, request_id,
        created_at, updated_at, bool(taken_over), mode or "exclusive",
    )  # fmt: skip


def parse_serial_id(claim_id: str) -> int | None:
    """The fence behind a claim ID of a store whose IDs are its fences, or None.

    Only the canonical spelling names a claim (``"7"``, never ``"007"``), and
    only a fence a signed 64-bit column can hold.
    """
    if not (claim_id.isascii() and claim_id.isdigit()) or len(claim_id) > 19:
        return None
    number = int(claim_id)
    return number if 0 < number <= NUMBER_MAX and str(number) == claim_id else None


def span_overlaps(a: Span, b: Span) -> bool:
    """Whether two spans on one resource share a point (half-open intervals)."""
    return a.overlaps(b)
