"""Durable schedules: which occurrences become jobs, decided from a watermark in the job table.

Each schedule has a *watermark* in the job table: every occurrence at or
before it has been evaluated (turned into a job, or skipped by the misfire
policy). Any process may evaluate a schedule at any time — on its own timer
at each occurrence, when it registers the schedule, when one of the
schedule's jobs ends here. An evaluation at ``now`` looks at the occurrences
in ``(watermark, now]``, applies the misfire policy and ``max_running``, and
moves the watermark, in one transaction under the schedule's lock
(:meth:`JobTable.advance`). So downtime of the whole fleet is caught up by
the first process back, per the policy; two processes never evaluate one
occurrence differently; and an occurrence's job ID ``"{schedule}@{nominal}"``
makes its row unique besides.

Under ``overlap="skip"`` an evaluation that finds a live job of the schedule
moves the watermark past the due occurrences without adding jobs (they are
skipped), and every job of the schedule carries the schedule's lock key, a
claim on the store, so the runs of one catch-up start one after the other.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime

from dibs.tasks._jobs import Job
from dibs.tasks._schedules import MAX_BACKLOG, Coalesce, Misfire, Policy, most_recent
from dibs.tasks._triggers import Trigger

__all__ = ["DurableSchedule", "occurrence_id", "schedule_lock_key"]


def schedule_lock_key(schedule_id: str) -> str:
    """The lock key every job of an ``overlap="skip"`` schedule carries."""
    return f"dibs.schedule/{schedule_id}"


def occurrence_id(schedule_id: str, nominal: float) -> str:
    """The job ID of one occurrence: the schedule's ID and the nominal time (ISO, UTC)."""
    return f"{schedule_id}@{datetime.fromtimestamp(nominal, UTC).isoformat()}"


@dataclass(frozen=True, slots=True)
class DurableSchedule:
    """A schedule whose occurrences are jobs; ``make_job(job_id, nominal)`` builds one row."""

    id: str
    trigger: Trigger
    rules: Policy
    make_job: Callable[[str, float], Job]

    @property
    def misfire(self) -> Misfire:
        return self.rules.misfire

    @property
    def max_running(self) -> int:
        return self.rules.max_running

    def decide(
        self, now: float, watermark: float | None, live: int
    ) -> tuple[float, list[Job]] | None:
        """The new watermark and the jobs to add, or None to change nothing.

        A schedule seen for the first time starts at ``now``: occurrences
        before it registered are not run. With ``live >= max_running`` nothing
        is evaluated; the waiting occurrences are looked at again, under the
        misfire policy, by the next evaluation.
        """
        first_time = watermark is None
        mark = math.nextafter(now, -math.inf) if watermark is None else watermark
        last = self.trigger.last_at_or_before(now)
        if last is None or last <= mark:
            return (mark, []) if first_time else None
        if self.rules.overlap is not None:
            return self._decide(now, mark, last, live)
        lo = mark
        window = self.misfire.window
        if window is not None and now - window > lo:
            lo = math.nextafter(now - window, -math.inf)  # older ones are skipped
        picks = self._picks(lo, now)
        free = self.max_running - live
        if free <= 0 and picks:
            return (mark, []) if first_time else None
        starts = picks[:free]
        more = self.misfire.coalesce is Coalesce.ALL and len(picks) > len(starts)
        new_mark = starts[-1] if more else last
        return new_mark, self._jobs(starts)

    def _decide(self, now: float, mark: float, last: float, live: int) -> tuple[float, list[Job]]:
        """The third-wave rules: skip while a run is live, else the most recent ``max_catch_up``."""
        if self.rules.skip and live > 0:
            return last, []  # skipped, not queued: the watermark passes them
        assert self.rules.max_catch_up is not None
        most = self.rules.max_catch_up
        # Intervals are at least 1 us, so at most two occurrences share a job ID (an
        # instant to the microsecond): walk back twice as far, keep the last ``most``.
        return last, self._jobs(most_recent(self.trigger, mark, now, 2 * most + 1))[-most:]

    def _jobs(self, starts: list[float]) -> list[Job]:
        """One job per occurrence ID: occurrences closer than a microsecond share one, the last."""
        by_id = {occurrence_id(self.id, at): at for at in starts}
        return [self.make_job(job_id, at) for job_id, at in by_id.items()]

    def _picks(self, lo: float, now: float) -> list[float]:
        """Occurrences in ``(lo, now]`` that the coalesce policy runs, oldest first."""
        coalesce = self.misfire.coalesce
        if coalesce is Coalesce.LATEST:
            latest = self.trigger.last_at_or_before(now)
            return [latest] if latest is not None and latest > lo else []
        at = self.trigger.first_at_or_after(math.nextafter(lo, math.inf))
        picks: list[float] = []
        while at is not None and at <= now and len(picks) < MAX_BACKLOG:
            picks.append(at)
            if coalesce is Coalesce.EARLIEST:
                break
            at = self.trigger.first_at_or_after(math.nextafter(at, math.inf))
        return picks
