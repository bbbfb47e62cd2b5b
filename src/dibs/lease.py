"""A fenced lease: hold targets for a ``with`` block, renewed in the background.

``store.lease(targets, holder=..., ttl=...)`` claims the targets as a hold of
``ttl`` seconds, renews it with the fenced :meth:`~dibs.Store.extend` every
``renew_every`` seconds (``ttl / 3`` by default) while the block runs, and
releases it, fenced, when the block exits. ``lease.fence`` is the claim's
fence token: pass it to whatever the block writes to, so that a writer whose
lease was lost is refused there.

Both faces share one policy, written once (in ``dibs._lease``) as generators of *steps* (claim,
extend, release, sleep...) that :func:`dibs._drive.drive` / ``adrive`` run:
:class:`Lease` with blocking calls, :class:`AsyncLease` with awaits. The
store calls a step makes (``_call``, ``_abandon``) are generated from the
async ones by ``scripts/unasync.py``. What stays written per face is what must
differ, and only that: the sync face renews in a thread that a
``threading.Event`` stops, since a thread cannot be interrupted, while the async
face renews in a task that cancels the block's task on a loss; an extend stuck
past the hold's deadline is cut off by ``asyncio.timeout`` on the async face
and by a bounded join on the sync one; and ``on_lost`` is called from the
renewal thread on the sync face, and awaited in the renewal task on the async
one. Both watch the store's change feed while waiting (``_Watch``, generated
from ``_AsyncWatch``). The policy:

* **Claiming.** Each attempt carries a fresh request ID. An attempt that fails
  with :class:`~dibs.StoreUnavailable` is retried with the *same* ID, so the
  store answers the first attempt's outcome instead of making a second hold;
  such retries stop ``UNAVAILABLE_RETRY`` seconds (or ``wait``) after entering.
  A grant answered so late that the hold may already have expired is released
  and claimed again.
  A grant the lease did not make (the same holder already holds exactly these
  targets: another lease, or a claim of its own) counts as taken: a lease
  never adopts a hold it did not claim.
* **Taken.** With ``wait=0`` (the default) taken targets raise
  :class:`~dibs.ResourceBusy` at once, saying which targets were taken and who
  holds them (a snapshot); ``wait=seconds`` retries with jittered backoff (and
  the store's change feed where it has one, which only shortens a pause) until
  then; ``wait=None`` waits as long as it takes. Waiters are served first come,
  first served: each takes a ticket in its first target's queue and only the
  head tries (``dibs._fair``, ``dibs._queue``; docs/leases.md, "Fair waiting").
* **Renewal.** Every ``renew_every`` seconds, or sooner when half the time the
  hold has left is gone. An extend that fails with :class:`~dibs.StoreUnavailable` is
  retried while the hold can still be alive: until ``ttl`` after the last
  renewal was sent, less a margin of ``ttl / 10``. Past that, or on
  :class:`~dibs.HoldLost`, the lease is lost.
* **Release.** Fenced; retried on :class:`~dibs.StoreUnavailable`, and a retry
  that finds the claim released under its fence after an unanswered try counts
  as the lease's own release. An unexpected error from it never replaces the
  block's exception (it becomes a note).
* **Lifetime.** With ``max_hold``, no renewal is sent once ``max_hold``
  seconds have passed since the claim was sent (on the lease's monotonic
  clock): the hold runs out at its last TTL, and the lease counts it lost
  (reason ``expired``) when it is overdue, as for any renewal that stopped.
* **on_lost.** Called once with the :class:`~dibs.HoldLost`, as soon as the
  lease knows of the loss: from the renewal thread (sync) or task (async,
  which awaits what it returns if that is awaitable, after cancelling the
  block's task), or from the exit when the loss shows only there. An
  exception from it is logged on ``dibs.lease``, never raised. Never called
  after an exit that released the hold cleanly; an exit waits for a call under way.
* **Loss.** The async face cancels the block's task and turns that
  cancellation into :class:`~dibs.HoldLost` when the block exits; an outside
  cancellation still propagates as :class:`asyncio.CancelledError`. The sync
  face cannot safely interrupt a thread: ``lease.check()`` raises
  :class:`~dibs.HoldLost` as soon as the loss is known, and the ``with``
  statement raises it when the block ends normally. A block that raised keeps
  its own exception, with a note that the hold was lost.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import threading
import time
from collections.abc import Callable, Iterable
from datetime import datetime
from types import TracebackType
from typing import TYPE_CHECKING, Any, Self

from dibs._bell import alisten, listen
from dibs._fair import FairAttempt, fair_claim_policy
from dibs._lease import (
    _FEED_POLL,
    LEASE_TTL_MIN,
    RENEW_EVERY_MIN,
    UNAVAILABLE_RETRY,
    _adrive,
    _call_on_lost,
    _ChangeStep,
    _ClaimStep,
    _describe,
    _drive,
    _ExtendStep,
    _GetStep,
    _Hold,
    _HoldersStep,
    _logger,
    _release_policy,
    _ReleaseStep,
    _renewal_policy,
    _SleepStep,
    _Step,
    _terms,
    _unexpected,
    check_on_lost,
)
from dibs._model import Claim, ClaimState, Span, Target, Unit
from dibs._queue import QCall, QPause
from dibs._queue import abandon as abandon_queue
from dibs._shield import to_the_end
from dibs.exceptions import HoldLost, StoreUnavailable
from dibs.stores.base import Store
from dibs.stores.base_async import AsyncStore
from dibs.stores.capabilities import UnchangingFeed

if TYPE_CHECKING:
    from dibs._lease import _Terms
    from dibs.stores.capabilities import AsyncChangeFeed, ChangeFeed

__all__ = ["LEASE_TTL_MIN", "RENEW_EVERY_MIN", "UNAVAILABLE_RETRY", "AsyncLease", "Lease"]


class _LeaseFace:
    """What both faces show the block: the claim, its fence, and whether it was lost."""

    def __init__(
        self,
        targets: Target | Iterable[Target],
        *,
        holder: str,
        ttl: float,
        wait: float | None,
        renew_every: float | None,
        on_lost: Callable[[HoldLost], object] | None,
        max_hold: float | None,
        monotonic: Callable[[], float] | None,
    ) -> None:
        self._terms = _terms(targets, holder, ttl, wait, renew_every, max_hold, monotonic)
        self._on_lost = check_on_lost(on_lost)
        self._hold: _Hold | None = None
        self._entered = False

    def _enter(self) -> None:
        if self._entered:
            raise RuntimeError("a lease is entered once; call store.lease() again for another")
        self._entered = True

    def _live(self) -> _Hold:
        if self._hold is None:
            raise RuntimeError("the lease has no claim yet: use it in a with block")
        return self._hold

    @property
    def holder(self) -> str:
        """The holder the lease claims for."""
        return self._terms.holder

    @property
    def targets(self) -> tuple[Target, ...]:
        """The targets the lease holds, normalized as the store keeps them."""
        return self._terms.targets

    @property
    def ttl(self) -> float:
        """Seconds each renewal pushes the hold's expiry to, on the store's clock."""
        return self._terms.ttl

    @property
    def max_hold(self) -> float | None:
        """Seconds after its claim was sent past which the lease renews no more, or None."""
        return self._terms.max_hold

    @property
    def claim(self) -> Claim:
        """The hold, as of its latest renewal (``expires_at`` moves; ``id`` and ``fence`` don't)."""
        return self._live().claim

    @property
    def id(self) -> str:
        """The claim's ID (``lease.claim.id``)."""
        return self._live().claim.id

    @property
    def state(self) -> ClaimState:
        """The claim's state as of its latest renewal (``lease.claim.state``)."""
        return self._live().claim.state

    @property
    def expires_at(self) -> datetime | None:
        """When the hold expires on the store's clock, as of its latest renewal."""
        return self._live().claim.expires_at

    @property
    def fence(self) -> int:
        """The claim's fence token: pass it to what the block writes, to refuse stale writers."""
        return self._live().claim.fence

    @property
    def renewals(self) -> int:
        """How many renewals have succeeded so far."""
        return self._live().renewals

    @property
    def lost(self) -> bool:
        """Whether the hold is known lost, or may have expired because renewal is overdue."""
        hold = self._hold
        return hold is not None and hold.overdue()

    @property
    def error(self) -> HoldLost | None:
        """The :class:`~dibs.HoldLost` that ended the lease, or None while it holds."""
        hold = self._hold
        return None if hold is None or not hold.overdue() else hold.error

    def check(self) -> None:
        """Raise :class:`~dibs.HoldLost` if the hold is lost, or may have expired unrenewed."""
        hold = self._live()
        if hold.overdue():
            assert hold.error is not None
            raise hold.error

    def __repr__(self) -> str:
        hold = self._hold
        state = (
            "unclaimed" if hold is None else "lost" if hold.error else f"fence={hold.claim.fence}"
        )
        return f"<{type(self).__name__} {_describe(self._terms.targets)} {self.holder!r} {state}>"


def _note(exc: BaseException, lost: HoldLost) -> None:
    if exc is not lost:
        exc.add_note(f"dibs: and the lease's hold was lost meanwhile: {lost}")


def _release_failed(
    hold: _Hold, exc: BaseException | None, failure: Exception
) -> HoldLost | Exception | None:
    """What a release that failed unexpectedly makes of the exit: the error to raise, if any.

    The block's own exception is never replaced: the failure becomes a note on it (and a
    log record). After a block that succeeded, the failure is raised, as the
    :class:`~dibs.HoldLost` already known if the hold was lost meanwhile.
    """
    _logger.error("lease %s: release failed", hold.claim.id, exc_info=failure)
    if exc is not None:
        exc.add_note(f"dibs: and releasing the lease's hold failed: {failure!r}")
        if hold.error is not None:
            _note(exc, hold.error)
        return None
    if hold.error is not None:
        hold.error.add_note(f"dibs: and releasing the hold failed: {failure!r}")
        return hold.error
    return failure


# --- generated from the shared part below (scripts/unasync.py): edit that, then run it ---
def _call(store: Store, terms: _Terms, step: _Step) -> Any:
    """Perform a policy's step that is one store call; the store's answer, or its error."""
    match step:
        case _ClaimStep(request_id):
            return store.claim(
                terms.targets, holder=terms.holder, request_id=request_id, ttl=terms.ttl
            )
        case _ExtendStep(claim):
            return store.extend(claim.id, holder=terms.holder, fence=claim.fence, ttl=terms.ttl)
        case _ReleaseStep(claim):
            return store.release(claim.id, holder=terms.holder, fence=claim.fence)
        case _GetStep(claim_id):
            return store.get(claim_id)
        case _HoldersStep(targets):
            return {target: store.holder_of(_one(target)) for target in targets}
        case QCall(method, args, kwargs):
            return getattr(store, method)(*args, **kwargs)
    raise AssertionError(step)  # pragma: no cover


def _abandon(store: Store, terms: _Terms, request_id: str) -> None:
    """Best effort: learn a cut-off claim's outcome by replaying it, and release it if granted.

    A replay of a request the store never saw makes the hold (to release it at once):
    the lease cannot tell the two apart, and a hold left behind blocks the targets
    until it expires, which is worse.
    """
    try:
        result = store.claim(
            terms.targets, holder=terms.holder, request_id=request_id, ttl=terms.ttl
        )
        claim = result.claim
        if result and claim is not None and claim.request_id == request_id:
            store.release(claim.id, holder=terms.holder, fence=claim.fence)
    except Exception as exc:  # best effort: the hold expires by itself
        _logger.warning("lease request %s: abandoned claim left to expire (%s)", request_id, exc)


class _Watch:
    """A waiting lease's view of the store's change feed, opened on its first wait.

    Without a feed (memory://, a store that offers none, or one that failed) a
    wait is a plain sleep. Closed by the lease once it has its claim.
    """

    def __init__(self, store: Store) -> None:
        self._store = store
        self._feed: ChangeFeed | None = None
        self._token: object = None
        self._polling = False

    def wait(
        self,
        seconds: float,
        hurried: float,
        since: int | None = None,
        poll: float = _FEED_POLL,
        ids: frozenset[str] | None = None,
    ) -> None:
        """Sleep ``seconds``, cut to at most ``hurried`` more once the feed moves (read every
        ``poll`` seconds), and ended at once by a release in this process past ``since``
        (the bell's count before the waiter's last read; None: not listened for) of one of
        ``ids`` (None: of any claim)."""
        end = time.monotonic() + seconds
        if self._feed is None and not self._polling:
            try:
                self._feed = self._store.change_feed()
            except Exception:  # the feed only hurries a retry; polling does without it
                _logger.debug("lease: no change feed; polling", exc_info=True)
            if self._feed is None or isinstance(self._feed, UnchangingFeed):
                self._polling = True  # nothing to watch: every change comes through here
            else:
                self._token = self._read()  # the first wait: changes since go unseen
        if self._polling:
            listen(since, seconds, ids)
            return
        while (left := end - time.monotonic()) > 0:
            if listen(since, min(poll, left), ids):
                return
            if self._polling or self._read() != self._token:
                time.sleep(max(0.0, min(end - time.monotonic(), hurried)))
                return

    def mark(self) -> None:
        """Take the feed's token now: called after each of the lease's claims (its own write
        is no news), and before each queue call (a change while it reads is news)."""
        if self._feed is not None:
            self._token = self._read()

    def _read(self) -> object:
        assert self._feed is not None
        try:
            return self._feed.read()
        except Exception:  # the feed only hurries a retry; polling does without it
            _logger.debug("lease: change feed failed; polling instead", exc_info=True)
            self.close()
            self._polling = True
            return None

    @property
    def watching(self) -> bool:
        """Whether a feed is open (for :meth:`close` to close)."""
        return self._feed is not None

    def close(self) -> None:
        """Close the feed, if one is open."""
        feed, self._feed = self._feed, None
        if feed is not None:
            with contextlib.suppress(Exception):
                feed.close()


# --- end of the generated part ---


# --- shared with the sync face: scripts/unasync.py makes _call() and _abandon() from this part ---
async def _call_async(store: AsyncStore, terms: _Terms, step: _Step) -> Any:
    """Perform a policy's step that is one store call; the store's answer, or its error."""
    match step:
        case _ClaimStep(request_id):
            return await store.claim(
                terms.targets, holder=terms.holder, request_id=request_id, ttl=terms.ttl
            )
        case _ExtendStep(claim):
            return await store.extend(
                claim.id, holder=terms.holder, fence=claim.fence, ttl=terms.ttl
            )
        case _ReleaseStep(claim):
            return await store.release(claim.id, holder=terms.holder, fence=claim.fence)
        case _GetStep(claim_id):
            return await store.get(claim_id)
        case _HoldersStep(targets):
            return {target: await store.holder_of(_one(target)) for target in targets}
        case QCall(method, args, kwargs):
            return await getattr(store, method)(*args, **kwargs)
    raise AssertionError(step)  # pragma: no cover


async def _abandon_async(store: AsyncStore, terms: _Terms, request_id: str) -> None:
    """Best effort: learn a cut-off claim's outcome by replaying it, and release it if granted.

    A replay of a request the store never saw makes the hold (to release it at once):
    the lease cannot tell the two apart, and a hold left behind blocks the targets
    until it expires, which is worse.
    """
    try:
        result = await store.claim(
            terms.targets, holder=terms.holder, request_id=request_id, ttl=terms.ttl
        )
        claim = result.claim
        if result and claim is not None and claim.request_id == request_id:
            await store.release(claim.id, holder=terms.holder, fence=claim.fence)
    except Exception as exc:  # best effort: the hold expires by itself
        _logger.warning("lease request %s: abandoned claim left to expire (%s)", request_id, exc)


class _AsyncWatch:
    """A waiting lease's view of the store's change feed, opened on its first wait.

    Without a feed (memory://, a store that offers none, or one that failed) a
    wait is a plain sleep. Closed by the lease once it has its claim.
    """

    def __init__(self, store: AsyncStore) -> None:
        self._store = store
        self._feed: AsyncChangeFeed | None = None
        self._token: object = None
        self._polling = False

    async def wait(
        self,
        seconds: float,
        hurried: float,
        since: int | None = None,
        poll: float = _FEED_POLL,
        ids: frozenset[str] | None = None,
    ) -> None:
        """Sleep ``seconds``, cut to at most ``hurried`` more once the feed moves (read every
        ``poll`` seconds), and ended at once by a release in this process past ``since``
        (the bell's count before the waiter's last read; None: not listened for) of one of
        ``ids`` (None: of any claim)."""
        end = time.monotonic() + seconds
        if self._feed is None and not self._polling:
            try:
                self._feed = self._store.change_feed()
            except Exception:  # the feed only hurries a retry; polling does without it
                _logger.debug("lease: no change feed; polling", exc_info=True)
            if self._feed is None or isinstance(self._feed, UnchangingFeed):
                self._polling = True  # nothing to watch: every change comes through here
            else:
                self._token = await self._read()  # the first wait: changes since go unseen
        if self._polling:
            await alisten(since, seconds, ids)
            return
        while (left := end - time.monotonic()) > 0:
            if await alisten(since, min(poll, left), ids):
                return
            if self._polling or await self._read() != self._token:
                await asyncio.sleep(max(0.0, min(end - time.monotonic(), hurried)))
                return

    async def mark(self) -> None:
        """Take the feed's token now: called after each of the lease's claims (its own write
        is no news), and before each queue call (a change while it reads is news)."""
        if self._feed is not None:
            self._token = await self._read()

    async def _read(self) -> object:
        assert self._feed is not None
        try:
            return await self._feed.read()
        except Exception:  # the feed only hurries a retry; polling does without it
            _logger.debug("lease: change feed failed; polling instead", exc_info=True)
            await self.close()
            self._polling = True
            return None

    @property
    def watching(self) -> bool:
        """Whether a feed is open (for :meth:`close` to close)."""
        return self._feed is not None

    async def close(self) -> None:
        """Close the feed, if one is open."""
        feed, self._feed = self._feed, None
        if feed is not None:
            with contextlib.suppress(Exception):
                await feed.close()


# --- end of the shared part ---


class Lease(_LeaseFace):
    """``with store.lease(targets, holder=..., ttl=...) as lease:``: see :mod:`dibs.lease`.

    Entering claims the targets (raises :class:`~dibs.ResourceBusy` when they
    stay taken past ``wait``, :class:`~dibs.StoreUnavailable` when the store
    stays unreachable); a thread renews the hold while the block runs; exiting
    stops it and releases the hold. Python cannot safely interrupt the block's
    thread, so a loss shows through :meth:`check` and :attr:`lost` at once, and
    the ``with`` statement raises :class:`~dibs.HoldLost` when the block ends.
    """

    def __init__(
        self,
        store: Store,
        targets: Target | Iterable[Target],
        *,
        holder: str,
        ttl: float,
        wait: float | None = 0.0,
        renew_every: float | None = None,
        on_lost: Callable[[HoldLost], object] | None = None,
        max_hold: float | None = None,
        monotonic: Callable[[], float] | None = None,
    ) -> None:
        super().__init__(
            targets,
            holder=holder,
            ttl=ttl,
            wait=wait,
            renew_every=renew_every,
            on_lost=on_lost,
            max_hold=max_hold,
            monotonic=monotonic,
        )
        self._store = store
        self._stop = threading.Event()
        self._renewer: threading.Thread | None = None
        self._watch = _Watch(store)

    def __enter__(self) -> Self:
        self._enter()
        attempt = FairAttempt(clock=self._terms.monotonic)
        try:
            claim = _drive(fair_claim_policy(self._terms, attempt), self._perform)
        except BaseException:  # gave up, interrupted...: a claim sent may have made a hold
            if attempt.unanswered is not None:
                _abandon(self._store, self._terms, attempt.unanswered)
            if attempt.queue:  # cut off while queued: the next waiter goes on
                with contextlib.suppress(Exception):  # best effort: tickets expire anyway
                    _drive(abandon_queue(attempt.queue, attempt.place), self._perform)  # type: ignore[arg-type]
            raise
        finally:
            self._watch.close()
        hold = self._hold = _Hold(self._terms, claim, attempt.sent, self._on_lost)
        self._renewer = threading.Thread(
            target=self._renew, args=(hold,), name=f"dibs-lease-{claim.id}", daemon=True
        )
        self._renewer.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        hold = self._live()
        self._stop.set()
        assert self._renewer is not None
        # A renewal stuck in an extend is waited for only while the hold can be alive:
        # the release is fenced, so an extend landing after it is refused.
        self._renewer.join(max(0.0, hold.alive_until - self._terms.monotonic()))
        hold.overdue()
        try:
            at_release = _drive(_release_policy(hold), self._perform)
        except Exception as failure:
            hold.ended = True
            self._tell(hold)
            raised = _release_failed(hold, exc, failure)
            if raised is None:
                return
            if raised is failure:
                raise
            raise raised from raised.__cause__  # the release's failure is in a note on it
        hold.ended = True
        lost = hold.error or at_release
        if lost is None:
            hold.clean()
            return
        hold.lose(lost)
        self._tell(hold)  # waits for a call the renewal thread is making, if any
        if exc is None:
            raise lost
        _note(exc, lost)

    def _renew(self, hold: _Hold) -> None:
        try:
            lost = _drive(_renewal_policy(hold), self._perform)
        except _Stopped:
            return
        except Exception as exc:  # any failure ends the renewal: a lost hold
            lost = _unexpected(hold.claim.id, exc)
        if self._stop.is_set():
            return  # the block ended (and its exit may have released): the release judges
        hold.lose(lost)
        self._tell(hold)

    def _tell(self, hold: _Hold) -> None:
        """Call ``on_lost`` with the loss, once; an exit waits here for a call under way."""
        with hold.telling:
            lost = hold.to_tell()
            if lost is not None:
                assert hold.on_lost is not None
                _call_on_lost(hold.on_lost, lost)

    def _perform(self, step: _Step) -> Any:
        match step:
            case _SleepStep(seconds, renewal):
                if renewal and self._stop.wait(seconds):
                    raise _Stopped
                if not renewal:
                    time.sleep(seconds)
                return None
            case _ChangeStep(seconds, hurried):
                self._watch.wait(seconds, hurried)
                return None
            case QPause(seconds, hurried, since, poll, ids):
                self._watch.wait(seconds, hurried, since, poll, ids)
                return None
            case QCall():
                self._watch.mark()
                return _call(self._store, self._terms, step)
            case _ClaimStep():
                result = _call(self._store, self._terms, step)
                self._watch.mark()
                return result
        return _call(self._store, self._terms, step)


class _Stopped(Exception):
    """The lease's block ended: its renewal stops (sync face)."""


def _one(target: Target) -> Unit | Span:
    assert isinstance(target, Unit | Span)
    return target


_background: set[asyncio.Task[Any]] = set()
"""Clean-ups that outlive the task that started them, kept here so they are not collected."""


def _keep(task: asyncio.Task[Any]) -> None:
    _background.add(task)
    task.add_done_callback(_background.discard)


class AsyncLease(_LeaseFace):
    """``async with store.lease(targets, holder=..., ttl=...) as lease:``: see :mod:`dibs.lease`.

    Entering claims the targets (raises :class:`~dibs.ResourceBusy` when they
    stay taken past ``wait``); a task renews the hold while the block runs;
    exiting stops it and releases the hold. When renewal fails, the block's
    task is cancelled at once and the ``async with`` statement raises
    :class:`~dibs.HoldLost` in place of that cancellation. A cancellation from
    outside propagates as :class:`asyncio.CancelledError`, as always.
    Cancelling the entry releases, best effort, a hold its cut-off claim may
    have made: the claim is replayed with its request ID and released before
    the cancellation propagates (to its end even if cancelled again), so a retry
    finds the targets free; if the store cannot be reached, the hold expires.
    Enter and exit the lease in one task: its loss cancels the task that entered it.
    """

    def __init__(
        self,
        store: AsyncStore,
        targets: Target | Iterable[Target],
        *,
        holder: str,
        ttl: float,
        wait: float | None = 0.0,
        renew_every: float | None = None,
        on_lost: Callable[[HoldLost], object] | None = None,
        max_hold: float | None = None,
        monotonic: Callable[[], float] | None = None,
    ) -> None:
        super().__init__(
            targets,
            holder=holder,
            ttl=ttl,
            wait=wait,
            renew_every=renew_every,
            on_lost=on_lost,
            max_hold=max_hold,
            monotonic=monotonic,
        )
        self._store = store
        self._task: asyncio.Task[Any] | None = None
        self._cancelling = 0
        self._cancelled = False  # whether the renewal cancelled the block's task
        self._exiting = False
        self._renewer: asyncio.Task[None] | None = None
        self._renewing = False  # the renewer still renews (else it is calling on_lost, or done)
        self._watch = _AsyncWatch(store)

    async def __aenter__(self) -> Self:
        self._enter()
        task = asyncio.current_task()
        if task is None:
            raise RuntimeError("async with store.lease() must run in an asyncio task")
        attempt = FairAttempt(clock=self._terms.monotonic)
        try:
            claim = await _adrive(fair_claim_policy(self._terms, attempt), self._perform)
        except BaseException:  # cancelled, gave up...: a claim sent may have made a hold
            if attempt.unanswered is not None:
                # Settled before the error propagates, even if cancelled again: once
                # the cancelled entry returns, a retry finds the targets as they were.
                await to_the_end(_abandon_async(self._store, self._terms, attempt.unanswered))
            if attempt.queue:  # cut off while queued: the next waiter goes on
                with contextlib.suppress(Exception):  # best effort: tickets expire anyway
                    await to_the_end(
                        _adrive(abandon_queue(attempt.queue, attempt.place), self._perform)  # type: ignore[arg-type]
                    )
            raise
        finally:
            if self._watch.watching:  # its connection is closed even if we are cancelled
                closing = asyncio.ensure_future(self._watch.close())
                try:
                    await asyncio.shield(closing)
                except asyncio.CancelledError:
                    _keep(closing)
                    raise
        hold = self._hold = _Hold(self._terms, claim, attempt.sent, self._on_lost)
        self._task = task
        self._cancelling = task.cancelling()
        self._renewing = True
        self._renewer = asyncio.create_task(self._renew(hold), name=f"dibs-lease-{claim.id}")
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        hold = self._live()
        self._exiting = True
        elsewhere = asyncio.current_task() is not self._task
        outside = False
        if self._cancelled and not elsewhere:
            assert self._task is not None
            # Take back our cancellation; any count left is someone else's.
            outside = self._task.uncancel() > self._cancelling
        finish = asyncio.ensure_future(self._finish(hold))
        try:
            at_release = await asyncio.shield(finish)
        except asyncio.CancelledError:
            _keep(finish)  # cancelled from outside while releasing: the release goes on
            raise
        except Exception as failure:
            hold.ended = True
            raised = _release_failed(hold, exc, failure)
            if raised is None:
                return
            if raised is failure:
                raise
            raise raised from raised.__cause__  # the release's failure is in a note on it
        hold.ended = True
        if elsewhere:  # released all the same; the loss cancelled the entering task, if any
            raise RuntimeError(
                "an async lease must be exited in the task that entered it"
                " (its loss cancels that task)"
            )
        lost = hold.error or at_release
        if lost is None:
            hold.clean()
            return
        hold.lose(lost)
        await self._tell(hold)
        if exc is None:
            raise lost
        if isinstance(exc, asyncio.CancelledError) and self._cancelled and not outside:
            raise lost  # the cancellation was ours: the block's task hears why
        _note(exc, lost)

    async def _finish(self, hold: _Hold) -> HoldLost | None:
        assert self._renewer is not None
        if self._renewing:  # else it is calling on_lost: the exit waits for that call
            self._renewer.cancel()
        await asyncio.wait([self._renewer])
        hold.overdue()
        return await _adrive(_release_policy(hold), self._perform)

    async def _renew(self, hold: _Hold) -> None:
        try:
            lost = await _adrive(_renewal_policy(hold), self._perform)
        except Exception as exc:  # any failure ends the renewal: a lost hold
            lost = _unexpected(hold.claim.id, exc)
        self._renewing = False
        hold.lose(lost)
        if not self._exiting:
            assert self._task is not None
            self._cancelled = True
            self._task.cancel(f"dibs: lease {hold.claim.id!r} lost")
        await self._tell(hold)  # after the cancel: the block stops while on_lost runs

    async def _tell(self, hold: _Hold) -> None:
        """Call ``on_lost`` with the loss, once, awaiting what it returns if awaitable."""
        lost = hold.to_tell()
        if lost is None:
            return
        assert hold.on_lost is not None
        result = _call_on_lost(hold.on_lost, lost)
        if inspect.isawaitable(result):
            try:
                await result
            except Exception:
                _logger.exception("lease %s: on_lost raised", lost.claim_id)

    async def _perform(self, step: _Step) -> Any:
        match step:
            case _ExtendStep(claim, deadline):
                # Only a task can stop waiting for a stuck extend; the sync face's renewal
                # thread cannot be interrupted, so its exit bounds the wait instead.
                try:
                    async with asyncio.timeout(max(0.0, deadline - self._terms.monotonic())):
                        return await _call_async(self._store, self._terms, step)
                except TimeoutError:
                    raise StoreUnavailable(
                        f"renewing lease {claim.id!r} got no answer in time"
                    ) from None
            case _SleepStep(seconds):
                await asyncio.sleep(seconds)
                return None
            case _ChangeStep(seconds, hurried):
                await self._watch.wait(seconds, hurried)
                return None
            case QPause(seconds, hurried, since, poll, ids):
                await self._watch.wait(seconds, hurried, since, poll, ids)
                return None
            case QCall():
                await self._watch.mark()
                return await _call_async(self._store, self._terms, step)
            case _ClaimStep():
                result = await _call_async(self._store, self._terms, step)
                await self._watch.mark()
                return result
        return await _call_async(self._store, self._terms, step)


# The stores' lease() builds these; the store layer never imports this module.
Store._lease_class = Lease
AsyncStore._lease_class = AsyncLease
