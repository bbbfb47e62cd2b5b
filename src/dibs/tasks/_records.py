"""What callers see of durable jobs: :class:`JobRecord` snapshots and the options a job carries."""

from __future__ import annotations

import contextlib
import json
import math
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from dibs._model import shown
from dibs.exceptions import InvalidInput
from dibs.stores.jobs import DEFAULT_QUEUE, Attempt, Job
from dibs.tasks._options import check_id

__all__ = ["PRIORITY_MAX", "PRIORITY_MIN", "JobOptions", "JobRecord", "to_record"]

PRIORITY_MIN = -(2**31)
PRIORITY_MAX = 2**31 - 1
"""Priorities are 32-bit integers (a PostgreSQL ``integer`` column)."""


@dataclass(frozen=True, slots=True)
class JobOptions:
    """Where and how a durable job runs: set per task by ``@task``, per job by ``enqueue``."""

    queue: str = DEFAULT_QUEUE
    priority: int = 0
    lock_key: str | None = None
    retention: float | None = None

    def merged(
        self, queue: object, priority: object, lock_key: object, retention: object
    ) -> JobOptions:
        """These options with the given ones (None: keep) checked and put in their place.

        Raises :class:`~dibs.InvalidInput` for a bad value.
        """
        return JobOptions(
            self.queue if queue is None else check_id(queue, "queue"),
            self.priority if priority is None else check_priority(priority),
            self.lock_key if lock_key is None else check_id(lock_key, "lock_key"),
            self.retention if retention is None else check_retention(retention),
        )


def check_priority(value: object) -> int:
    """Return ``value`` or raise :class:`~dibs.InvalidInput` unless it is a 32-bit int."""
    if (
        isinstance(value, bool)
        or not isinstance(value, int)
        or not PRIORITY_MIN <= value <= PRIORITY_MAX
    ):
        raise InvalidInput(
            f"priority must be an int from {PRIORITY_MIN} to {PRIORITY_MAX}, got {shown(value)}",
            field="priority",
            value=value,
        )
    return value


def check_retention(value: object) -> float:
    """Return ``value`` in seconds or raise :class:`~dibs.InvalidInput` unless finite and >= 0."""
    seconds = math.nan
    if not isinstance(value, bool) and isinstance(value, int | float):
        with contextlib.suppress(OverflowError):  # an int too large for a float
            seconds = float(value)
    if not 0 <= seconds < math.inf:
        raise InvalidInput(
            f"retention must be seconds >= 0, got {shown(value)}", field="retention", value=value
        )
    return seconds


@dataclass(frozen=True, slots=True)
class JobRecord:
    """A snapshot of one durable job, as :meth:`TaskProcessor.job` returns it."""

    id: str
    name: str
    state: str
    """``pending``, ``running``, ``done``, ``failed`` or ``cancelled``."""
    attempt: int
    """The attempt running, the next to run, or the last one that ran (1-based)."""
    max_attempts: int
    run_at: datetime
    result: Any
    """The JSON-decoded return value once done."""
    error: str | None
    """The last failure's traceback text."""
    schedule_id: str | None
    queue: str = DEFAULT_QUEUE
    priority: int = 0
    lock_key: str | None = None
    key: str | None = None
    args: list[Any] | None = None
    kwargs: dict[str, Any] | None = None
    enqueued_at: datetime | None = None
    started_at: datetime | None = None
    """When the running (or last) attempt was taken."""
    finished_at: datetime | None = None
    holder: str | None = None
    """The worker running the current attempt (or the last one)."""
    attempts: tuple[Attempt, ...] = ()
    """The ended attempts, oldest first: who ran each, when, and how it ended."""
    cancel_requested: bool = False

    @property
    def finished(self) -> bool:
        """Whether the job will never run again (unless retried by hand)."""
        return self.state in ("done", "failed", "cancelled")


def _when(epoch: float | None) -> datetime | None:
    return None if epoch is None else datetime.fromtimestamp(epoch, UTC)


def to_record(job: Job) -> JobRecord:
    """The caller's snapshot of a job row."""
    done = job.state == "done"
    try:
        args, kwargs = json.loads(job.args)
    except (TypeError, ValueError):
        args, kwargs = None, None
    return JobRecord(
        id=job.id, name=job.name, state=job.state, attempt=job.attempt,
        max_attempts=job.max_attempts, run_at=datetime.fromtimestamp(job.run_at or 0.0, UTC),
        result=json.loads(job.outcome) if done and job.outcome is not None else None,
        error=job.outcome if job.outcome_kind == "error" else None,
        schedule_id=job.schedule_id, queue=job.queue, priority=job.priority,
        lock_key=job.lock_key, key=job.key, args=args, kwargs=kwargs,
        enqueued_at=_when(job.enqueued_at), started_at=_when(job.started_at),
        finished_at=_when(job.finished_at), holder=job.holder, attempts=tuple(job.attempts),
        cancel_requested=job.cancel_requested,
    )  # fmt: skip
