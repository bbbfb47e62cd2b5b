"""A submitted task's record and handle, its cancellation token and the running-task context."""

from __future__ import annotations

import contextvars
import enum
import random
import threading
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Generic, Protocol, TypeVar

from dibs._model import shown
from dibs.exceptions import InvalidInput
from dibs.limits import RETENTION_MAX
from dibs.tasks._errors import CancelReason, NotInTask, TaskCancelled, TaskTimeout, WaitTimeout

__all__ = ["Backoff", "CancelToken", "TaskContext", "TaskHandle", "TaskStatus", "current"]

T = TypeVar("T")


class Canceller(Protocol):
    """What a handle needs of the engine that runs it (the engine, without importing it)."""

    def cancel(self, handle: TaskHandle[Any], reason: CancelReason) -> bool:
        """Cancel ``handle``; True if this call cancelled it."""
        ...


class TaskStatus(enum.StrEnum):
    """Where a task is: scheduled → queued → running → done | failed | cancelled."""

    SCHEDULED = "scheduled"
    """Waiting for its run time (its first attempt or a retry after backoff)."""
    QUEUED = "queued"
    """Due, waiting for a free worker."""
    RUNNING = "running"
    DONE = "done"
    FAILED = "failed"
    CANCELLED = "cancelled"

    @property
    def finished(self) -> bool:
        """Whether the task will never run again."""
        return self in _FINISHED


_FINISHED = frozenset({TaskStatus.DONE, TaskStatus.FAILED, TaskStatus.CANCELLED})


@dataclass(frozen=True, slots=True)
class Backoff:
    """Exponential backoff with full jitter: retry n waits U(0, min(cap, base * factor**(n-1))).

    Full jitter spreads retries of tasks that failed together (AWS
    architecture blog, "Exponential Backoff And Jitter"). Raises
    :class:`~dibs.InvalidInput` for a negative or non-finite parameter.
    """

    base: float = 1.0
    factor: float = 2.0
    cap: float = 300.0
    jitter: bool = True

    def __post_init__(self) -> None:
        for name in ("base", "factor", "cap"):
            value = getattr(self, name)
            if (
                isinstance(value, bool)
                or not isinstance(value, int | float)
                or not 0 <= value <= RETENTION_MAX  # a huge int has no float: compare first
            ):
                raise InvalidInput(
                    f"Backoff.{name} must be a number from 0 to {RETENTION_MAX:g}, "
                    f"got {shown(value)}",
                    field=name,
                    value=value,
                )
        if self.factor < 1:
            raise InvalidInput(
                f"Backoff.factor must be >= 1, got {shown(self.factor)}",
                field="factor",
                value=self.factor,
            )

    def ceiling(self, retry: int) -> float:
        """The longest wait before retry number ``retry`` (1 for the first retry)."""
        try:
            return min(self.cap, self.base * self.factor ** (retry - 1))
        except OverflowError:
            return self.cap

    def delay(self, retry: int, rng: random.Random) -> float:
        """Seconds to wait before retry number ``retry``."""
        ceiling = self.ceiling(retry)
        return rng.uniform(0.0, ceiling) if self.jitter else ceiling


