"""The errors ``dibs.tasks`` raises, all under :class:`dibs.DibsError`::

DibsError
├── InvalidInput (ValueError)          bad argument to submit/every/cron/...
├── TaskCancelled                      the task was cancelled; ``reason`` says why
├── TaskTimeout (TimeoutError)         an attempt ran past its ``timeout``
├── WaitTimeout (TimeoutError)         result()/exception() waited too long
├── ProcessorClosed (RuntimeError)     submit/every/cron after shutdown began
├── NotInTask (LookupError)            current() outside a running task
├── UnknownTask (LookupError)          durable job names a task not registered here
├── JobNotFound (LookupError)          no durable job with that ID (or purged after retention)
└── JobFailed (RuntimeError)           result() of a durable job that failed
"""

from __future__ import annotations

import enum

from dibs.exceptions import DibsError

__all__ = [
    "CancelReason",
    "JobFailed",
    "JobNotFound",
    "NotInTask",
    "ProcessorClosed",
    "TaskCancelled",
    "TaskTimeout",
    "UnknownTask",
    "WaitTimeout",
]


class CancelReason(enum.StrEnum):
    """Why a task's cancellation token was set."""

    CANCELLED = "cancelled"
    """Someone called :meth:`TaskHandle.cancel`."""
    TIMEOUT = "timeout"
    """The attempt ran past the task's ``timeout``."""
    SHUTDOWN = "shutdown"
    """The processor's shutdown deadline passed before the task finished."""


class TaskCancelled(DibsError):
    """Raised by ``result()`` of a cancelled task (``task_id``, ``reason``).

    A task may raise it too, through ``current().raise_if_cancelled()``, to
    stop cooperatively; the task is then recorded as cancelled, not failed.
    """

    task_id: str
    reason: CancelReason


class TaskTimeout(DibsError, TimeoutError):
    """Recorded when an attempt of ``task_id`` ran longer than ``timeout`` seconds."""

    task_id: str
    timeout: float


class WaitTimeout(DibsError, TimeoutError):
    """Raised by ``result(timeout=)`` when ``task_id`` had not finished in time."""

    task_id: str
    timeout: float


class ProcessorClosed(DibsError, RuntimeError):
    """Raised when work is submitted to a processor that is shutting down."""


class NotInTask(DibsError, LookupError):
    """Raised by :func:`dibs.tasks.current` when no task is running in this context."""


class UnknownTask(DibsError, LookupError):
    """Raised when a durable job names a task (``name``) this processor has not registered."""

    name: str


class JobNotFound(DibsError, LookupError):
    """Raised for a durable job ID (``job_id``) with no row: never added, or purged."""

    job_id: str


class JobFailed(DibsError, RuntimeError):
    """Raised by ``result()`` of a durable job that failed; ``error`` is its last traceback.

    ``error`` is None when the job failed without raising: it lost its worker too
    many times (a poison pill).
    """

    job_id: str
    error: str | None
