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

import inspect
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
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any

from dibs.exceptions import DibsError, InvalidInput, StoreClosed, StoreUnavailable
from dibs.ratelimit import Rate, RateLimit
from dibs.stores.base import Store
from dibs.tasks._async import AsyncLane
from dibs.tasks._durable_schedules import DurableSchedule
from dibs.tasks._errors import CancelReason, TaskCancelled, UnknownTask
from dibs.tasks._handle import (
    Backoff,
    CancelToken,
    TaskContext,
    TaskHandle,
    current,
    current_job,
    job_context,
)
from dibs.tasks._jobs import Job, job_table
from dibs.tasks._locks import BadConcurrencyKey, Concurrency, LockKeys
from dibs.tasks._options import check_id
from dibs.tasks._unique import Unique
from dibs.tasks._worker import Outcome, OutcomeKind

__all__ = ["DurableRunner", "RegisteredTask", "encode_payload"]

log = logging.getLogger("dibs.tasks")

MAX_LOST = 3
"""Attempts a job may lose to crashed or stalled workers, on top of its retries.

A job that kills every worker that runs it (a poison pill) fails after this
many takeovers instead of being retried forever.
"""
SPREAD = 0.25
"""A deferred job is due again after its delay and up to this share of it more (at least
up to a poll more), at random."""
RATE_LIMITS_KEPT = 1024
"""Rate limit handles kept per process (by key and rate) before they are dropped."""


def encode_payload(args: tuple[Any, ...], kwargs: dict[str, Any]) -> str:
    """A durable task's arguments as stored: JSON ``[args, kwargs]``.

    Raises :class:`~dibs.InvalidInput` (``field="args"`` or ``"kwargs"``) for
    arguments that JSON cannot hold as they are: no JSON type (a set, an
    object), a cycle, nesting too deep, an int past Python's int-to-str
    digit limit, NaN or an infinity (not JSON), or a dict key that is not a
    str (JSON would turn ``1`` into ``"1"``, and ``{1: ..., "1": ...}`` into
    duplicate keys).
    """
    try:
        return _to_json([list(args), kwargs])
    except _UNENCODABLE as exc:
        # Which part: the whole failed, so at most one more encode, on the error path only.
        value: object = args
        field = "args"
        try:
            _to_json(list(args))
        except _UNENCODABLE:
            pass
        else:
            field, value = "kwargs", kwargs
        raise InvalidInput(
            f"durable task {field} must be JSON: {_reason(exc)}", field=field, value=value
        ) from None


_UNENCODABLE = (TypeError, ValueError, RecursionError)
"""What ``json.dumps`` raises for a value it cannot encode (ValueError: a cycle, NaN, an
int past the int-to-str digit limit; RecursionError: nesting deeper than the stack)."""


def _to_json(value: object) -> str:
    """``value`` as strict JSON; raises one of :data:`_UNENCODABLE` where it cannot be."""
    text = json.dumps(value, allow_nan=False)
    # json.dumps turns int, float, bool and None keys into strings: the task would get
    # other keys than it was given. Encoded, the value has no cycle: this walk ends.
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            for key, child in item.items():
                if not isinstance(key, str):
                    raise TypeError(f"dict keys must be str, got {type(key).__name__}")
                stack.append(child)
        elif isinstance(item, list | tuple):
            stack.extend(item)
    return text


def _reason(exc: BaseException) -> str:
    """Why encoding failed, in words (never a repr of the value: a huge int has none)."""
    if isinstance(exc, RecursionError):
        return "nested too deeply"
    return str(exc)


