"""Time for the scheduler: reading a clock, waiting on it, and turning user times into epochs.

The scheduler keeps every due time as epoch seconds on its clock and sleeps on
a condition variable until the earliest one. With the system clock that is a
timed wait; with a clock that jumps by hand (tests) a timed wait would never
notice the jump, so such a clock must say when it moves: :class:`dibs.FakeClock`
does (``subscribe``), and :class:`Alarm` subscribes to it.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Protocol, runtime_checkable

from dibs._clock import Clock, SystemClock
from dibs._model import shown
from dibs.exceptions import InvalidInput
from dibs.limits import RETENTION_MAX

__all__ = [
    "DURATION_MAX",
    "EPOCH_MAX",
    "EPOCH_MIN",
    "Alarm",
    "WakingClock",
    "to_epoch",
    "to_seconds",
]

MAX_REAL_WAIT = 30.0
"""Longest single timed wait on a real clock.

``Condition.wait`` measures its timeout on the monotonic clock, but due times
are on the wall clock; re-reading the wall clock at least this often bounds how
late a run can be after the system clock is stepped forward (NTP, suspend).
"""


@runtime_checkable
class WakingClock(Protocol):
    """A clock that calls back whenever it jumps, so waits on it can end early."""

    def now(self) -> float:
        """Return the current time in seconds since the epoch."""
        ...

    def subscribe(self, callback: Callable[[], None]) -> Callable[[], None]:
        """Call ``callback()`` after every jump; return a function that unsubscribes."""
        ...


class Alarm:
    """Waits on a condition variable until notified or until a due time on a clock."""

    def __init__(self, clock: Clock | None, condition: threading.Condition) -> None:
        if clock is None:
            clock = SystemClock()
        self.clock = clock
        self._condition = condition
        self._unsubscribe: Callable[[], None] | None = None
        if isinstance(clock, WakingClock):
            self._unsubscribe = clock.subscribe(self.ring)

    @property
    def manual(self) -> bool:
        """Whether time moves only when the clock says so (no timed waits)."""
        return self._unsubscribe is not None

    def now(self) -> float:
        """The clock's current time."""
        return self.clock.now()

    def ring(self) -> None:
        """Wake every thread waiting in :meth:`wait`."""
        with self._condition:
            self._condition.notify_all()

    def wait(self, due: float | None) -> None:
        """Block (the condition's lock held) until notified or until ``due`` on the clock."""
        if due is None or self.manual:
            self._condition.wait()
            return
        remaining = due - self.clock.now()
        if remaining > 0:
            self._condition.wait(min(remaining, MAX_REAL_WAIT))

    def close(self) -> None:
        """Stop listening to the clock."""
        if self._unsubscribe is not None:
            self._unsubscribe()


EPOCH_MIN = datetime(1, 1, 2, tzinfo=UTC).timestamp()
"""Earliest due time, in epoch seconds: a day inside the years :class:`datetime` holds, so
that a job's times convert back in any zone."""
EPOCH_MAX = datetime(9999, 12, 30, tzinfo=UTC).timestamp()
"""Latest due time, in epoch seconds (likewise)."""
DURATION_MAX = RETENTION_MAX
"""Longest delay, interval, lease, poll or timeout, in seconds (about ten years): far
enough, and within what ``threading`` waits accept and :data:`EPOCH_MAX` can follow."""


def to_epoch(value: object, field: str) -> float:
    """Return an aware datetime or epoch number as epoch seconds.

    Raises :class:`~dibs.InvalidInput` for naive datetimes, NaN, other types and
    times outside the years 1 to 9999.
    """
    if isinstance(value, datetime):
        if value.tzinfo is None or value.utcoffset() is None:
            raise InvalidInput(
                f"{field} must be timezone-aware, got naive {shown(value)}",
                field=field,
                value=value,
            )
        try:
            seconds: object = value.timestamp()
        except (OverflowError, ValueError):  # the offset pushed it past year 1 or 9999
            seconds = math.nan
    else:
        seconds = value
    # Compare before converting: a huge int has no float, and NaN fails both bounds.
    if (
        isinstance(seconds, bool)
        or not isinstance(seconds, int | float)
        or not EPOCH_MIN <= seconds <= EPOCH_MAX
    ):
        raise InvalidInput(
            f"{field} must be an aware datetime or epoch seconds in the years 1 to 9999, "
            f"got {shown(value)}",
            field=field,
            value=value,
        )
    return float(seconds)


def to_seconds(value: object, field: str, *, allow_zero: bool = False, least: float = 0.0) -> float:
    """Return a duration (number of seconds or timedelta) as seconds.

    Raises :class:`~dibs.InvalidInput` unless it is positive (or zero where
    allowed), at least ``least`` and at most :data:`DURATION_MAX`.
    """
    seconds: object = value.total_seconds() if isinstance(value, timedelta) else value
    if (
        isinstance(seconds, bool)
        or not isinstance(seconds, int | float)
        or not least <= seconds <= DURATION_MAX
        or (seconds == 0 and not allow_zero)
    ):
        bound = ">= 0" if allow_zero else "> 0"
        if least:
            bound = f">= {least:g}"
        raise InvalidInput(
            f"{field} must be a number of seconds {bound} and <= {DURATION_MAX:g}, or a "
            f"timedelta, got {shown(value)}",
            field=field,
            value=value,
        )
    return float(seconds)
