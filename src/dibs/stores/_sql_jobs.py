"""The job table on a SQL database: one implementation, the SQL dialect its only variable.

SQLite (:mod:`dibs.stores.sqlite._jobs`) and PostgreSQL
(:mod:`dibs.stores.postgres._jobs`) subclass :class:`SQLJobs` and supply how to
run work on a connection and the few words their SQL differs by
(:class:`Dialect`). The hot path is three statements per job, each its own
transaction (see :mod:`dibs.stores.jobs`):

* **add**: ``INSERT … ON CONFLICT DO NOTHING RETURNING id`` (PostgreSQL wraps it
  in a CTE that also calls ``pg_notify``, still one statement);
* **take**: ``WITH picked AS (SELECT id … ORDER BY priority DESC, run_at, id
  LIMIT n FOR UPDATE SKIP LOCKED) UPDATE … SET state = 'running', fence = fence
  + 1, holder, lease … RETURNING *`` — concurrent takers on PostgreSQL skip each
  other's rows instead of racing for them; on SQLite the statement runs under
  the file's write lock, which serializes takers anyway;
* **finish**: ``UPDATE … WHERE id = ? AND fence = ? AND state = 'running'``,
  which records the outcome, decides retry or final state, appends the attempt
  to ``attempts_log`` and ends the lease, all at once. Zero rows: the lease was
  taken over, and nothing changes.

A schedule's evaluation runs in one transaction that first locks the
schedule (SQLite: ``BEGIN IMMEDIATE`` takes the file's write lock;
PostgreSQL: ``SELECT … FOR UPDATE`` on its row), so its watermark, its live
job count and the jobs it adds are read and written as one, whatever the
number of processes or hosts.

Statements are written with named parameters (``:name``) and ``{now}``, the
store's clock as the dialect reads it; the dialect turns them into its own.
"""

from __future__ import annotations

import abc
import json
import logging
import re
import threading
import time
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from typing import Any, TypeVar

from dibs.exceptions import StoreUnavailable
from dibs.stores.jobs import (
    COLUMN_NAMES,
    COLUMNS,
    FINISHED_STATES,
    PUT_BACK_LOG_MAX,
    Decide,
    Job,
    Wakers,
    job_from_row,
    row_values,
)

__all__ = ["Dialect", "SQLJobs"]

log = logging.getLogger("dibs.tasks")

_T = TypeVar("_T")

_LIVE = "state IN ('pending', 'running')"
_FLOAT = "DOUBLE PRECISION"
BATCH = 200
"""Rows per multi-row INSERT in :meth:`SQLJobs.add_many`."""

# What a retried error needs: a delay, retries left, attempts left, no cancel asked.
_RETRY = (
    "(b_kind = 'error' AND b_delay IS NOT NULL "
    "AND failures < retries AND attempt < max_attempts AND cancel_requested = FALSE)"
)
_GIVE_UP = "(cancel_requested = TRUE OR attempt >= max_attempts)"


def _counts(alias: str = "") -> str:
    """Whether a row counts against its unique key: the unique index's predicate, verbatim."""
    return (
        f"({alias}unique_states & (CASE {alias}state WHEN 'pending' THEN 1 WHEN 'running' "
        "THEN 2 WHEN 'done' THEN 4 WHEN 'failed' THEN 8 WHEN 'cancelled' THEN 16 ELSE 0 END)) "
        "<> 0"
    )


UNIQUE_TRIES = 20
"""Rounds of :meth:`SQLJobs.add_unique` before it gives up (each round ends in a decision
unless another transaction changed the key's holder in between)."""

