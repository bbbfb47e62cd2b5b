"""Adding durable jobs: the checks and rows behind ``TaskProcessor.enqueue`` and its batches.

One call or a batch becomes job rows here: the task's options merged with the
call's, the due time on the store's clock, and, for a unique task, each job's key.
A batch is one transaction of the job table (``add_many``, or ``add_unique_many``
for a unique task: each job's key decided in order, in that same transaction).
"""

from __future__ import annotations

import secrets
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from dibs._model import shown
from dibs.exceptions import InvalidInput
from dibs.tasks._durable import DurableRunner, RegisteredTask, encode_payload
from dibs.tasks._jobs import Job
from dibs.tasks._options import check_id
from dibs.tasks._records import JobOptions
from dibs.tasks._time import to_epoch, to_seconds
from dibs.tasks._unique import Inserted, Unique, unique_key

__all__ = ["Adding", "check_unique"]


@dataclass(frozen=True)
class Call:
    """The options of one enqueue call (or of every job of a batch)."""

    at: object = None
    delay: object = None
    key: str | None = None
    queue: str | None = None
    priority: int | None = None
    lock_key: str | None = None
    retention: float | None = None
    connection: object = None
    unique: Unique | None = None


class Adding:
    """Turns enqueue calls into job rows on a processor's job table.

    ``durable`` and ``registered`` are the processor's (each raises
    :class:`~dibs.InvalidInput` without a store, or for an unknown task);
    ``check_open`` raises ``ProcessorClosed`` once shutdown has begun.
    """

    def __init__(
        self,
        durable: Callable[[], DurableRunner],
        registered: Callable[[object], RegisteredTask],
        job_options: dict[str, JobOptions],
        check_open: Callable[[], None],
    ) -> None:
        self._durable = durable
        self._registered = registered
        self._job_options = job_options
        self._check_open = check_open

    def insert_many(
        self, task: object, calls: Iterable[tuple[Any, ...] | Mapping[str, Any]], call: Call
    ) -> list[Inserted]:
        """Add one job of ``task`` per call, in one transaction; what happened to each.

        Raises :class:`~dibs.InvalidInput` for bad arguments or options.
        """
        durable = self._durable()
        registered = self._registered(task)
        check_unique(call.unique)
        rule = registered.unique if call.unique is None else call.unique
        options = self._job_options.get(registered.name, JobOptions()).merged(
            call.queue, call.priority, call.lock_key, call.retention
        )
        if rule is not None:
            if call.key is not None:
                raise InvalidInput(
                    "give key= or a unique rule, not both", field="key", value=call.key
                )
            if rule.mode == "debounce" and (call.at is not None or call.delay is not None):
                raise InvalidInput(
                    "a debounced job runs window seconds after the latest call: no at= or delay=",
                    field="delay" if call.delay is not None else "at",
                    value=call.delay if call.at is None else call.at,
                )  # fmt: skip
        run_at = self.run_at(call.at, call.delay)
        if call.key is not None:
            check_id(call.key, "key")
        if isinstance(calls, str | bytes | Mapping) or not isinstance(calls, Iterable):
            raise InvalidInput(
                f"calls must be a list of calls, got {shown(calls)}", field="calls", value=calls
            )
        split = [split_call(one) for one in calls]
        payloads = [encode_payload(args, kwargs) for args, kwargs in split]
        if call.key is not None and len(payloads) > 1:
            raise InvalidInput(
                "key= de-duplicates one job; give it to enqueue(), not to a batch",
                field="key", value=call.key,
            )  # fmt: skip
        keys = [
            None if rule is None else unique_key(rule, registered.name, registered.fn, *one)
            for one in split
        ]
        self._check_open()
        jobs = [
            self.new_job(registered, payload, f"j-{secrets.token_hex(8)}", run_at, options,
                         key=call.key)
            for payload in payloads
        ]  # fmt: skip
        if not jobs:
            return []
        if rule is None:
            standing = durable.jobs.add_many(jobs, connection=call.connection)
            return [
                Inserted(found, "added" if found == job.id else "duplicate")
                for job, found in zip(jobs, standing, strict=True)
            ]
        jobs = [
            replace(job, unique_key=made, unique_states=rule.state_bits)
            for job, made in zip(jobs, keys, strict=True)
        ]
        if len(jobs) == 1:  # one call (insert, enqueue): the table's single-job method
            outcomes = [durable.jobs.add_unique(jobs[0], rule.mode, rule.seconds, call.connection)]
        else:
            outcomes = durable.jobs.add_unique_many(jobs, rule.mode, rule.seconds, call.connection)
        return [
            Inserted(job_id, outcome)  # type: ignore[arg-type]  # one of UNIQUE_OUTCOMES
            for job_id, outcome in outcomes
        ]

    def run_at(self, at: object, delay: object) -> float | None:
        """The due time of a job: ``at``, now + ``delay``, or None (now, on the store's clock)."""
        if at is not None and delay is not None:
            raise InvalidInput("give at= or delay=, not both", field="delay", value=delay)
        if at is not None:
            return to_epoch(at, "at")
        if delay is not None:
            seconds = to_seconds(delay, "delay", allow_zero=True)
            return self._durable().store.now().timestamp() + seconds
        return None

    def new_job(
        self, registered: RegisteredTask, payload: str, job_id: str, run_at: float | None,
        options: JobOptions, *, key: str | None = None, schedule_id: str | None = None,
    ) -> Job:  # fmt: skip
        """A job row of ``registered`` with these arguments, due time and options."""
        job = self._durable().new_job(
            registered, payload, job_id, 0.0, key=key, schedule_id=schedule_id
        )
        return replace(
            job, run_at=run_at, queue=options.queue, priority=options.priority,
            lock_key=options.lock_key, retention=options.retention,
        )  # fmt: skip


def check_unique(unique: object) -> None:
    """Raise :class:`~dibs.InvalidInput` unless ``unique`` is a :class:`Unique` or None."""
    if unique is not None and not isinstance(unique, Unique):
        raise InvalidInput(
            f"unique must be a dibs.tasks.Unique or None, got {shown(unique)}",
            field="unique", value=unique,
        )  # fmt: skip


def split_call(call: object) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """One call of :meth:`TaskProcessor.enqueue_many` as ``(args, kwargs)``."""
    if (
        isinstance(call, tuple)
        and len(call) == 2
        and isinstance(call[0], tuple)
        and isinstance(call[1], dict)
    ):
        return call[0], call[1]
    if isinstance(call, tuple):
        return call, {}
    if isinstance(call, Mapping) and all(isinstance(name, str) for name in call):
        return (), dict(call)
    raise InvalidInput(
        f"each call is a tuple of arguments, a mapping of keyword arguments or an "
        f"(args, kwargs) pair, got {shown(call)}",
        field="calls",
        value=call,
    )
