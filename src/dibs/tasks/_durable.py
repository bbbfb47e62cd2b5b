"""Durable mode: jobs are rows, an attempt is a lease on its row, completion is fenced.

A worker takes due jobs with :meth:`JobTable.take`: one statement that picks
them (``FOR UPDATE SKIP LOCKED`` on PostgreSQL, so concurrent workers get
different jobs) and starts each with a new fence and a lease on its row. A
heartbeat extends the leases (:meth:`JobTable.extend`, one statement for all
of this process's jobs, which also reports cancel requests); a worker that
crashes or stops stops extending, its lease lapses on the store's clock, and
:meth:`JobTable.reclaim` (run by every worker process each ``lease / 3``)
makes the job pending for attempt n + 1 — the lost attempt counts toward
``max_attempts``, so a job that kills its worker is not retried forever. To
finish, the worker records its outcome with :meth:`JobTable.finish`, one
statement conditional on its fence that also ends the lease: a worker whose
lease was taken over changes nothing, so every attempt is recorded at most once
and a job completes exactly once. Finished attempts hold nothing.

So a job costs three statements, each its own transaction: the enqueue, the
take, the finish.

Cancelling a pending job ends it; a running one has ``cancel_requested`` set
on its row, which its worker reads at its next heartbeat and passes on to the
task's token. Recurring schedules are evaluated against a watermark in the job
table (:mod:`._durable_schedules`): one job per occurrence and, through the
fenced finish above, one completed run — with no leader.
"""

from __future__ import annotations

import json
import logging
import os
import random
import secrets
import socket
import threading
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from dibs.exceptions import DibsError, InvalidInput
from dibs.stores.base import Store
from dibs.tasks._durable_schedules import DurableSchedule
from dibs.tasks._errors import CancelReason, TaskCancelled, UnknownTask
from dibs.tasks._handle import Backoff, TaskHandle, current, current_job
from dibs.tasks._jobs import Job, job_table

__all__ = ["DurableRunner", "JobRecord", "RegisteredTask", "encode_payload"]

log = logging.getLogger("dibs.tasks")

MAX_LOST = 3
"""Attempts a job may lose to crashed or stalled workers, on top of its retries.

A job that kills every worker that runs it (a poison pill) fails after this
many takeovers instead of being retried forever.
"""


def encode_payload(args: tuple[Any, ...], kwargs: dict[str, Any]) -> str:
    """A durable task's arguments as stored: JSON ``[args, kwargs]``.

    Raises :class:`~dibs.InvalidInput` for arguments JSON cannot hold.
    """
    try:
        return json.dumps([list(args), kwargs])
    except TypeError as exc:
        raise InvalidInput(
            f"durable task arguments must be JSON: {exc}", field="args", value=args
        ) from None


@dataclass(frozen=True, slots=True)
class RegisteredTask:
    """A function registered by name so that any process with the same code can run it."""

    name: str
    fn: Callable[..., Any]
    retries: int
    backoff: Backoff
    timeout: float | None


@dataclass(frozen=True, slots=True)
class JobRecord:
    """A snapshot of one durable job, as :meth:`TaskProcessor.job` returns it."""

    id: str
    name: str
    state: str
    """``pending``, ``running``, ``done``, ``failed`` or ``cancelled``."""
    attempt: int
    max_attempts: int
    run_at: datetime
    result: Any
    """The JSON-decoded return value once done."""
    error: str | None
    """The last failure's traceback text."""
    schedule_id: str | None


@dataclass(slots=True)
class _Running:
    job: Job  # as taken: its fence is this attempt's
    handle: TaskHandle[Any] | None = None
    lost: bool = False


@dataclass(slots=True)
class _Outcome:
    """One attempt's outcome to record."""

    running: _Running
    kind: str
    outcome: str
    delay: float | None
    done: threading.Event
    state: str | None = None
    error: DibsError | None = None
    refilled: bool = False  # the same transaction took jobs for the slots it freed