_SQL = {
    "standing": "SELECT {id_out} FROM {jobs} "
    f"WHERE id = :id OR (key = :key AND {_LIVE}) LIMIT 1",
    "get": f"SELECT {COLUMNS} FROM {{jobs}} WHERE id = :id",
    "take": "WITH picked AS (SELECT j.id FROM {jobs} AS j "
    "WHERE j.state = 'pending' AND j.run_at <= {now}{queues}{names} "
    # A lock key's jobs go one at a time, oldest first: none while one is running,
    # and only the oldest pending one (so one take never starts two of a key).
    "AND (j.lock_key IS NULL OR (NOT EXISTS (SELECT 1 FROM {jobs} AS r "
    "WHERE r.state = 'running' AND r.lock_key = j.lock_key) AND NOT EXISTS (SELECT 1 "
    "FROM {jobs} AS o WHERE o.state = 'pending' AND o.lock_key = j.lock_key "
    "AND (o.run_at < j.run_at OR (o.run_at = j.run_at AND o.id < j.id))))) "
    "ORDER BY j.priority DESC, j.run_at, j.id LIMIT :limit{skip_locked}) "
    "UPDATE {jobs} SET state = 'running', fence = COALESCE(fence, 0) + 1, "
    f"holder = :holder, started_at = {{now}}, lease_expires = {{now}} + CAST(:ttl AS {_FLOAT}), "
    "outcome_kind = NULL, outcome = NULL "
    f"WHERE id IN (SELECT id FROM picked) AND state = 'pending' RETURNING {COLUMNS}",
    "due": "SELECT 1 FROM {jobs} AS j WHERE j.state = 'pending' AND j.run_at <= {now}"
    "{queues}{names} LIMIT 1",
    "extend": f"UPDATE {{jobs}} SET lease_expires = {{now}} + CAST(:ttl AS {_FLOAT}) "
    "WHERE state = 'running' AND {held} RETURNING id, fence, cancel_requested",
    # Many attempts at once: {batch} yields (b_id, b_fence, b_kind, b_outcome, b_delay).
    "finish": "UPDATE {jobs} SET "
    "state = CASE WHEN b_kind = 'ok' THEN 'done' "
    f"WHEN b_kind = 'cancelled' THEN 'cancelled' WHEN {_RETRY} THEN 'pending' "
    "ELSE 'failed' END, "
    f"run_at = CASE WHEN {_RETRY} THEN {{now}} + b_delay ELSE run_at END, "
    f"attempt = CASE WHEN {_RETRY} THEN attempt + 1 ELSE attempt END, "
    "failures = CASE WHEN b_kind = 'error' THEN failures + 1 ELSE failures END, "
    f"finished_at = CASE WHEN {_RETRY} THEN NULL ELSE {{now}} END, "
    "outcome_kind = b_kind, outcome = b_outcome, holder = NULL, lease_expires = NULL, "
    "attempts_log = {log_kind} FROM {batch} AS b "
    "WHERE id = b_id AND fence = b_fence AND state = 'running' RETURNING id, state, lock_key",
    # The log keeps the first PUT_BACK_LOG_MAX put-backs: a job put back at every poll
    # must not grow its row without end.
    "put_back": "UPDATE {jobs} SET state = 'pending', holder = NULL, lease_expires = NULL, "
    f"attempts_log = CASE WHEN {{put_backs}} >= {PUT_BACK_LOG_MAX} THEN attempts_log "
    "ELSE {log_put_back} END WHERE id = :id AND fence = :fence AND state = 'running'",
    # put_back with a delay: due again ``delay`` seconds from now (a rate limit's refusal).
    "defer": "UPDATE {jobs} SET state = 'pending', holder = NULL, lease_expires = NULL, "
    f"run_at = {{now}} + CAST(:delay AS {_FLOAT}), "
    f"attempts_log = CASE WHEN {{put_backs}} >= {PUT_BACK_LOG_MAX} THEN attempts_log "
    "ELSE {log_put_back} END WHERE id = :id AND fence = :fence AND state = 'running'",
    "reclaim": "UPDATE {jobs} SET "
    "state = CASE WHEN cancel_requested = TRUE THEN 'cancelled' "
    "WHEN attempt >= max_attempts THEN 'failed' ELSE 'pending' END, "
    "outcome_kind = CASE WHEN cancel_requested = TRUE THEN 'cancelled' "
    "WHEN attempt >= max_attempts THEN 'lost' ELSE NULL END, "
    f"attempt = CASE WHEN {_GIVE_UP} THEN attempt ELSE attempt + 1 END, "
    f"finished_at = CASE WHEN {_GIVE_UP} THEN {{now}} ELSE NULL END, "
    "holder = NULL, lease_expires = NULL, attempts_log = {log_lost} "
    "WHERE state = 'running' AND (lease_expires IS NULL OR lease_expires <= {now}) "
    "RETURNING id, state",
    # One statement: a pending job is cancelled, a running one flagged.
    "cancel": "UPDATE {jobs} SET "
    "state = CASE WHEN state = 'pending' THEN 'cancelled' ELSE state END, "
    "outcome_kind = CASE WHEN state = 'pending' THEN 'cancelled' ELSE outcome_kind END, "
    "finished_at = CASE WHEN state = 'pending' THEN {now} ELSE finished_at END, "
    "cancel_requested = (state = 'running') "
    f"WHERE id = :id AND {_LIVE}",
    "retry": "UPDATE {jobs} SET state = 'pending', run_at = {now}, attempt = attempt + 1, "
    "max_attempts = max_attempts + attempt, failures = 0, cancel_requested = FALSE, "
    "finished_at = NULL, outcome_kind = NULL, outcome = NULL "
    "WHERE id = :id AND state IN ('failed', 'cancelled') AND (key IS NULL OR NOT EXISTS "
    f"(SELECT 1 FROM {{jobs}} AS o WHERE o.key = {{jobs}}.key AND o.{_LIVE})) "
    # Pending again must not make a second job count against its unique key.
    "AND (unique_key IS NULL OR (unique_states & 1) = 0 OR NOT EXISTS (SELECT 1 FROM {jobs} "
    f"AS u WHERE u.unique_key = {{jobs}}.unique_key AND u.id <> {{jobs}}.id AND {_counts('u.')}))",
    # A unique key's holder whose window has passed stops counting: its key is cleared,
    # in the enqueuer's transaction (its rollback restores it).
    # (Only counting rows matter; saying so lets the partial unique index find them.)
    "unique_expire": "UPDATE {jobs} SET unique_key = NULL "
    f"WHERE unique_key = :unique_key AND unique_until <= {{now}} AND {_counts()}",
    "unique_replace": "UPDATE {jobs} SET args = :args, run_at = {run_at}, "
    "unique_until = {until} WHERE unique_key = :unique_key AND state = 'pending' "
    f"AND {_counts()} RETURNING {{id_out}}",
    "unique_standing": "SELECT {id_out}, state FROM {jobs} "
    f"WHERE unique_key = :unique_key AND {_counts()} LIMIT 1",
    "delete": "DELETE FROM {jobs} WHERE state IN ('done', 'failed', 'cancelled') AND {ids}",
    "purge": "DELETE FROM {jobs} WHERE {states}{queues} "
    f"AND finished_at + COALESCE(retention, CAST(:retention AS {_FLOAT})) < {{now}}",
    "seed_schedule": "INSERT INTO {schedules} (id, watermark) VALUES (:id, NULL) "
    "ON CONFLICT DO NOTHING",
    "watermark": "SELECT watermark FROM {schedules} WHERE id = :id{lock}",
    "live": f"SELECT count(*) FROM {{jobs}} WHERE schedule_id = :id AND {_LIVE}",
    "set_watermark": "INSERT INTO {schedules} (id, watermark) VALUES (:id, :watermark) "
    "ON CONFLICT (id) DO UPDATE SET watermark = excluded.watermark",
}


