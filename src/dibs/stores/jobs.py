"""The job table capability: the rows :mod:`dibs.tasks` durable mode keeps next to a store.

A store that offers durable tasks returns a :class:`JobTable` from
:meth:`dibs.Store.job_table`. :class:`MemoryJobs` is the in-process one, which
any single-process store (memory://, a plug-in built on it) may hand out.

An attempt's hold (its *lease*) lives on the job row: ``holder``, ``fence`` and
``lease_expires``. :meth:`JobTable.take` picks due jobs and starts them with a
new fence and a lease in one statement (``FOR UPDATE SKIP LOCKED`` on
PostgreSQL, so concurrent workers get different jobs); :meth:`JobTable.finish`
records the outcome and ends the lease in one statement that is conditional
on ``(id, fence)``, so a worker whose lease was taken over changes nothing and
an attempt is recorded exactly once. A worker that dies stops extending its
lease (:meth:`JobTable.extend`); once the lease has lapsed,
:meth:`JobTable.reclaim` (run by every worker process now and then) turns the
row back into ``pending`` for the next attempt, or fails it once it has lost
too many (the poison-pill limit, counted in ``max_attempts``).

The table lives next to the store: ``dibs_jobs`` in the SQLite file
(:mod:`dibs.stores.sqlite._jobs`), ``jobs`` in the PostgreSQL store's schema
(:mod:`dibs.stores.postgres._jobs`), dicts next to a memory:// store object (here).

Times are epoch seconds on the store's clock. A ``now`` argument of None means
"the store's clock, read where the statement runs" (on PostgreSQL the server's
``clock_timestamp()``, inside the statement: no extra round trip).
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, replace
from typing import Any, Protocol

from dibs.exceptions import InvalidInput, StoreClosed

__all__ = [
    "DEFAULT_QUEUE",
    "FINISHED_STATES",
    "LIVE_STATES",
    "PUT_BACK_LOG_MAX",
    "STATE_BITS",
    "UNIQUE_OUTCOMES",
    "Attempt",
    "Decide",
    "Job",
    "JobTable",
    "MemoryJobs",
    "Wakers",
]

LIVE_STATES = ("pending", "running")
FINISHED_STATES = ("done", "failed", "cancelled")
DEFAULT_QUEUE = "default"
STATE_BITS = {"pending": 1, "running": 2, "done": 4, "failed": 8, "cancelled": 16}
"""A job state's bit in :attr:`Job.unique_states` (the unique index's predicate spells it too)."""
UNIQUE_OUTCOMES = ("added", "duplicate", "replaced")
"""What :meth:`JobTable.add_unique` did: added the job, found another holding its key, or
gave the waiting job that holds it the new arguments and time."""

Decide = Callable[[float | None, int], "tuple[float, list[Job]] | None"]
"""Evaluates a schedule: (watermark or None, live jobs) → (new watermark, jobs) or None."""


@dataclass(frozen=True, slots=True)
class Attempt:
    """One ended attempt of a job, as :attr:`Job.attempts` lists them."""

    attempt: int
    holder: str | None
    started_at: float | None
    ended_at: float
    outcome_kind: str
    """``ok``, ``error``, ``cancelled``, ``lost`` (its lease lapsed) or ``put_back``."""


@dataclass(frozen=True, slots=True)
class Job:
    """One job row.

    To add a job, build one with ``state="pending"`` and ``attempt=1``; the
    lease columns stay None. ``run_at=None`` means "now on the store's clock"
    (as set by the insert); a row read back always has a number there.
    """

    id: str
    name: str
    args: str  # JSON [args, kwargs]
    run_at: float | None  # epoch seconds on the store's clock; None on add: now
    attempt: int  # the attempt running, or the next to run (1-based)
    max_attempts: int  # retries + 1 + the poison-pill allowance of lost attempts
    state: str  # pending | running | done | failed | cancelled
    fence: int | None = None  # the current (or last) attempt's fence; +1 on every take
    holder: str | None = None  # the worker holding the running attempt
    outcome_kind: str | None = None  # "ok" | "error" | "cancelled", once finished
    outcome: str | None = None  # JSON result, or the error's text
    schedule_id: str | None = None
    retries: int = 0  # failed attempts that may be retried
    failures: int = 0  # failed attempts so far (lost ones count only toward max_attempts)
    key: str | None = None  # unique among live jobs
    cancel_requested: bool = False
    finished_at: float | None = None
    queue: str = DEFAULT_QUEUE
    priority: int = 0  # higher is taken first among due jobs
    lock_key: str | None = None  # jobs sharing one never run at once (see take)
    lease_expires: float | None = None  # while running: when the attempt's lease lapses
    started_at: float | None = None  # when the current (or last) attempt was taken
    enqueued_at: float | None = None  # set by the insert
    retention: float | None = None  # seconds a finished row is kept; None: purge's default
    attempts_log: str | None = None  # JSON list of ended attempts; see ``attempts``
    unique_key: str | None = None  # one counting job per key (see add_unique)
    unique_states: int | None = None  # the STATE_BITS in which this job counts against it
    unique_until: float | None = None  # when it stops counting; None: while in those states

    @property
    def attempts(self) -> list[Attempt]:
        """The ended attempts, oldest first (the running one is not among them)."""
        if not self.attempts_log:
            return []
        return [Attempt(**entry) for entry in json.loads(self.attempts_log)]


COLUMN_NAMES = (
    "id", "name", "args", "run_at", "attempt", "max_attempts", "state", "fence", "holder",
    "outcome_kind", "outcome", "schedule_id", "retries", "failures", "key", "cancel_requested",
    "finished_at", "queue", "priority", "lock_key", "lease_expires", "started_at", "enqueued_at",
    "retention", "attempts_log", "unique_key", "unique_states", "unique_until",
)  # fmt: skip
COLUMNS = ", ".join(COLUMN_NAMES)
"""Every column of a job row, in :class:`Job` field order."""


def row_values(job: Job) -> tuple[Any, ...]:
    """The job's column values, in :data:`COLUMNS` order."""
    return tuple(getattr(job, name) for name in COLUMN_NAMES)


