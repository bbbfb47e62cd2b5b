"""The job table on a SQL database: one implementation, the SQL dialect its only variable.

SQLite (:mod:`dibs.stores.sqlite._jobs`) and PostgreSQL
(:mod:`dibs.stores.postgres._jobs`) subclass :class:`SQLJobs` and supply how to
run work on a connection and the few words their SQL differs by
(:class:`Dialect`). Every write to a taken job is conditional on the
``(attempt, fence)`` the caller saw (see :mod:`dibs.stores.jobs`).

A schedule's evaluation runs in one transaction that first locks the
schedule (SQLite: ``BEGIN IMMEDIATE`` takes the file's write lock;
PostgreSQL: ``SELECT … FOR UPDATE`` on its row), so its watermark, its live
job count and the jobs it adds are read and written as one, whatever the
number of processes or hosts.
"""

from __future__ import annotations

import abc
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from dibs.stores.jobs import COLUMNS, Decide, Job, job_from_row, row_values

__all__ = ["Dialect", "SQLJobs"]

_T = TypeVar("_T")

_LIVE = "state IN ('pending', 'running')"

# "?" marks a parameter; {jobs}, {schedules} and {same} come from the dialect.
_SQL = {
    "insert": f"INSERT INTO {{jobs}} ({COLUMNS}) VALUES ({', '.join('?' * 17)}) "
    "ON CONFLICT DO NOTHING",
    "standing": f"SELECT id FROM {{jobs}} WHERE id = ? OR (key = ? AND {_LIVE}) LIMIT 1",
    "get": f"SELECT {COLUMNS} FROM {{jobs}} WHERE id = ?",
    "due": f"SELECT {COLUMNS} FROM {{jobs}} WHERE {_LIVE} AND run_at <= ? ORDER BY run_at LIMIT ?",
    "find": f"SELECT {COLUMNS} FROM {{jobs}} ORDER BY run_at, id",
    "find_schedule": f"SELECT {COLUMNS} FROM {{jobs}} WHERE schedule_id = ? ORDER BY run_at, id",
    "start": "UPDATE {jobs} SET state = 'running', attempt = ?, fence = ?, claim_id = ?, "
    "outcome_kind = NULL, outcome = NULL WHERE id = ? AND attempt = ? AND fence {same} ? "
    f"AND {_LIVE}",
    "propose": "UPDATE {jobs} SET outcome_kind = ?, outcome = ? "
    "WHERE id = ? AND attempt = ? AND fence = ? AND state = 'running'",
    "retry": "UPDATE {jobs} SET state = 'pending', attempt = attempt + 1, run_at = ?, "
    "failures = failures + 1, fence = NULL, claim_id = NULL "
    "WHERE id = ? AND attempt = ? AND fence {same} ? AND state = 'running'",
    "finish": "UPDATE {jobs} SET state = ?, finished_at = ? "
    "WHERE id = ? AND attempt = ? AND fence {same} ? AND state = 'running'",
    # One statement: a pending job is cancelled, a running one flagged.
    "cancel": "UPDATE {jobs} SET "
    "state = CASE WHEN state = 'pending' THEN 'cancelled' ELSE state END, "
    "outcome_kind = CASE WHEN state = 'pending' THEN 'cancelled' ELSE outcome_kind END, "
    "finished_at = CASE WHEN state = 'pending' THEN ? ELSE finished_at END, "
    "cancel_requested = (state = 'running') "
    f"WHERE id = ? AND {_LIVE}",
    "cancel_requested": "SELECT id FROM {jobs} WHERE cancel_requested = TRUE "
    "AND state = 'running' AND id IN ({ids})",
    "seed_schedule": "INSERT INTO {schedules} (id, watermark) VALUES (?, NULL) "
    "ON CONFLICT DO NOTHING",
    "watermark": "SELECT watermark FROM {schedules} WHERE id = ?{lock}",
    "live": f"SELECT count(*) FROM {{jobs}} WHERE schedule_id = ? AND {_LIVE}",
    "set_watermark": "INSERT INTO {schedules} (id, watermark) VALUES (?, ?) "
    "ON CONFLICT (id) DO UPDATE SET watermark = excluded.watermark",
    "purge": "DELETE FROM {jobs} WHERE state IN ('done', 'failed', 'cancelled') "
    "AND finished_at < ?",
}


@dataclass(frozen=True)
class Dialect:
    """What one database's job-table SQL differs by."""

    jobs: str
    """The jobs table's name, qualified as the statements need it."""
    schedules: str
    """The schedules table's name, likewise."""
    param: str
    """The driver's parameter marker: ``?`` or ``%s``."""
    same: str
    """Null-safe equality: ``IS`` (SQLite) or ``IS NOT DISTINCT FROM`` (PostgreSQL)."""
    lock_schedule: bool
    """Whether an evaluation must create and row-lock its schedule's row first (no file lock)."""


