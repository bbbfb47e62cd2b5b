"""Lock keys: jobs sharing a ``lock_key`` never run at the same time, because each holds a claim.

A worker that has taken a job with a lock key claims ``Unit("dibs.tasks.lock",
lock_key)`` on the store, as a hold whose TTL is the job's lease, before it
runs the job. The store's unique claim is the arbiter (the linearization
point is that claim): while one attempt holds the unit, no other can, on
any process or host. The heartbeat extends the hold with the lease; the hold
is released as soon as the attempt has returned. A worker that dies stops
extending it, so the hold expires within one lease and the next job of that
key can run — as its own job is taken over by then.

Each hold has a holder of its own (the worker's name and a random suffix): two
attempts in one process must not be taken for one holder re-claiming what it
holds, which the store would answer with the existing claim.

A task registered with ``concurrency=N`` also takes a permit of the semaphore
``dibs.tasks.concurrency/<key>`` (:class:`dibs.Semaphore`, N permits) for each
attempt, as a lease of the same TTL renewed by its own thread; ``key`` is the
task's ``concurrency_key`` (a string, or a function of the job's arguments),
its name by default. An attempt that finds every permit taken goes back
uncounted, as for a lock key; a lost permit is a lost attempt. A worker killed
with ``kill -9`` stops renewing, so its permit comes back when the lease ends.

The job table's ``take`` skips jobs whose lock key is on a running row, which
keeps most losers from taking a job they cannot run; a worker that takes one
anyway loses the claim here and puts the job back, uncounted.
"""

from __future__ import annotations

import json
import logging
import secrets
import threading
from collections.abc import Callable
from dataclasses import dataclass

from dibs._model import Unit
from dibs.exceptions import ClaimNotFound, DibsError, HoldLost, ResourceBusy
from dibs.semaphore import Semaphore, SemaphoreLease
from dibs.stores.base import Store
from dibs.stores.jobs import Job

__all__ = ["CONCURRENCY_PREFIX", "LOCK_RESOURCE", "BadConcurrencyKey", "Concurrency", "LockKeys"]

log = logging.getLogger("dibs.tasks")

Attempt = tuple[str, int | None]
"""An attempt of a job: its ID and the fence its take gave it."""

LOCK_RESOURCE = "dibs.tasks.lock"
"""The resource whose slots are lock keys: a lock key ``k`` is ``Unit(LOCK_RESOURCE, k)``."""

CONCURRENCY_PREFIX = "dibs.tasks.concurrency/"
"""A concurrency key ``k`` is the semaphore ``CONCURRENCY_PREFIX + k``."""


class BadConcurrencyKey(Exception):
    """A job's concurrency key could not be made: the task's key function raised, or
    returned a name no store takes. The attempt fails with :attr:`error` (and is
    retried as the task's retries allow); it must never stop the worker."""

    def __init__(self, error: Exception) -> None:
        super().__init__(str(error))
        self.error = error


@dataclass(frozen=True, slots=True)
class Concurrency:
    """A task's limit: at most ``permits`` running attempts per key."""

    permits: int
    key: str | Callable[..., str] | None
    """A fixed key, a function of the job's ``(*args, **kwargs)``, or None: the task's name."""

    def key_of(self, job: Job) -> str:
        """The semaphore key of ``job``'s attempt."""
        if self.key is None:
            return CONCURRENCY_PREFIX + job.name
        if isinstance(self.key, str):
            return CONCURRENCY_PREFIX + self.key
        args, kwargs = json.loads(job.args)
        return CONCURRENCY_PREFIX + str(self.key(*args, **kwargs))


@dataclass(frozen=True, slots=True)
class _Held:
    claim_id: str
    holder: str
    fence: int