class DurableRunner:
    """Takes due jobs from the job table, runs them on the local engine, records them."""

    def __init__(
        self,
        store: Store,
        submit: Callable[..., TaskHandle[Any]],
        workers: int,
        lease: float,
        poll: float,
        rng: random.Random,
        take_jobs: bool,
    ) -> None:
        self.store = store
        self.jobs = job_table(store)
        self._submit = submit
        self._slots = workers
        self.lease = lease
        self.poll = poll
        self.max_lost = MAX_LOST
        self.queues: Sequence[str] | None = None
        """The queues this process takes jobs from; None: every queue."""
        self._rng = rng
        self.holder = f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(3)}"
        self.tasks: dict[str, RegisteredTask] = {}
        self.schedules: dict[str, DurableSchedule] = {}
        self._lock = threading.Lock()  # guards _running, _reserved, _taking, _stopping, _woken
        self._wake = threading.Condition(self._lock)
        self._running: dict[tuple[str, int | None], _Running] = {}  # by (job ID, fence)
        self._taking = take_jobs  # False once shutdown began: no new jobs
        self._stopping = False  # True once the local work has drained: no more heartbeats
        self._woken = True  # a wake-up came since the poller last looked: look again
        self._reserved = 0  # slots being filled by a take in flight
        self._record_lock = threading.Lock()  # guards _to_record and _recording
        self._to_record: list[_Outcome] = []
        self._recording = False  # a worker thread is recording outcomes for all
        self._threads = [
            threading.Thread(target=self._poll_loop, name="dibs-tasks-poller", daemon=True),
            threading.Thread(target=self._heartbeat_loop, name="dibs-tasks-heartbeat", daemon=True),
        ]
        # Listening first: a job added between the first take and the listen is not missed.
        self._unlisten = self.jobs.listen(self._notify) if take_jobs else (lambda: None)
        for thread in self._threads:
            thread.start()

    def _notify(self) -> None:
        with self._wake:
            self._woken = True
            self._wake.notify_all()  # the poller and the heartbeat both wait on it

    # --- enqueueing -----------------------------------------------------------------------

    def enqueue(
        self,
        task: RegisteredTask,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        *,
        job_id: str,
        run_at: float | None,
        key: str | None = None,
    ) -> str:
        """Add a job row; return its ID, or that of the live job holding ``key``.

        ``run_at`` None: due now on the store's clock, read by the insert itself.
        """
        payload = encode_payload(args, kwargs)
        return self.jobs.add(self.new_job(task, payload, job_id, run_at, key=key))

    def new_job(
        self, task: RegisteredTask, payload: str, job_id: str, run_at: float | None, *,
        key: str | None = None, schedule_id: str | None = None,
    ) -> Job:  # fmt: skip
        """A pending row for the first attempt of ``task``."""
        return Job(
            id=job_id, name=task.name, args=payload, run_at=run_at, attempt=1,
            max_attempts=task.retries + 1 + self.max_lost, state="pending",
            schedule_id=schedule_id, retries=task.retries, key=key,
        )  # fmt: skip

    def evaluate(self, schedule: DurableSchedule) -> int:
        """Turn ``schedule``'s due occurrences into jobs, per its policy; return how many."""
        now = self.store.now().timestamp()
        added = self.jobs.advance(
            schedule.id, lambda watermark, live: schedule.decide(now, watermark, live)
        )
        return len(added)

    def cancel(self, job_id: str) -> bool:
        """Cancel a pending job, or ask a running one to stop; False if it had finished."""
        if not self.jobs.cancel(job_id):
            return False
        with self._lock:
            here = [r for (i, _), r in self._running.items() if i == job_id]
        for running in here:
            if running.handle is not None:
                running.handle.cancel()  # running here: no need to wait for a heartbeat
        return True

    def record(self, job_id: str) -> JobRecord | None:
        job = self.jobs.get(job_id)
        if job is None:
            return None
        done = job.state == "done"
        assert job.run_at is not None  # a stored row always has one
        return JobRecord(
            id=job.id, name=job.name, state=job.state, attempt=job.attempt,
            max_attempts=job.max_attempts, run_at=datetime.fromtimestamp(job.run_at, UTC),
            result=json.loads(job.outcome) if done and job.outcome is not None else None,
            error=job.outcome if job.outcome_kind == "error" else None,
            schedule_id=job.schedule_id,
        )  # fmt: skip

    def stop_taking(self) -> None:
        """Take no new jobs; keep heartbeating the running ones."""
        with self._wake:
            self._taking = False
            self._wake.notify_all()
        self._threads[0].join()

    def stop(self) -> None:
        """Stop heartbeating (after the running jobs have finished or been abandoned)."""
        with self._wake:
            self._taking = False
            self._stopping = True
            self._wake.notify_all()
        for thread in self._threads:
            thread.join()
        self._unlisten()
        self.jobs.close()

    # --- taking jobs ----------------------------------------------------------------------

    def _poll_loop(self) -> None:
        while True:
            with self._wake:
                while self._taking and not self._woken:
                    # Woken by an add (this process, NOTIFY, or the SQLite watcher) or
                    # a free slot; the timeout is the fallback poll.
                    if not self._wake.wait(self.poll):
                        break
                if not self._taking:
                    return
                self._woken = False
                free = self._slots - len(self._running)
            if free <= 0:
                continue  # a finishing job sets _woken
            try:
                took = self._take_some(free)
            except DibsError:
                log.exception("taking durable jobs failed; trying again")
                took = 0
            if took == free:
                with self._wake:
                    self._woken = True  # there may be more: look again once a slot frees

    def _take_some(self, free: int) -> int:
        with self._lock:
            free = max(min(free, self._slots - len(self._running) - self._reserved), 0)
            self._reserved += free
        try:
            if free <= 0:
                return 0
            # Linearization point: the take's UPDATE gives each job to one worker.
            taken = self.jobs.take(
                self.queues, free, self.lease, self.holder, names=list(self.tasks)
            )
            self._start(taken)
        finally:
            with self._lock:
                self._reserved -= free
        return len(taken)

    def _start(self, taken: list[Job]) -> None:
        """Run jobs just taken on the local engine."""
        for job in taken:
            running = _Running(job)
            with self._lock:
                self._running[job.id, job.fence] = running
            task = self.tasks.get(job.name)
            running.handle = self._submit(
                self._run, running, timeout=None if task is None else task.timeout
            )

    # --- running and finishing ------------------------------------------------------------

    def _run(self, running: _Running) -> None:
        job = running.job
        refilled = False  # whether recording the outcome also filled the slots it freed
        try:
            task = self.tasks.get(job.name)
            if task is None:
                raise UnknownTask(f"no task named {job.name!r} is registered", name=job.name)
            args, kwargs = json.loads(job.args)
            reset = current_job.set(job.id)
            try:
                value = task.fn(*args, **kwargs)
                kind, outcome = "ok", json.dumps(value)
            except Exception as exc:
                token = current().token
                if token.cancelled and (running.lost or token.reason is CancelReason.SHUTDOWN):
                    # Our lease is gone, or this process is stopping: the attempt is
                    # left unrecorded, and the job is reclaimed once its lease lapses.
                    return
                if token.reason is CancelReason.CANCELLED and isinstance(exc, TaskCancelled):
                    kind, outcome = "cancelled", "".join(traceback.format_exception(exc))
                else:
                    kind, outcome = "error", "".join(traceback.format_exception(exc))
            finally:
                current_job.reset(reset)
            refilled = self._complete(running, kind, outcome)
        finally:
            with self._wake:
                self._running.pop((job.id, job.fence), None)
                if not refilled:
                    self._woken = True  # a slot is free: the poller fills it
                self._wake.notify_all()  # the poller and the heartbeat both wait on it

    def _complete(self, running: _Running, kind: str, outcome: str) -> bool:
        """Record the attempt; return whether its slot was refilled in the same transaction."""
        job = running.job
        assert job.fence is not None  # taken rows always have one
        delay: float | None = None
        task = self.tasks.get(job.name)
        if kind == "error" and task is not None and task.retries > 0:
            delay = task.backoff.delay(job.attempt, self._rng)
        # Completion is this fenced statement: a worker whose lease was taken over
        # changes nothing.
        item = _Outcome(running, kind, outcome, delay, threading.Event())
        state = self._record(item)
        if state is None:
            log.warning("job %s attempt %d lost its lease; result dropped", job.id, job.attempt)
            return item.refilled
        schedule = self.schedules.get(job.schedule_id or "")
        if schedule is not None:
            self.evaluate(schedule)  # a slot is free: occurrences held back may start
        return item.refilled

    def _record(self, item: _Outcome) -> str | None:
        """Record an outcome and refill the slots it frees, in one transaction.

        The worker threads that finish while a recording is in flight queue their
        outcomes; the first of them then records all of them in one statement
        (:meth:`JobTable.finish_and_take`), taking jobs for every slot they free in
        the same transaction, and goes on until none is left. The others wait
        for theirs, as they would have waited for the write lock: under load one
        transaction records several jobs.
        """
        with self._record_lock:
            self._to_record.append(item)
            lead = not self._recording
            self._recording = True
        while lead:
            with self._record_lock:
                batch, self._to_record = self._to_record, []
                if not batch:
                    self._recording = False
                    break
            self._record_batch(batch)
        item.done.wait()
        if item.error is not None:
            raise item.error
        return item.state

    def _record_batch(self, batch: list[_Outcome]) -> None:
        with self._lock:
            free = self._slots - len(self._running) - self._reserved + len(batch)
            free = max(free, 0) if self._taking else 0
            self._reserved += free  # so that the poller does not overfill
        items = [
            (b.running.job.id, b.running.job.fence or 0, b.kind, b.outcome, b.delay) for b in batch
        ]
        try:
            states, taken = self.jobs.finish_and_take(
                items, self.queues, free, self.lease, self.holder, names=list(self.tasks)
            )
            self._start(taken)
            for waiting, state in zip(batch, states, strict=True):
                waiting.state, waiting.refilled = state, free > 0
        except DibsError as exc:
            for waiting in batch:
                waiting.error = exc
        finally:
            with self._lock:
                self._reserved -= free
            for waiting in batch:
                waiting.done.set()

    # --- heartbeats -----------------------------------------------------------------------

    def _heartbeat_loop(self) -> None:
        while True:
            beat = time.monotonic() + self.lease / 3
            with self._wake:
                # The condition is shared with the poller: sleep out the whole beat.
                while not self._stopping and (left := beat - time.monotonic()) > 0:
                    self._wake.wait(left)
                if self._stopping:
                    return
                running = list(self._running.values())
                taking = self._taking
            if taking:
                try:
                    self.jobs.reclaim()  # other processes' lapsed leases
                except DibsError:
                    log.exception("reclaiming lapsed jobs failed")
            if not running:
                continue
            held = [(item.job.id, item.job.fence) for item in running if item.job.fence]
            try:
                alive = self.jobs.extend(held, self.lease)
            except DibsError:
                log.exception("heartbeat for %d jobs failed", len(held))
                continue
            for item in running:
                pair = (item.job.id, item.job.fence or 0)
                if pair not in alive:
                    with self._lock:
                        if (item.job.id, item.job.fence) not in self._running:
                            continue  # finished meanwhile: nothing was lost
                    item.lost = True
                if (item.lost or alive.get(pair)) and item.handle is not None:
                    item.handle.cancel()  # cooperative: the task sees its token set
