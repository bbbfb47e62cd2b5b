"""Recurring schedules: overlap and catch-up rules, and which occurrences run when.

Two ways to say the policy. The third-wave names: ``overlap`` ("skip": an
occurrence due while a run of the schedule is live is skipped; "allow": runs
overlap freely) and ``catch_up`` ("coalesce": missed occurrences run once, for
the latest; "all": each runs, the ``max_catch_up`` most recent of them). The
older names, kept: ``max_running`` runs at once, and missed occurrences wait in
a small backlog that :class:`Misfire` coalesces. :func:`policy` turns either
into one :class:`Policy`.
"""

from __future__ import annotations

import enum
import logging
import math
import sys
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from dibs._model import shown
from dibs.exceptions import InvalidInput
from dibs.tasks._handle import Backoff
from dibs.tasks._triggers import Trigger

__all__ = ["CatchUp", "Coalesce", "Misfire", "Overlap", "Policy", "Schedule", "policy"]

log = logging.getLogger("dibs.tasks")

MAX_BACKLOG = 1000
"""Most missed occurrences kept for ``coalesce="all"``; later ones past it are skipped."""

MAX_CATCH_UP = MAX_BACKLOG
"""The largest ``max_catch_up``, and its default for ``catch_up="all"``."""

UNLIMITED = sys.maxsize
"""``max_running`` under ``overlap="allow"``: no cap on runs at once."""


class Overlap(enum.StrEnum):
    """What an occurrence does when it comes due while a run of its schedule is live."""

    SKIP = "skip"
    """It is skipped, not queued: runs of the schedule never overlap (the default)."""
    ALLOW = "allow"
    """It runs, beside the live runs."""


class CatchUp(enum.StrEnum):
    """Which missed occurrences (process down, or too busy) run once the schedule is looked at."""

    COALESCE = "coalesce"
    """One run, for the latest missed occurrence (the default)."""
    ALL = "all"
    """A run for each, oldest first: the ``max_catch_up`` most recent of them."""


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
class Policy:
    """One schedule's rules, from the third-wave names or from ``misfire``/``max_running``."""

    misfire: Misfire
    max_running: int
    overlap: Overlap | None = None
    """None: the older rules (an occurrence due while ``max_running`` runs are live waits)."""
    catch_up: CatchUp | None = None
    max_catch_up: int | None = None
    """At most this many runs for one catch-up, the most recent; None with the older rules."""

    @property
    def skip(self) -> bool:
        """True if an occurrence due while a run is live is skipped, not queued."""
        return self.overlap is Overlap.SKIP


def policy(
    misfire: object = None,
    max_running: object = None,
    overlap: object = None,
    catch_up: object = None,
    max_catch_up: object = None,
) -> Policy:
    """The :class:`Policy` of these arguments, each None when not given.

    Raises :class:`~dibs.InvalidInput` naming the field for a bad value, or for
    a third-wave name beside ``misfire`` or ``max_running`` (they say the same
    thing two ways).
    """
    if misfire is not None and not isinstance(misfire, Misfire):
        raise InvalidInput(
            f"misfire must be a Misfire, got {shown(misfire)}", field="misfire", value=misfire
        )
    if max_running is not None and (
        isinstance(max_running, bool) or not isinstance(max_running, int) or max_running < 1
    ):
        raise InvalidInput(
            f"max_running must be an int >= 1, got {shown(max_running)}",
            field="max_running",
            value=max_running,
        )
    if overlap is None and catch_up is None and max_catch_up is None:
        return Policy(
            misfire=misfire if isinstance(misfire, Misfire) else Misfire(),
            max_running=max_running if isinstance(max_running, int) else 1,
        )
    rule = Overlap(_choice(Overlap, "overlap", Overlap.SKIP if overlap is None else overlap))
    catch = CatchUp(
        _choice(CatchUp, "catch_up", CatchUp.COALESCE if catch_up is None else catch_up)
    )
    if max_catch_up is None:
        most = MAX_CATCH_UP
    elif (
        isinstance(max_catch_up, bool)
        or not isinstance(max_catch_up, int)
        or not 1 <= max_catch_up <= MAX_CATCH_UP
    ):
        raise InvalidInput(
            f"max_catch_up must be an int from 1 to {MAX_CATCH_UP}, got {shown(max_catch_up)}",
            field="max_catch_up",
            value=max_catch_up,
        )
    else:
        most = max_catch_up
    for name, old in (("misfire", misfire), ("max_running", max_running)):
        if old is not None:
            raise InvalidInput(
                f"{name} cannot be given with overlap, catch_up or max_catch_up",
                field=name,
                value=old,
            )
    if catch is CatchUp.COALESCE:
        most = 1  # one run for however many were missed
    return Policy(
        misfire=Misfire(coalesce=Coalesce.LATEST if catch is CatchUp.COALESCE else Coalesce.ALL),
        max_running=1 if rule is Overlap.SKIP else UNLIMITED,
        overlap=rule,
        catch_up=catch,
        max_catch_up=most,
    )


