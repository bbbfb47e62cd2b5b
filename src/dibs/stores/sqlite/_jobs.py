"""The job table in a SQLite store's file: ``dibs_jobs`` and ``dibs_job_schedules``.

Every multi-statement operation runs in ``BEGIN IMMEDIATE``, which takes the
file's write lock first: operations on the file are serialized, so a
schedule's watermark, its live-job count and the jobs an evaluation adds are
read and written as one. Wake-ups: none; the runner polls (short and cheap).
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from typing import Any, TypeVar

from dibs.stores.jobs import COLUMNS, Decide, Job, job_from_row, row_values
from dibs.stores.sqlite._conn import SQLitePool
from dibs.stores.sqlite._schema import JOBS, upgrade

__all__ = ["SQLiteJobs"]

_INSERT = f"INSERT INTO dibs_jobs ({COLUMNS}) VALUES ({', '.join('?' * 17)}) ON CONFLICT DO NOTHING"
_T = TypeVar("_T")
_STANDING = (
    "SELECT id FROM dibs_jobs WHERE id = ? OR (key = ? AND state IN ('pending', 'running')) LIMIT 1"
)


class SQLiteJobs:
    """``dibs_jobs`` in the SQLite store's file, on the store's own connections.

    Sharing the store's pool gives the job table the same fork rules, pragmas, busy
    retries and bounded connections (see :mod:`dibs.stores.sqlite._conn`); closing the
    store closes them.
    """

    def __init__(self, pool: SQLitePool) -> None:
        self._pool = pool

        def create() -> None:
            with self._pool.transaction("BEGIN IMMEDIATE") as conn:
                upgrade(conn, JOBS, pool.path)

        self._pool.retrying(create)

    def close(self) -> None:
        """Nothing of its own to close: the connections are the store's."""

    def listen(self, wake: Callable[[], None]) -> Callable[[], None]:
        return lambda: None  # no notifications on SQLite: the runner's poll finds new rows

    def _transaction(self, work: Callable[[sqlite3.Connection], _T]) -> _T:
        def attempt() -> _T:
            with self._pool.transaction("BEGIN IMMEDIATE") as conn:
                return work(conn)

        return self._pool.retrying(attempt)

    def _write(self, sql: str, params: tuple[Any, ...]) -> bool:
        def attempt() -> bool:
            with self._pool.connection() as conn:
                return bool(conn.execute(sql, params).rowcount == 1)

        return self._pool.retrying(attempt)

    def _read(self, sql: str, params: tuple[Any, ...]) -> list[Any]:
        def attempt() -> list[Any]:
            with self._pool.connection() as conn:
                return conn.execute(sql, params).fetchall()

        return self._pool.retrying(attempt)

    def add(self, job: Job) -> str:
        def work(conn: sqlite3.Connection) -> str:
            if conn.execute(_INSERT, row_values(job)).rowcount == 1:
                return job.id
            (standing,) = conn.execute(_STANDING, (job.id, job.key)).fetchone()
            return str(standing)

        return self._transaction(work)

    def get(self, job_id: str) -> Job | None:
        rows = self._read(f"SELECT {COLUMNS} FROM dibs_jobs WHERE id = ?", (job_id,))
        return job_from_row(rows[0]) if rows else None

    def due(self, now: float, limit: int) -> list[Job]:
        rows = self._read(
            f"SELECT {COLUMNS} FROM dibs_jobs WHERE state IN ('pending', 'running') "
            "AND run_at <= ? ORDER BY run_at LIMIT ?",
            (now, limit),
        )
        return [job_from_row(row) for row in rows]

    def start(
        self, job_id: str, seen_attempt: int, seen_fence: int | None, attempt: int, fence: int,
        claim_id: str,
    ) -> bool:  # fmt: skip
        return self._write(
            "UPDATE dibs_jobs SET state = 'running', attempt = ?, fence = ?, claim_id = ?, "
            "outcome_kind = NULL, outcome = NULL WHERE id = ? AND attempt = ? AND fence IS ? "
            "AND state IN ('pending', 'running')",
            (attempt, fence, claim_id, job_id, seen_attempt, seen_fence),
        )

    def propose(self, job_id: str, attempt: int, fence: int, kind: str, outcome: str) -> bool:
        return self._write(
            "UPDATE dibs_jobs SET outcome_kind = ?, outcome = ? "
            "WHERE id = ? AND attempt = ? AND fence = ? AND state = 'running'",
            (kind, outcome, job_id, attempt, fence),
        )

    def settle(
        self, job_id: str, attempt: int, fence: int | None, state: str, run_at: float | None,
        now: float,
    ) -> bool:  # fmt: skip
        if state == "pending":  # a retry: the next attempt, not yet taken
            return self._write(
                "UPDATE dibs_jobs SET state = 'pending', attempt = attempt + 1, run_at = ?, "
                "failures = failures + 1, fence = NULL, claim_id = NULL "
                "WHERE id = ? AND attempt = ? AND fence IS ? AND state = 'running'",
                (run_at, job_id, attempt, fence),
            )
        return self._write(
            "UPDATE dibs_jobs SET state = ?, finished_at = ? WHERE id = ? AND attempt = ? "
            "AND fence IS ? AND state = 'running'",
            (state, now, job_id, attempt, fence),
        )

    def cancel(self, job_id: str, now: float) -> bool:
        def work(conn: sqlite3.Connection) -> bool:
            pending = conn.execute(
                "UPDATE dibs_jobs SET state = 'cancelled', outcome_kind = 'cancelled', "
                "finished_at = ? WHERE id = ? AND state = 'pending'",
                (now, job_id),
            ).rowcount
            running = conn.execute(
                "UPDATE dibs_jobs SET cancel_requested = 1 WHERE id = ? AND state = 'running'",
                (job_id,),
            ).rowcount
            return pending + running == 1

        return self._transaction(work)

    def cancel_requested(self, job_ids: list[str]) -> set[str]:
        if not job_ids:
            return set()
        rows = self._read(
            f"SELECT id FROM dibs_jobs WHERE cancel_requested = 1 AND state = 'running' "
            f"AND id IN ({', '.join('?' * len(job_ids))})",
            tuple(job_ids),
        )
        return {row[0] for row in rows}

    def advance(self, schedule_id: str, decide: Decide) -> list[Job]:
        # ``decide`` is pure: a retry after "database is locked" may run it again.
        def work(conn: sqlite3.Connection) -> list[Job]:
            row = conn.execute(
                "SELECT watermark FROM dibs_job_schedules WHERE id = ?", (schedule_id,)
            ).fetchone()
            (live,) = conn.execute(
                "SELECT count(*) FROM dibs_jobs WHERE schedule_id = ? "
                "AND state IN ('pending', 'running')",
                (schedule_id,),
            ).fetchone()
            decision = decide(None if row is None else float(row[0]), int(live))
            if decision is None:
                return []
            watermark, jobs = decision
            conn.execute(
                "INSERT INTO dibs_job_schedules (id, watermark) VALUES (?, ?) "
                "ON CONFLICT (id) DO UPDATE SET watermark = excluded.watermark",
                (schedule_id, watermark),
            )
            return [job for job in jobs if conn.execute(_INSERT, row_values(job)).rowcount == 1]

        return self._transaction(work)

    def purge(self, before: float) -> int:
        def work(conn: sqlite3.Connection) -> int:
            return int(
                conn.execute(
                    "DELETE FROM dibs_jobs WHERE state IN ('done', 'failed', 'cancelled') "
                    "AND finished_at < ?",
                    (before,),
                ).rowcount
            )

        return self._transaction(work)
