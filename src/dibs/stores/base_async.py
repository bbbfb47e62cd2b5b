"""The async face of a store: the sync store's contract, as coroutines.

:class:`AsyncStore` checks its input with the very functions the sync
:class:`~dibs.Store` uses (:mod:`dibs.stores.base`) and then awaits the
backend's ``_``-coroutines with normalized values, so both faces give the same
errors for the same bad input and the same results for the same calls.

An async store opens lazily: :func:`dibs.aio.open` returns it at once, without
I/O, and the first ``await`` (of the store itself, of ``async with``, or of any
method) opens it on the running loop.
"""

from __future__ import annotations

import abc
import asyncio
import logging
import os
from collections.abc import Awaitable, Callable, Generator, Iterable
from datetime import UTC, datetime
from types import TracebackType
from typing import TYPE_CHECKING, Any, ClassVar, Self

from dibs._bell import ring
from dibs._model import (
    Claim,
    ClaimResult,
    Span,
    SweepResult,
    Target,
    Unit,
    check_claim_id,
    check_holder,
)
from dibs._request import ClaimRequest
from dibs.exceptions import HoldLost, StoreClosed
from dibs.stores.base import (
    adapt_old_claim,
    closed_under,
    extend_args,
    log_lost,
    log_sweep,
    shared_refused,
    target_arg,
    transition_args,
)

if TYPE_CHECKING:
    from dibs.lease import AsyncLease
    from dibs.stores.capabilities import AsyncChangeFeed

__all__ = ["AsyncStore", "TokenFeed"]