def _choice(kind: type[enum.StrEnum], field: str, value: object) -> str:
    """``value`` if it is one of ``kind``'s strings; else raises InvalidInput naming ``field``."""
    if isinstance(value, str) and value in {str(m) for m in kind}:
        return value
    names = " or ".join(repr(str(m)) for m in kind)
    raise InvalidInput(f"{field} must be {names}, got {shown(value)}", field=field, value=value)


def most_recent(trigger: Trigger, lo: float, now: float, most: int) -> list[float]:
    """The ``most`` latest occurrences in ``(lo, now]``, oldest first.

    Walks back from ``now``, so it costs ``most`` steps however long the gap.
    """
    picks: list[float] = []
    at = trigger.last_at_or_before(now)
    while at is not None and at > lo and len(picks) < most:
        picks.append(at)
        at = trigger.last_at_or_before(math.nextafter(at, -math.inf))
    picks.reverse()
    return picks


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
    overlap: str | None = None
    """``"skip"`` or ``"allow"``; None if the schedule was given ``misfire``/``max_running``."""
    catch_up: str | None = None
    max_catch_up: int | None = None
    skipped: int = 0
    """Skips so far (in-process): due occurrences passed over while a run was live."""


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
        rules: Policy,
        retries: int,
        backoff: Backoff,
        timeout: float | None,
    ) -> None:
        self.id = schedule_id
        self.trigger = trigger
        self.fn = fn
        self.args = args
        self.kwargs = kwargs
        self.rules = rules
        self.misfire = rules.misfire
        self.max_running = rules.max_running
        self.retries = retries
        self.backoff = backoff
        self.timeout = timeout
        self.cursor = first  # earliest occurrence not yet looked at
        self.backlog: deque[float] = deque()  # missed occurrences waiting to start, oldest first
        self.running = 0
        self.runs = 0
        self.skipped = 0
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
            overlap=None if self.rules.overlap is None else str(self.rules.overlap),
            catch_up=None if self.rules.catch_up is None else str(self.rules.catch_up),
            max_catch_up=self.rules.max_catch_up,
            skipped=self.skipped,
        )

    def take_due(self, now: float) -> list[float]:
        """Collect the occurrences due by ``now`` and return the nominal times to start now.

        Advances :attr:`cursor` to the first occurrence after ``now``.
        """
        if self.cursor is not None and self.cursor <= now:
            if self.rules.skip and self.running > 0:
                self._skip(self.cursor, now)
            elif self.rules.max_catch_up is not None:
                # A newer catch-up replaces what still waits of an older one.
                self.backlog.clear()
                prior = math.nextafter(self.cursor, -math.inf)
                self.backlog.extend(most_recent(self.trigger, prior, now, self.rules.max_catch_up))
            else:
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

    def _skip(self, lo: float, now: float) -> None:
        """Skip the occurrences in [lo, now]: a run of this schedule is live."""
        last = self.trigger.last_at_or_before(now)
        if last is None or last < lo:
            return
        self.skipped += 1
        log.info("schedule %s: skipped occurrences up to %s, a run is live", self.id, last)

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
