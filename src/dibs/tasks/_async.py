"""The async lane: ``async def`` durable jobs run as tasks on one event loop, not a thread each.

One daemon thread runs the loop; every attempt of an async task is an
:class:`asyncio.Task` on it, so a processor runs ``async_workers`` of them at
once with no thread per job. Cancellation is real: the attempt's token (set by
:meth:`TaskProcessor.cancel`, a lost lease, the timeout or the shutdown
deadline) cancels the task, and :class:`asyncio.CancelledError` is thrown in
at its next ``await``. Recording the outcome takes blocking store calls, so it
runs on a small pool of finisher threads, never on the loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import traceback
from collections.abc import Callable, Coroutine
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from dibs.tasks._errors import CancelReason, ProcessorClosed, TaskCancelled
from dibs.tasks._handle import CancelToken, TaskContext, job_context
from dibs.tasks._worker import Outcome, OutcomeKind

__all__ = ["AsyncLane"]

FINISHERS = 4
"""Threads that record async outcomes; each recording is a few store round trips."""


class AsyncLane:
    """Runs coroutine attempts on one event loop thread, at most ``slots`` at a time."""

    def __init__(self, name: str, slots: int) -> None:
        self.slots = slots
        self._name = name
        self._lock = threading.Lock()  # guards _loop, _thread, _active and _closed
        self._idle = threading.Condition(self._lock)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._active = 0
        self._closed = False
        self._finishers = ThreadPoolExecutor(FINISHERS, thread_name_prefix=f"{name}-finish")

    @property
    def free(self) -> int:
        """Attempts this lane can start now."""
        with self._lock:
            return 0 if self._closed else self.slots - self._active

    def start(
        self,
        fn: Callable[..., Coroutine[Any, Any, Any]],
        args: list[Any],
        kwargs: dict[str, Any],
        context: TaskContext,
        timeout: float | None,
        finish: Callable[[Outcome], None],
    ) -> None:
        """Run ``fn(*args, **kwargs)`` on the loop; then call ``finish(outcome)`` on a finisher.

        ``finish`` is called exactly once, whatever the attempt does. Raises
        :class:`ProcessorClosed` once the lane is closed (and calls nothing).
        """
        with self._lock:
            if self._closed:
                raise ProcessorClosed("the async lane is closed; it starts no new attempt")
            self._active += 1
            loop = self._ensure_loop()

        def finished(outcome: Outcome) -> None:
            try:
                finish(outcome)
            finally:
                with self._idle:
                    self._active -= 1
                    self._idle.notify_all()

        async def attempt() -> None:
            outcome = await _attempt(fn, args, kwargs, context, timeout)
            # Store calls block: record on a finisher thread, off the loop.
            self._finishers.submit(finished, outcome)

        asyncio.run_coroutine_threadsafe(attempt(), loop)

    def wait_idle(self, timeout: float | None) -> bool:
        """Wait until no attempt is running or being recorded; False if ``timeout`` passed."""
        with self._idle:
            return self._idle.wait_for(lambda: self._active == 0, timeout)

    def close(self) -> None:
        """Stop the loop and the finishers (after :meth:`wait_idle`)."""
        with self._lock:
            self._closed = True
            loop, thread = self._loop, self._thread
        if loop is not None and thread is not None:
            loop.call_soon_threadsafe(loop.stop)
            thread.join()
            loop.close()
        self._finishers.shutdown(wait=True)

    def _ensure_loop(self) -> asyncio.AbstractEventLoop:
        # Called with self._lock held.
        if self._loop is None:
            loop = asyncio.new_event_loop()
            ready = threading.Event()

            def run() -> None:
                asyncio.set_event_loop(loop)
                loop.call_soon(ready.set)
                loop.run_forever()

            self._thread = threading.Thread(target=run, name=f"{self._name}-loop", daemon=True)
            self._thread.start()
            ready.wait()
            self._loop = loop
        return self._loop


async def _attempt(
    fn: Callable[..., Coroutine[Any, Any, Any]],
    args: list[Any],
    kwargs: dict[str, Any],
    context: TaskContext,
    timeout: float | None,
) -> Outcome:
    """One attempt as an outcome; never raises (except for the loop's own shutdown)."""
    loop = asyncio.get_running_loop()
    task = asyncio.current_task()
    assert task is not None
    token: CancelToken = context.token

    def cancel_soon() -> None:
        # RuntimeError: the loop is closed, so the attempt is long over.
        with contextlib.suppress(RuntimeError):
            loop.call_soon_threadsafe(task.cancel)

    # This task runs in its own copy of the context: current() sees this attempt only.
    job_context.set(context)
    remove = token.on_cancel(cancel_soon)
    timer = None
    if timeout is not None:
        timer = loop.call_later(timeout, token.cancel, CancelReason.TIMEOUT)
    try:
        return Outcome(OutcomeKind.OK, value=await fn(*args, **kwargs))
    except TaskCancelled as exc:
        return Outcome(OutcomeKind.CANCELLED, error=exc, traceback=_text(exc))
    except asyncio.CancelledError:
        error = token.error()
        kind = OutcomeKind.FAILED if token.reason is CancelReason.TIMEOUT else OutcomeKind.CANCELLED
        return Outcome(kind, error=error, traceback=_text(error))
    except BaseException as exc:
        # Anything an attempt raises, even SystemExit, ends the attempt, never the loop.
        return Outcome(OutcomeKind.FAILED, error=exc, traceback=_text(exc))
    finally:
        remove()
        if timer is not None:
            timer.cancel()


def _text(exc: BaseException) -> str:
    return "".join(traceback.format_exception(exc))
