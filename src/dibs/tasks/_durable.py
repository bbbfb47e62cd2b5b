"""Durable mode: jobs are rows, an attempt is a hold, completion is a fenced confirm.

A worker takes attempt n of a due job by claiming ``Unit(job_id, str(n))`` as
a hold whose TTL is the lease; the claim is the only arbiter of who runs it.
A heartbeat extends the hold; a worker that crashes or stops stops extending,
its hold expires on the store's clock, and the next worker that finds the job
claims attempt n + 1 (the lost attempt counts toward ``max_attempts``, so a
job that kills its worker is not retried forever). To finish, the worker
writes its outcome as a proposal on the row, then confirms its hold with its
fence; only a confirmed hold's proposal is ever settled into the row. A worker
whose hold was taken over learns it from the failed confirm (``HoldLost``) and
changes nothing. Once the row is settled the attempt's claim is released (so
finished jobs hold nothing in the store); the row, not the claim, then keeps
the attempt from running again, as every ``start`` is conditional on the
``(attempt, fence)`` its taker read.

Cancelling a pending job ends it; a running one has ``cancel_requested`` set
on its row, which its worker reads at its next heartbeat and passes on to the
task's token. Recurring schedules are evaluated against a watermark in the job
table (:mod:`._durable_schedules`): one job per occurrence and, through the
claims above, one completed run — with no leader.
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
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from dibs._model import ClaimState, Unit
from dibs.exceptions import ClaimNotFound, DibsError, HoldLost, InvalidInput
from dibs.stores.base import Store
from dibs.tasks._async import AsyncLane
from dibs.tasks._durable_schedules import DurableSchedule
from dibs.tasks._errors import CancelReason, TaskCancelled, UnknownTask
from dibs.tasks._handle import Backoff, CancelToken, TaskContext, TaskHandle, current, current_job
from dibs.tasks._jobs import Job, job_table
from dibs.tasks._worker import Outcome, OutcomeKind

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

    @property
    def is_async(self) -> bool:
        """Whether its attempts run on the processor's event loop (an ``async def``)."""
        return inspect.iscoroutinefunction(self.fn)


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
    job: Job
    attempt: int
    fence: int
    claim_id: str
    handle: TaskHandle[Any] | None = None
    token: CancelToken | None = None  # an async attempt's; a thread attempt's is its handle's
    lost: bool = False

    def cancel(self) -> None:
        """Ask the attempt to stop (cooperatively in a thread, at its next await on the loop)."""
        if self.handle is not None:
            self.handle.cancel()
        elif self.token is not None:
            self.token.cancel(CancelReason.CANCELLED)