def counts(job: Job) -> bool:
    """Whether ``job`` holds its unique key now (the unique index's predicate, in Python)."""
    return job.unique_key is not None and bool((job.unique_states or 0) & STATE_BITS[job.state])


def job_from_row(row: Sequence[Any]) -> Job:
    """A :class:`Job` from a row read in :data:`COLUMNS` order."""
    values = list(row)
    values[15] = bool(values[15])
    return Job(*values)


class JobTable(Protocol):
    """The job rows of one store. Every method is atomic and may raise StoreUnavailable.

    ``connection``: the caller's own DB-API connection to the same database (a
    ``sqlite3.Connection`` on the same file, a ``psycopg.Connection`` to the
    same database). The statements run on it inside the caller's transaction,
    without BEGIN or COMMIT: the job exists if and only if the caller commits.
    Any other object raises :class:`~dibs.InvalidInput` (``field="connection"``).
    """

    # --- adding ---------------------------------------------------------------------------

    def add(self, job: Job, connection: object | None = None) -> str:
        """Insert ``job`` unless its ID exists or its key is live; return the ID standing.

        One transaction (one commit on PostgreSQL, with the ``NOTIFY`` that wakes
        workers). Workers of this process waiting in :meth:`listen` are woken at once.
        """
        ...

    def add_many(self, jobs: Sequence[Job], connection: object | None = None) -> list[str]:
        """:meth:`add` for many jobs in one transaction; the standing ID of each, in order."""
        ...

    def add_unique(
        self, job: Job, mode: str, window: float | None, connection: object | None = None
    ) -> tuple[str, str]:
        """Add ``job`` unless a job counting against its ``unique_key`` stands; return
        ``(job ID, outcome)``, the outcome one of :data:`UNIQUE_OUTCOMES`.

        A job counts while its state's bit is in its ``unique_states`` and, if it has a
        ``unique_until``, until then. ``mode`` ``refuse`` adds nothing and returns the
        counting job (``duplicate``); ``replace`` and ``debounce`` give a *pending*
        counting job ``job.args`` and a new due time (``job.run_at``; debounce: ``now
        + window``), and it counts ``window`` seconds from now again (``replaced``);
        a running or finished one is left as it is (``duplicate``). The store enforces
        it: a partial unique index on the key among counting rows, written in the
        transaction of the insert (the caller's, with ``connection``), so a rollback
        frees the key with the job and two processes never both add. ``window``:
        seconds the added job counts (None: while in its states; debounce: while
        pending or running).
        """
        ...

    def add_unique_many(
        self, jobs: Sequence[Job], mode: str, window: float | None, connection: object | None = None
    ) -> list[tuple[str, str]]:
        """:meth:`add_unique` for each of ``jobs`` in order, in one transaction; the
        ``(job ID, outcome)`` of each. A later job of a key an earlier one in the batch
        took meets it as it would meet a job added before: ``refuse`` answers
        ``duplicate``, ``replace`` and ``debounce`` give it the later arguments
        (``replaced``). All or none: an error leaves none of them added or replaced.
        """
        ...

    # --- reading --------------------------------------------------------------------------

    def get(self, job_id: str) -> Job | None:
        """The row, or None."""
        ...

    def find(
        self,
        schedule_id: str | None = None,
        *,
        states: Sequence[str] | None = None,
        queues: Sequence[str] | None = None,
        name: str | None = None,
        limit: int | None = None,
    ) -> list[Job]:
        """The rows matching every filter given (None: any), by ``run_at``, then ID."""
        ...

    def wait(self, job_id: str, timeout: float) -> Job | None:
        """The row once it has finished, or as it stands after ``timeout`` real seconds.

        None if there is no such row. Polls with a growing interval (1 ms to 50 ms);
        a finish in this process wakes it at once.
        """
        ...

    # --- running: take, extend, finish ----------------------------------------------------

    def take(
        self,
        queues: Sequence[str] | None,
        limit: int,
        lease_ttl: float,
        holder: str,
        names: Sequence[str] | None = None,
        now: float | None = None,
    ) -> list[Job]:
        """Start up to ``limit`` due pending jobs for ``holder``, in one statement.

        Picks ``state = 'pending' AND run_at <= now`` in ``queues`` (None: every
        queue) and ``names`` (None: any task), highest ``priority`` first, then
        earliest ``run_at``, then ID; skips a job whose ``lock_key`` is on a
        running row. Each becomes ``running`` with ``fence + 1``, ``holder``,
        ``started_at = now`` and ``lease_expires = now + lease_ttl``. On
        PostgreSQL the rows are chosen ``FOR UPDATE SKIP LOCKED``: concurrent
        callers get different jobs and never wait on each other. Returns the
        started rows as they now stand.
        """
        ...

    def extend(
        self, held: Sequence[tuple[str, int]], lease_ttl: float, now: float | None = None
    ) -> dict[tuple[str, int], bool]:
        """Extend the leases of running ``(job_id, fence)`` pairs to ``now + lease_ttl``.

        One statement. Returns ``{(job_id, fence): cancel_requested}`` for those still
        held; a pair missing from the answer has lost its lease (reclaimed or finished).
        """
        ...

    def finish(
        self,
        job_id: str,
        fence: int,
        kind: str,
        outcome: str | None,
        retry_delay: float | None = None,
        now: float | None = None,
    ) -> str | None:
        """Record the running attempt's outcome and end its lease, in one fenced statement.

        ``kind`` is ``ok`` (→ ``done``), ``cancelled`` (→ ``cancelled``) or
        ``error``: → ``pending`` at ``now + retry_delay`` with ``attempt + 1``
        and ``failures + 1`` if ``retry_delay`` is not None, ``failures <
        retries``, ``attempt < max_attempts`` and no cancel was requested; else
        → ``failed``. Appends the attempt to ``attempts_log``; sets
        ``finished_at`` for a final state. Conditional on ``state = 'running'
        AND fence = fence``: returns the new state, or None if the attempt was
        no longer this caller's (nothing changed).
        """
        ...

    def finish_many(
        self,
        items: Sequence[tuple[str, int, str, str | None, float | None]],
        now: float | None = None,
    ) -> list[str | None]:
        """:meth:`finish` for ``(job_id, fence, kind, outcome, retry_delay)`` items, in one
        statement; the new state (or None) of each, in order. Each job at most once."""
        ...

    def finish_and_take(
        self,
        items: Sequence[tuple[str, int, str, str | None, float | None]],
        queues: Sequence[str] | None,
        limit: int,
        lease_ttl: float,
        holder: str,
        names: Sequence[str] | None = None,
        now: float | None = None,
    ) -> tuple[list[str | None], list[Job]]:
        """:meth:`finish_many` then :meth:`take`, in one transaction (one commit)."""
        ...

    def put_back(
        self, job_id: str, fence: int, now: float | None = None, delay: float | None = None
    ) -> bool:
        """Return a taken attempt to ``pending`` uncounted (no failure, same attempt); fenced.

        With ``delay`` (seconds), the job is due again that long after ``now``
        (a task's rate limit refused it), not at once.
        """
        ...

    def reclaim(self, now: float | None = None) -> int:
        """End every running attempt whose lease has lapsed; return how many.

        Each becomes ``pending`` for ``attempt + 1`` (logged as ``lost``), or
        ``cancelled`` if a cancel was requested, or ``failed`` if ``attempt``
        has reached ``max_attempts`` (a poison pill). One statement.
        """
        ...

    # --- operating ------------------------------------------------------------------------

    def cancel(self, job_id: str, now: float | None = None) -> bool:
        """Cancel a pending job, or flag a running one; False if it is finished or absent."""
        ...

    def retry(self, job_id: str, now: float | None = None) -> bool:
        """Make a ``failed`` or ``cancelled`` job ``pending`` again at ``now``.

        ``attempt + 1``, ``failures`` reset, ``max_attempts`` raised so that it gets
        its retries and lost-attempt allowance again, ``cancel_requested`` cleared.
        False for any other state or an absent job.
        """
        ...

    def delete(self, job_ids: Sequence[str]) -> int:
        """Delete these jobs if finished; return how many were deleted."""
        ...

    def purge(
        self,
        retention: float,
        *,
        states: Sequence[str] | None = None,
        queues: Sequence[str] | None = None,
        now: float | None = None,
    ) -> int:
        """Delete finished rows kept long enough; return how many.

        A row goes once ``finished_at + COALESCE(row.retention, retention) < now``;
        ``states`` (finished ones only; None: all three) and ``queues`` narrow it.
        """
        ...

    def advance(self, schedule_id: str, decide: Decide) -> list[Job]:
        """Evaluate a schedule under its lock: read its watermark and live job count, call
        ``decide``, store the new watermark and add its jobs, all in one transaction.

        Returns the jobs added. Two processes evaluating one schedule are serialized.
        """
        ...

    def listen(self, wake: Callable[[], None]) -> Callable[[], None]:
        """Call ``wake()`` soon after a job may have been added (or a lock key freed).

        At once for an add in this process; PostgreSQL: ``LISTEN``/``NOTIFY``;
        SQLite: a watcher of ``PRAGMA data_version``. Returns a stopper.
        """
        ...

    def turn(self) -> AbstractContextManager[None]:
        """Hold this table's write turn across the calls inside (SQLite: the file's writer
        lock; elsewhere nothing): writes from this thread then go without queueing again.

        For gathering work once it is this process's turn to write: the outcomes
        that queue while a recording waits for the lock go in its transaction.
        """
        ...

    def close(self) -> None:
        """Release connections."""
        ...


