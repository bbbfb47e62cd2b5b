"""The job table in a SQLite store's file: ``dibs_jobs`` and ``dibs_job_schedules``.

Every multi-statement operation runs in ``BEGIN IMMEDIATE``, which takes the
file's write lock first: operations on the file are serialized, so a
schedule's watermark, its live-job count and the jobs an evaluation adds are
read and written as one. Wake-ups: none; the runner polls (short and cheap).
"""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from dibs.exceptions import StoreUnavailable
from dibs.stores.base import Store
from dibs.tasks._jobs import COLUMNS, Decide, Job, job_from_row, row_values

__all__ = ["SQLiteJobs"]

_SCHEMA = """
CREATE TABLE IF NOT EXISTS dibs_jobs (
    id               TEXT PRIMARY KEY,
    name             TEXT NOT NULL,
    args             TEXT NOT NULL,
    run_at           REAL NOT NULL,
    attempt          INTEGER NOT NULL,
    max_attempts     INTEGER NOT NULL,
    state            TEXT NOT NULL,
    fence            INTEGER,
    claim_id         TEXT,
    outcome_kind     TEXT,
    outcome          TEXT,
    schedule_id      TEXT,
    retries          INTEGER NOT NULL,
    failures         INTEGER NOT NULL,
    key              TEXT,
    cancel_requested INTEGER NOT NULL DEFAULT 0,
    finished_at      REAL
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS dibs_jobs_due
    ON dibs_jobs (run_at) WHERE state IN ('pending', 'running');
CREATE UNIQUE INDEX IF NOT EXISTS dibs_jobs_live_key
    ON dibs_jobs (key) WHERE state IN ('pending', 'running');
CREATE INDEX IF NOT EXISTS dibs_jobs_live_schedule
    ON dibs_jobs (schedule_id) WHERE state IN ('pending', 'running');
CREATE TABLE IF NOT EXISTS dibs_job_schedules (
    id        TEXT PRIMARY KEY,
    watermark REAL NOT NULL
) WITHOUT ROWID;
"""
_INSERT = f"INSERT INTO dibs_jobs ({COLUMNS}) VALUES ({', '.join('?' * 17)}) ON CONFLICT DO NOTHING"
_STANDING = (
    "SELECT id FROM dibs_jobs WHERE id = ? OR (key = ? AND state IN ('pending', 'running')) LIMIT 1"
)


class SQLiteJobs:
    """``dibs_jobs`` in the SQLite store's file; one connection per thread."""

    def __init__(self, store: Store) -> None:
        self.path: str = getattr(store, "path")  # noqa: B009 - SQLiteStore, typed loosely here
        self.busy_timeout = float(getattr(store, "busy_timeout", 60.0))
        self._local = threading.local()
        self._all: list[sqlite3.Connection] = []
        self._all_lock = threading.Lock()  # guards _all (connections to close)
        try:
            # Each statement takes the write lock; IF NOT EXISTS makes racing creators safe.
            self._conn().executescript(_SCHEMA)
        except sqlite3.Error as exc:
            raise StoreUnavailable(f"cannot create job table in {self.path!r}: {exc}") from exc

    def close(self) -> None:
        with self._all_lock:
            conns, self._all = self._all, []
        for conn in conns:
            conn.close()

    def listen(self, wake: Callable[[], None]) -> Callable[[], None]:
        return lambda: None  # no notifications on SQLite: the runner's poll finds new rows

    def _conn(self) -> sqlite3.Connection:
        conn: sqlite3.Connection | None = getattr(self._local, "conn", None)
        if conn is None:
            try:
                conn = sqlite3.connect(
                    self.path,
                    timeout=self.busy_timeout,
                    isolation_level=None,
                    check_same_thread=False,  # only so close() may close it from any thread
                )
            except sqlite3.Error as exc:
                raise StoreUnavailable(f"cannot open job table in {self.path!r}: {exc}") from exc
            self._local.conn = conn
            with self._all_lock:
                self._all.append(conn)
        return conn

    @contextmanager
    def _transaction(self) -> Iterator[sqlite3.Connection]:
        conn = self._conn()
        try:
            conn.execute("BEGIN IMMEDIATE")
            try:
                yield conn
            except BaseException:
                conn.execute("ROLLBACK")
                raise
            conn.execute("COMMIT")
        except sqlite3.Error as exc:
            raise StoreUnavailable(f"job table in {self.path!r}: {exc}") from exc

    def _write(self, sql: str, params: tuple[Any, ...]) -> bool:
        try:
            return self._conn().execute(sql, params).rowcount == 1
        except sqlite3.Error as exc:
            raise StoreUnavailable(f"job table in {self.path!r}: {exc}") from exc

    def _read(self, sql: str, params: tuple[Any, ...]) -> list[Any]:
        try:
            return self._conn().execute(sql, params).fetchall()
        except sqlite3.Error as exc:
            raise StoreUnavailable(f"job table in {self.path!r}: {exc}") from exc

    def add(self, job: Job) -> str:
        with self._transaction() as conn:
            if conn.execute(_INSERT, row_values(job)).rowcount == 1:
                return job.id
            (standing,) = conn.execute(_STANDING, (job.id, job.key)).fetchone()
            return str(standing)

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
        with self._transaction() as conn:
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
        with self._transaction() as conn:
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

    def purge(self, before: float) -> int:
        with self._transaction() as conn:
            return int(
                conn.execute(
                    "DELETE FROM dibs_jobs WHERE state IN ('done', 'failed', 'cancelled') "
                    "AND finished_at < ?",
                    (before,),
                ).rowcount
            )
