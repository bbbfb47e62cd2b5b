"""Clocks: where a store reads "now". Injectable so tests can move time by hand."""

from __future__ import annotations

import threading
import time
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

    Raises :class:`~dibs.InvalidInput` from :meth:`advance` for a negative or
    non-finite step: time never goes backwards.
    """

    def __init__(self, start: float = 1_800_000_000.0) -> None:
        self._now = float(start)
        self._lock = threading.Lock()  # guards _now

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
            return self._now
