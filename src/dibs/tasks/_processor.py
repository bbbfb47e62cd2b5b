"""TaskProcessor: the public face of dibs.tasks; it checks input and hands work to the engine."""

from __future__ import annotations

import itertools
import json
import os
import random
import secrets
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import replace
from types import TracebackType
from typing import Any, Self, TypeVar

from dibs._clock import Clock
from dibs._model import shown
from dibs.exceptions import InvalidInput
from dibs.limits import NAME_MAX_BYTES
from dibs.ratelimit import Rate
from dibs.stores.base import Store
from dibs.stores.jobs import DEFAULT_QUEUE, FINISHED_STATES, LIVE_STATES
from dibs.tasks._durable import DurableRunner, RegisteredTask, encode_payload
from dibs.tasks._durable_schedules import DurableSchedule, schedule_lock_key
from dibs.tasks._engine import Engine
from dibs.tasks._enqueue import Adding, Call, check_unique
from dibs.tasks._errors import (
    CancelReason,
    JobFailed,
    JobNotFound,
    ProcessorClosed,
    TaskCancelled,
    WaitTimeout,
)
from dibs.tasks._handle import Backoff, TaskHandle
from dibs.tasks._jobs import Job
from dibs.tasks._options import (
    check_fn,
    check_id,
    check_limit,
    concurrency_option,
    task_options,
)
from dibs.tasks._records import JobOptions, JobRecord, to_record
from dibs.tasks._schedules import Misfire, Policy, Schedule, ScheduleState, policy
from dibs.tasks._time import to_epoch, to_seconds
from dibs.tasks._triggers import CronTrigger, EveryTrigger, Trigger, zone
from dibs.tasks._unique import Inserted, Unique

__all__ = ["TaskProcessor"]

R = TypeVar("R")
DEFAULT_BACKOFF = Backoff()
"""Retry n waits up to min(300, 2**(n-1)) seconds, uniformly at random."""
WAIT_CHUNK = 5.0
"""Real seconds one read of the job table waits for a job to finish (waits loop over it)."""
SWEEP_TASK = "dibs.sweep"
"""The built-in durable task (and schedule ID) that runs the store's sweeper."""
"""Catch up once: one run, for the latest missed occurrence, however late."""