class AsyncStore(abc.ABC):
    """A claim store for asyncio code: :class:`~dibs.Store`'s methods, as coroutines.

    ``claim``, ``confirm``, ``extend``, ``release``, ``get``, ``claims_of``,
    ``holder_of``, ``sweep``, ``now`` and ``close`` take the sync store's
    arguments and return (or raise) what it does. Use it as ``async with
    dibs.aio.open(url) as store:``, or ``store = await dibs.aio.open(url)`` and
    ``await store.close()``.

    One async store belongs to one event loop (its connections do). Cancelling a
    call is safe: a cancelled ``claim`` either made no claim or made one that a
    retry with the same request ID learns about, and no connection goes back to
    its pool mid-transaction.

    A backend implements :meth:`from_url`, :meth:`_open` and the ``_``-coroutines.
    """

    scheme: ClassVar[str]
    """The URL scheme this store answers to, for display (logs, metrics)."""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        adapt_old_claim(cls)

    shared_holds: ClassVar[bool] = False
    """Whether this store takes ``mode="shared"`` claims; one that does not refuses them
    with :class:`~dibs.InvalidInput` (never treats a reader as a writer, or the reverse)."""

    _lease_class: ClassVar[type[AsyncLease]]
    """What :meth:`lease` builds: :class:`dibs.lease.AsyncLease`, set when :mod:`dibs.lease`
    loads, as ``Store._lease_class`` is."""

    _inline: bool = False
    """True when every call runs to its end within its await, never suspending (memory://
    behind :class:`~dibs.aio.ThreadedStore`): a cancelled await never leaves one running."""

    def __init__(self) -> None:
        self._closed = False
        self._opened = False
        self._opening: asyncio.Lock | None = None
        self._closing: asyncio.Future[None] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._loop_pid = 0
        self._logger = logging.getLogger("dibs.stores." + type(self).scheme)

    @classmethod
    @abc.abstractmethod
    def from_url(cls, url: str, **options: Any) -> Self:
        """Make the store for ``url`` without I/O; :meth:`_open` connects it.

        Raises :class:`~dibs.InvalidInput` for a malformed URL or option.
        """

    # --- opening and closing --------------------------------------------------------------------

    async def open(self) -> Self:
        """Open the store now (connect, create its schema); calls after the first do nothing.

        Every method opens the store first if needed, so calling this is only a
        way to meet open errors (:class:`~dibs.StoreMisconfigured`,
        :class:`~dibs.StoreUnavailable`, :class:`~dibs.SchemaError`) early.
        """
        self._check_open()
        if not self._opened:
            self._check_loop()
            if self._opening is None:
                self._opening = asyncio.Lock()
            async with self._opening:
                if not self._opened:
                    await self._open()
                    self._opened = True
                    if self._closed:  # closed while opening: close() saw nothing to close
                        await self._close()
            # Waiting for the lock, it may have been closed meanwhile.
            self._check_open()
        return self

    def __await__(self) -> Generator[Any, None, Self]:
        return self.open().__await__()

    async def __aenter__(self) -> Self:
        return await self.open()

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    async def close(self) -> None:
        """Release the store's resources; later calls raise :class:`~dibs.StoreClosed`.

        Close it on the loop it was used on. Closing runs to its end even if the
        call is cancelled (a shutdown timeout), and every call of ``close()``
        waits for that end. A PostgreSQL store left open keeps its pool's
        connections and background tasks until the loop ends.
        """
        if not self._closed:
            self._closed = True
            if self._opened:
                self._check_loop()
                self._closing = asyncio.ensure_future(self._close())
        if self._closing is not None:
            await asyncio.shield(self._closing)

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` was called."""
        return self._closed

    # --- the contract ---------------------------------------------------------------------------

    async def claim(
        self,
        targets: Target | Iterable[Target],
        *,
        holder: str,
        request_id: str | None = None,
        ttl: float | None = None,
        mode: str = "exclusive",
    ) -> ClaimResult:
        """Claim every target or none, atomically, and answer who won: :meth:`dibs.Store.claim`."""
        if self._closed:
            self._check_open()
        request = ClaimRequest(targets, holder=holder, request_id=request_id, ttl=ttl, mode=mode)
        if request.mode != "exclusive" and not self.shared_holds:
            raise shared_refused(self.scheme)
        if not self._opened:
            await self.open()
        elif self._loop is not asyncio.get_running_loop():
            self._check_loop()
        try:
            return await self._claim(request)
        except Exception as exc:
            self._closed_under(exc)
            raise

    async def confirm(self, claim_id: str, *, holder: str, fence: int) -> Claim:
        """Turn a live hold into a confirmed claim: :meth:`dibs.Store.confirm`."""
        self._check_open()
        args = transition_args(claim_id, holder, fence)
        await self._ready()
        try:
            return await self._confirm(*args)
        except HoldLost as exc:
            log_lost(self._logger, "confirm", exc)
            raise
        except Exception as exc:
            self._closed_under(exc)
            raise

    async def extend(self, claim_id: str, *, holder: str, fence: int, ttl: float) -> Claim:
        """Push a live hold's expiry to ``ttl`` seconds from now: :meth:`dibs.Store.extend`."""
        self._check_open()
        args = extend_args(claim_id, holder, fence, ttl)
        await self._ready()
        try:
            return await self._extend(*args)
        except HoldLost as exc:
            log_lost(self._logger, "extend", exc)
            raise
        except Exception as exc:
            self._closed_under(exc)
            raise

    async def release(self, claim_id: str, *, holder: str, fence: int) -> bool:
        """Give up a live hold or confirmed claim: :meth:`dibs.Store.release`."""
        self._check_open()
        args = transition_args(claim_id, holder, fence)
        await self._ready()
        try:
            released = await self._release(*args)
        except HoldLost as exc:
            log_lost(self._logger, "release", exc)
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
    ) -> AsyncLease:
        """Hold the targets for an ``async with`` block, renewed: :meth:`dibs.Store.lease`.

        When renewal fails, the block's task is cancelled and ``async with``
        raises :class:`~dibs.HoldLost` (a :class:`~dibs.lease.AsyncLease`).
        ``on_lost`` (a plain or a coroutine function) is called, and awaited, in the
        renewal task; ``max_hold`` as on the sync face.
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

    async def get(self, claim_id: str) -> Claim | None:
        """The claim with this ID as stored now, or None: :meth:`dibs.Store.get`."""
        self._check_open()
        checked = check_claim_id(claim_id)
        await self._ready()
        try:
            return await self._get(checked)
        except Exception as exc:
            self._closed_under(exc)
            raise

    async def holder_of(self, target: Unit | Span) -> str | None:
        """Who holds this unit or an overlapping span now: :meth:`dibs.Store.holder_of`."""
        self._check_open()
        checked = target_arg(target)
        await self._ready()
        try:
            return await self._holder_of(checked)
        except Exception as exc:
            self._closed_under(exc)
            raise

    async def claims_of(self, holder: str) -> list[Claim]:
        """The holder's live claims, a snapshot: :meth:`dibs.Store.claims_of`."""
        self._check_open()
        checked = check_holder(holder)
        await self._ready()
        try:
            return await self._claims_of(checked)
        except Exception as exc:
            self._closed_under(exc)
            raise

    async def sweep(self) -> SweepResult:
        """Mark dead holds expired and purge past retention: :meth:`dibs.Store.sweep`."""
        self._check_open()
        await self._ready()
        try:
            result = await self._sweep()
        except Exception as exc:
            self._closed_under(exc)
            raise
        log_sweep(self._logger, result)
        return result

    async def now(self) -> datetime:
        """The store's current time (the clock that judges expiry), as aware UTC."""
        self._check_open()
        await self._ready()
        try:
            return datetime.fromtimestamp(await self._now(), UTC)
        except Exception as exc:
            self._closed_under(exc)
            raise

    # --- optional capabilities: None means "this store does not offer it" ----------------------

    def change_feed(self) -> AsyncChangeFeed | None:
        """A cheap token that moves whenever anyone may have changed this store, or None.

        :meth:`dibs.Store.change_feed` for asyncio code: the same token, read
        with ``await feed.read()`` on this store's loop (a native store reads
        it on its own connections, a store on threads on its workers). Returns
        at once, without I/O; the first read opens the store if needed. The
        caller closes it (``await feed.close()``).
        """
        return None

    # --- for backends ---------------------------------------------------------------------------

    async def _ready(self) -> None:
        if not self._opened:
            await self.open()
        elif self._loop is not asyncio.get_running_loop():
            self._check_loop()

    def _check_loop(self) -> None:
        """Bind the store to the running loop on first use; refuse any other loop.

        Its connections, futures and pool tasks belong to that loop: a call from
        another loop would fail deep in the driver after its work was queued.
        """
        if self._inline:  # nothing of it belongs to a loop
            return
        loop = asyncio.get_running_loop()
        if self._loop is None or self._loop_pid != os.getpid():
            # First use, or a forked child (its loop is its own; stores that hold
            # connections open their own in the child).
            self._loop, self._loop_pid = loop, os.getpid()
        elif self._loop is not loop:
            if self._loop.is_closed() and self._move_to(loop):
                # One asyncio.run() after another: the old loop is gone for good.
                self._loop, self._opening = loop, None
                return
            raise StoreClosed(
                f"this {type(self).__name__} belongs to the event loop it was first used on, "
                "not this one: open one store per loop, and close it there"
            )

    def _check_open(self) -> None:
        if self._closed:
            raise StoreClosed(f"this {type(self).__name__} is closed")

    def _closed_under(self, exc: Exception) -> None:
        """Raise :class:`~dibs.StoreClosed` for a driver's error met because close() came.

        See :meth:`dibs.Store._closed_under`; a backend whose resources another
        owner may close (:meth:`ThreadedStore.over`) widens :meth:`_shut`.
        """
        closed_under(self._shut(), type(self).__name__, exc)

    def _shut(self) -> bool:
        """Whether this store, or what it runs on, was closed."""
        return self._closed

    def _move_to(self, loop: asyncio.AbstractEventLoop) -> bool:
        """Move to ``loop`` after the loop the store was used on has closed; False if it can't.

        A backend whose resources can follow (worker threads) overrides this.
        """
        return False

    @abc.abstractmethod
    async def _open(self) -> None:
        """Connect and make the schema ready; raises like :func:`dibs.open`."""

    async def _claim_checked(self, units: tuple[Unit, ...], holder: str) -> ClaimResult:
        """Claim units a pattern built from checked names: :meth:`dibs.Store._claim_checked`."""
        return await self.claim(units, holder=holder)

    @abc.abstractmethod
    async def _claim(self, request: ClaimRequest) -> ClaimResult:
        """Claim the request's targets: :meth:`dibs.Store._claim`."""

    @abc.abstractmethod
    async def _confirm(self, claim_id: str, holder: str, fence: int) -> Claim: ...

    @abc.abstractmethod
    async def _extend(self, claim_id: str, holder: str, fence: int, ttl: float) -> Claim: ...

    @abc.abstractmethod
    async def _release(self, claim_id: str, holder: str, fence: int) -> bool: ...

    @abc.abstractmethod
    async def _get(self, claim_id: str) -> Claim | None: ...

    @abc.abstractmethod
    async def _holder_of(self, target: Unit | Span) -> str | None: ...

    @abc.abstractmethod
    async def _claims_of(self, holder: str) -> list[Claim]: ...

    @abc.abstractmethod
    async def _sweep(self) -> SweepResult: ...

    @abc.abstractmethod
    async def _now(self) -> float:
        """Seconds since the epoch on the store's clock."""

    @abc.abstractmethod
    async def _close(self) -> None: ...


class TokenFeed:
    """An :class:`~dibs.stores.capabilities.AsyncChangeFeed` read through its store's connections.

    ``read`` is the backend's coroutine function that reads the token (etcd's
    revision, PostgreSQL's WAL position) with the store's own pool or client,
    so the feed holds nothing of its own. A read opens the store if needed;
    any failure but the store's closing answers a fresh ``object()``.
    """

    def __init__(self, store: AsyncStore, read: Callable[[], Awaitable[object]]) -> None:
        self._store = store
        self._read = read
        self._closed = False

    async def read(self) -> object:
        """The current token, or a fresh ``object()``; raises StoreClosed once the store or
        this feed is closed."""
        if self._closed:
            raise StoreClosed("this change feed is closed")
        store = self._store
        store._check_open()
        try:
            await store._ready()
            return await self._read()
        except StoreClosed:
            raise
        except Exception:  # a transient failure: "maybe changed", as the protocol says
            if store._shut():
                raise StoreClosed(f"this {type(store).__name__} is closed") from None
            return object()

    async def close(self) -> None:
        """Nothing to release (the feed reads on its store's connections); later reads
        raise StoreClosed, as on every feed."""
        self._closed = True