class CancelToken:
    """Set when the running task should stop: it was cancelled, timed out, or shutdown ran out.

    A task checks :attr:`cancelled`, calls :meth:`raise_if_cancelled`, or
    sleeps with :meth:`sleep`, which wakes early on cancellation.
    """

    __slots__ = ("_callbacks", "_event", "_lock", "_reason", "_task_id", "_timeout")

    def __init__(self, task_id: str, timeout: float | None) -> None:
        self._task_id = task_id
        self._timeout = timeout
        self._lock = threading.Lock()  # guards _reason, _event and _callbacks
        self._reason: CancelReason | None = None
        self._event: threading.Event | None = None
        self._callbacks: list[Callable[[], None]] = []

    @property
    def cancelled(self) -> bool:
        """Whether the task has been asked to stop."""
        return self._reason is not None

    @property
    def reason(self) -> CancelReason | None:
        """Why the task was asked to stop, or None."""
        return self._reason

    def error(self) -> Exception:
        """The exception that describes this cancellation (TaskTimeout or TaskCancelled)."""
        if self._reason is CancelReason.TIMEOUT:
            return TaskTimeout(
                f"task {self._task_id} ran longer than its timeout of {self._timeout}s",
                task_id=self._task_id,
                timeout=self._timeout,
            )
        reason = self._reason or CancelReason.CANCELLED
        return TaskCancelled(
            f"task {self._task_id} was cancelled ({reason})", task_id=self._task_id, reason=reason
        )

    def raise_if_cancelled(self) -> None:
        """Raise :class:`TaskCancelled` (or :class:`TaskTimeout`) if the task should stop."""
        if self._reason is not None:
            raise self.error()

    def sleep(self, seconds: float) -> bool:
        """Sleep up to ``seconds`` of real time; return True early if cancelled."""
        with self._lock:
            if self._reason is not None:
                return True
            if self._event is None:
                self._event = threading.Event()
            event = self._event
        return event.wait(seconds)

    def cancel(self, reason: CancelReason) -> bool:
        """Set the token (first reason wins); return True if this call set it."""
        with self._lock:
            if self._reason is not None:
                return False
            self._reason = reason
            event, callbacks = self._event, list(self._callbacks)
        if event is not None:
            event.set()
        for callback in callbacks:
            callback()
        return True

    def on_cancel(self, callback: Callable[[], None]) -> Callable[[], None]:
        """Call ``callback()`` when the token is set (now, if it is); return a remover."""
        with self._lock:
            if self._reason is None:
                self._callbacks.append(callback)
                return lambda: self._remove(callback)
        callback()
        return lambda: None

    def _remove(self, callback: Callable[[], None]) -> None:
        with self._lock:
            if callback in self._callbacks:
                self._callbacks.remove(callback)


@dataclass(frozen=True, slots=True)
class TaskContext:
    """What a running task can learn about itself through :func:`current`."""

    task_id: str
    attempt: int
    """1 for the first attempt, 2 for the first retry, ..."""
    token: CancelToken
    schedule_id: str | None = None
    nominal_time: datetime | None = None
    """For a recurring run: the occurrence it is for (not when it started)."""
    job_id: str | None = None
    """In durable mode: the job row this run is an attempt of."""

    @property
    def cancelled(self) -> bool:
        """Whether the task has been asked to stop."""
        return self.token.cancelled

    def raise_if_cancelled(self) -> None:
        """Raise :class:`TaskCancelled` (or :class:`TaskTimeout`) if the task should stop."""
        self.token.raise_if_cancelled()


_current: contextvars.ContextVar[tuple[TaskHandle[Any], int, CancelToken]] = contextvars.ContextVar(
    "dibs_task"
)
current_job: contextvars.ContextVar[str | None] = contextvars.ContextVar("dibs_job", default=None)
job_context: contextvars.ContextVar[TaskContext | None] = contextvars.ContextVar(
    "dibs_async_job", default=None
)
"""The context of an ``async def`` durable attempt, set inside its own asyncio task."""


def current() -> TaskContext:
    """Return the context of the task running in this thread or coroutine.

    Raises :class:`NotInTask` when called outside a task.
    """
    context = job_context.get()
    if context is not None:
        return context
    try:
        handle, attempt, token = _current.get()
    except LookupError:
        raise NotInTask("dibs.tasks.current() called outside a running task") from None
    return TaskContext(
        task_id=handle.id,
        attempt=attempt,
        token=token,
        schedule_id=handle._schedule_id,
        nominal_time=handle.nominal_time,
        job_id=current_job.get(),
    )