class DurableRunner:
    """Polls the job table, takes due jobs through store claims, runs them on the local engine."""

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
        self.queues: list[str] | None = None  # the queues taken from; None: every queue
        self.lane = AsyncLane("dibs-tasks-async", async_workers)
        self.lease = lease
        self.poll = poll
        self.max_lost = MAX_LOST
        self._rng = rng
        self.holder = f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(3)}"
        self.tasks: dict[str, RegisteredTask] = {}
        self.schedules: dict[str, DurableSchedule] = {}
        self._lock = threading.Lock()  # guards _running and _stopping
        self._wake = threading.Condition(self._lock)
        self._running: dict[str, _Running] = {}
        self._taking = take_jobs  # False once shutdown began: no new jobs
        self._stopping = False  # True once the local work has drained: no more heartbeats
        self._threads = [
            threading.Thread(target=self._poll_loop, name="dibs-tasks-poller", daemon=True),
            threading.Thread(target=self._heartbeat_loop, name="dibs-tasks-heartbeat", daemon=True),
        ]
        for thread in self._threads:
            thread.start()
        self._unlisten = self.jobs.listen(self._notify) if take_jobs else (lambda: None)

    def _notify(self) -> None:
        with self._wake:
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
        """Add a job row; return its ID, or that of the live job holding ``key``."""
        payload = encode_payload(args, kwargs)
        if run_at is None:
            run_at = self.store.now().timestamp()
        return self.jobs.add(self.new_job(task, payload, job_id, run_at, key=key))

    def new_job(
        self, task: RegisteredTask, payload: str, job_id: str, run_at: float, *,
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
        if not self.jobs.cancel(job_id, self.store.now().timestamp()):
            return False
        with self._lock:
            running = self._running.get(job_id)
        if running is not None:
            running.cancel()  # running here: no need to wait for a heartbeat
        return True

    def record(self, job_id: str) -> JobRecord | None:
        job = self.jobs.get(job_id)
        if job is None:
            return None
        done = job.state == "done"
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
        self.lane.close()
        self.jobs.close()

    # --- taking jobs ----------------------------------------------------------------------

    def _poll_loop(self) -> None:
        while True:
            with self._wake:
                if not self._taking:
                    return
                threads = sum(1 for r in self._running.values() if r.token is None)
                free = self._slots - threads
            free_async = self.lane.free
            if free > 0 or free_async > 0:
                try:
                    self._take_some(free, free_async)
                except DibsError:
                    log.exception("durable poll failed; trying again")
            with self._wake:
                if not self._taking:
                    return
                # Other processes add rows without telling us: this wait is the poll.
                self._wake.wait(self.poll)

    def _take_some(self, free: int, free_async: int) -> None:
        now = self.store.now().timestamp()
        for job in self.jobs.due(now, limit=(free + free_async) * 4 + 8):
            if free <= 0 and free_async <= 0:
                return
            task = self.tasks.get(job.name)
            if task is None or job.id in self._running:
                continue
            if task.is_async and free_async > 0 and self._take(job, now):
                free_async -= 1
            elif not task.is_async and free > 0 and self._take(job, now):
                free -= 1

    def _take(self, job: Job, now: float) -> bool:
        seen_fence: int | None = None
        attempt = job.attempt
        if job.state == "running":
            claim = self.store.get(job.claim_id) if job.claim_id else None
            if (
                claim is not None
                and claim.state is ClaimState.CONFIRMED
                and claim.fence == job.fence
            ):
                # Its worker confirmed (and maybe died before settling). Re-read: the
                # proposal was written before the confirm we just saw, maybe after our read.
                fresh = self.jobs.get(job.id)
                if fresh is not None and fresh.state == "running" and fresh.fence == job.fence:
                    self._settle(fresh, fresh.attempt, fresh.fence)
                self._end(claim.id, claim.holder, claim.fence)  # on behalf of its dead worker
                return False
            if (
                claim is not None
                and claim.state is ClaimState.HELD
                and (claim.expires_at is not None and claim.expires_at.timestamp() > now)
            ):
                return False  # alive: its holder is heartbeating
            if job.cancel_requested:  # cancelled while its worker was dying
                self.jobs.settle(job.id, job.attempt, job.fence, "cancelled", None, now)
                return False
            # The lease lapsed: that attempt is lost and counts.
            seen_fence, attempt = job.fence, job.attempt + 1
            if attempt > job.max_attempts:
                log.error(
                    "job %s lost %d workers; failing it as a poison pill", job.id, self.max_lost
                )
                self.jobs.settle(job.id, job.attempt, job.fence, "failed", None, now)
                return False
        # Linearization point: the store's claim decides who runs this attempt.
        won = self.store.claim(Unit(job.id, str(attempt)), holder=self.holder, ttl=self.lease)
        if not won or won.claim is None:
            return False
        claim = won.claim
        if not self.jobs.start(job.id, job.attempt, seen_fence, attempt, claim.fence, claim.id):
            self.store.release(claim.id, holder=self.holder, fence=claim.fence)
            return False
        running = _Running(job, attempt, claim.fence, claim.id)
        with self._lock:
            self._running[job.id] = running
        task = self.tasks[job.name]
        if task.is_async:
            self._start_async(task, running)
        else:
            running.handle = self._submit(self._run, running, timeout=task.timeout)
        return True

    # --- running and finishing ------------------------------------------------------------

    def _run(self, running: _Running) -> None:
        job = running.job
        try:
            task = self.tasks.get(job.name)
            if task is None:
                raise UnknownTask(f"no task named {job.name!r} is registered", name=job.name)
            args, kwargs = json.loads(job.args)
            reset = current_job.set(job.id)
            try:
                recorded = _recorded(running, current().token, task.fn(*args, **kwargs), None)
            except Exception as exc:
                recorded = _recorded(running, current().token, None, exc)
            finally:
                current_job.reset(reset)
            if recorded is not None:
                self._complete(running, *recorded)
        finally:
            self._ran(running)

    def _ran(self, running: _Running) -> None:
        with self._lock:
            self._running.pop(running.job.id, None)
        with self._wake:
            self._wake.notify_all()  # the poller, the heartbeat and waiters all wait on it

    def _start_async(self, task: RegisteredTask, running: _Running) -> None:
        """Run an ``async def`` attempt on the lane's loop; record it on a finisher thread."""
        job = running.job
        token = CancelToken(job.id, task.timeout)
        running.token = token
        context = TaskContext(
            task_id=job.id, attempt=running.attempt, token=token,
            schedule_id=job.schedule_id, nominal_time=_nominal(job), job_id=job.id,
        )  # fmt: skip

        def finish(outcome: Outcome) -> None:
            try:
                if outcome.kind is OutcomeKind.OK:
                    recorded = _recorded(running, token, outcome.value, None)
                else:
                    assert outcome.error is not None
                    recorded = _recorded(running, token, None, outcome.error)
                if recorded is not None:
                    self._complete(running, *recorded)
            except DibsError:
                # As for a worker that died: the lease lapses and another takes over.
                log.exception("recording job %s attempt %d failed", job.id, running.attempt)
            finally:
                self._ran(running)

        try:
            args, kwargs = json.loads(job.args)
        except ValueError as exc:
            finish(Outcome(OutcomeKind.FAILED, error=exc))
            return
        self.lane.start(task.fn, args, kwargs, context, task.timeout, finish)

    def wait_idle(self, timeout: float | None) -> bool:
        """Wait until no async attempt is running; False if ``timeout`` real seconds passed."""
        return self.lane.wait_idle(timeout)

    def cancel_async(self, reason: CancelReason) -> None:
        """Set the token of every running async attempt (the shutdown deadline passed)."""
        with self._lock:
            tokens = [r.token for r in self._running.values() if r.token is not None]
        for token in tokens:
            token.cancel(reason)

    def _complete(self, running: _Running, kind: str, outcome: str) -> None:
        job = running.job
        if not self.jobs.propose(job.id, running.attempt, running.fence, kind, outcome):
            log.warning("job %s attempt %d was taken over; result dropped", job.id, running.attempt)
            return
        try:
            # Completion is this fenced confirm: a stale worker's fails here.
            self.store.confirm(running.claim_id, holder=self.holder, fence=running.fence)
        except (HoldLost, ClaimNotFound) as exc:
            log.warning("job %s attempt %d lost its hold (%s); result dropped", job.id,
                        running.attempt, exc)  # fmt: skip
            return
        settled = self.jobs.get(job.id)
        if settled is not None:
            self._settle(settled, running.attempt, running.fence)
        self._end(running.claim_id, self.holder, running.fence)
        schedule = self.schedules.get(job.schedule_id or "")
        if schedule is not None:
            self.evaluate(schedule)  # a slot is free: occurrences held back may start

    def _end(self, claim_id: str, holder: str, fence: int) -> None:
        """Release a settled attempt's confirmed claim, so that finished jobs hold nothing.

        Only after the row has been settled: from then on the row itself refuses
        the attempt (every ``start`` is conditional on the ``(attempt, fence)``
        its taker read, and a settled row has left those for good), so a claim
        granted on the released unit later changes nothing and is given back.
        A failure here leaves the claim confirmed, which is harmless.
        """
        try:
            self.store.release(claim_id, holder=holder, fence=fence)
        except DibsError as exc:
            log.warning("releasing the claim %s of a finished attempt failed: %s", claim_id, exc)

    def _settle(self, job: Job, attempt: int, fence: int | None) -> None:
        """Turn the confirmed attempt's proposal into the row's state (idempotent)."""
        now = self.store.now().timestamp()
        if job.outcome_kind == "ok":
            self.jobs.settle(job.id, attempt, fence, "done", None, now)
        elif job.outcome_kind == "cancelled":
            self.jobs.settle(job.id, attempt, fence, "cancelled", None, now)
        elif job.failures < job.retries and attempt < job.max_attempts and not job.cancel_requested:
            task = self.tasks.get(job.name)
            backoff = task.backoff if task is not None else Backoff()
            run_at = now + backoff.delay(attempt, self._rng)
            self.jobs.settle(job.id, attempt, fence, "pending", run_at, now)
        else:
            self.jobs.settle(job.id, attempt, fence, "failed", None, now)

    # --- heartbeats -----------------------------------------------------------------------

    def _heartbeat_loop(self) -> None:
        while True:
            with self._wake:
                if self._stopping:
                    return
                self._wake.wait(self.lease / 3)
                running = list(self._running.values())
            for item in running:
                try:
                    self.store.extend(
                        item.claim_id, holder=self.holder, fence=item.fence, ttl=self.lease
                    )
                except (HoldLost, ClaimNotFound):
                    item.lost = True
                    item.cancel()
                except DibsError:
                    log.exception("heartbeat for job %s failed", item.job.id)
            try:
                flagged = self.jobs.cancel_requested([item.job.id for item in running])
            except DibsError:
                log.exception("reading cancellations failed")
                continue
            for item in running:
                if item.job.id in flagged:
                    item.cancel()  # cooperative: the task sees its token set


def _recorded(
    running: _Running, token: CancelToken, value: Any, exc: BaseException | None
) -> tuple[str, str] | None:
    """What an attempt that returned ``value`` or raised ``exc`` records, or None for nothing."""
    if exc is None:
        try:
            return "ok", json.dumps(value)
        except (TypeError, ValueError) as error:
            exc = error
    if token.cancelled and (running.lost or token.reason is CancelReason.SHUTDOWN):
        # Our hold is gone, or this process is stopping: the attempt is left
        # unrecorded, and the job is taken over once its lease lapses.
        return None
    text = "".join(traceback.format_exception(exc))
    if token.reason is CancelReason.CANCELLED and isinstance(exc, TaskCancelled):
        return "cancelled", text
    return "error", text


def _nominal(job: Job) -> datetime | None:
    """A schedule occurrence's nominal time, from its job ID ``"{schedule}@{iso instant}"``."""
    if job.schedule_id is None:
        return None
    try:
        return datetime.fromisoformat(job.id.rsplit("@", 1)[1])
    except (IndexError, ValueError):
        return None