@dataclass(frozen=True, slots=True)
class RegisteredTask:
    """A function registered by name so that any process with the same code can run it."""

    name: str
    fn: Callable[..., Any]
    retries: int
    backoff: Backoff
    timeout: float | None
    concurrency: Concurrency | None = None
    """At most this many running attempts per concurrency key, on every worker together."""
    rate: Rate | None = None
    """At most this many of its attempts start per window (on every process), or None."""
    rate_key: str | Callable[..., str] | None = None
    """The key of its rate limit: a name, a function of the job's arguments, or None
    (the task's name)."""
    unique: Unique | None = None
    """At most one of its jobs per key (see :class:`~dibs.tasks.Unique`), or None."""
    is_async: bool = field(init=False)
    """Whether its attempts run on the processor's event loop (an ``async def``); read
    per job, so worked out once."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "is_async", inspect.iscoroutinefunction(self.fn))


@dataclass(slots=True)
class _Running:
    job: Job  # as taken: its fence is this attempt's
    handle: TaskHandle[Any] | None = None
    token: CancelToken | None = None  # an async attempt's; a thread attempt's is its handle's
    lost: bool = False
    error: Exception | None = None  # the attempt fails with this instead of running the task

    def cancel(self) -> None:
        """Ask the attempt to stop (cooperatively in a thread, at its next await on the loop)."""
        if self.handle is not None:
            self.handle.cancel()
        elif self.token is not None:
            self.token.cancel(CancelReason.CANCELLED)


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
        async_workers: int = 100,
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
        self.lane = AsyncLane("dibs-tasks-async", async_workers)
        self.locks = LockKeys(store, self.holder, lease)
        # By (key, rate): plain dict steps; two threads may make one twice, harmlessly.
        self._rate_limits: dict[tuple[str, Rate], RateLimit] = {}
        self.tasks: dict[str, RegisteredTask] = {}
        """By name; add through :meth:`register`."""
        self._lane_names: dict[bool, tuple[int, list[str]]] = {}  # by lane: (version, names)
        self._tasks_version = 0
        self.schedules: dict[str, DurableSchedule] = {}
        self._lock = threading.Lock()  # guards _running, _reserved, _taking, _stopping, _woken
        self._wake = threading.Condition(self._lock)  # the poller waits on it
        # The heartbeat waits on a condition of its own, woken only to stop: sharing the
        # poller's woke it at every wake-up (each commit seen, each slot freed).
        self._beat = threading.Condition(self._lock)
        self._running: dict[tuple[str, int | None], _Running] = {}  # by (job ID, fence)
        self._taking = take_jobs  # False once shutdown began: no new jobs
        self._stopping = False  # True once the local work has drained: no more heartbeats
        self._woken = True  # a wake-up came since the poller last looked: look again
        self._reserved = {False: 0, True: 0}  # per lane (async?): slots a take in flight fills
        # Per lane: a wake-up found the lane's free slots reserved by a refill in flight,
        # whose take may have read the table before the job that woke us was committed.
        # The refill looks again when it ends (else that job waits for the next poll).
        self._deferred = {False: False, True: False}
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
            self._wake.notify_all()

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
            running.cancel()  # running here: no need to wait for a heartbeat
        return True

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
            self._beat.notify_all()
        for thread in self._threads:
            thread.join()
        self._unlisten()
        self.lane.close()
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
                lanes = [(is_async, self._free(is_async)) for is_async in (False, True)]
                for is_async, free in lanes:
                    self._defer(is_async, free)
            full = False
            # Two lanes: plain functions on the worker threads, async def on the event loop.
            for is_async, free in lanes:
                names = self._names(is_async)
                if free <= 0 or not names:
                    continue  # a finishing job sets _woken
                try:
                    full |= self._take_some(free, names, is_async) == free
                except StoreClosed:
                    # Not a passing fault: trying again every poll would only fill the log.
                    log.error("the store was closed under this processor: it takes no more jobs")
                    return
                except DibsError:
                    log.exception("taking durable jobs failed; trying again")
            if full:
                with self._wake:
                    self._woken = True  # there may be more: look again once a slot frees

    def _free(self, is_async: bool, finishing: int = 0) -> int:
        """Slots of a lane that no attempt holds and no take in flight fills (under _lock).

        ``finishing``: attempts of that lane whose outcome is being recorded; they
        still hold their slots, which the same transaction refills.
        """
        if not self._taking:
            return 0
        slots = self.lane.slots if is_async else self._slots
        running = sum(1 for r in self._running.values() if (r.token is not None) is is_async)
        return max(slots - running - self._reserved[is_async] + finishing, 0)

    def _defer(self, is_async: bool, free: int) -> None:
        """Under _lock: a wake-up the lane cannot act on while a refill holds its slots."""
        if free <= 0 and self._reserved[is_async] > 0:
            self._deferred[is_async] = True

    def register(self, task: RegisteredTask) -> None:
        """Run jobs named ``task.name`` with it (replacing an earlier one of that name)."""
        self.tasks[task.name] = task
        self._tasks_version += 1  # after the task is in: a reader of the new version sees it
        # Its jobs may be due already: look now, not at the next poll (a processor's tasks
        # are registered after it starts, so its first jobs waited up to `poll` for it).
        self._notify()

    def _names(self, is_async: bool) -> list[str]:
        """The registered task names a lane runs (read per job, so kept until a register)."""
        version = self._tasks_version  # before reading the tasks: a register after it shows
        cached = self._lane_names.get(is_async)
        if cached is not None and cached[0] == version:
            return cached[1]
        names = [task.name for task in list(self.tasks.values()) if task.is_async is is_async]
        self._lane_names[is_async] = (version, names)
        return names

    def _take_some(self, free: int, names: list[str], is_async: bool = False) -> int:
        with self._lock:
            free = min(free, self._free(is_async))
            self._defer(is_async, free)
            self._reserved[is_async] += free
        try:
            if free <= 0:
                return 0
            # Linearization point: the take's UPDATE gives each job to one worker.
            taken = self.jobs.take(self.queues, free, self.lease, self.holder, names=names)
            return self._start(taken)
        finally:
            with self._lock:
                self._reserved[is_async] -= free

    def _start(self, taken: list[Job]) -> int:
        """Run jobs just taken on the local engine; return how many started.

        A job whose lock key another attempt holds goes back, uncounted.
        """
        started = 0
        for job in taken:
            error: Exception | None = None
            try:
                if not self._lock_key(job):
                    continue
            except BadConcurrencyKey as bad:
                error = bad.error  # the attempt runs only to fail with it, holding nothing
            task = self.tasks.get(job.name)
            rated = error is None and task is not None and task.rate is not None
            try:
                if rated and task is not None and not self._rate_allows(task, job):
                    continue
            except BadConcurrencyKey as bad:
                error = bad.error  # a rate key the task's function cannot make: fail the attempt
            running = _Running(job, error=error)
            if task is not None and task.is_async:
                # Before it is listed: _free tells the lanes apart by the token.
                running.token = CancelToken(job.id, task.timeout)
            with self._lock:
                self._running[job.id, job.fence] = running
            try:
                if task is not None and task.is_async:
                    self._start_async(task, running)
                else:
                    running.handle = self._submit(
                        self._run, running, timeout=None if task is None else task.timeout
                    )
            except DibsError:
                # Shutdown began after the take (a refill in flight): give it back uncounted
                # rather than leave it to lapse and be counted as a lost attempt.
                self._give_back(job)
                continue
            started += 1
        return started

    def _give_back(self, job: Job, delay: float | None = None) -> None:
        """Forget a taken job that will not run here and put it back, uncounted; never raises.

        With ``delay``, it is due again only that many seconds from now.
        """
        assert job.fence is not None  # taken rows always have one
        with self._lock:
            self._running.pop((job.id, job.fence), None)
        self.locks.release((job.id, job.fence))
        try:
            if delay is None:
                self.jobs.put_back(job.id, job.fence)
            else:
                self.jobs.put_back(job.id, job.fence, delay=delay)
        except DibsError:
            # Its lease lapses and reclaim() makes it pending again (counted as lost).
            log.exception("putting job %s back failed", job.id)

    def _rate_allows(self, task: RegisteredTask, job: Job) -> bool:
        """Admit one attempt of ``task`` under its rate; else defer the job until it may start.

        The limit is ``dibs.RateLimit(store, rate_key or task name, rate)``, shared with
        every process and with any other caller of that key and rate. A refused job
        goes back uncounted (it is deferred, not failed), due ``retry_after`` from now.
        """
        assert task.rate is not None
        try:
            # The task's own function, on the job's arguments: anything may come out.
            key = (_rate_key(task, job), task.rate)
            limit = self._rate_limits.get(key)
            if limit is None:
                if len(self._rate_limits) >= RATE_LIMITS_KEPT:
                    self._rate_limits.clear()  # handles are cheap; a key per customer is not
                limit = self._rate_limits[key] = RateLimit(self.store, *key)
        except Exception as exc:
            raise BadConcurrencyKey(exc) from exc
        if self._closing():
            # Shutting down: the job would be put back after its unit is spent.
            self._give_back(job)
            return False
        try:
            decision = limit.acquire()
        except DibsError:
            log.exception("asking the rate limit of job %s failed; deferring it", job.id)
            self._give_back(job, delay=self._spread(self.poll))
            return False
        if decision:
            return True
        self._give_back(job, delay=self._spread(decision.retry_after))
        return False

    def _closing(self) -> bool:
        with self._lock:
            return not self._taking

    def _spread(self, delay: float) -> float:
        """``delay`` and a random part of it (at least of a poll): jobs a rate limit or a
        concurrency limit deferred together must not all come due together, to be taken
        and put back together again."""
        return delay + self._rng.uniform(0, max(self.poll, delay * SPREAD))

    def _lock_key(self, job: Job) -> bool:
        """Claim a taken job's lock key; if another attempt holds it, put the job back uncounted.

        Raises :class:`BadConcurrencyKey` when the job's concurrency key cannot be
        made (its attempt then fails with the error: putting it back would take it
        again at every poll, for ever).
        """
        task = self.tasks.get(job.name)
        try:
            if self.locks.acquire(job, None if task is None else task.concurrency):
                return True
        except DibsError:
            log.exception("claiming the lock key or permit of job %s failed; put back", job.id)
        # Deferred as a rate limit's refusals are, a poll and a random part of one: jobs
        # of a key at its limit, put back together, must not all come due together only
        # to be taken and put back together again at every poll. On the store's clock,
        # so a FakeClock's test advances it for them (docs/tasks.md).
        self._give_back(job, delay=self._spread(self.poll))
        return False

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
            # The run sees its schedule and occurrence, as an in-process run does.
            occurrence = job_context.set(
                replace(current(), schedule_id=job.schedule_id, nominal_time=_nominal(job))
            )
            try:
                if running.error is not None:
                    raise running.error
                recorded = _recorded(running, current().token, task.fn(*args, **kwargs), None)
            except Exception as exc:
                recorded = _recorded(running, current().token, None, exc)
            finally:
                job_context.reset(occurrence)
                current_job.reset(reset)
            # The attempt has returned: the next job of its lock key may start.
            self.locks.release((job.id, job.fence))
            if recorded is not None:
                refilled = self._complete(running, *recorded)
        finally:
            self._ran(running, refilled)

    def _ran(self, running: _Running, refilled: bool) -> None:
        """The attempt's slot is free (``refilled``: taken again by its recording's transaction)."""
        job = running.job
        self.locks.release((job.id, job.fence))  # if the attempt raised before releasing
        with self._wake:
            self._running.pop((job.id, job.fence), None)
            if not refilled:
                self._woken = True  # a slot is free: the poller fills it
            self._wake.notify_all()

    def _start_async(self, task: RegisteredTask, running: _Running) -> None:
        """Run an ``async def`` attempt on the lane's loop; record it on a finisher thread."""
        job = running.job
        token = running.token
        assert token is not None  # set by _start
        context = TaskContext(
            task_id=job.id, attempt=job.attempt, token=token,
            schedule_id=job.schedule_id, nominal_time=_nominal(job), job_id=job.id,
        )  # fmt: skip

        def finish(outcome: Outcome) -> None:
            refilled = False
            try:
                self.locks.release((job.id, job.fence))
                if outcome.kind is OutcomeKind.OK:
                    recorded = _recorded(running, token, outcome.value, None)
                else:
                    assert outcome.error is not None
                    recorded = _recorded(running, token, None, outcome.error)
                if recorded is not None:
                    # As a thread attempt's: batched, refilling in the same transaction.
                    refilled = self._complete(running, *recorded)
            except DibsError:
                # As for a worker that died: the lease lapses and reclaim() retries it.
                log.exception("recording job %s attempt %d failed", job.id, job.attempt)
            finally:
                self._ran(running, refilled)

        fn: Callable[..., Any] = task.fn
        try:
            if running.error is not None:
                raise running.error
            args, kwargs = json.loads(job.args)
        except Exception as exc:
            # Failed on the lane like any attempt: finishing here could be inside a
            # recording transaction's refill, which would then wait for itself.
            error = exc

            async def undecodable() -> None:
                raise error

            fn, args, kwargs = undecodable, [], {}
        self.lane.start(fn, args, kwargs, context, task.timeout, finish)

    def wait_idle(self, timeout: float | None) -> bool:
        """Wait until no async attempt is running; False if ``timeout`` real seconds passed."""
        return self.lane.wait_idle(timeout)

    def cancel_async(self, reason: CancelReason) -> None:
        """Set the token of every running async attempt (the shutdown deadline passed)."""
        with self._lock:
            tokens = [r.token for r in self._running.values() if r.token is not None]
        for token in tokens:
            token.cancel(reason)

    def _complete(self, running: _Running, kind: str, outcome: str) -> bool:
        """Record the attempt; return whether its slot was refilled in the same transaction."""
        job = running.job
        assert job.fence is not None  # taken rows always have one
        delay: float | None = None
        task = self.tasks.get(job.name)
        if kind == "error" and task is not None and task.retries > 0:
            delay = task.backoff.delay(job.attempt, self._rng)
        schedule = self.schedules.get(job.schedule_id or "")
        if schedule is not None and schedule.rules.skip:
            # Skip what came due while the run executed, before its job stops being
            # live: a tick that lagged must not take those for missed occurrences.
            try:
                self.evaluate(schedule)
            except StoreUnavailable:  # the outcome matters more; a tick evaluates later
                log.warning("schedule %s: not evaluated before its run ended", schedule.id)
        # Completion is this fenced statement: a worker whose lease was taken over
        # changes nothing.
        item = _Outcome(running, kind, outcome, delay, threading.Event())
        state = self._record(item)
        if state is None:
            log.warning("job %s attempt %d lost its lease; result dropped", job.id, job.attempt)
            return item.refilled
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
        transaction records several jobs. The leader gathers its batch once it holds
        the table's write turn (:meth:`JobTable.turn`): on SQLite with several
        processes the turn comes round after the others' transactions, and every
        outcome queued meanwhile goes in the same one.
        """
        with self._record_lock:
            self._to_record.append(item)
            lead = not self._recording
            self._recording = True
        while lead:
            with self._record_lock:
                if not self._to_record:
                    self._recording = False
                    break
            # Only the leader takes from the queue: once the turn is held it is not empty.
            self._record_batch()
        item.done.wait()
        if item.error is not None:
            raise item.error
        return item.state

    def _record_batch(self) -> None:
        # The transaction refills one lane: the worker threads' if any outcome
        # in the batch freed one of theirs, else the event loop's. The other
        # lane's freed slots are left to the poller (their outcomes' refilled
        # stays False, which wakes it).
        batch: list[_Outcome] = []
        is_async, free = False, 0
        try:
            with self.jobs.turn():
                with self._record_lock:
                    batch, self._to_record = self._to_record, []
                is_async = all(b.running.token is not None for b in batch)
                names = self._names(is_async)
                with self._lock:
                    finishing = sum(1 for b in batch if (b.running.token is not None) is is_async)
                    free = self._free(is_async, finishing) if names else 0
                    self._reserved[is_async] += free  # so that the poller does not overfill
                items = [
                    (b.running.job.id, b.running.job.fence or 0, b.kind, b.outcome, b.delay)
                    for b in batch
                ]
                states, taken = self.jobs.finish_and_take(
                    items, self.queues, free, self.lease, self.holder, names=names
                )
            self._start(taken)  # after the turn: a put-back must not hold up the others
            for waiting, state in zip(batch, states, strict=True):
                waiting.state = state
                waiting.refilled = free > 0 and (waiting.running.token is not None) is is_async
        except Exception as exc:
            if not batch:  # the turn itself failed (the lock file): fail what is queued
                with self._record_lock:
                    batch, self._to_record = self._to_record, []
            error = exc if isinstance(exc, DibsError) else StoreUnavailable(f"job table: {exc}")
            for waiting in batch:
                waiting.error = error
        finally:
            with self._wake:
                self._reserved[is_async] -= free
                if self._deferred[is_async]:
                    # A wake-up came while this transaction held the slots: its take may
                    # have missed the job (read before its commit). The poller looks again.
                    self._deferred[is_async] = False
                    self._woken = True
                    self._wake.notify_all()
            for waiting in batch:
                waiting.done.set()

    # --- heartbeats -----------------------------------------------------------------------

    def _heartbeat_loop(self) -> None:
        while True:
            beat = time.monotonic() + self.lease / 3
            with self._beat:
                while not self._stopping and (left := beat - time.monotonic()) > 0:
                    self._beat.wait(left)
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
            # A lost lock key hold is a lost attempt: another job of its key may run now.
            unlocked = self.locks.extend([(item.job.id, item.job.fence) for item in running])
            for item in running:
                pair = (item.job.id, item.job.fence or 0)
                if pair not in alive or (item.job.id, item.job.fence) in unlocked:
                    with self._lock:
                        if (item.job.id, item.job.fence) not in self._running:
                            continue  # finished meanwhile: nothing was lost
                    item.lost = True
                if item.lost or alive.get(pair):
                    item.cancel()  # cooperative: the task sees its token set


def _recorded(
    running: _Running, token: CancelToken, value: Any, exc: BaseException | None
) -> tuple[str, str] | None:
    """What an attempt that returned ``value`` or raised ``exc`` records, or None for nothing."""
    if exc is None:
        try:
            # Strict, as arguments are: NaN, an infinity or an int key would be stored
            # as something other than what the task returned (and NaN is not JSON).
            return "ok", _to_json(value)
        except _UNENCODABLE as error:  # too deep a result must fail its attempt, not the worker
            exc = error
    if token.cancelled and (running.lost or token.reason is CancelReason.SHUTDOWN):
        # Our lease is gone, or this process is stopping: the attempt is left
        # unrecorded, and the job is reclaimed once its lease lapses.
        return None
    text = "".join(traceback.format_exception(exc))
    if token.reason is CancelReason.CANCELLED and isinstance(exc, TaskCancelled):
        return "cancelled", text
    return "error", text


def _rate_key(task: RegisteredTask, job: Job) -> str:
    """The rate limit key of ``job``: its task's ``rate_key`` (a name, or a function of the
    job's arguments) or the task's name."""
    if task.rate_key is None:
        return task.name
    if isinstance(task.rate_key, str):
        return task.rate_key
    args, kwargs = json.loads(job.args)
    return check_id(task.rate_key(*args, **kwargs), "rate_key")


def _nominal(job: Job) -> datetime | None:
    """A schedule occurrence's nominal time, from its job ID ``"{schedule}@{iso instant}"``."""
    if job.schedule_id is None:
        return None
    try:
        return datetime.fromisoformat(job.id.rsplit("@", 1)[1])
    except (IndexError, ValueError):
        return None
