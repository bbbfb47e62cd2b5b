"""The job table capability: the rows :mod:`dibs.tasks` durable mode keeps next to a store.

A store that offers durable tasks returns a :class:`JobTable` from
:meth:`dibs.Store.job_table`. :class:`MemoryJobs` is the in-process one, which
any single-process store (memory://, a plug-in built on it) may hand out.

The store decides who runs an attempt (a hold on ``Unit(job_id, attempt)``)
and who completed it (the fenced confirm of that hold). The job table only
remembers: every write to a taken job is conditional on ``(attempt, fence)``
of the hold that took it, so a worker whose hold was taken over changes
nothing. A worker writes its outcome as a *proposal* before confirming; the
proposal is official once the confirm succeeded, so a crash between confirm
and the final row update is finished by the next worker that reads the row.

The table lives next to the store: ``dibs_jobs`` in the SQLite file
(:mod:`dibs.stores.sqlite._jobs`), ``jobs`` in the PostgreSQL store's schema
(:mod:`dibs.stores.postgres._jobs`), dicts next to a memory:// store object (here).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any, Protocol

__all__ = ["FINISHED_STATES", "LIVE_STATES", "Decide", "Job", "JobTable", "MemoryJobs"]

LIVE_STATES = ("pending", "running")
FINISHED_STATES = ("done", "failed", "cancelled")

Decide = Callable[[float | None, int], "tuple[float, list[Job]] | None"]
"""Evaluates a schedule: (watermark or None, live jobs) → (new watermark, jobs) or None."""


@dataclass(frozen=True, slots=True)
class Job:
    """One job row."""

    id: str
    name: str
    args: str  # JSON [args, kwargs]
    run_at: float  # epoch seconds on the store's clock
    attempt: int  # the attempt running, or the next to run (1-based)
    max_attempts: int
    state: str  # pending | running | done | failed | cancelled
    fence: int | None = None  # fence of the hold that took the current attempt
    claim_id: str | None = None
    outcome_kind: str | None = None  # "ok" | "error" | "cancelled", proposed or final
    outcome: str | None = None  # JSON result, or the error's text
    schedule_id: str | None = None
    retries: int = 0  # failed attempts that may be retried
    failures: int = 0  # failed attempts so far (lost ones count only toward max_attempts)
    key: str | None = None  # unique among live jobs
    cancel_requested: bool = False
    finished_at: float | None = None


COLUMNS = (
    "id, name, args, run_at, attempt, max_attempts, state, fence, claim_id, outcome_kind, "
    "outcome, schedule_id, retries, failures, key, cancel_requested, finished_at"
)


def row_values(job: Job) -> tuple[Any, ...]:
    """The job's column values, in :data:`COLUMNS` order."""
    return (
        job.id, job.name, job.args, job.run_at, job.attempt, job.max_attempts, job.state,
        job.fence, job.claim_id, job.outcome_kind, job.outcome, job.schedule_id, job.retries,
        job.failures, job.key, job.cancel_requested, job.finished_at,
    )  # fmt: skip


def job_from_row(row: tuple[Any, ...]) -> Job:
    """A :class:`Job` from a row read in :data:`COLUMNS` order."""
    values = list(row)
    values[15] = bool(values[15])
    return Job(*values)


class JobTable(Protocol):
    """The job rows of one store. Every method is atomic and may raise StoreUnavailable.

    Writes to a taken job are conditional on the ``(attempt, fence)`` the
    caller saw and return whether they changed the row.
    """

    def add(self, job: Job) -> str:
        """Insert ``job`` unless its ID exists or its key is live; return the ID standing."""
        ...

    def get(self, job_id: str) -> Job | None:
        """The row, or None."""
        ...

    def due(self, now: float, limit: int) -> list[Job]:
        """Up to ``limit`` live jobs whose ``run_at`` has passed, earliest first."""
        ...

    def find(self, schedule_id: str | None = None) -> list[Job]:
        """Every row, or every row of one schedule, in any state; by ``run_at``, then ID."""
        ...

    def start(
        self, job_id: str, seen_attempt: int, seen_fence: int | None, attempt: int, fence: int,
        claim_id: str,
    ) -> bool:  # fmt: skip
        """Record that the hold ``(claim_id, fence)`` took ``attempt`` of a live job."""
        ...

    def propose(self, job_id: str, attempt: int, fence: int, kind: str, outcome: str) -> bool:
        """Write the running attempt's outcome as a proposal."""
        ...

    def settle(
        self, job_id: str, attempt: int, fence: int | None, state: str, run_at: float | None,
        now: float,
    ) -> bool:  # fmt: skip
        """End a running attempt: a final state, or ``pending`` (a retry at ``run_at``)."""
        ...

    def cancel(self, job_id: str, now: float) -> bool:
        """Cancel a pending job, or flag a running one; False if it is finished or absent."""
        ...

    def cancel_requested(self, job_ids: list[str]) -> set[str]:
        """Which of these running jobs have been flagged by :meth:`cancel`."""
        ...

    def advance(self, schedule_id: str, decide: Decide) -> list[Job]:
        """Evaluate a schedule under its lock: read its watermark and live job count, call
        ``decide``, store the new watermark and add its jobs, all in one transaction.

        Returns the jobs added. Two processes evaluating one schedule are serialized.
        """
        ...

    def purge(self, before: float) -> int:
        """Delete finished jobs that finished before ``before``; return how many."""
        ...

    def listen(self, wake: Callable[[], None]) -> Callable[[], None]:
        """Call ``wake()`` when another process may have added a job; return a stopper."""
        ...

    def close(self) -> None:
        """Release connections."""
        ...