PUT_BACK_LOG_MAX = 20
"""Put-backs a job's attempts log keeps (the first ones); later ones change its state only."""


def put_backs(job: Job) -> int:
    """How many put-backs ``job``'s attempts log holds."""
    return sum(1 for a in job.attempts if a.outcome_kind == "put_back")


def ended(job: Job, kind: str, now: float) -> str:
    """``job.attempts_log`` with its current attempt appended as ended ``kind`` at ``now``."""
    log = json.loads(job.attempts_log) if job.attempts_log else []
    log.append(
        {"attempt": job.attempt, "holder": job.holder, "started_at": job.started_at,
         "ended_at": now, "outcome_kind": kind}
    )  # fmt: skip
    return json.dumps(log)


class Wakers:
    """The wake-up callbacks of this process's workers, each registered until its stop."""

    def __init__(self) -> None:
        self._wakes: list[Callable[[], None]] = []
        self._lock = threading.Lock()  # guards _wakes

    def add(self, wake: Callable[[], None]) -> Callable[[], None]:
        """Register ``wake``; returns the function that unregisters it (idempotent)."""
        with self._lock:
            self._wakes.append(wake)

        def stop() -> None:
            with self._lock:
                if wake in self._wakes:
                    self._wakes.remove(wake)

        return stop

    def wake_all(self) -> None:
        """Call every registered callback, outside the lock."""
        with self._lock:
            wakes = list(self._wakes)
        for wake in wakes:
            wake()


