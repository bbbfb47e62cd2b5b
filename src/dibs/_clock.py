"""Clocks: where a store reads "now". Injectable so tests can move time by hand."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Protocol, runtime_checkable

from dibs.exceptions import InvalidInput

__all__ = ["Clock", "FakeClock", "SystemClock"]


@runtime_checkable
class Clock(Protocol):
    """Anything with ``now()`` returning seconds since the Unix epoch."""

    def now(self) -> float:
        """Return the current time in seconds since the epoch."""
        ...


class SystemClock:
    """The machine's wall clock (``time.time``)."""

    def now(self) -> float:
        """Return ``time.time()``."""
        return time.time()


class FakeClock:
    """A clock that moves only when told to; safe to share between threads.

    Code that sleeps until a time on it (a task scheduler) can :meth:`subscribe`
    to hear when it moves. Raises :class:`~dibs.InvalidInput` from
    :meth:`advance` for a negative or non-finite step: time never goes
    backwards.
    """

    def __init__(self, start: float = 1_800_000_000.0) -> None:
        self._now = float(start)
        self._lock = threading.Lock()  # guards _now, _subscribers and _next_token
        self._subscribers: dict[int, Callable[[], None]] = {}
        self._next_token = 0

    def now(self) -> float:
        """Return the fake current time."""
        return self._now

    def advance(self, seconds: float) -> float:
        """Move time forward by ``seconds`` and return the new time."""
        if (
            isinstance(seconds, bool)
            or not isinstance(seconds, int | float)
            or not (0 <= seconds < float("inf"))
        ):
            raise InvalidInput(
                f"advance() takes a finite number of seconds >= 0, got {seconds!r}",
                field="seconds",
                value=seconds,
            )
        with self._lock:
            self._now += seconds
            now = self._now
            callbacks = list(self._subscribers.values())
        # Called outside our lock: a callback takes its own locks (a scheduler's), and
        # may read now() or subscribe; none of that can wait on us.
        for callback in callbacks:
            callback()
        return now

    def subscribe(self, callback: Callable[[], None]) -> Callable[[], None]:
        """Call ``callback()`` after every :meth:`advance`; return a function that unsubscribes."""
        with self._lock:
            token = self._next_token
            self._next_token += 1
            self._subscribers[token] = callback

        def unsubscribe() -> None:
            with self._lock:
                self._subscribers.pop(token, None)

        return unsubscribe
