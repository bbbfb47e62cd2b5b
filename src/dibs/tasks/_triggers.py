"""When a recurring schedule's occurrences fall: fixed intervals and cron in a time zone.

A trigger maps the schedule to a strictly increasing sequence of instants
(epoch seconds). Both kinds compute each occurrence from a fixed anchor, never
from when the previous run happened, so runs do not drift.

Cron DST policy (cron expressions are local wall-clock times in ``tz``):

* A wall time that does not exist (skipped by a spring-forward gap) runs once,
  at the first valid instant after the gap. Several skipped wall times collapse
  into that one instant, and into the occurrence at the end of the gap if the
  expression has one.
* A wall time that occurs twice (repeated by a fall-back overlap) runs once, at
  its first occurrence; the repeated hour adds no runs.
"""

from __future__ import annotations

import math
from datetime import UTC, datetime, timedelta
from typing import Any, Protocol
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from dibs._extras import needs
from dibs._model import shown
from dibs.exceptions import InvalidInput

try:
    from croniter import CroniterBadDateError, croniter  # type: ignore[import-untyped]
except ImportError as missing:  # the tasks extra is not installed: cron schedules say so
    croniter = None
    CroniterBadDateError = ValueError
    _CRONITER_MISSING: ImportError | None = missing
else:
    _CRONITER_MISSING = None

__all__ = ["CronTrigger", "EveryTrigger", "Trigger", "zone"]


class Trigger(Protocol):
    """A strictly increasing sequence of instants (epoch seconds)."""

    def first_at_or_after(self, t: float) -> float | None:
        """The earliest occurrence at or after ``t``, or None if there is none."""
        ...

    def last_at_or_before(self, t: float) -> float | None:
        """The latest occurrence at or before ``t``, or None if there is none."""
        ...

    def describe(self) -> str:
        """A short human description, e.g. ``every 10s`` or ``cron 0 3 * * * Europe/Berlin``."""
        ...


class EveryTrigger:
    """Occurrences at ``start + k * interval`` for k = 0, 1, 2, ...

    Each occurrence is computed from ``start`` and ``k`` directly, so rounding
    never accumulates over many periods.
    """

    def __init__(self, interval: float, start: float) -> None:
        self.interval = interval
        self.start = start

    def _at(self, k: int) -> float:
        return self.start + k * self.interval

    def first_at_or_after(self, t: float) -> float | None:
        if t <= self.start:
            return self.start
        k = math.ceil((t - self.start) / self.interval)
        # Float division can land one step off either way at a boundary.
        while self._at(k) < t:
            k += 1
        while k > 0 and self._at(k - 1) >= t:
            k -= 1
        return self._at(k)

    def last_at_or_before(self, t: float) -> float | None:
        if t < self.start:
            return None
        k = math.floor((t - self.start) / self.interval)
        while self._at(k) > t:
            k -= 1
        while self._at(k + 1) <= t:
            k += 1
        return self._at(k)

    def describe(self) -> str:
        anchor = datetime.fromtimestamp(self.start, UTC)
        return f"every {self.interval:g}s from {anchor:%Y-%m-%dT%H:%M:%S}Z"


def zone(tz: object) -> ZoneInfo:
    """Return ``tz`` (an IANA name or a ZoneInfo) as a ZoneInfo.

    Raises :class:`~dibs.InvalidInput` for an unknown zone name or another type.
    """
    if isinstance(tz, ZoneInfo):
        return tz
    if isinstance(tz, str) and tz:
        try:
            return ZoneInfo(tz)
        except (ZoneInfoNotFoundError, ValueError):
            pass
    raise InvalidInput(
        f"tz must be an IANA time zone name such as 'Europe/Berlin' or a ZoneInfo, got {shown(tz)}",
        field="tz",
        value=tz,
    )


class CronTrigger:
    """Occurrences of a cron expression read as wall-clock times in ``tz``, per the DST policy.

    Raises :class:`~dibs.InvalidInput` for an expression croniter rejects or
    one that never matches (such as February 30th), and :class:`~dibs.MissingExtra`
    without the tasks extra.
    """

    def __init__(self, expr: str, tz: ZoneInfo) -> None:
        if _CRONITER_MISSING is not None:
            with needs("tasks", "a cron schedule"):
                raise _CRONITER_MISSING
        if not isinstance(expr, str) or not croniter.is_valid(expr):
            raise InvalidInput(
                f"not a valid cron expression: {shown(expr)}", field="expr", value=expr
            )
        self.expr = expr
        self.tz = tz
        try:
            self._iter(datetime(2000, 1, 1)).get_next(datetime)
        except CroniterBadDateError:
            raise InvalidInput(
                f"cron expression {shown(expr)} never matches a date", field="expr", value=expr
            ) from None

    def describe(self) -> str:
        return f"cron {self.expr} {self.tz.key}"

    def _iter(self, wall: datetime) -> Any:
        return croniter(self.expr, wall)

    def _wall(self, t: float) -> datetime:
        """The naive local wall time at instant ``t``, whole seconds, fold cleared."""
        local = datetime.fromtimestamp(math.floor(t), self.tz)
        return local.replace(tzinfo=None, fold=0)

    def instant(self, wall: datetime) -> float:
        """Map a naive local wall time to the one instant it runs at, per the DST policy."""
        first = wall.replace(tzinfo=self.tz, fold=0).timestamp()
        second = wall.replace(tzinfo=self.tz, fold=1).timestamp()
        if first <= second:
            # Ordinary (equal) or repeated by a fall-back (fold=0 is the earlier): run once, first.
            return first
        # Skipped by a spring-forward gap: fold=1 reads it with the old offset
        # (earlier), fold=0 with the new (later). The transition lies between;
        # find the first whole second whose wall time is past ``wall``.
        lo, hi = math.floor(second), math.ceil(first)
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if datetime.fromtimestamp(mid, self.tz).replace(tzinfo=None, fold=0) > wall:
                hi = mid
            else:
                lo = mid
        return float(hi)

    def first_at_or_after(self, t: float) -> float | None:
        it = self._iter(self._wall(t) - timedelta(seconds=1))
        try:
            while True:
                at = self.instant(it.get_next(datetime))
                if at >= t:
                    return at
        except CroniterBadDateError:
            return None

    def last_at_or_before(self, t: float) -> float | None:
        it = self._iter(self._wall(t) + timedelta(seconds=1))
        try:
            while True:
                at = self.instant(it.get_prev(datetime))
                if at <= t:
                    return at
        except CroniterBadDateError:
            return None
