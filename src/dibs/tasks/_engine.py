"""The machinery under TaskProcessor: one scheduler thread, a min-heap, a ready queue, N workers.

Locks (the order is engine, then handle; a handle's lock is never held while
taking the engine's):

* ``Engine.lock`` guards the heap, the live, key and schedule tables, the
  counters and the closing state. ``changed`` (the scheduler waits on it) and
  ``idle`` (join and shutdown wait on it) are conditions on it.
* ``TaskHandle._cond`` guards one task's state. Every state change of a task
  happens under it, so a cancel racing a dispatch, a timeout or a finish has
  exactly one winner.
* The ready queue (``queue.SimpleQueue``) locks itself and never calls back.

Heap entries are ``(due, seq, kind, object, attempt)``; ``seq`` breaks ties in
submission order and keeps objects out of comparisons. Nothing is removed from
the heap early: cancelling or re-arming makes an entry stale (its handle's or
schedule's ``heap_seq`` moves on, or its state changes) and the scheduler drops
stale entries as they surface; :meth:`Engine._compact` bounds the garbage.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import queue
import random
import threading
from typing import Any

from dibs._clock import Clock
from dibs.tasks._errors import CancelReason, TaskCancelled
from dibs.tasks._handle import CancelToken, TaskHandle, TaskStatus
from dibs.tasks._options import describe
from dibs.tasks._schedules import ScheduleState
from dibs.tasks._time import Alarm
from dibs.tasks._worker import LoopRunner, Outcome, OutcomeKind, execute

__all__ = ["Engine"]

log = logging.getLogger("dibs.tasks")
RUN, TIMEOUT, FIRE, DEADLINE = range(4)
COMPACT_MIN = 256
Entry = tuple[float, int, int, Any, int]


class Engine:
    """Runs handles when due on worker threads; fires schedules; enforces timeouts and deadlines."""

    def __init__(
        self, workers: int, clock: Clock | None, rng: random.Random | None, name: str
    ) -> None:
        self.lock = threading.Lock()
        self.changed = threading.Condition(self.lock)
        self.idle = threading.Condition(self.lock)
        self.alarm = Alarm(clock, self.changed)
        self._rng = rng if rng is not None else random.Random()
        self._heap: list[Entry] = []
        self._seq = itertools.count()
        self._dead = 0  # stale heap entries, roughly; compaction recounts
        self._ready: queue.SimpleQueue[TaskHandle[Any] | None] = queue.SimpleQueue()
        self.live: dict[str, TaskHandle[Any]] = {}  # every unfinished handle
        self.keys: dict[str, TaskHandle[Any]] = {}
        self.schedules: dict[str, ScheduleState] = {}
        self._busy = 0  # handles queued or running: a worker holds or will hold them
        self.abandoned = 0  # timed-out attempts whose thread has not returned yet
        self._joiners = 0
        self.closing = False
        self._deadline: float | None = None
        self.deadline_passed = False
        self.finished = False
        self._scheduler = threading.Thread(
            target=self._schedule_loop, name=f"{name}-scheduler", daemon=True
        )
        # Daemon threads: a task that ignores its token must not keep the
        # interpreter alive after shutdown's deadline has passed.
        self.workers = [
            threading.Thread(target=self._work, name=f"{name}-worker-{i}", daemon=True)
            for i in range(workers)
        ]
        self._scheduler.start()
        for thread in self.workers:
            thread.start()

    # --- called with self.lock held -------------------------------------------------------

    def add(self, handle: TaskHandle[Any], due: float | None) -> None:
        """Track a new handle and queue it now (``due`` None or past) or at ``due``."""
        self.live[handle.id] = handle
        if due is None or due <= self.alarm.now():
            self._enqueue(handle)
        else:
            self._push(due, RUN, handle)

    def add_schedule(self, state: ScheduleState) -> None:
        self.schedules[state.id] = state
        self._arm(state)

    def remove_schedule(self, schedule_id: str) -> bool:
        state = self.schedules.pop(schedule_id, None)
        if state is None:
            return False
        state.live = False
        state.backlog.clear()
        self._dead += 1
        return True

    def close(self, deadline: float | None) -> None:
        """Stop schedules and new work; cancel what is left at ``deadline``."""
        if not self.closing:
            self.closing = True
            for state in self.schedules.values():
                state.live = False
            self.schedules.clear()
        if deadline is not None and (self._deadline is None or deadline < self._deadline):
            self._deadline = deadline
            self._push(deadline, DEADLINE, None)
        self.changed.notify_all()

    def is_idle(self) -> bool:
        if self.finished:
            return True
        if self._busy:
            return False
        return not self._heap or self._heap[0][0] > self.alarm.now()

    def wait_idle(self, timeout: float | None) -> bool:
        self._joiners += 1
        try:
            return self.idle.wait_for(self.is_idle, timeout)
        finally:
            self._joiners -= 1

    def _push(self, due: float, kind: int, obj: Any, attempt: int = 0) -> None:
        seq = next(self._seq)
        if kind == RUN:
            obj._heap_seq = seq
        elif kind == FIRE:
            obj.heap_seq = seq
        heapq.heappush(self._heap, (due, seq, kind, obj, attempt))
        if self._heap[0][1] == seq:
            self.changed.notify()  # a new earliest due time: the scheduler must re-arm

    def _enqueue(self, handle: TaskHandle[Any]) -> None:
        handle._state = TaskStatus.QUEUED
        self._busy += 1
        self._ready.put(handle)

    def _arm(self, state: ScheduleState) -> None:
        if state.live and state.cursor is not None:
            if state.heap_seq != -1:
                self._dead += 1
            self._push(state.cursor, FIRE, state)

    def _fire(self, state: ScheduleState, now: float) -> None:
        cursor = state.cursor
        for nominal in state.take_due(now):
            handle: TaskHandle[Any] = TaskHandle(
                self, state.new_run_id(), state.fn, state.args, state.kwargs,
                retries=state.retries, backoff=state.backoff, timeout=state.timeout,
                schedule_id=state.id, nominal=nominal,
            )  # fmt: skip
            self.live[handle.id] = handle
            state.running += 1
            state.runs += 1
            self._enqueue(handle)
        if state.cursor != cursor:
            self._arm(state)

    def _resolved(self, handle: TaskHandle[Any]) -> None:
        """Bookkeeping once ``handle`` has finished for good."""
        self.live.pop(handle.id, None)
        if handle._key is not None and self.keys.get(handle._key) is handle:
            del self.keys[handle._key]
        if self.closing and not self.live:
            self.changed.notify()

    def _released(self, handle: TaskHandle[Any]) -> None:
        """Bookkeeping once no worker holds or will hold ``handle`` (for now)."""
        self._busy -= 1
        if handle._schedule_id is not None:
            state = self.schedules.get(handle._schedule_id)
            if state is not None:
                state.running -= 1
                if state.backlog:
                    self._fire(state, self.alarm.now())
        if self._busy == 0 and self._joiners:
            self.idle.notify_all()

    def _cancel_rest(self) -> None:
        """Shutdown deadline: cancel every unfinished task."""
        self.deadline_passed = True
        for handle in list(self.live.values()):
            self.cancel(handle, CancelReason.SHUTDOWN, locked=True)
        self._heap.clear()

    def _compact(self) -> None:
        """Drop stale entries once they are most of the heap: amortized O(1) per cancel."""
        if self._dead < COMPACT_MIN or self._dead * 2 < len(self._heap):
            return
        self._heap = [entry for entry in self._heap if self._is_live(entry)]
        heapq.heapify(self._heap)
        self._dead = 0

    def _is_live(self, entry: Entry) -> bool:
        _, seq, kind, obj, attempt = entry
        if kind == RUN:
            with obj._cond:
                return bool(obj._heap_seq == seq and obj._state is TaskStatus.SCHEDULED)
        if kind == TIMEOUT:
            with obj._cond:
                return bool(obj._state is TaskStatus.RUNNING and obj._attempts == attempt)
        if kind == FIRE:
            return bool(obj.live and obj.heap_seq == seq)
        return True

    # --- the scheduler thread -------------------------------------------------------------

    def _schedule_loop(self) -> None:
        with self.lock:
            while True:
                now = self.alarm.now()
                while self._heap and self._heap[0][0] <= now:
                    _, seq, kind, obj, attempt = heapq.heappop(self._heap)
                    self._dispatch(kind, seq, obj, attempt, now)
                self._compact()
                if self._joiners:
                    self.idle.notify_all()
                if self.closing and (self.deadline_passed or not self.live):
                    break
                self.alarm.wait(self._heap[0][0] if self._heap else None)
            for _ in self.workers:
                self._ready.put(None)
            self.alarm.close()
            self.finished = True
            self.idle.notify_all()

    def _dispatch(self, kind: int, seq: int, obj: Any, attempt: int, now: float) -> None:
        if kind == RUN:
            with obj._cond:
                live = obj._heap_seq == seq and obj._state is TaskStatus.SCHEDULED
                if live:
                    obj._state = TaskStatus.QUEUED
            if live:
                self._busy += 1
                self._ready.put(obj)
                return
        elif kind == TIMEOUT:
            if self._time_out(obj, attempt):
                return
        elif kind == FIRE:
            if obj.live and obj.heap_seq == seq:
                obj.heap_seq = -1
                self._fire(obj, now)
                return
        else:
            self._cancel_rest()
            return
        self._dead = max(0, self._dead - 1)

    def _time_out(self, handle: TaskHandle[Any], attempt: int) -> bool:
        """End ``attempt`` of ``handle`` for running too long; False if it already ended."""
        with handle._cond:
            if handle._state is not TaskStatus.RUNNING or handle._attempts != attempt:
                return False
            handle._timed_out = attempt
            token = handle._token
            assert token is not None
            token.cancel(CancelReason.TIMEOUT)
            final = attempt > handle._retries or self.deadline_passed
            if final:
                # The thread cannot be stopped; the caller learns the outcome now
                # and the attempt's eventual result is discarded.
                handle._state = TaskStatus.FAILED
                handle._exception = token.error()
                handle._cond.notify_all()
        if final:
            self.abandoned += 1
            self._resolved(handle)
            log.error("task %s (%s) timed out", handle.id, describe(handle._fn))
        return True

    # --- worker threads -------------------------------------------------------------------

    def _work(self) -> None:
        loop = LoopRunner()
        try:
            while True:
                handle = self._ready.get()
                if handle is None:
                    return
                with handle._cond:
                    if handle._state is not TaskStatus.QUEUED:
                        continue  # cancelled while queued; the canceller did the bookkeeping
                    handle._state = TaskStatus.RUNNING
                    handle._attempts += 1
                    attempt = handle._attempts
                    token = handle._token = CancelToken(handle.id, handle._timeout)
                if handle._timeout is not None:
                    with self.lock:
                        self._push(self.alarm.now() + handle._timeout, TIMEOUT, handle, attempt)
                outcome = execute(handle, attempt, token, loop)
                self._finish(handle, attempt, token, outcome)
        finally:
            loop.close()

    def _finish(
        self, handle: TaskHandle[Any], attempt: int, token: CancelToken, outcome: Outcome
    ) -> None:
        retry = False
        with handle._cond:
            current = handle._state is TaskStatus.RUNNING and handle._attempts == attempt
            if current:
                kind, error = outcome.kind, outcome.error
                if handle._timed_out == attempt:
                    kind, error = OutcomeKind.FAILED, token.error()
                if kind is OutcomeKind.OK:
                    handle._state = TaskStatus.DONE
                    handle._result = outcome.value
                    handle._exception = handle._traceback = None  # from an earlier attempt
                elif kind is OutcomeKind.CANCELLED:
                    handle._state = TaskStatus.CANCELLED
                    handle._exception = error
                else:
                    handle._exception = error
                    handle._traceback = outcome.traceback
                    retry = (
                        isinstance(error, Exception)
                        and attempt <= handle._retries
                        and not handle._cancel_requested
                    )
                    handle._state = TaskStatus.SCHEDULED if retry else TaskStatus.FAILED
                if not retry:
                    handle._cond.notify_all()
        delay: float | None = None
        with self.lock:
            if not current:
                self.abandoned -= 1
            elif retry:
                delay = self._retry(handle, attempt)
            else:
                self._resolved(handle)
            self._released(handle)
        if delay is not None:
            log.warning(
                "task %s (%s) attempt %d failed (%r); retrying in %.3gs",
                handle.id, describe(handle._fn), attempt, handle._exception, delay,
            )  # fmt: skip
        elif current and handle._state is TaskStatus.FAILED:
            log.error(
                "task %s (%s) failed after %d attempt(s)",
                handle.id, describe(handle._fn), attempt, exc_info=handle._exception,
            )  # fmt: skip

    def _retry(self, handle: TaskHandle[Any], attempt: int) -> float | None:
        """Schedule the next attempt after a backoff; return the delay, or None if it cannot be."""
        delay = handle._backoff.delay(attempt, self._rng)
        with handle._cond:
            if handle._state is not TaskStatus.SCHEDULED or handle._attempts != attempt:
                return None  # cancelled in between; the canceller did the bookkeeping
            if not self.deadline_passed:
                self._push(self.alarm.now() + delay, RUN, handle)
                return delay
            handle._state = TaskStatus.FAILED
            handle._cond.notify_all()
        self._resolved(handle)
        return None

    # --- cancellation (any thread) --------------------------------------------------------

    def cancel(
        self, handle: TaskHandle[Any], reason: CancelReason, *, locked: bool = False
    ) -> bool:
        """Cancel ``handle``; ``locked`` says the caller holds ``self.lock``."""
        token: CancelToken | None = None
        with handle._cond:
            was = handle._state
            if was is TaskStatus.SCHEDULED or was is TaskStatus.QUEUED:
                handle._state = TaskStatus.CANCELLED
                handle._exception = TaskCancelled(
                    f"task {handle.id} was cancelled ({reason})", task_id=handle.id, reason=reason
                )
                handle._cond.notify_all()
            elif was is TaskStatus.RUNNING:
                handle._cancel_requested = True
                token = handle._token
            else:
                return False
        if token is not None:
            token.cancel(reason)
            return True
        if not locked:
            with self.lock:
                self._cancelled(handle, was)
        else:
            self._cancelled(handle, was)
        return True

    def _cancelled(self, handle: TaskHandle[Any], was: TaskStatus) -> None:
        if was is TaskStatus.QUEUED:
            self._released(handle)  # the worker that pops it will skip it
        else:
            self._dead += 1
            self._compact()
        self._resolved(handle)
