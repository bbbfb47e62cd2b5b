"""Coalesce duplicate in-flight work: one caller runs it, every concurrent caller gets its result.

:class:`SingleFlight` is for threads and :class:`AsyncSingleFlight` for
coroutines on one event loop. Both keep, per key, at most one *flight*: the
first caller (the leader) starts the work, later callers (waiters) block on
the flight's published outcome rather than on a guess about how long it takes,
and every caller gets the leader's value or re-raises the leader's exception
(a copy per caller that did not raise it first: a raise mutates the exception).

The two faces share everything but how the work runs and how a waiter waits
(``_Flights``: the options, the flight table, the cache, the copies); that part
differs on purpose, so it is written per face. A thread leader runs the work
itself and its waiters block on a ``threading.Event`` it sets. A task leader
cannot: its cancellation would cancel the work under its waiters, so the async
work runs in a task of its own that every caller awaits through
:func:`asyncio.shield`, and the last caller to be cancelled cancels it.

Locking: one ``threading.Lock`` per instance (``_lock``) guards the flight
table, the result cache and each flight's caller count. It is never held while
user code runs or while a caller waits, and it is the only lock this module
takes, so there is no lock order to keep.
"""

from __future__ import annotations

import asyncio
import copy as _copy
import threading
import time
from collections.abc import Awaitable, Callable, Hashable
from dataclasses import dataclass
from typing import Any, Generic, ParamSpec, Protocol, TypeVar

from dibs.exceptions import InvalidInput

__all__ = ["AsyncSingleFlight", "FlightResult", "SingleFlight"]

P = ParamSpec("P")
R = TypeVar("R")


class _Flight(Protocol):
    callers: int


F = TypeVar("F", bound=_Flight)

_MISSING: Any = object()


@dataclass(frozen=True, slots=True)
class FlightResult(Generic[R]):
    """What a caller got: ``value``, and how.

    ``shared`` is false for the caller whose own call ran the work, true for a
    caller that waited on another's flight or was answered from the cache;
    ``cached`` is true only for the latter.
    """

    value: R
    shared: bool
    cached: bool = False


