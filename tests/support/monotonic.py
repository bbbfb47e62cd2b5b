"""A monotonic clock that moves only when a test moves it, for a lease's ``monotonic=``.

A lease times its renewals, its overdue rule and ``max_hold`` on this clock; with it
frozen, a test says exactly how much time the lease sees pass, whatever the load.
"""

from __future__ import annotations

import threading


class Monotonic:
    """Seconds, from 1000.0, moved by :meth:`advance`; safe to read from any thread."""

    def __init__(self) -> None:
        self._now = 1000.0
        self._lock = threading.Lock()

    def __call__(self) -> float:
        with self._lock:
            return self._now

    def advance(self, seconds: float) -> None:
        with self._lock:
            self._now += seconds