class SQLJobs(abc.ABC):
    """The job table on a SQL database; subclasses say how to reach it. See :class:`JobTable`."""

    def __init__(self, dialect: Dialect) -> None:
        self._dialect = dialect
        self._sql = {name: self._statement(text) for name, text in _SQL.items()}

    def _statement(self, text: str, ids: int = 0) -> Any:
        d = self._dialect
        text = text.format(
            jobs=d.jobs,
            schedules=d.schedules,
            same=d.same,
            lock=" FOR UPDATE" if d.lock_schedule else "",
            ids=", ".join("?" * ids) or "{ids}",
        )
        return self._prepare(text.replace("?", d.param))

    def _prepare(self, text: str) -> Any:
        """The statement as the driver takes it."""
        return text

    @abc.abstractmethod
    def _atomic(self, work: Callable[[Any], _T]) -> _T:
        """Run ``work(conn)`` in one transaction holding the database's write lock.

        Translates driver errors to :class:`~dibs.StoreUnavailable`; ``work`` may run
        again after a transient failure, so it must be safe to repeat.
        """

    @abc.abstractmethod
    def _single(self, work: Callable[[Any], _T]) -> _T:
        """Run ``work(conn)``, one statement, outside an explicit transaction; like _atomic."""

    def _added(self, conn: Any) -> None:  # noqa: B027 - a hook; only PostgreSQL needs it
        """Called in the transaction that added jobs (PostgreSQL notifies listeners)."""

    def _write(self, name: str, params: tuple[Any, ...]) -> bool:
        return self._single(lambda conn: bool(conn.execute(self._sql[name], params).rowcount == 1))

    def _rows(self, name: str, params: tuple[Any, ...]) -> list[Any]:
        return self._single(lambda conn: conn.execute(self._sql[name], params).fetchall())

    def add(self, job: Job) -> str:
        def work(conn: Any) -> str | None:
            if conn.execute(self._sql["insert"], row_values(job)).rowcount == 1:
                self._added(conn)
                return job.id
            row = conn.execute(self._sql["standing"], (job.id, job.key)).fetchone()
            return None if row is None else str(row[0])

        standing = self._atomic(work)
        # None: the live job holding the key finished in between (no file lock on PostgreSQL).
        return self.add(job) if standing is None else standing

    def get(self, job_id: str) -> Job | None:
        rows = self._rows("get", (job_id,))
        return job_from_row(rows[0]) if rows else None

    def due(self, now: float, limit: int) -> list[Job]:
        return [job_from_row(row) for row in self._rows("due", (now, limit))]

    def find(self, schedule_id: str | None = None) -> list[Job]:
        if schedule_id is None:
            return [job_from_row(row) for row in self._rows("find", ())]
        return [job_from_row(row) for row in self._rows("find_schedule", (schedule_id,))]

    def start(
        self, job_id: str, seen_attempt: int, seen_fence: int | None, attempt: int, fence: int,
        claim_id: str,
    ) -> bool:  # fmt: skip
        return self._write("start", (attempt, fence, claim_id, job_id, seen_attempt, seen_fence))

    def propose(self, job_id: str, attempt: int, fence: int, kind: str, outcome: str) -> bool:
        return self._write("propose", (kind, outcome, job_id, attempt, fence))

    def settle(
        self, job_id: str, attempt: int, fence: int | None, state: str, run_at: float | None,
        now: float,
    ) -> bool:  # fmt: skip
        if state == "pending":  # a retry: the next attempt, not yet taken
            return self._write("retry", (run_at, job_id, attempt, fence))
        return self._write("finish", (state, now, job_id, attempt, fence))

    def cancel(self, job_id: str, now: float) -> bool:
        return self._write("cancel", (now, job_id))

    def cancel_requested(self, job_ids: list[str]) -> set[str]:
        if not job_ids:
            return set()
        query = self._statement(_SQL["cancel_requested"], ids=len(job_ids))
        rows = self._single(lambda conn: conn.execute(query, tuple(job_ids)).fetchall())
        return {str(row[0]) for row in rows}

    def advance(self, schedule_id: str, decide: Decide) -> list[Job]:
        # ``decide`` is pure: a retry after a transient failure may run it again.
        def work(conn: Any) -> list[Job]:
            if self._dialect.lock_schedule:
                conn.execute(self._sql["seed_schedule"], (schedule_id,))
            # Linearization point: the schedule's lock (its row, or the file's write lock).
            row = conn.execute(self._sql["watermark"], (schedule_id,)).fetchone()
            (live,) = conn.execute(self._sql["live"], (schedule_id,)).fetchone()
            watermark = None if row is None or row[0] is None else float(row[0])
            decision = decide(watermark, int(live))
            if decision is None:
                return []
            new_watermark, jobs = decision
            conn.execute(self._sql["set_watermark"], (schedule_id, new_watermark))
            insert = self._sql["insert"]
            added = [job for job in jobs if conn.execute(insert, row_values(job)).rowcount == 1]
            if added:
                self._added(conn)
            return added

        return self._atomic(work)

    def purge(self, before: float) -> int:
        return self._single(lambda conn: int(conn.execute(self._sql["purge"], (before,)).rowcount))