class MemoryJobs:
    """The job table as dicts, for memory:// stores (one process)."""

    def __init__(self) -> None:
        self._rows: dict[str, Job] = {}
        self._watermarks: dict[str, float] = {}
        self._wakes: list[Callable[[], None]] = []
        self._lock = threading.Lock()  # guards everything above

    def close(self) -> None:
        pass  # the rows live as long as the store object

    def listen(self, wake: Callable[[], None]) -> Callable[[], None]:
        with self._lock:
            self._wakes.append(wake)

        def stop() -> None:
            with self._lock:
                if wake in self._wakes:
                    self._wakes.remove(wake)

        return stop

    def _insert(self, job: Job) -> str:
        existing = self._rows.get(job.id)
        if existing is not None:
            return existing.id
        if job.key is not None:
            for row in self._rows.values():
                if row.key == job.key and row.state in LIVE_STATES:
                    return row.id
        self._rows[job.id] = job
        return job.id

    def add(self, job: Job) -> str:
        with self._lock:
            standing = self._insert(job)
            wakes = list(self._wakes)
        for wake in wakes:
            wake()
        return standing

    def get(self, job_id: str) -> Job | None:
        with self._lock:
            return self._rows.get(job_id)

    def due(self, now: float, limit: int) -> list[Job]:
        with self._lock:
            rows = [j for j in self._rows.values() if j.state in LIVE_STATES and j.run_at <= now]
        return sorted(rows, key=lambda j: j.run_at)[:limit]

    def find(self, schedule_id: str | None = None) -> list[Job]:
        with self._lock:
            rows = [j for j in self._rows.values() if schedule_id in (None, j.schedule_id)]
        return sorted(rows, key=lambda j: (j.run_at, j.id))

    def _swap(self, job_id: str, ok: Callable[[Job], bool], **changes: Any) -> bool:
        with self._lock:
            job = self._rows.get(job_id)
            if job is None or not ok(job):
                return False
            self._rows[job_id] = replace(job, **changes)
            return True

    def start(
        self, job_id: str, seen_attempt: int, seen_fence: int | None, attempt: int, fence: int,
        claim_id: str,
    ) -> bool:  # fmt: skip
        return self._swap(
            job_id,
            lambda j: (
                j.attempt == seen_attempt and j.fence == seen_fence and j.state in LIVE_STATES
            ),
            state="running", attempt=attempt, fence=fence, claim_id=claim_id,
            outcome_kind=None, outcome=None,
        )  # fmt: skip

    def propose(self, job_id: str, attempt: int, fence: int, kind: str, outcome: str) -> bool:
        return self._swap(
            job_id,
            lambda j: j.attempt == attempt and j.fence == fence and j.state == "running",
            outcome_kind=kind, outcome=outcome,
        )  # fmt: skip

    def settle(
        self, job_id: str, attempt: int, fence: int | None, state: str, run_at: float | None,
        now: float,
    ) -> bool:  # fmt: skip
        def ok(j: Job) -> bool:
            return j.attempt == attempt and j.fence == fence and j.state == "running"

        if state == "pending":
            assert run_at is not None
            with self._lock:
                failures = self._rows[job_id].failures + 1 if job_id in self._rows else 0
            return self._swap(
                job_id, ok, state="pending", attempt=attempt + 1, run_at=run_at,
                fence=None, claim_id=None, failures=failures,
            )  # fmt: skip
        return self._swap(job_id, ok, state=state, finished_at=now)

    def cancel(self, job_id: str, now: float) -> bool:
        with self._lock:
            job = self._rows.get(job_id)
            if job is None or job.state not in LIVE_STATES:
                return False
            if job.state == "pending":
                self._rows[job_id] = replace(
                    job, state="cancelled", outcome_kind="cancelled", finished_at=now
                )
            else:
                self._rows[job_id] = replace(job, cancel_requested=True)
            return True

    def cancel_requested(self, job_ids: list[str]) -> set[str]:
        with self._lock:
            return {
                i for i in job_ids if (j := self._rows.get(i)) is not None and j.cancel_requested
            }

    def advance(self, schedule_id: str, decide: Decide) -> list[Job]:
        with self._lock:
            live = sum(
                1
                for j in self._rows.values()
                if j.schedule_id == schedule_id and j.state in LIVE_STATES
            )
            decision = decide(self._watermarks.get(schedule_id), live)
            if decision is None:
                return []
            self._watermarks[schedule_id], jobs = decision
            added = [job for job in jobs if self._insert(job) == job.id]
            wakes = list(self._wakes)
        for wake in wakes:
            wake()
        return added

    def purge(self, before: float) -> int:
        with self._lock:
            old = [
                i
                for i, j in self._rows.items()
                if j.state in FINISHED_STATES and (j.finished_at or 0.0) < before
            ]
            for i in old:
                del self._rows[i]
            return len(old)
