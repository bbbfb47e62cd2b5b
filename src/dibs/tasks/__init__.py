"""Scheduled, recurring and cancellable tasks in one process (durable mode: on a store).

>>> from dibs.tasks import TaskProcessor
>>> with TaskProcessor(workers=2) as tasks:
...     handle = tasks.submit(sum, [1, 2, 3])
...     handle.result(timeout=5)
6

Needs the ``tasks`` extra (``pip install 'dibs[tasks]'``) for cron schedules.
"""

from dibs.tasks._errors import (
    CancelReason,
    JobFailed,
    JobNotFound,
    NotInTask,
    ProcessorClosed,
    TaskCancelled,
    TaskTimeout,
    UnknownTask,
    WaitTimeout,
)
from dibs.tasks._handle import Backoff, CancelToken, TaskContext, TaskHandle, TaskStatus, current
from dibs.tasks._processor import TaskProcessor
from dibs.tasks._records import JobRecord
from dibs.tasks._schedules import Coalesce, Misfire, Schedule
from dibs.tasks._time import WakingClock
from dibs.tasks._unique import Inserted, Unique

__all__ = [
    "Backoff",
    "CancelReason",
    "CancelToken",
    "Coalesce",
    "Inserted",
    "JobFailed",
    "JobNotFound",
    "JobRecord",
    "Misfire",
    "NotInTask",
    "ProcessorClosed",
    "Schedule",
    "TaskCancelled",
    "TaskContext",
    "TaskHandle",
    "TaskProcessor",
    "TaskStatus",
    "TaskTimeout",
    "Unique",
    "UnknownTask",
    "WaitTimeout",
    "WakingClock",
    "current",
]
