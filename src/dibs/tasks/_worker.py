"""Running one attempt of a task: plain functions in the worker thread, coroutines on its loop."""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import enum
import traceback
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from dibs.tasks._errors import CancelReason, TaskCancelled
from dibs.tasks._handle import CancelToken, TaskHandle, _current

__all__ = ["LoopRunner", "Outcome", "OutcomeKind", "execute"]


class OutcomeKind(enum.Enum):
    OK = "ok"
    FAILED = "failed"
    CANCELLED = "cancelled"


@dataclass(slots=True)
class Outcome:
    """What one attempt did: returned ``value``, or raised ``error`` (with its traceback text)."""

    kind: OutcomeKind
    value: Any = None
    error: BaseException | None = None
    traceback: str | None = None


class LoopRunner:
    """One event loop per worker thread, made on first use, for coroutine tasks."""

    def __init__(self) -> None:
        self._runner: asyncio.Runner | None = None

    def run(self, awaitable: Awaitable[Any], token: CancelToken) -> Any:
        """Run ``awaitable`` to completion; the token cancels it at its next await."""
        if self._runner is None:
            self._runner = asyncio.Runner()
        # The task sees this thread's context, where current() was just set.
        return self._runner.run(_drive(awaitable, token), context=contextvars.copy_context())

    def close(self) -> None:
        if self._runner is not None:
            self._runner.close()
            self._runner = None


async def _drive(awaitable: Awaitable[Any], token: CancelToken) -> Any:
    task = asyncio.current_task()
    loop = asyncio.get_running_loop()
    assert task is not None

    def cancel_soon() -> None:
        # RuntimeError: the worker's loop is already closed, so the task is long over.
        with contextlib.suppress(RuntimeError):
            loop.call_soon_threadsafe(task.cancel)

    remove = token.on_cancel(cancel_soon)
    try:
        return await awaitable
    finally:
        remove()


def execute(handle: TaskHandle[Any], attempt: int, token: CancelToken, loop: LoopRunner) -> Outcome:
    """Run one attempt of ``handle``'s function and say how it ended; never raises."""
    # current() builds its TaskContext from this on demand: most tasks never ask.
    reset = _current.set((handle, attempt, token))
    fn: Callable[..., Any] = handle._fn
    try:
        value = fn(*handle._args, **handle._kwargs)
        if asyncio.iscoroutine(value) or isinstance(value, asyncio.Future):
            value = loop.run(value, token)
        return Outcome(OutcomeKind.OK, value=value)
    except TaskCancelled as exc:
        return Outcome(OutcomeKind.CANCELLED, error=exc)
    except asyncio.CancelledError:
        if token.reason is CancelReason.TIMEOUT:
            return Outcome(OutcomeKind.FAILED, error=token.error())
        return Outcome(OutcomeKind.CANCELLED, error=token.error())
    except BaseException as exc:
        # Anything a task raises, even SystemExit, ends the attempt, never the worker.
        text = "".join(traceback.format_exception(exc))
        return Outcome(OutcomeKind.FAILED, error=exc, traceback=text)
    finally:
        _current.reset(reset)