def _no_connection(connection: object | None) -> None:
    if connection is not None:
        raise InvalidInput(
            "a memory store's job table takes no connection", field="connection", value=connection
        )


class MemoryJobs:
    """The job table as dicts, for memory:// stores (one process)."""

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self._clock = clock
        self._rows: dict[str, Job] = {}
        self._watermarks: dict[str, float] = {}
        # By unique key: the IDs of rows that had it (stale ones are skipped when read).
        self._unique: dict[str, set[str]] = {}
        self._wakers = Wakers()
        self._lock = threading.Lock()  # guards everything above
        self._finished = threading.Condition(self._lock)
        self._closed = False

    def close(self) -> None:
        pass  # a processor is done with the table; the rows live as long as the store object

    def store_closed(self) -> None:
        """Called as the store closes: every later call raises StoreClosed, as on SQL stores."""
        with self._lock:
            self._closed = True
            self._finished.notify_all()  # a wait() in progress raises too
        self._wake_all()

    def _check_open(self) -> None:
        if self._closed:
            raise StoreClosed("this MemoryStore is closed")

    def turn(self) -> AbstractContextManager[None]:
        return nullcontext()  # each call holds the lock for itself; none waits long

    def _now(self, now: float | None) -> float:
        return self._clock() if now is None else now

    def listen(self, wake: Callable[[], None]) -> Callable[[], None]:
        return self._wakers.add(wake)

    def _wake_all(self) -> None:
        self._wakers.wake_all()

    def _insert(self, job: Job, now: float) -> str:
        existing = self._rows.get(job.id)
        if existing is not None:
            return existing.id
        if job.key is not None:
            for row in self._rows.values():
                if row.key == job.key and row.state in LIVE_STATES:
                    return row.id
        run_at = now if job.run_at is None else job.run_at
        self._rows[job.id] = replace(job, run_at=run_at, enqueued_at=now)
        if job.unique_key is not None:
            self._unique.setdefault(job.unique_key, set()).add(job.id)
        return job.id

    def add(self, job: Job, connection: object | None = None) -> str:
        return self.add_many([job], connection)[0]

    def add_many(self, jobs: Sequence[Job], connection: object | None = None) -> list[str]:
        self._check_open()
        _no_connection(connection)
        with self._lock:
            now = self._clock()
            standing = [self._insert(job, now) for job in jobs]
        self._wake_all()
        return standing

    def add_unique(
        self, job: Job, mode: str, window: float | None, connection: object | None = None
    ) -> tuple[str, str]:
        return self.add_unique_many([job], mode, window, connection)[0]

    def add_unique_many(
        self, jobs: Sequence[Job], mode: str, window: float | None, connection: object | None = None
    ) -> list[tuple[str, str]]:
        self._check_open()
        _no_connection(connection)
        with self._lock:
            now = self._clock()
            outcomes = [self._unique_one(job, mode, window, now) for job in jobs]
        if any(outcome != "duplicate" for _, outcome in outcomes):
            self._wake_all()
        return outcomes

    def _unique_one(self, job: Job, mode: str, window: float | None, now: float) -> tuple[str, str]:
        debounce = mode == "debounce" and window is not None
        until = None if window is None or debounce else now + window
        run_at = now + window if debounce and window is not None else job.run_at
        assert job.unique_key is not None
        holders = self._unique.setdefault(job.unique_key, set())
        for row_id in sorted(holders):
            row = self._rows.get(row_id)
            if row is None or row.unique_key != job.unique_key:
                holders.discard(row_id)  # purged, deleted or expired
                continue
            if row.unique_until is not None and row.unique_until <= now:
                self._rows[row.id] = replace(row, unique_key=None)  # its window has passed
            elif counts(row):
                if mode == "refuse" or row.state != "pending":
                    return row.id, "duplicate"
                self._rows[row.id] = replace(
                    row, args=job.args, run_at=now if run_at is None else run_at,
                    unique_until=until,
                )  # fmt: skip
                return row.id, "replaced"
        added = self._insert(replace(job, run_at=run_at, unique_until=until), now)
        return added, "added" if added == job.id else "duplicate"

    def get(self, job_id: str) -> Job | None:
        self._check_open()
        with self._lock:
            return self._rows.get(job_id)

    def find(
        self,
        schedule_id: str | None = None,
        *,
        states: Sequence[str] | None = None,
        queues: Sequence[str] | None = None,
        name: str | None = None,
        limit: int | None = None,
    ) -> list[Job]:
        self._check_open()
        with self._lock:
            rows = [
                j
                for j in self._rows.values()
                if schedule_id in (None, j.schedule_id)
                and (states is None or j.state in states)
                and (queues is None or j.queue in queues)
                and name in (None, j.name)
            ]
        rows.sort(key=lambda j: (j.run_at, j.id))
        return rows if limit is None else rows[:limit]

    def wait(self, job_id: str, timeout: float) -> Job | None:
        self._check_open()
        deadline = time.monotonic() + timeout
        with self._lock:
            while True:
                self._check_open()
                job = self._rows.get(job_id)
                left = deadline - time.monotonic()
                if job is None or job.state in FINISHED_STATES or left <= 0:
                    return job
                self._finished.wait(left)

    def take(
        self,
        queues: Sequence[str] | None,
        limit: int,
        lease_ttl: float,
        holder: str,
        names: Sequence[str] | None = None,
        now: float | None = None,
    ) -> list[Job]:
        self._check_open()
        with self._lock:
            at = self._now(now)
            busy = {j.lock_key for j in self._rows.values() if j.state == "running"}
            # A lock key's jobs go oldest first: only its oldest pending one may be taken.
            oldest: dict[str, tuple[float, str]] = {}
            for j in self._rows.values():
                if j.state == "pending" and j.lock_key is not None:
                    place = (j.run_at or 0.0, j.id)
                    oldest[j.lock_key] = min(oldest.get(j.lock_key, place), place)
            due = sorted(
                (
                    j
                    for j in self._rows.values()
                    if j.state == "pending"
                    and (j.run_at or 0.0) <= at
                    and (queues is None or j.queue in queues)
                    and (names is None or j.name in names)
                ),
                key=lambda j: (-j.priority, j.run_at, j.id),
            )
            taken: list[Job] = []
            for job in due:
                if len(taken) >= limit:
                    break
                if job.lock_key is not None:
                    if job.lock_key in busy or oldest[job.lock_key] != (job.run_at or 0.0, job.id):
                        continue
                    busy.add(job.lock_key)
                started = replace(
                    job, state="running", fence=(job.fence or 0) + 1, holder=holder,
                    started_at=at, lease_expires=at + lease_ttl, outcome_kind=None, outcome=None,
                )  # fmt: skip
                self._rows[job.id] = started
                taken.append(started)
            return taken

    def _held(self, job_id: str, fence: int) -> Job | None:
        job = self._rows.get(job_id)
        return job if job is not None and job.state == "running" and job.fence == fence else None

    def extend(
        self, held: Sequence[tuple[str, int]], lease_ttl: float, now: float | None = None
    ) -> dict[tuple[str, int], bool]:
        self._check_open()
        with self._lock:
            at = self._now(now)
            alive: dict[tuple[str, int], bool] = {}
            for job_id, fence in held:
                job = self._held(job_id, fence)
                if job is not None:
                    self._rows[job_id] = replace(job, lease_expires=at + lease_ttl)
                    alive[job_id, fence] = job.cancel_requested
            return alive

    def finish(
        self,
        job_id: str,
        fence: int,
        kind: str,
        outcome: str | None,
        retry_delay: float | None = None,
        now: float | None = None,
    ) -> str | None:
        self._check_open()
        with self._lock:
            job = self._held(job_id, fence)
            if job is None:
                return None
            at = self._now(now)
            log = ended(job, kind, at)
            base = replace(job, holder=None, lease_expires=None, attempts_log=log,
                           outcome_kind=kind, outcome=outcome)  # fmt: skip
            if kind == "ok":
                row = replace(base, state="done", finished_at=at)
            elif kind == "cancelled":
                row = replace(base, state="cancelled", finished_at=at)
            elif (
                retry_delay is not None
                and job.failures < job.retries
                and job.attempt < job.max_attempts
                and not job.cancel_requested
            ):
                row = replace(base, state="pending", run_at=at + retry_delay,
                              attempt=job.attempt + 1, failures=job.failures + 1)  # fmt: skip
            else:
                row = replace(base, state="failed", finished_at=at, failures=job.failures + 1)
            self._rows[job_id] = row
            self._finished.notify_all()
        if job.lock_key is not None or row.state == "pending":
            self._wake_all()
        return row.state

    def finish_many(
        self,
        items: Sequence[tuple[str, int, str, str | None, float | None]],
        now: float | None = None,
    ) -> list[str | None]:
        self._check_open()
        return [self.finish(*item, now=now) for item in items]

    def finish_and_take(
        self,
        items: Sequence[tuple[str, int, str, str | None, float | None]],
        queues: Sequence[str] | None,
        limit: int,
        lease_ttl: float,
        holder: str,
        names: Sequence[str] | None = None,
        now: float | None = None,
    ) -> tuple[list[str | None], list[Job]]:
        self._check_open()
        states = self.finish_many(items, now)
        return states, self.take(queues, limit, lease_ttl, holder, names, now) if limit else []

    def put_back(
        self, job_id: str, fence: int, now: float | None = None, delay: float | None = None
    ) -> bool:
        self._check_open()
        with self._lock:
            job = self._held(job_id, fence)
            if job is None:
                return False
            at = self._now(now)
            # Bounded: a job deferred at every poll must not grow its row without end.
            log = (
                job.attempts_log
                if put_backs(job) >= PUT_BACK_LOG_MAX
                else ended(job, "put_back", at)
            )
            run_at = job.run_at if delay is None else at + delay
            self._rows[job_id] = replace(job, state="pending", holder=None, lease_expires=None,
                                         run_at=run_at, attempts_log=log)  # fmt: skip
        return True

    def reclaim(self, now: float | None = None) -> int:
        self._check_open()
        with self._lock:
            at = self._now(now)
            lapsed = [
                j
                for j in self._rows.values()
                if j.state == "running" and (j.lease_expires is None or j.lease_expires <= at)
            ]
            for job in lapsed:
                base = replace(job, holder=None, lease_expires=None,
                               attempts_log=ended(job, "lost", at))  # fmt: skip
                if job.cancel_requested:
                    row = replace(base, state="cancelled", outcome_kind="cancelled", finished_at=at)
                elif job.attempt >= job.max_attempts:
                    row = replace(base, state="failed", outcome_kind="lost", finished_at=at)
                else:
                    row = replace(base, state="pending", attempt=job.attempt + 1)
                self._rows[job.id] = row
            if lapsed:
                self._finished.notify_all()
        if lapsed:
            self._wake_all()
        return len(lapsed)

    def cancel(self, job_id: str, now: float | None = None) -> bool:
        self._check_open()
        with self._lock:
            job = self._rows.get(job_id)
            if job is None or job.state not in LIVE_STATES:
                return False
            if job.state == "pending":
                self._rows[job_id] = replace(
                    job, state="cancelled", outcome_kind="cancelled", finished_at=self._now(now)
                )
                self._finished.notify_all()
            else:
                self._rows[job_id] = replace(job, cancel_requested=True)
            return True

    def retry(self, job_id: str, now: float | None = None) -> bool:
        self._check_open()
        with self._lock:
            job = self._rows.get(job_id)
            if job is None or job.state not in ("failed", "cancelled"):
                return False
            if job.key is not None and any(
                j.key == job.key and j.state in LIVE_STATES for j in self._rows.values()
            ):
                return False  # another live job holds its key
            if (job.unique_states or 0) & STATE_BITS["pending"] and any(
                j.unique_key == job.unique_key and j.id != job_id and counts(j)
                for j in self._rows.values()
            ):
                return False  # another job counts against its unique key
            self._rows[job_id] = replace(
                job, state="pending", run_at=self._now(now), attempt=job.attempt + 1,
                max_attempts=job.max_attempts + job.attempt, failures=0,
                cancel_requested=False, finished_at=None, outcome_kind=None, outcome=None,
            )  # fmt: skip
        self._wake_all()
        return True

    def delete(self, job_ids: Sequence[str]) -> int:
        self._check_open()
        with self._lock:
            gone = [i for i in job_ids if (j := self._rows.get(i)) and j.state in FINISHED_STATES]
            for i in gone:
                del self._rows[i]
            return len(gone)

    def purge(
        self,
        retention: float,
        *,
        states: Sequence[str] | None = None,
        queues: Sequence[str] | None = None,
        now: float | None = None,
    ) -> int:
        self._check_open()
        with self._lock:
            at = self._now(now)
            old = [
                i
                for i, j in self._rows.items()
                if j.state in (states or FINISHED_STATES)
                and j.state in FINISHED_STATES
                and (queues is None or j.queue in queues)
                and (j.finished_at or 0.0) + (retention if j.retention is None else j.retention)
                < at
            ]
            for i in old:
                del self._rows[i]
            return len(old)

    def advance(self, schedule_id: str, decide: Decide) -> list[Job]:
        self._check_open()
        with self._lock:
            live = sum(
                1
                for j in self._rows.values()
                if j.schedule_id == schedule_id and j.state in LIVE_STATES
            )
            decision = decide(self._watermarks.get(schedule_id), live)
            if decision is None:
                return []
            self._watermarks[schedule_id], jobs = decision
            now = self._clock()
            added = [job for job in jobs if self._insert(job, now) == job.id]
        self._wake_all()
        return added