class _Flights:
    """The flight table, result cache, copy policy and options of both faces."""

    def __init__(
        self,
        *,
        ttl: float | None = None,
        copy: Callable[[Any], Any] | None = _copy.deepcopy,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if ttl is not None and (
            isinstance(ttl, bool) or not isinstance(ttl, int | float) or not 0 < ttl < float("inf")
        ):
            raise InvalidInput(
                f"ttl must be a finite number of seconds > 0 or None, got {ttl!r}",
                field="ttl",
                value=ttl,
            )
        self.ttl = None if ttl is None else float(ttl)
        self._copy = copy
        self._clock = clock
        self._lock = threading.Lock()
        # Guarded by _lock: the current flight per key, and cached (expires_at, value).
        self._flights: dict[Hashable, Any] = {}
        self._cache: dict[Hashable, tuple[float, Any]] = {}
        self._purge_at = 64

    def forget(self, key: Hashable) -> None:
        """Drop the cached result for ``key`` and detach its in-flight call.

        Callers already waiting on that call still get its outcome; callers
        arriving afterwards start a new one, and the detached call's result is
        not cached.
        """
        with self._lock:
            self._cache.pop(key, None)
            self._flights.pop(key, None)

    def in_flight(self, key: Hashable) -> int:
        """How many callers are sharing the in-flight call for ``key`` now (0 if none).

        A snapshot, for metrics and tests; it may be stale as soon as it returns.
        """
        with self._lock:
            flight = self._flights.get(key)
            return 0 if flight is None else int(flight.callers)

    def _hit(self, key: Hashable) -> Any:
        """Return the live cached value for ``key`` or ``_MISSING``; caller holds _lock."""
        entry = self._cache.get(key)
        if entry is None:
            return _MISSING
        expires_at, value = entry
        if expires_at <= self._clock():
            del self._cache[key]
            return _MISSING
        return value

    def _remember(self, key: Hashable, flight: object, stored: Any) -> None:
        """Detach ``flight`` if it is still current and cache its value; caller holds _lock."""
        if self._flights.get(key) is not flight:
            return  # forgotten while it ran: a newer flight, or none, owns the key
        del self._flights[key]
        if self.ttl is None or stored is _MISSING:
            return
        now = self._clock()
        self._cache[key] = (now + self.ttl, stored)
        if len(self._cache) >= self._purge_at:
            for k in [k for k, (exp, _) in self._cache.items() if exp <= now]:
                del self._cache[k]
            self._purge_at = max(64, 2 * len(self._cache))

    def _handout(self, value: Any) -> Any:
        """The value as given to a caller other than the leader: a copy if configured."""
        return value if self._copy is None else self._copy(value)

    def _join(self, key: Hashable, new_flight: Callable[[], F]) -> tuple[Any, F | None, bool]:
        """Under the lock: (cached value, None, False) on a cache hit, else
        (``_MISSING``, the key's flight, whether this caller leads it)."""
        with self._lock:
            hit = self._hit(key)
            if hit is not _MISSING:
                return hit, None, False
            flight: F | None = self._flights.get(key)
            if flight is None:
                flight = self._flights[key] = new_flight()
                return _MISSING, flight, True
            flight.callers += 1
            return _MISSING, flight, False


def _detached(exc: BaseException) -> BaseException:
    """A copy of ``exc`` to raise in one caller: its type, arguments, attributes, notes,
    cause, context and traceback so far, none of them mutated by another caller's raise.

    Raising an exception prepends the raising frames to its ``__traceback__``
    and may set its ``__context__``, so callers sharing one object would see
    each other's frames. An exception that ``copy.copy`` cannot rebuild (an
    ``__init__`` that does not take its own ``args``) is returned itself, shared.
    """
    try:
        new = _copy.copy(exc)
    except Exception:
        return exc
    if type(new) is not type(exc):
        return exc
    new.__traceback__ = exc.__traceback__
    new.__cause__ = exc.__cause__
    new.__context__ = exc.__context__
    new.__suppress_context__ = exc.__suppress_context__  # after __cause__, which sets it
    notes = getattr(exc, "__notes__", None)
    if isinstance(notes, list):
        new.__notes__ = list(notes)
    return new


class _ThreadFlight:
    """One in-flight call: the leader publishes once, waiters block on ``done``."""

    __slots__ = ("callers", "done", "error", "stored")

    def __init__(self) -> None:
        self.done = threading.Event()
        self.stored: Any = _MISSING
        self.error: BaseException | None = None
        self.callers = 1


class SingleFlight(_Flights):
    """Run a function once per key among concurrent threads and share its outcome.

    ``ttl`` (seconds) also caches a successful result for that long after the
    flight lands; exceptions are never cached. ``copy`` (``copy.deepcopy`` by
    default) is applied to the value kept for sharing and again to each value
    handed to a waiter or a cache hit, so no caller can mutate what another
    sees; the leader gets the original. Pass ``copy=None`` to hand every caller
    the same object (for immutable values, or ones that cannot be copied).
    ``clock`` is the monotonic clock the cache is judged on.

    Raises :class:`~dibs.InvalidInput` for a bad ``ttl``.
    """

    def do(self, key: Hashable, fn: Callable[P, R], *args: P.args, **kwargs: P.kwargs) -> R:
        """Return ``fn(*args, **kwargs)``, run once among the concurrent callers for ``key``.

        Re-raises the leader's exception in every caller of that flight: the
        leader the original, each waiter its own copy (same type, arguments,
        cause; its own traceback).
        """
        return self.call(key, fn, *args, **kwargs).value

    def call(
        self, key: Hashable, fn: Callable[P, R], *args: P.args, **kwargs: P.kwargs
    ) -> FlightResult[R]:
        """Like :meth:`do`, but say whether the value was shared; see :class:`FlightResult`."""
        hit, flight, leader = self._join(key, _ThreadFlight)
        if flight is None:
            return FlightResult(self._handout(hit), shared=True, cached=True)
        if not leader:
            return self._wait(flight)
        try:
            value = fn(*args, **kwargs)
            # Copy before publishing: if copying fails, nothing was published and
            # the except clause below publishes that failure instead.
            stored = value if self._copy is None else self._copy(value)
        except BaseException as exc:
            # Publish even KeyboardInterrupt/SystemExit: waiters must never be stranded.
            # What is published is a copy taken now, before our raise below adds our
            # frames; it is never raised itself, and each waiter raises a copy of it.
            self._publish(key, flight, _MISSING, _detached(exc))
            raise
        self._publish(key, flight, stored, None)
        return FlightResult(value, shared=False)

    def _wait(self, flight: _ThreadFlight) -> FlightResult[Any]:
        try:
            flight.done.wait()  # the leader's publish is the only thing that sets it
        finally:
            with self._lock:
                flight.callers -= 1
        if flight.error is not None:
            raise _detached(flight.error)
        return FlightResult(self._handout(flight.stored), shared=True)

    def _publish(
        self, key: Hashable, flight: _ThreadFlight, stored: Any, error: BaseException | None
    ) -> bool:
        """Publish the flight's outcome once; a second publish is a no-op returning False."""
        with self._lock:
            flight.callers -= 1
            if flight.done.is_set():
                return False
            flight.stored = stored
            flight.error = error
            self._remember(key, flight, stored if error is None else _MISSING)
            flight.done.set()
            return True


class _AsyncFlight:
    """One in-flight call: a task every caller awaits through a shield."""

    __slots__ = ("callers", "error", "task")

    def __init__(self) -> None:
        self.task: asyncio.Future[Any] | None = None
        self.error: BaseException | None = None  # a copy of the work's exception, never raised
        self.callers = 1


class AsyncSingleFlight(_Flights):
    """:class:`SingleFlight` for coroutine functions, used from one event loop.

    The work runs in its own task, which every caller (the leader included)
    awaits through :func:`asyncio.shield`. So a cancelled caller stops waiting
    without cancelling the work while others still wait, and a cancelled
    leader strands nobody; when the last caller is cancelled the work is
    cancelled too, since nobody wants its result. Options as for
    :class:`SingleFlight`.
    """

    async def do(
        self, key: Hashable, fn: Callable[P, Awaitable[R]], *args: P.args, **kwargs: P.kwargs
    ) -> R:
        """Return ``await fn(*args, **kwargs)``, run once among the concurrent callers for ``key``.

        Re-raises the work's exception in every caller of that flight, each
        caller its own copy (same type, arguments, cause; its own traceback).
        """
        return (await self.call(key, fn, *args, **kwargs)).value

    async def call(
        self, key: Hashable, fn: Callable[P, Awaitable[R]], *args: P.args, **kwargs: P.kwargs
    ) -> FlightResult[R]:
        """Like :meth:`do`, but say whether the value was shared; see :class:`FlightResult`."""
        hit, flight, leader = self._join(key, _AsyncFlight)
        if flight is None:
            return FlightResult(self._handout(hit), shared=True, cached=True)
        if leader:
            # No await between registering the flight and starting its task, so
            # no other caller on this loop can observe the flight without one.
            try:
                work = fn(*args, **kwargs)
            except BaseException:
                with self._lock:
                    self._remember(key, flight, _MISSING)
                raise
            flight.task = asyncio.get_running_loop().create_task(self._run(key, flight, work))
            flight.task.add_done_callback(_retrieve)
        task = flight.task
        assert task is not None
        failed: BaseException | None = None
        try:
            stored = await asyncio.shield(task)
        except asyncio.CancelledError:
            with self._lock:
                flight.callers -= 1
                abandoned = flight.callers == 0 and not task.done()
                if abandoned and self._flights.get(key) is flight:
                    # Detach first so a caller arriving now starts fresh work
                    # instead of joining one that is being cancelled.
                    del self._flights[key]
            if abandoned:
                task.cancel()
            raise
        except BaseException as exc:
            # Every caller awaits the task's one exception object: raise a copy.
            failed = flight.error if flight.error is not None else exc
        with self._lock:
            flight.callers -= 1
        if failed is not None:
            # Outside the except clause, so the copy is not chained to the shared one.
            raise _detached(failed)
        if leader:
            return FlightResult(stored[0], shared=False)
        return FlightResult(self._handout(stored[1]), shared=True)

    async def _run(self, key: Hashable, flight: _AsyncFlight, work: Awaitable[R]) -> tuple[R, Any]:
        """Await the work; return (original, kept copy) and cache it if still current."""
        try:
            value = await work
            stored = value if self._copy is None else self._copy(value)
        except BaseException as exc:
            flight.error = _detached(exc)  # before any caller's raise mutates exc
            with self._lock:
                self._remember(key, flight, _MISSING)
            raise
        with self._lock:
            self._remember(key, flight, stored)
        return value, stored


def _retrieve(task: asyncio.Future[Any]) -> None:
    # Mark the exception retrieved: if every caller was cancelled, nobody else will.
    if not task.cancelled():
        task.exception()
