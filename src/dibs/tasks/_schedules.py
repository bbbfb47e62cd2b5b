"""Recurring schedules: misfire policy, overlap limit, and which occurrences run when.

An occurrence is *missed* when it comes due while the process was busy,
asleep, or already running ``max_running`` runs of the schedule. Missed
occurrences wait in a small backlog; the misfire policy decides which of them
run: those older than ``window`` seconds are dropped, and the rest are
coalesced to the earliest, the latest, or kept all (in order).
"""

from __future__ import annotations

import enum
import logging
import math
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from dibs._model import shown
from dibs.exceptions import InvalidInput
from dibs.tasks._handle import Backoff
from dibs.tasks._triggers import Trigger

__all__ = ["Coalesce", "Misfire", "Schedule"]

log = logging.getLogger("dibs.tasks")

MAX_BACKLOG = 1000
"""Most missed occurrences kept for ``coalesce="all"``; later ones past it are skipped."""


class Coalesce(enum.StrEnum):
    """Which missed occurrences run when several are waiting."""

    EARLIEST = "earliest"
    """Run one, for the earliest missed occurrence."""
    LATEST = "latest"
    """Run one, for the latest missed occurrence (the default)."""
    ALL = "all"
    """Run every missed occurrence still inside the window, oldest first."""


@dataclass(frozen=True, slots=True)
class Misfire:
    """What to do with occurrences that could not start on time.

    ``window``: how late (seconds after its nominal time) an occurrence may
    still start; None means no limit. ``coalesce``: see :class:`Coalesce`.
    The default catches up once: however many occurrences were missed, one
    run starts as soon as possible, for the latest. Raises
    :class:`~dibs.InvalidInput` for a bad window or coalesce value.
    """

    window: float | None = None
    coalesce: Coalesce | str = Coalesce.LATEST

    def __post_init__(self) -> None:
        if self.window is not None and (
            isinstance(self.window, bool)
            or not isinstance(self.window, int | float)
            or not 0 <= self.window < math.inf  # a huge int has no float: compare first
        ):
            raise InvalidInput(
                f"misfire window must be seconds >= 0 or None, got {shown(self.window)}",
                field="window",
                value=self.window,
            )
        try:
            object.__setattr__(self, "coalesce", Coalesce(self.coalesce))
        except ValueError:
            raise InvalidInput(
                f"coalesce must be one of earliest, latest, all; got {shown(self.coalesce)}",
                field="coalesce",
                value=self.coalesce,
            ) from None


@dataclass(frozen=True, slots=True)
class Schedule:
    """A snapshot of one recurring schedule, as :meth:`TaskProcessor.schedules` returns it."""

    id: str
    description: str
    next_run: datetime | None
    """Nominal time of the next occurrence not yet due (aware UTC), or None if none is left."""
    running: int
    """Runs queued or running now."""
    runs: int
    """Runs started so far."""
    misfire: Misfire
    max_running: int


class ScheduleState:
    """A live schedule inside a processor; every field is guarded by the processor's lock."""

    def __init__(
        self,
        schedule_id: str,
        trigger: Trigger,
        fn: Callable[..., Any],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        *,
        first: float | None,
        misfire: Misfire,
        max_running: int,
        retries: int,
        backoff: Backoff,
        timeout: float | None,
    ) -> None:
        self.id = schedule_id
        self.trigger = trigger
        self.fn = fn
        self.args = args
        self.kwargs = kwargs
        self.misfire = misfire
        self.max_running = max_running
        self.retries = retries
        self.backoff = backoff
        self.timeout = timeout
        self.cursor = first  # earliest occurrence not yet looked at
        self.backlog: deque[float] = deque()  # missed occurrences waiting to start, oldest first
        self.running = 0
        self.runs = 0
        self.heap_seq = -1  # seq of this schedule's live heap entry
        self.live = True

    def new_run_id(self) -> str:
        """An ID for the next run: the schedule's ID and the run's ordinal."""
        return f"{self.id}#{self.runs + 1}"

    def snapshot(self) -> Schedule:
        return Schedule(
            id=self.id,
            description=self.trigger.describe(),
            next_run=None if self.cursor is None else datetime.fromtimestamp(self.cursor, UTC),
            running=self.running,
            runs=self.runs,
            misfire=self.misfire,
            max_running=self.max_running,
        )

    def take_due(self, now: float) -> list[float]:
        """Collect the occurrences due by ``now`` and return the nominal times to start now.

        Advances :attr:`cursor` to the first occurrence after ``now``.
        """
        if self.cursor is not None and self.cursor <= now:
            self._collect(self.cursor, now)
            self.cursor = self.trigger.first_at_or_after(math.nextafter(now, math.inf))
        window = self.misfire.window
        while self.backlog and window is not None and now - self.backlog[0] > window:
            dropped = self.backlog.popleft()
            log.info("schedule %s: dropped occurrence %s, older than its window", self.id, dropped)
        starts: list[float] = []
        while self.backlog and self.running + len(starts) < self.max_running:
            starts.append(self.backlog.popleft())
        return starts

    def _collect(self, lo: float, now: float) -> None:
        """Add occurrences in [lo, now] to the backlog, coalesced per the policy."""
        if self.misfire.window is not None:
            lo = max(lo, now - self.misfire.window)
        coalesce = self.misfire.coalesce
        if coalesce is Coalesce.LATEST:
            latest = self.trigger.last_at_or_before(now)
            if latest is not None and latest >= lo:
                # A newer occurrence supersedes any older one still waiting.
                self.backlog.clear()
                self.backlog.append(latest)
            return
        if coalesce is Coalesce.EARLIEST:
            if self.backlog:
                return  # the earliest missed occurrence is already waiting
            earliest = self.trigger.first_at_or_after(lo)
            if earliest is not None and earliest <= now:
                self.backlog.append(earliest)
            return
        at = self.trigger.first_at_or_after(lo)
        while at is not None and at <= now:
            if len(self.backlog) >= MAX_BACKLOG:
                log.warning(
                    "schedule %s: more than %d missed occurrences; skipping those after %s",
                    self.id,
                    MAX_BACKLOG,
                    self.backlog[-1],
                )
                return
            self.backlog.append(at)
            at = self.trigger.first_at_or_after(math.nextafter(at, math.inf))