class TaskHandle(Generic[T]):
    """The caller's view of one submitted task (or one run of a schedule).

    Its state changes under its own lock; the engine's lock is never taken
    while this one is held (order: engine, then handle).
    """

    __slots__ = (
        "_args",
        "_attempts",
        "_backoff",
        "_cancel_requested",
        "_cond",
        "_engine",
        "_exception",
        "_fn",
        "_heap_seq",
        "_key",
        "_kwargs",
        "_nominal",
        "_result",
        "_retries",
        "_schedule_id",
        "_state",
        "_timed_out",
        "_timeout",
        "_token",
        "_traceback",
        "id",
    )

    def __init__(
        self,
        engine: Canceller,
        task_id: str,
        fn: Callable[..., Any],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        *,
        key: str | None = None,
        retries: int = 0,
        backoff: Backoff,
        timeout: float | None = None,
        schedule_id: str | None = None,
        nominal: float | None = None,
        state: TaskStatus = TaskStatus.SCHEDULED,
    ) -> None:
        self.id = task_id
        self._engine = engine
        self._fn = fn
        self._args = args
        self._kwargs = kwargs
        self._key = key
        self._retries = retries
        self._backoff = backoff
        self._timeout = timeout
        self._schedule_id = schedule_id
        self._nominal = nominal
        # Guards everything below. Condition() makes its own RLock, far cheaper
        # to set up than wrapping a plain Lock (which costs three AttributeErrors).
        self._cond = threading.Condition()
        self._state = state
        self._attempts = 0
        self._heap_seq = -1
        self._token: CancelToken | None = None
        self._cancel_requested = False
        self._timed_out = 0
        self._result: Any = None
        self._exception: BaseException | None = None
        self._traceback: str | None = None

    def __repr__(self) -> str:
        return f"<TaskHandle {self.id} {self._state}>"

    @property
    def status(self) -> TaskStatus:
        """Where the task is now (a snapshot)."""
        return self._state

    @property
    def key(self) -> str | None:
        """The de-duplication key it was submitted with."""
        return self._key

    @property
    def attempts(self) -> int:
        """How many attempts have started so far."""
        return self._attempts

    @property
    def schedule_id(self) -> str | None:
        """The schedule this run belongs to, or None for a one-off task."""
        return self._schedule_id

    @property
    def nominal_time(self) -> datetime | None:
        """For a recurring run, the occurrence it is for (aware UTC)."""
        return None if self._nominal is None else datetime.fromtimestamp(self._nominal, UTC)

    @property
    def traceback(self) -> str | None:
        """The formatted traceback of the last failure, or None."""
        return self._traceback

    def done(self) -> bool:
        """Whether the task has finished (done, failed or cancelled)."""
        return self._state in _FINISHED

    def cancel(self) -> bool:
        """Cancel the task: a pending one never runs; a running one is asked to stop.

        Returns False if the task had already finished. A running task stops
        only when it checks its token (or, for a coroutine, at its next await);
        if it completes anyway, it is recorded as done.
        """
        return self._engine.cancel(self, CancelReason.CANCELLED)

    def wait(self, timeout: float | None = None) -> bool:
        """Block until the task finishes or ``timeout`` seconds pass; return whether it finished."""
        with self._cond:
            return self._cond.wait_for(self.done, timeout)

    def result(self, timeout: float | None = None) -> T:
        """Wait for the task and return its result, or raise what it raised.

        Raises :class:`TaskCancelled` if it was cancelled, :class:`TaskTimeout`
        if its last attempt timed out, the task's own exception if it failed,
        and :class:`WaitTimeout` if it did not finish within ``timeout`` seconds.
        """
        self._wait_or_raise(timeout)
        if self._exception is not None:
            raise self._exception
        return self._result  # type: ignore[no-any-return]

    def exception(self, timeout: float | None = None) -> BaseException | None:
        """Wait for the task and return the exception it failed with, or None if it succeeded.

        Raises :class:`TaskCancelled` if it was cancelled and :class:`WaitTimeout`
        as :meth:`result` does.
        """
        self._wait_or_raise(timeout)
        if self._state is TaskStatus.CANCELLED:
            assert self._exception is not None
            raise self._exception
        return self._exception

    def _wait_or_raise(self, timeout: float | None) -> None:
        if not self.wait(timeout):
            raise WaitTimeout(
                f"task {self.id} did not finish within {timeout}s",
                task_id=self.id,
                timeout=timeout,
            )