def _text(value: Any) -> str:
    """A text value read back on any connection: a caller's may hand it over as bytes."""
    if isinstance(value, bytes | bytearray | memoryview):
        return bytes(value).decode()
    return str(value)


_PARAM = re.compile(r"(?<![:\w]):([a-z_][a-z_0-9]*)")


@dataclass(frozen=True)
class Dialect:
    """What one database's job-table SQL differs by."""

    jobs: str
    """The jobs table's name, qualified as the statements need it."""
    schedules: str
    """The schedules table's name, likewise."""
    named: str
    """The driver's named parameter, ``{}`` for the name: ``:{}`` or ``%({})s``."""
    now: str
    """The store's clock in a statement (may use ``:now``)."""
    in_list: str
    """``{col} IN`` a list parameter ``{name}`` (SQLite: JSON text; PostgreSQL: an array)."""
    held: str
    """``(id, fence)`` of the row in the JSON list parameter ``:held``."""
    batch: str
    """The JSON list parameter ``:batch`` of ``[id, fence, kind, outcome, delay]`` as a
    table of ``b_id, b_fence, b_kind, b_outcome, b_delay``."""
    log_append: str
    """``attempts_log`` with one entry appended: ``{kind}`` and ``{now}`` are SQL."""
    put_backs: str
    """The number of ``put_back`` entries in ``attempts_log``."""
    lock_schedule: bool
    """Whether an evaluation must create and row-lock its schedule's row first (no file lock)."""
    skip_locked: str
    """What makes concurrent takers skip each other's rows (PostgreSQL) or nothing."""
    json_lists: bool
    """Whether list parameters are passed as JSON text (SQLite) rather than lists."""
    insert_returning: str = "{insert} RETURNING id"
    """How an INSERT reports the IDs it added (PostgreSQL also notifies ``:channel``)."""
    id_out: str = "id"
    """A job ID as :meth:`SQLJobs.add_many` reads it back (SQLite: as a BLOB, which neither
    a caller connection's ``text_factory`` nor its converters touch)."""
    precheck: bool = False
    """Whether a take reads first and writes only if a job is due (SQLite: the single
    writer lock is the scarce thing; PostgreSQL: the read would be a commit of its own)."""
    channel: str | None = None
    """The ``NOTIFY`` channel that wakes workers in other processes, if any."""