class TaskProcessor:
    """Runs functions now, later, on an interval or on cron, on ``workers`` threads.

    Use it as a context manager: leaving the block shuts it down and waits for
    the work already submitted. ``clock`` is for tests (a
    :class:`~dibs.FakeClock`, whose ``advance`` wakes the scheduler); ``rng`` drives backoff jitter.

    Durable mode: with ``store``, registered tasks (:meth:`task`) can be
    enqueued as job rows that any process with the same registrations runs.
    ``lease`` is the seconds a worker's hold on a job lasts between
    heartbeats (a crashed worker's job is taken over after at most that);
    ``poll`` is how often the job table is read for jobs other processes
    added (on PostgreSQL a fallback: LISTEN/NOTIFY wakes workers at once);
    ``take_jobs=False`` makes an enqueue-only client. Durable tasks defined
    with ``async def`` run as tasks on one event loop thread, up to
    ``async_workers`` at once, next to the ``workers`` threads that run the
    others. ``queues`` names the queues this processor takes jobs from (None:
    the JSON list in ``$DIBS_QUEUES``, which ``dibs worker --queue`` sets,
    else every queue). A processor that takes
    jobs also runs the store's sweeper as the durable schedule ``dibs.sweep``
    every ``sweep_every`` seconds (None: not from this process). Raises
    :class:`~dibs.InvalidInput` for a bad argument.
    """

    def __init__(
        self,
        workers: int = 4,
        *,
        clock: Clock | None = None,
        rng: random.Random | None = None,
        name: str = "dibs-tasks",
        store: Store | None = None,
        lease: float = 30.0,
        poll: float = 0.5,
        take_jobs: bool = True,
        sweep_every: float | None = 60.0,
        async_workers: int = 100,
        queues: Iterable[str] | None = None,
    ) -> None:
        for field, count, most in (
            ("workers", workers, WORKERS_MAX), ("async_workers", async_workers, ASYNC_WORKERS_MAX)
        ):  # fmt: skip
            # A thread each (workers), or a take's row limit (async): bounded, not a MemoryError.
            if isinstance(count, bool) or not isinstance(count, int) or not 1 <= count <= most:
                raise InvalidInput(f"{field} must be an int from 1 to {most}, got {shown(count)}",
                                   field=field, value=count)  # fmt: skip
        # Every check before the first thread starts: a refused option must leave none behind.
        lease_s, poll_s = to_seconds(lease, "lease"), to_seconds(poll, "poll")
        sweep_s = None if sweep_every is None else to_seconds(sweep_every, "sweep_every")
        if queues is None and os.environ.get(QUEUES_ENV):
            self._queues: list[str] | None = _check_queues(_queues_from_env(os.environ[QUEUES_ENV]))
        else:
            self._queues = None if queues is None else _check_queues(queues)
        if store is not None and not isinstance(store, Store):
            raise InvalidInput("store must be a dibs Store", field="store", value=store)
        self._engine = Engine(workers, clock, rng, name)
        self._prefix = secrets.token_hex(3)
        self._ids = itertools.count(1)
        self._durable: DurableRunner | None = None
        self._job_options: dict[str, JobOptions] = {}
        self._adding = Adding(
            self._require_store, self._registered, self._job_options, self._check_open_now
        )
        if store is not None:
            try:
                self._durable = DurableRunner(
                    store, self.submit, workers, lease_s, poll_s,
                    rng if rng is not None else random.Random(), take_jobs, async_workers,
                )  # fmt: skip
                self._durable.queues = self._queues
                if take_jobs and sweep_s is not None:
                    self._add_sweeper(sweep_s)
            except BaseException:
                self.shutdown(timeout=0)  # a store without a job table, closed, unreachable...
                raise

    @property
    def clock(self) -> Clock:
        """The clock due times are read on."""
        return self._engine.alarm.clock

    @property
    def store(self) -> Store | None:
        """The store of durable mode, or None for an in-process processor."""
        return None if self._durable is None else self._durable.store

    def submit(
        self,
        fn: Callable[..., R],
        /,
        *args: Any,
        at: object = None,
        delay: object = None,
        key: str | None = None,
        retries: int = 0,
        backoff: Backoff | float = DEFAULT_BACKOFF,
        timeout: float | None = None,
        **kwargs: Any,
    ) -> TaskHandle[R]:
        """Run ``fn(*args, **kwargs)`` now, at ``at`` (aware datetime or epoch), or after ``delay``.

        With ``key``, a second submit while a task with that key is unfinished
        returns the first task's handle. A failed attempt is retried up to
        ``retries`` times after an exponential ``backoff`` with full jitter;
        ``timeout`` (seconds) bounds each attempt. Coroutine functions run on
        the worker's event loop. Raises :class:`~dibs.InvalidInput` for bad
        arguments and :class:`ProcessorClosed` once shutdown has begun.
        """
        check_fn(fn)
        retries, backoff, timeout = task_options(retries, backoff, timeout)
        if key is not None:
            check_id(key, "key")
        if at is not None and delay is not None:
            raise InvalidInput("give at= or delay=, not both", field="delay", value=delay)
        engine = self._engine
        due: float | None = None
        if at is not None:
            due = to_epoch(at, "at")
        elif delay is not None:
            due = engine.alarm.now() + to_seconds(delay, "delay", allow_zero=True)
        with engine.lock:
            self._check_open()
            if key is not None:
                first = engine.keys.get(key)
                if first is not None and not first.done():
                    return first
            handle: TaskHandle[R] = TaskHandle(
                engine, f"t-{self._prefix}-{next(self._ids)}", fn, args, kwargs,
                key=key, retries=retries, backoff=backoff, timeout=timeout,
            )  # fmt: skip
            if key is not None:
                engine.keys[key] = handle
            engine.add(handle, due)
        return handle

    def every(
        self,
        interval: object,
        fn: Callable[..., Any] | str,
        /,
        *args: Any,
        start: object = None,
        id: str | None = None,
        misfire: Misfire | None = None,
        max_running: int | None = None,
        overlap: str | None = None,
        catch_up: str | None = None,
        max_catch_up: int | None = None,
        retries: int = 0,
        backoff: Backoff | float = DEFAULT_BACKOFF,
        timeout: float | None = None,
        **kwargs: Any,
    ) -> Schedule:
        """Run ``fn`` at ``start + k * interval`` (default start: one interval from now).

        Occurrences are computed from ``start``, never from when a run
        finished, so they do not drift; those before now are not run. For a
        durable task, ``start`` defaults to the Unix epoch so that every
        process computes the same occurrences. ``overlap``, ``catch_up`` and
        ``max_catch_up`` (or the older ``misfire`` and ``max_running``, not
        both) say what overlaps and what catches up: see :class:`Policy`.
        ``interval`` is seconds or a timedelta. Raises
        :class:`~dibs.InvalidInput` for bad arguments or an ``id`` in use.
        """
        seconds = to_seconds(interval, "interval", least=INTERVAL_MIN)
        if start is None and self._durable is not None:
            start = 0.0  # durable: every process must agree on the occurrences
        anchor = self._engine.alarm.now() + seconds if start is None else to_epoch(start, "start")
        return self._add_schedule(
            EveryTrigger(seconds, anchor), fn, args, kwargs,
            id, policy(misfire, max_running, overlap, catch_up, max_catch_up),
            retries, backoff, timeout,
        )  # fmt: skip

    def cron(
        self,
        expr: str,
        fn: Callable[..., Any] | str,
        /,
        *args: Any,
        tz: object = "UTC",
        id: str | None = None,
        misfire: Misfire | None = None,
        max_running: int | None = None,
        overlap: str | None = None,
        catch_up: str | None = None,
        max_catch_up: int | None = None,
        retries: int = 0,
        backoff: Backoff | float = DEFAULT_BACKOFF,
        timeout: float | None = None,
        **kwargs: Any,
    ) -> Schedule:
        """Run ``fn`` at the wall-clock times of cron ``expr`` in IANA zone ``tz`` (default UTC).

        A local time skipped by a DST change runs once, at the first instant
        after the gap; a local time repeated by one runs once, the first time.
        ``overlap``, ``catch_up``, ``max_catch_up``, ``misfire`` and
        ``max_running`` are as for :meth:`every`. Raises
        :class:`~dibs.InvalidInput` for a bad expression, zone or argument, or
        an ``id`` in use.
        """
        return self._add_schedule(
            CronTrigger(expr, zone(tz)), fn, args, kwargs,
            id, policy(misfire, max_running, overlap, catch_up, max_catch_up),
            retries, backoff, timeout,
        )  # fmt: skip

    # --- durable mode -----------------------------------------------------------------------

    def task(
        self,
        name: str | None = None,
        *,
        retries: int = 0,
        backoff: Backoff | float = DEFAULT_BACKOFF,
        timeout: float | None = None,
        queue: str = DEFAULT_QUEUE,
        priority: int = 0,
        lock_key: str | None = None,
        retention: float | None = None,
        concurrency: int | None = None,
        concurrency_key: str | Callable[..., str] | None = None,
        rate: str | Rate | None = None,
        rate_key: str | Callable[..., str] | None = None,
        unique: Unique | None = None,
    ) -> Callable[[Callable[..., R]], Callable[..., R]]:
        """Register a function by ``name`` (default: module and qualified name) for durable jobs.

        Every process that registers the same name can run its jobs. ``queue``,
        ``priority``, ``lock_key`` and ``retention`` are the defaults of its
        jobs (see :meth:`enqueue`). An ``async def`` function runs on the
        processor's event loop. ``concurrency=N`` runs at most N of its jobs
        at once per ``concurrency_key`` across every worker (a string, or a
        function of the job's arguments returning one; default: the task's
        name), each attempt holding a permit of a :class:`dibs.Semaphore`.
        With ``rate`` (``"10/s"``, a :class:`dibs.Rate`), at most that many of
        its attempts start in any window, across every process: the limit is
        ``dibs.RateLimit(store, rate_key or name, rate)`` (``rate_key``: a name,
        or a function of the job's arguments returning one), and a job over it is
        deferred (put back uncounted, due when the limit allows), never failed.
        With ``unique`` (a :class:`~dibs.tasks.Unique`), at most one of its jobs
        counts per key at a time, on every process (see :meth:`insert`).
        Raises :class:`~dibs.InvalidInput` without a store or for bad options.
        """
        durable = self._require_store()
        retries, backoff, timeout = task_options(retries, backoff, timeout)
        limit = concurrency_option(concurrency, concurrency_key)
        rate_limit = None if rate is None else Rate.parse(rate)
        if rate_key is not None:
            if isinstance(rate_key, str):
                check_id(rate_key, "rate_key")
            elif not callable(rate_key):
                raise InvalidInput(
                    "rate_key must be a name or a function of the job's arguments, "
                    f"got {shown(rate_key)}",
                    field="rate_key",
                    value=rate_key,
                )
            if rate_limit is None:
                raise InvalidInput(
                    "rate_key needs a rate (rate_key names its limit)",
                    field="rate_key",
                    value=rate_key,
                )
        options = JobOptions().merged(queue, priority, lock_key, retention)
        check_unique(unique)

        def register(fn: Callable[..., R]) -> Callable[..., R]:
            check_fn(fn)
            task_name = check_id(name or f"{fn.__module__}.{fn.__qualname__}", "name")
            if unique is not None:
                unique.check_task(fn)
            durable.register(
                RegisteredTask(
                    task_name, fn, retries, backoff, timeout, limit, rate_limit, rate_key, unique
                )
            )
            self._job_options[task_name] = options
            return fn

        return register

    def enqueue(
        self,
        task: str | Callable[..., Any],
        /,
        *args: Any,
        at: object = None,
        delay: object = None,
        key: str | None = None,
        queue: str | None = None,
        priority: int | None = None,
        lock_key: str | None = None,
        retention: float | None = None,
        connection: object = None,
        unique: Unique | None = None,
        **kwargs: Any,
    ) -> str:
        """Add a durable job for a registered task; return its job ID.

        Arguments must be JSON-serializable. With ``key``, while a job with
        that key is pending or running (on any process), enqueue adds nothing
        and returns that job's ID; once it has finished the key is free again.
        ``queue`` (default ``"default"``) is where it waits: only processors
        taking that queue run it. Among due jobs, higher ``priority`` runs
        first (a 32-bit int, default 0). Jobs sharing a ``lock_key`` never run
        at the same time, on any process. A finished job and its result are
        kept ``retention`` seconds (default: the store's
        ``request_retention``). Each defaults to the task's own (:meth:`task`).

        With ``connection`` (your open ``sqlite3.Connection`` on the store's
        file, or ``psycopg.Connection`` to its database), the job is written
        inside your current transaction: it exists if and only if you commit.
        ``unique`` (a :class:`~dibs.tasks.Unique`) overrides the task's own for
        this call; a duplicate returns the ID of the job holding the key (use
        :meth:`insert` to tell the cases apart).

        Raises :class:`~dibs.InvalidInput` for an unregistered task or bad
        arguments, and :class:`ProcessorClosed` once shutdown has begun.
        """
        return self.insert(
            task, *args, at=at, delay=delay, key=key, queue=queue, priority=priority,
            lock_key=lock_key, retention=retention, connection=connection, unique=unique,
            **kwargs,
        ).job_id  # fmt: skip

    def insert(
        self,
        task: str | Callable[..., Any],
        /,
        *args: Any,
        at: object = None,
        delay: object = None,
        key: str | None = None,
        queue: str | None = None,
        priority: int | None = None,
        lock_key: str | None = None,
        retention: float | None = None,
        connection: object = None,
        unique: Unique | None = None,
        **kwargs: Any,
    ) -> Inserted:
        """:meth:`enqueue`, telling what happened: an :class:`~dibs.tasks.Inserted` with the
        job ID and ``outcome`` ``added``, ``duplicate`` (a job holding the key stands,
        nothing was added: its ID) or ``replaced`` (the pending job holding the key got
        these arguments and due time: its ID).

        A task with a :class:`~dibs.tasks.Unique` (its own, or ``unique`` here) is
        unique per key on every store, across processes, and inside your transaction
        with ``connection``: the rule is a unique index of the job table, so a
        rollback frees the key with the job. Raises like :meth:`enqueue`; with
        ``unique``, also for ``key=`` (one or the other) and, in ``debounce`` mode,
        for ``at=`` or ``delay=`` (the window decides when it runs).
        """
        call = Call(at, delay, key, queue, priority, lock_key, retention, connection, unique)
        return self._adding.insert_many(task, [(args, kwargs)], call)[0]

    def enqueue_many(
        self,
        task: str | Callable[..., Any],
        calls: Iterable[tuple[Any, ...] | Mapping[str, Any]],
        /,
        *,
        at: object = None,
        delay: object = None,
        key: str | None = None,
        queue: str | None = None,
        priority: int | None = None,
        lock_key: str | None = None,
        retention: float | None = None,
        connection: object = None,
        unique: Unique | None = None,
    ) -> list[str]:
        """Add one job of ``task`` per call, all in one transaction; return their IDs in order.

        Each call is a tuple of positional arguments, a mapping of keyword
        arguments, or an ``(args, kwargs)`` pair of a tuple and a dict. The
        options are those of :meth:`enqueue` and apply to every job (a ``key``
        to the first one only makes no sense, so ``key`` is refused with more
        than one call). Either every job is added or none is. For a unique task
        (or with ``unique``) each ID is the one :meth:`enqueue` would return:
        see :meth:`insert_many`. Raises :class:`~dibs.InvalidInput` for bad
        arguments, and :class:`ProcessorClosed` once shutdown has begun.
        """
        inserted = self.insert_many(
            task, calls, at=at, delay=delay, key=key, queue=queue, priority=priority,
            lock_key=lock_key, retention=retention, connection=connection, unique=unique,
        )  # fmt: skip
        return [one.job_id for one in inserted]

    def insert_many(
        self,
        task: str | Callable[..., Any],
        calls: Iterable[tuple[Any, ...] | Mapping[str, Any]],
        /,
        *,
        at: object = None,
        delay: object = None,
        key: str | None = None,
        queue: str | None = None,
        priority: int | None = None,
        lock_key: str | None = None,
        retention: float | None = None,
        connection: object = None,
        unique: Unique | None = None,
    ) -> list[Inserted]:
        """:meth:`enqueue_many`, telling what happened to each call: an
        :class:`~dibs.tasks.Inserted` per call, in order, as :meth:`insert` tells.

        For a unique task (or with ``unique``), each job's key is decided in the
        batch's one transaction (yours, with ``connection``), in order, as if each
        call were an :meth:`insert` of its own: a later call of a key that an
        earlier one in the batch took is a ``duplicate`` of it (``refuse``), or
        ``replaced`` it with its arguments (``replace``, ``debounce``), exactly as it
        would meet a job added before the batch. All or none. Raises like
        :meth:`enqueue_many`, and like :meth:`insert` for a unique rule.
        """
        call = Call(at, delay, key, queue, priority, lock_key, retention, connection, unique)
        return self._adding.insert_many(task, calls, call)

    def result(self, job_id: str, timeout: float | None = None) -> Any:
        """Wait for durable job ``job_id`` to finish and return its result.

        Works from any process on the store, while the job runs anywhere, and
        survives the death of its worker (another takes the job over). Raises
        :class:`JobFailed` (with the last traceback) if it failed,
        :class:`TaskCancelled` if it was cancelled, :class:`WaitTimeout` after
        ``timeout`` real seconds (the job goes on), and :class:`JobNotFound`
        for an unknown job or one purged after its retention.
        """
        record = self.wait(job_id, timeout)
        if record.state == "done":
            return record.result
        if record.state == "cancelled":
            raise TaskCancelled(
                f"job {job_id} was cancelled", task_id=job_id, reason=CancelReason.CANCELLED
            )
        last = (record.error or "").strip().splitlines()[-1:] or ["it lost its worker too often"]
        raise JobFailed(
            f"job {job_id} failed after {record.attempt} attempt(s): {last[0]}",
            job_id=job_id, error=record.error,
        )  # fmt: skip

    def wait(self, job_id: str, timeout: float | None = None) -> JobRecord:
        """Wait until durable job ``job_id`` has finished; return its record.

        Raises :class:`WaitTimeout` after ``timeout`` real seconds (None: no
        limit) and :class:`JobNotFound` for an unknown or purged job.
        """
        durable = self._require_store()
        check_id(job_id, "job_id")
        if timeout is not None:
            timeout = to_seconds(timeout, "timeout", allow_zero=True)
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            left = WAIT_CHUNK if deadline is None else max(0.0, deadline - time.monotonic())
            job = durable.jobs.wait(job_id, min(left, WAIT_CHUNK))
            if job is None:
                raise JobNotFound(
                    f"no durable job {job_id!r}: never added, or purged after its retention",
                    job_id=job_id,
                )
            if job.state in FINISHED_STATES:
                return to_record(job)
            if deadline is not None and time.monotonic() >= deadline:
                raise WaitTimeout(
                    f"job {job_id} had not finished after {timeout}s (it is {job.state})",
                    task_id=job_id, timeout=timeout,
                )  # fmt: skip

    def cancel(self, job_id: str) -> bool:
        """Cancel durable job ``job_id``: a pending one never runs; a running one is asked to stop.

        A running job's worker learns it at its next heartbeat (at most
        ``lease / 3`` seconds later; at once if it runs in this process) and
        sets the task's token; a job that stops by raising
        :class:`TaskCancelled` is recorded ``cancelled``, one that finishes
        anyway is recorded ``done``. Returns False if the job had finished or
        does not exist. Raises :class:`~dibs.InvalidInput` without a store.
        """
        return self._require_store().cancel(check_id(job_id, "job_id"))

    def job(self, job_id: str) -> JobRecord | None:
        """A snapshot of durable job ``job_id``, or None if there is none."""
        job = self._require_store().jobs.get(check_id(job_id, "job_id"))
        return None if job is None else to_record(job)

    def jobs(
        self,
        *,
        states: Iterable[str] | None = None,
        queues: Iterable[str] | None = None,
        task: str | None = None,
        limit: int | None = None,
    ) -> list[JobRecord]:
        """Snapshots of the durable jobs matching every filter given, earliest due first.

        ``states`` among ``pending``, ``running``, ``done``, ``failed`` and
        ``cancelled``; ``queues`` and ``task`` (a registered name) narrow it;
        at most ``limit`` (None: all). Raises :class:`~dibs.InvalidInput` for a
        bad filter or without a store.
        """
        durable = self._require_store()
        if isinstance(states, str) or not isinstance(states, Iterable | None):
            raise InvalidInput(
                f"states must be a list of job states, got {shown(states)}", field="states",
                value=states,
            )  # fmt: skip
        wanted = None if states is None else list(states)
        for state in wanted or []:
            if state not in (*LIVE_STATES, *FINISHED_STATES):
                raise InvalidInput(f"no job state {state!r}", field="states", value=state)
        names = None if queues is None else _check_queues(queues)
        if task is not None:
            check_id(task, "task")
        rows = durable.jobs.find(states=wanted, queues=names, name=task, limit=check_limit(limit))
        return [to_record(row) for row in rows]

    def retry(self, job_id: str) -> bool:
        """Run a ``failed`` or ``cancelled`` durable job again, now, with its retries restored.

        Returns False for a job in any other state or none. Raises
        :class:`~dibs.InvalidInput` without a store.
        """
        return self._require_store().jobs.retry(check_id(job_id, "job_id"))

    def _require_store(self) -> DurableRunner:
        if self._durable is None:
            raise InvalidInput(
                "durable tasks need TaskProcessor(store=...)", field="store", value=None
            )
        return self._durable

    def _registered(self, task: object) -> RegisteredTask:
        durable = self._require_store()
        for registered in durable.tasks.values():
            if task == registered.name or task is registered.fn:
                return registered
        raise InvalidInput(
            f"{shown(task)} is not a registered durable task", field="task", value=task
        )

    def _add_sweeper(self, interval: float) -> None:
        """Register the store's sweeper as a durable task, run once per ``interval`` fleet-wide."""
        durable = self._require_store()

        def sweep() -> dict[str, int]:
            swept = durable.store.sweep()
            # A job's own retention wins; the store's request_retention is the default.
            purged = durable.jobs.purge(durable.store.request_retention)
            return {
                "expired": swept.expired,
                "purged_requests": swept.purged_requests,
                "purged_claims": swept.purged_claims,
                "purged_jobs": purged,
            }

        # In this processor's first queue, which it takes: whoever evaluates an occurrence runs it.
        self.task(SWEEP_TASK, queue=(self._queues or [DEFAULT_QUEUE])[0])(sweep)
        self.every(interval, SWEEP_TASK, id=SWEEP_TASK)

    def schedules(self) -> list[Schedule]:
        """Snapshots of the live schedules, in the order they were added."""
        with self._engine.lock:
            return [state.snapshot() for state in self._engine.schedules.values()]

    def unschedule(self, schedule_id: str) -> bool:
        """Stop a schedule (runs already started go on); return False if there was none.

        For a durable schedule this stops this process's evaluations only: the
        processes that still declare it go on running its occurrences.
        """
        if self._durable is not None:
            self._durable.schedules.pop(schedule_id, None)
        with self._engine.lock:
            return self._engine.remove_schedule(schedule_id)

    def join(self, timeout: float | None = None) -> bool:
        """Wait until nothing is due, queued or running; return False if ``timeout`` passed first.

        ``timeout`` is real seconds. Tasks timed for later do not count until due.
        Raises :class:`~dibs.InvalidInput` for a bad timeout.
        """
        if timeout is not None:
            timeout = to_seconds(timeout, "timeout", allow_zero=True)
        start = time.monotonic()
        with self._engine.lock:
            if not self._engine.wait_idle(timeout):
                return False
        if self._durable is None:
            return True
        left = None if timeout is None else max(0.0, timeout - (time.monotonic() - start))
        return self._durable.wait_idle(left)

    def shutdown(self, wait: bool = True, timeout: float | None = None) -> None:
        """Stop taking work, finish what was submitted, cancel what is left at the deadline.

        Schedules stop at once. Tasks already submitted (queued, running, timed
        for later or waiting for a retry) go on until ``timeout`` seconds on the
        processor's clock (None: no deadline); then the unstarted are cancelled
        and the running are asked to stop through their tokens. With ``wait``,
        returns when everything has finished or the deadline has passed; called
        from one of its own tasks, it never waits. Raises
        :class:`~dibs.InvalidInput` for a negative timeout.
        """
        engine = self._engine
        if timeout is not None:
            timeout = to_seconds(timeout, "timeout", allow_zero=True)
        start = time.monotonic()
        if self._durable is not None:
            self._durable.stop_taking()  # running jobs keep their heartbeats while they drain
        with engine.lock:
            engine.close(None if timeout is None else engine.alarm.now() + timeout)
            if not wait or threading.current_thread() in engine.workers:
                return
            engine.idle.wait_for(lambda: engine.finished)
        if self._durable is not None:
            # Async attempts drain until the same deadline, in real seconds, then are cancelled.
            left = None if timeout is None else max(0.0, timeout - (time.monotonic() - start))
            if not self._durable.wait_idle(left):
                self._durable.cancel_async(CancelReason.SHUTDOWN)
                self._durable.wait_idle(None)
            self._durable.stop()
        with engine.lock:
            # A worker stuck in a task that ignored its token is left behind (daemon).
            join_workers = not engine.deadline_passed and engine.abandoned == 0
        if join_workers:
            for thread in engine.workers:
                thread.join()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        # An exception must surface now, not after work timed for next week: cancel
        # what has not started, ask running tasks to stop, and wait only for them.
        self.shutdown(wait=True, timeout=None if exc is None else 0)

    def _check_open(self) -> None:
        if self._engine.closing:
            raise ProcessorClosed("the task processor is shutting down; it takes no new work")

    def _check_open_now(self) -> None:
        with self._engine.lock:
            self._check_open()

    def _add_schedule(
        self,
        trigger: Trigger,
        fn: Callable[..., Any] | str,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        schedule_id: str | None,
        rules: Policy,
        retries: int,
        backoff: Backoff | float,
        timeout: float | None,
    ) -> Schedule:
        durable: DurableSchedule | None = None
        if self._durable is not None and (
            isinstance(fn, str) or any(fn is t.fn for t in self._durable.tasks.values())
        ):
            durable = self._durable_schedule(trigger, fn, args, kwargs, schedule_id, rules)
            # Every process runs the trigger locally; each tick evaluates the schedule
            # (one evaluation at a time is enough: each looks at everything due).
            fn, args, kwargs, schedule_id = self._durable.evaluate, (durable,), {}, durable.id
            retries, timeout, local = 0, None, policy()
        else:
            local = rules
        check_fn(fn)
        assert not isinstance(fn, str)  # check_fn refused it: a str is not callable
        retries, backoff, timeout = task_options(retries, backoff, timeout)
        if schedule_id is not None:
            check_id(schedule_id, "id")
        engine = self._engine
        with engine.lock:
            self._check_open()
            if schedule_id is None:
                schedule_id = f"s-{self._prefix}-{next(self._ids)}"
            if schedule_id in engine.schedules:
                raise InvalidInput(
                    f"a schedule with id {schedule_id!r} already exists",
                    field="id",
                    value=schedule_id,
                )
            state = ScheduleState(
                schedule_id, trigger, fn, args, kwargs,
                first=trigger.first_at_or_after(engine.alarm.now()), rules=local,
                retries=retries, backoff=backoff, timeout=timeout,
            )  # fmt: skip
            engine.add_schedule(state)
            snapshot = state.snapshot()
            if durable is not None:
                # The snapshot shows the schedule's own policy, not its evaluator's.
                snapshot = replace(
                    snapshot, misfire=rules.misfire, max_running=rules.max_running,
                    overlap=rules.overlap and str(rules.overlap),
                    catch_up=rules.catch_up and str(rules.catch_up),
                    max_catch_up=rules.max_catch_up,
                )  # fmt: skip
        if durable is not None:
            assert self._durable is not None
            self._durable.schedules[durable.id] = durable
            # Catch up at once on what the whole fleet missed, per the misfire policy.
            self.submit(self._durable.evaluate, durable)
        return snapshot

    def _durable_schedule(
        self, trigger: Trigger, fn: object, args: tuple[Any, ...], kwargs: dict[str, Any],
        schedule_id: str | None, rules: Policy,
    ) -> DurableSchedule:  # fmt: skip
        registered = self._registered(fn)
        payload = encode_payload(args, kwargs)
        if schedule_id is None:
            schedule_id = f"{registered.name}:{trigger.describe()}"

        options = self._job_options.get(registered.name, JobOptions())

        if rules.skip and options.lock_key is None:
            # Runs of one catch-up must not overlap either: one lock key chains them.
            options = replace(options, lock_key=schedule_lock_key(schedule_id))

        def make_job(job_id: str, nominal: float) -> Job:
            return self._adding.new_job(
                registered, payload, job_id, nominal, options, schedule_id=schedule_id
            )

        check_id(schedule_id, "id")
        # Each occurrence's job ID is the schedule ID, "@" and an ISO 8601 instant.
        longest = NAME_MAX_BYTES - len("@0001-01-01T00:00:00.000000+00:00")
        if len(schedule_id.encode()) > longest:
            raise InvalidInput(
                f"a durable schedule id must be at most {longest} bytes in UTF-8",
                field="id",
                value=schedule_id,
            )
        return DurableSchedule(schedule_id, trigger, rules, make_job)


QUEUES_ENV = "DIBS_QUEUES"
WORKERS_MAX = 4096
"""Most worker threads a processor starts."""
ASYNC_WORKERS_MAX = 100_000
"""Most ``async def`` jobs a processor runs at once."""
INTERVAL_MIN = 1e-6
"""Shortest ``every()`` interval, in seconds: the SQL stores keep time in microseconds."""


def _queues_from_env(text: str) -> object:
    try:
        return json.loads(text)
    except ValueError:
        raise InvalidInput(
            f"${QUEUES_ENV} must be a JSON list of queue names, got {shown(text)}",
            field="queues", value=text,
        ) from None  # fmt: skip


def _check_queues(queues: object) -> list[str]:
    """The queues a processor takes from, checked; raises InvalidInput for a bad one."""
    if isinstance(queues, str) or not isinstance(queues, Iterable):
        raise InvalidInput(
            f"queues must be a list of queue names, got {shown(queues)}",
            field="queues",
            value=queues,
        )
    names = [check_id(name, "queues") for name in queues]
    if not names:
        raise InvalidInput("queues must name at least one queue", field="queues", value=queues)
    return names