class LockKeys:
    """The lock-key holds of one worker process's running attempts, by ``(job ID, fence)``."""

    def __init__(self, store: Store, holder: str, lease: float) -> None:
        self._store = store
        self._holder = holder
        self._lease = lease
        self._lock = threading.Lock()  # guards _held
        self._held: dict[Attempt, _Held] = {}
        self._permits: dict[Attempt, SemaphoreLease] = {}  # guarded by _lock
        # By key and limit: two tasks sharing a key with other limits keep a handle each,
        # instead of a new one (and a new limit written to the store) per attempt.
        self._semaphores: dict[tuple[str, int], Semaphore] = {}  # guarded by _lock

    def acquire(self, job: Job, limit: Concurrency | None = None) -> bool:
        """Claim ``job``'s lock key and a permit of its ``limit`` for its attempt; False if taken.

        True at once for a job with neither. Raises what the store raises
        (StoreUnavailable), and :class:`BadConcurrencyKey` when the job's key
        cannot be made: then nothing is held.
        """
        if not self._lock_key(job):
            return False
        if limit is None:
            return True
        try:
            permit = self._permit(job, limit)
        except BaseException:
            self.release((job.id, job.fence))
            raise
        if permit is None:
            self.release((job.id, job.fence))
            return False
        with self._lock:
            self._permits[job.id, job.fence] = permit
        return True

    def _permit(self, job: Job, limit: Concurrency) -> SemaphoreLease | None:
        try:
            # The task's own function, on the job's arguments: anything may come out.
            key = limit.key_of(job)
            with self._lock:
                sem = self._semaphores.get((key, limit.permits))
                if sem is None:
                    sem = Semaphore(self._store, key, permits=limit.permits)
                    self._semaphores[key, limit.permits] = sem
        except Exception as exc:
            raise BadConcurrencyKey(exc) from exc
        permit = sem.lease(holder=f"{self._holder}/{secrets.token_hex(4)}", ttl=self._lease)
        try:
            permit.__enter__()
        except ResourceBusy:
            return None
        return permit

    def _lock_key(self, job: Job) -> bool:
        if job.lock_key is None:
            return True
        holder = f"{self._holder}/{secrets.token_hex(4)}"
        # Linearization point: the store's claim decides which attempt runs now.
        won = self._store.claim(Unit(LOCK_RESOURCE, job.lock_key), holder=holder, ttl=self._lease)
        if not won or won.claim is None:
            return False
        with self._lock:
            self._held[job.id, job.fence] = _Held(won.claim.id, holder, won.claim.fence)
        return True

    def extend(self, attempts: list[Attempt]) -> set[Attempt]:
        """Extend the holds of these running attempts by a lease; return those whose hold is lost.

        A lost hold means another attempt may now run a job of that key: the
        caller asks this job to stop, as for a lost lease.
        """
        with self._lock:
            held = [(attempt, self._held[attempt]) for attempt in attempts if attempt in self._held]
            permits = [(a, self._permits[a]) for a in attempts if a in self._permits]
        lost: set[Attempt] = {attempt for attempt, permit in permits if permit.lost}
        for attempt, hold in held:
            try:
                self._store.extend(
                    hold.claim_id, holder=hold.holder, fence=hold.fence, ttl=self._lease
                )
            except (HoldLost, ClaimNotFound):
                lost.add(attempt)
            except DibsError:
                log.exception("extending the lock key hold of job %s failed", attempt[0])
        return lost

    def release(self, attempt: Attempt) -> None:
        """Give back the lock key held for ``attempt``, if any; never raises.

        A failed release is harmless: the hold expires within a lease.
        """
        job_id = attempt[0]
        with self._lock:
            hold = self._held.pop(attempt, None)
            permit = self._permits.pop(attempt, None)
        if permit is not None:
            try:
                permit.__exit__(None, None, None)
            except DibsError as exc:  # lost or unreachable: the permit's hold expires by itself
                log.info("the concurrency permit of job %s ended badly: %s", job_id, exc)
        if hold is None:
            return
        try:
            self._store.release(hold.claim_id, holder=hold.holder, fence=hold.fence)
        except (HoldLost, ClaimNotFound):
            pass  # expired or taken over already: nothing left to give back
        except DibsError as exc:
            log.warning("releasing the lock key hold of job %s failed: %s", job_id, exc)