class SQLJobs(abc.ABC):
    """The job table on a SQL database; subclasses say how to reach it. See :class:`JobTable`."""

    def __init__(self, dialect: Dialect, clock: Callable[[], float | None]) -> None:
        self._dialect = dialect
        self._clock = clock
        self._cache: dict[tuple[str, Any], Any] = {}
        self._wakers = Wakers()
        self._finished = threading.Condition()

    # --- building statements --------------------------------------------------------------

    def _text(self, name: str, **parts: str) -> str:
        d = self._dialect
        text = _SQL.get(name, name)

        def log(kind: str) -> str:
            return d.log_append.format(kind=kind, now="{now}")

        fields = {
            "jobs": d.jobs,
            "schedules": d.schedules,
            "lock": " FOR UPDATE" if d.lock_schedule else "",
            "skip_locked": d.skip_locked,
            "log_kind": log("b_kind"),
            "batch": d.batch,
            "log_lost": log("'lost'"),
            "log_put_back": log("'put_back'"),
            "put_backs": d.put_backs,
            "held": d.held,
            "queues": "",
            "names": "",
            "states": "",
            "ids": "",
            "id_out": d.id_out,
            "now": "{now}",
            "run_at": "{now}",
            "until": "{now}",
        }
        fields.update(parts)
        text = text.format(**fields).format(now=d.now)
        return _PARAM.sub(lambda m: d.named.format(m.group(1)), text)

    def _statement(self, name: str, variant: Any = None, **parts: str) -> Any:
        key = (name, variant)
        statement = self._cache.get(key)
        if statement is None:
            statement = self._cache[key] = self._prepare(self._text(name, **parts))
        return statement

    def _in(self, col: str, name: str) -> str:
        return self._dialect.in_list.format(col=col, name=name)

    def _list(self, values: Sequence[Any]) -> Any:
        return json.dumps(list(values)) if self._dialect.json_lists else list(values)

    def _insert_text(self, count: int, exprs: dict[str, str] | None = None) -> str:
        values = []
        for i in range(count):
            row = []
            for col in COLUMN_NAMES:
                if exprs and col in exprs:
                    row.append(exprs[col])
                elif col == "run_at":
                    row.append(f"COALESCE(CAST(:run_at_{i} AS {_FLOAT}), {{now}})")
                elif col == "enqueued_at":
                    row.append("{now}")
                else:
                    row.append(f":{col}_{i}")
            values.append(f"({', '.join(row)})")
        insert = (
            f"INSERT INTO {{jobs}} ({COLUMNS}) VALUES {', '.join(values)} ON CONFLICT DO NOTHING"
        )
        return self._dialect.insert_returning.format(insert=insert)

    def _prepare(self, text: str) -> Any:
        """The statement as the driver takes it."""
        return text

    def _now(self, now: float | None) -> float | None:
        return self._clock() if now is None else now

    # --- how to reach the database (subclasses) -------------------------------------------

    @abc.abstractmethod
    def _atomic(self, work: Callable[[Any], _T]) -> _T:
        """Run ``work(conn)`` in one transaction holding the database's write lock.

        Translates driver errors to :class:`~dibs.StoreUnavailable`; ``work`` may run
        again after a transient failure, so it must be safe to repeat.
        """

    @abc.abstractmethod
    def _single(self, work: Callable[[Any], _T], write: bool = True) -> _T:
        """Run ``work(conn)``, one statement, as its own transaction; like _atomic.

        ``write``: the statement writes (SQLite takes the write lock first, so that a
        statement never has to upgrade a read snapshot that another writer moved on).
        """

    @abc.abstractmethod
    def _on_caller(self, connection: object, work: Callable[[Any], _T]) -> _T:
        """Run ``work`` on the caller's own connection, inside its transaction.

        Raises :class:`~dibs.InvalidInput` for an object that is not this database's
        connection; translates driver errors like :meth:`_atomic`.
        """

    def turn(self) -> AbstractContextManager[None]:
        """Nothing here (PostgreSQL's rows lock one by one); SQLite holds its writer lock."""
        return nullcontext()

    def _run(self, conn: Any, statement: Any, params: dict[str, Any]) -> Any:
        """Execute on ``conn``; returns the cursor."""
        return conn.execute(statement, params)

    def _rows(self, statement: Any, params: dict[str, Any], write: bool = True) -> list[Any]:
        return self._single(lambda conn: self._run(conn, statement, params).fetchall(), write)

    # --- waking ---------------------------------------------------------------------------

    def _origin(self) -> str:
        """Who sends an insert's notification (PostgreSQL): its listener skips its own
        process's, which the local wake-up after the commit already covers."""
        return ""

    def _local_wake(self) -> None:
        self._wakers.wake_all()

    def _add_local(self, wake: Callable[[], None]) -> Callable[[], None]:
        return self._wakers.add(wake)

    def _finished_here(self) -> None:
        with self._finished:
            self._finished.notify_all()

    # --- adding ---------------------------------------------------------------------------

    def add(self, job: Job, connection: object | None = None) -> str:
        return self.add_many([job], connection)[0]

    def add_many(self, jobs: Sequence[Job], connection: object | None = None) -> list[str]:
        if not jobs:
            return []
        now = self._now(None)

        # The caller commits a job added on its connection, after our local wake-up:
        # its notification must wake this process's workers too.
        origin = self._origin() if connection is None else ""

        def work(conn: Any) -> list[str | None]:
            standing: list[str | None] = []
            for start in range(0, len(jobs), BATCH):
                chunk = jobs[start : start + BATCH]
                params: dict[str, Any] = {
                    "now": now, "channel": self._dialect.channel, "origin": origin,
                }  # fmt: skip
                for i, job in enumerate(chunk):
                    for col, value in zip(COLUMN_NAMES, row_values(job), strict=True):
                        params[f"{col}_{i}"] = value
                statement = self._statement(self._insert_text(len(chunk)), ("insert", len(chunk)))
                added = {_text(row[0]) for row in self._run(conn, statement, params).fetchall()}
                for job in chunk:
                    if job.id in added:
                        standing.append(job.id)
                        continue
                    row = self._run(
                        conn, self._statement("standing"), {"id": job.id, "key": job.key}
                    ).fetchone()
                    standing.append(None if row is None else _text(row[0]))
            return standing

        result = self._atomic(work) if connection is None else self._on_caller(connection, work)
        self._local_wake()
        # None: the live job holding the key finished in between (no file lock on PostgreSQL).
        return [
            self.add(job, connection) if found is None else found
            for job, found in zip(jobs, result, strict=True)
        ]

    def add_unique(
        self, job: Job, mode: str, window: float | None, connection: object | None = None
    ) -> tuple[str, str]:
        return self.add_unique_many([job], mode, window, connection)[0]

    def add_unique_many(
        self, jobs: Sequence[Job], mode: str, window: float | None, connection: object | None = None
    ) -> list[tuple[str, str]]:
        debounce = mode == "debounce" and window is not None
        window_sql = f"CAST(:window AS {_FLOAT})"
        until = "NULL" if window is None or debounce else f"{{now}} + {window_sql}"
        given = f"COALESCE(CAST(:run_at AS {_FLOAT}), {{now}})"
        run_at = f"{{now}} + {window_sql}" if debounce else given
        variant = (debounce, window is None)
        insert = self._statement(
            self._insert_text(1, {"run_at": run_at, "unique_until": until}), ("unique", variant)
        )
        replace = self._statement("unique_replace", variant, run_at=run_at, until=until)
        expire, standing = self._statement("unique_expire"), self._statement("unique_standing")
        origin = self._origin() if connection is None else ""
        now = self._now(None)

        def one(conn: Any, job: Job) -> tuple[str, str]:
            params: dict[str, Any] = {
                f"{col}_0": value for col, value in zip(COLUMN_NAMES, row_values(job), strict=True)
            }
            params |= {
                "now": now, "channel": self._dialect.channel, "origin": origin,
                "window": window, "unique_key": job.unique_key, "args": job.args,
                "run_at": job.run_at,
            }  # fmt: skip
            # The unique index decides; these reads only say who won. A round ends
            # without a decision only if the holder changed in between (PostgreSQL,
            # READ COMMITTED: each statement sees the latest commits). An earlier job
            # of the batch is this transaction's own row: met as any other holder.
            for _ in range(UNIQUE_TRIES):
                self._run(conn, expire, params)
                if mode != "refuse":
                    row = self._run(conn, replace, params).fetchone()
                    if row is not None:
                        return _text(row[0]), "replaced"
                if self._run(conn, insert, params).fetchall():
                    return job.id, "added"
                row = self._run(conn, standing, params).fetchone()
                if row is not None and (mode == "refuse" or row[1] != "pending"):
                    return _text(row[0]), "duplicate"
            raise StoreUnavailable(
                f"unique job key stayed contended for {UNIQUE_TRIES} rounds; try again"
            )

        # Keys in one order (a job's own order among its key's): two batches wait for each
        # other's rows in that order, so they never deadlock; a key's calls keep theirs.
        order = sorted(range(len(jobs)), key=lambda i: (jobs[i].unique_key or "", i))

        def work(conn: Any) -> list[tuple[str, str]]:
            decided: dict[int, tuple[str, str]] = {i: one(conn, jobs[i]) for i in order}
            return [decided[i] for i in range(len(jobs))]

        if not jobs:
            return []
        result = self._atomic(work) if connection is None else self._on_caller(connection, work)
        if any(outcome != "duplicate" for _, outcome in result):
            self._local_wake()
        return result

    # --- reading --------------------------------------------------------------------------

    def get(self, job_id: str) -> Job | None:
        rows = self._rows(self._statement("get"), {"id": job_id}, write=False)
        return job_from_row(rows[0]) if rows else None

    def find(
        self,
        schedule_id: str | None = None,
        *,
        states: Sequence[str] | None = None,
        queues: Sequence[str] | None = None,
        name: str | None = None,
        limit: int | None = None,
    ) -> list[Job]:
        where = ["TRUE"]
        params: dict[str, Any] = {}
        if schedule_id is not None:
            where.append("schedule_id = :schedule_id")
            params["schedule_id"] = schedule_id
        if states is not None:
            where.append(self._in("state", "states"))
            params["states"] = self._list(states)
        if queues is not None:
            where.append(self._in("queue", "queues"))
            params["queues"] = self._list(queues)
        if name is not None:
            where.append("name = :name")
            params["name"] = name
        text = f"SELECT {COLUMNS} FROM {{jobs}} WHERE {' AND '.join(where)} ORDER BY run_at, id"
        if limit is not None:
            text += " LIMIT :limit"
            params["limit"] = limit
        statement = self._statement(text, tuple(sorted(params)))
        return [job_from_row(row) for row in self._rows(statement, params, write=False)]

    def wait(self, job_id: str, timeout: float) -> Job | None:
        deadline = time.monotonic() + timeout
        pause = 0.001
        while True:
            job = self.get(job_id)
            left = deadline - time.monotonic()
            if job is None or job.state in FINISHED_STATES or left <= 0:
                return job
            with self._finished:  # a finish in this process wakes us at once
                self._finished.wait(min(pause, left))
            pause = min(pause * 2, 0.05)

    # --- running --------------------------------------------------------------------------

    def take(
        self,
        queues: Sequence[str] | None,
        limit: int,
        lease_ttl: float,
        holder: str,
        names: Sequence[str] | None = None,
        now: float | None = None,
    ) -> list[Job]:
        statement, params = self._take_args(queues, limit, lease_ttl, holder, names, now)
        if self._dialect.precheck:
            # A read first: waking for nothing costs no write transaction.
            check = self._statement("due", (queues is None, names is None), **self._filters(params))
            if not self._rows(check, params, write=False):
                return []
        return self._single(lambda conn: self._take_on(conn, statement, params))

    def _take_args(
        self,
        queues: Sequence[str] | None,
        limit: int,
        lease_ttl: float,
        holder: str,
        names: Sequence[str] | None,
        now: float | None,
    ) -> tuple[Any, dict[str, Any]]:
        params: dict[str, Any] = {
            "now": self._now(now), "limit": limit, "ttl": lease_ttl, "holder": holder,
        }  # fmt: skip
        if queues is not None:
            params["queues"] = self._list(queues)
        if names is not None:
            params["names"] = self._list(names)
        parts = self._filters(params)
        return self._statement("take", (queues is None, names is None), **parts), params

    def _filters(self, params: dict[str, Any]) -> dict[str, str]:
        parts = {}
        if "queues" in params:
            parts["queues"] = " AND " + self._in("j.queue", "queues")
        if "names" in params:
            parts["names"] = " AND " + self._in("j.name", "names")
        return parts

    def _take_on(self, conn: Any, statement: Any, params: dict[str, Any]) -> list[Job]:
        jobs = [job_from_row(row) for row in self._run(conn, statement, params).fetchall()]
        jobs.sort(key=lambda j: (-j.priority, j.run_at, j.id))
        return jobs

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
        at = self._now(now)
        finish = self._statement("finish")
        fparams = {"batch": json.dumps([list(item) for item in items]), "now": at}
        take, tparams = self._take_args(queues, limit, lease_ttl, holder, names, at)

        def work(conn: Any) -> tuple[list[Any], list[Job]]:
            rows = self._run(conn, finish, fparams).fetchall() if items else []
            return rows, self._take_on(conn, take, tparams) if limit > 0 else []

        rows, taken = self._atomic(work)
        return self._ended_states(items, rows), taken

    def extend(
        self, held: Sequence[tuple[str, int]], lease_ttl: float, now: float | None = None
    ) -> dict[tuple[str, int], bool]:
        if not held:
            return {}
        params = {
            "now": self._now(now),
            "ttl": lease_ttl,
            "held": json.dumps([[job_id, fence] for job_id, fence in held]),
        }
        rows = self._rows(self._statement("extend"), params)
        return {(str(row[0]), int(row[1])): bool(row[2]) for row in rows}

    def finish(
        self,
        job_id: str,
        fence: int,
        kind: str,
        outcome: str | None,
        retry_delay: float | None = None,
        now: float | None = None,
    ) -> str | None:
        return self.finish_many([(job_id, fence, kind, outcome, retry_delay)], now)[0]

    def finish_many(
        self,
        items: Sequence[tuple[str, int, str, str | None, float | None]],
        now: float | None = None,
    ) -> list[str | None]:
        if not items:
            return []
        params = {"batch": json.dumps([list(item) for item in items]), "now": self._now(now)}
        return self._ended_states(items, self._rows(self._statement("finish"), params))

    def _ended_states(
        self, items: Sequence[tuple[str, int, str, str | None, float | None]], rows: list[Any]
    ) -> list[str | None]:
        ended = {str(row[0]): (str(row[1]), row[2]) for row in rows}
        if not ended:
            return [None] * len(items)
        self._finished_here()
        if any(lock_key is not None or state == "pending" for state, lock_key in ended.values()):
            self._local_wake()  # a lock key is free, or a retry is due: take again
        # One row per job: a batch never holds two attempts of one job with live fences.
        return [ended[job_id][0] if job_id in ended else None for job_id, *_ in items]

    def put_back(
        self, job_id: str, fence: int, now: float | None = None, delay: float | None = None
    ) -> bool:
        params: dict[str, Any] = {"id": job_id, "fence": fence, "now": self._now(now)}
        if delay is not None:
            params["delay"] = float(delay)
        stmt = self._statement("put_back" if delay is None else "defer")
        done = self._single(lambda conn: self._run(conn, stmt, params).rowcount == 1)
        return bool(done)

    def reclaim(self, now: float | None = None) -> int:
        rows = self._rows(self._statement("reclaim"), {"now": self._now(now)})
        for job_id, state in rows:
            if state == "failed":
                log.error("job %s lost its worker too many times; failed as a poison pill", job_id)
        if rows:
            self._finished_here()
            self._local_wake()
        return len(rows)

    # --- operating ------------------------------------------------------------------------

    def _write(self, statement: Any, params: dict[str, Any]) -> int:
        return int(self._single(lambda conn: self._run(conn, statement, params).rowcount))

    def cancel(self, job_id: str, now: float | None = None) -> bool:
        done = self._write(self._statement("cancel"), {"id": job_id, "now": self._now(now)}) == 1
        if done:
            self._finished_here()
        return done

    def retry(self, job_id: str, now: float | None = None) -> bool:
        done = self._write(self._statement("retry"), {"id": job_id, "now": self._now(now)}) == 1
        if done:
            self._local_wake()
        return done

    def delete(self, job_ids: Sequence[str]) -> int:
        if not job_ids:
            return 0
        statement = self._statement("delete", ids=self._in("id", "ids"))
        return self._write(statement, {"ids": self._list(job_ids)})

    def purge(
        self,
        retention: float,
        *,
        states: Sequence[str] | None = None,
        queues: Sequence[str] | None = None,
        now: float | None = None,
    ) -> int:
        chosen = [s for s in (states or FINISHED_STATES) if s in FINISHED_STATES]
        if not chosen:
            return 0
        params: dict[str, Any] = {
            "now": self._now(now), "retention": retention, "states": self._list(chosen),
        }  # fmt: skip
        parts = {"states": self._in("state", "states")}
        if queues is not None:
            parts["queues"] = " AND " + self._in("queue", "queues")
            params["queues"] = self._list(queues)
        return self._write(self._statement("purge", queues is None, **parts), params)

    def advance(self, schedule_id: str, decide: Decide) -> list[Job]:
        # ``decide`` is pure: a retry after a transient failure may run it again.
        now = self._now(None)
        origin = self._origin()

        def work(conn: Any) -> list[Job]:
            ids = {"id": schedule_id}
            if self._dialect.lock_schedule:
                self._run(conn, self._statement("seed_schedule"), ids)
            # Linearization point: the schedule's lock (its row, or the file's write lock).
            row = self._run(conn, self._statement("watermark"), ids).fetchone()
            (live,) = self._run(conn, self._statement("live"), ids).fetchone()
            watermark = None if row is None or row[0] is None else float(row[0])
            decision = decide(watermark, int(live))
            if decision is None:
                return []
            new_watermark, jobs = decision
            self._run(conn, self._statement("set_watermark"), {**ids, "watermark": new_watermark})
            added = []
            statement = self._statement(self._insert_text(1), ("insert", 1))
            for job in jobs:
                params = {"now": now, "channel": self._dialect.channel, "origin": origin} | {
                    f"{col}_0": value
                    for col, value in zip(COLUMN_NAMES, row_values(job), strict=True)
                }
                if self._run(conn, statement, params).fetchall():
                    added.append(job)
            return added

        added = self._atomic(work)
        if added:
            self._local_wake()
        return added
