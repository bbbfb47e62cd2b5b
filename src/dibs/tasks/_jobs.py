"""Job rows for durable mode: what to run, when, which attempt, and the recorded outcome.

The store decides who runs an attempt (a hold on ``Unit(job_id, attempt)``)
and who completed it (the fenced confirm of that hold). The job table only
remembers: every write to a taken job is conditional on ``(attempt, fence)``
of the hold that took it, so a worker whose hold was taken over changes
nothing. A worker writes its outcome as a *proposal* before confirming; the
proposal is official once the confirm succeeded, so a crash between confirm
and the final row update is finished by the next worker that reads the row.

SQLite keeps the table in the store's own file (``dibs_jobs``); memory://
keeps it next to the store object in this process.
"""

from __future__ import annotations

import sqlite3
import threading
import weakref
from dataclasses import dataclass, replace
from typing import Any, Protocol

from dibs.exceptions import InvalidInput, StoreUnavailable
from dibs.stores.base import Store

__all__ = ["Job", "JobTable", "job_table"]

LIVE_STATES = ("pending", "running")


@dataclass(frozen=True, slots=True)
class Job:
    """One job row."""

    id: str
    name: str
    args: str  # JSON [args, kwargs]
    run_at: float  # epoch seconds on the store's clock
    attempt: int  # the attempt running, or the next to run (1-based)
    max_attempts: int
    state: str  # pending | running | done | failed
    fence: int | None = None  # fence of the hold that took the current attempt
    claim_id: str | None = None
    outcome_kind: str | None = None  # "ok" | "error", proposed or final
    outcome: str | None = None  # JSON result, or the error's text
    schedule_id: str | None = None
    retries: int = 0  # failed attempts that may be retried
    failures: int = 0  # failed attempts so far (lost ones count only toward max_attempts)


class JobTable(Protocol):
    """Conditional writes on job rows; each returns whether it changed the row."""

    def insert(self, job: Job) -> bool: ...
    def get(self, job_id: str) -> Job | None: ...
    def due(self, now: float, limit: int) -> list[Job]: ...
    def live_count(self, schedule_id: str) -> int: ...
    def close(self) -> None: ...
    def start(
        self, job_id: str, seen_attempt: int, seen_fence: int | None, attempt: int, fence: int,
        claim_id: str,
    ) -> bool: ...  # fmt: skip
    def propose(self, job_id: str, attempt: int, fence: int, kind: str, outcome: str) -> bool: ...
    def settle(
        self, job_id: str, attempt: int, fence: int | None, state: str, run_at: float | None
    ) -> bool: ...


_COLUMNS = (
    "id, name, args, run_at, attempt, max_attempts, state, fence, claim_id, "
    "outcome_kind, outcome, schedule_id, retries, failures"
)

_SCHEMA = """
CREATE TABLE IF NOT EXISTS dibs_jobs (
    id           TEXT PRIMARY KEY,
    name         TEXT NOT NULL,
    args         TEXT NOT NULL,
    run_at       REAL NOT NULL,
    attempt      INTEGER NOT NULL,
    max_attempts INTEGER NOT NULL,
    state        TEXT NOT NULL,
    fence        INTEGER,
    claim_id     TEXT,
    outcome_kind TEXT,
    outcome      TEXT,
    schedule_id  TEXT,
    retries      INTEGER NOT NULL,
    failures     INTEGER NOT NULL
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS dibs_jobs_due
    ON dibs_jobs (run_at) WHERE state IN ('pending', 'running');
"""


class SQLiteJobs:
    """``dibs_jobs`` in the SQLite store's file; one connection per thread."""

    def __init__(self, path: str, busy_timeout: float) -> None:
        self.path = path
        self.busy_timeout = busy_timeout
        self._local = threading.local()
        self._all: list[sqlite3.Connection] = []
        self._all_lock = threading.Lock()  # guards _all (connections to close)
        self._conn().executescript(_SCHEMA)

    def close(self) -> None:
        with self._all_lock:
            conns, self._all = self._all, []
        for conn in conns:
            conn.close()

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

    def _write(self, sql: str, params: tuple[Any, ...]) -> bool:
        try:
            return self._conn().execute(sql, params).rowcount == 1
        except sqlite3.Error as exc:
            raise StoreUnavailable(f"job table in {self.path!r}: {exc}") from exc

    def _read(self, sql: str, params: tuple[Any, ...]) -> list[Job]:
        try:
            rows = self._conn().execute(sql, params).fetchall()
        except sqlite3.Error as exc:
            raise StoreUnavailable(f"job table in {self.path!r}: {exc}") from exc
        return [Job(*row) for row in rows]

    def insert(self, job: Job) -> bool:
        return self._write(
            f"INSERT OR IGNORE INTO dibs_jobs ({_COLUMNS}) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
            (
                job.id, job.name, job.args, job.run_at, job.attempt, job.max_attempts, job.state,
                job.fence, job.claim_id, job.outcome_kind, job.outcome, job.schedule_id,
                job.retries, job.failures,
            ),
        )  # fmt: skip

    def get(self, job_id: str) -> Job | None:
        rows = self._read(f"SELECT {_COLUMNS} FROM dibs_jobs WHERE id = ?", (job_id,))
        return rows[0] if rows else None

    def due(self, now: float, limit: int) -> list[Job]:
        return self._read(
            f"SELECT {_COLUMNS} FROM dibs_jobs WHERE state IN ('pending', 'running') "
            "AND run_at <= ? ORDER BY run_at LIMIT ?",
            (now, limit),
        )

    def live_count(self, schedule_id: str) -> int:
        rows = (
            self._conn()
            .execute(
                "SELECT count(*) FROM dibs_jobs WHERE schedule_id = ? "
                "AND state IN ('pending', 'running')",
                (schedule_id,),
            )
            .fetchone()
        )
        return int(rows[0])

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
        self, job_id: str, attempt: int, fence: int | None, state: str, run_at: float | None
    ) -> bool:
        if state == "pending":  # a retry: the next attempt, not yet taken
            return self._write(
                "UPDATE dibs_jobs SET state = 'pending', attempt = attempt + 1, run_at = ?, "
                "failures = failures + 1, fence = NULL, claim_id = NULL "
                "WHERE id = ? AND attempt = ? AND fence IS ? AND state = 'running'",
                (run_at, job_id, attempt, fence),
            )
        return self._write(
            "UPDATE dibs_jobs SET state = ? WHERE id = ? AND attempt = ? AND fence IS ? "
            "AND state = 'running'",
            (state, job_id, attempt, fence),
        )


class MemoryJobs:
    """The same table as a dict, for memory:// stores (one process)."""

    def __init__(self) -> None:
        self._rows: dict[str, Job] = {}
        self._lock = threading.Lock()  # guards _rows

    def close(self) -> None:
        pass  # the rows live as long as the store object

    def insert(self, job: Job) -> bool:
        with self._lock:
            if job.id in self._rows:
                return False
            self._rows[job.id] = job
            return True

    def get(self, job_id: str) -> Job | None:
        with self._lock:
            return self._rows.get(job_id)

    def due(self, now: float, limit: int) -> list[Job]:
        with self._lock:
            rows = [j for j in self._rows.values() if j.state in LIVE_STATES and j.run_at <= now]
        return sorted(rows, key=lambda j: j.run_at)[:limit]

    def live_count(self, schedule_id: str) -> int:
        with self._lock:
            return sum(
                1
                for j in self._rows.values()
                if j.schedule_id == schedule_id and j.state in LIVE_STATES
            )

    def _swap(self, job_id: str, ok: Any, **changes: Any) -> bool:
        with self._lock:
            job = self._rows.get(job_id)
            if job is None or not ok(job):
                return False
            self._rows[job_id] = replace(job, **changes)
            return True

    def start(
        self, job_id: str, seen_attempt: int, seen_fence: int | None, attempt: int, fence: int,
        claim_id: str,
    ) -> bool:  # fmt: skip
        return self._swap(
            job_id,
            lambda j: (
                j.attempt == seen_attempt and j.fence == seen_fence and j.state in LIVE_STATES
            ),
            state="running", attempt=attempt, fence=fence, claim_id=claim_id,
            outcome_kind=None, outcome=None,
        )  # fmt: skip

    def propose(self, job_id: str, attempt: int, fence: int, kind: str, outcome: str) -> bool:
        return self._swap(
            job_id,
            lambda j: j.attempt == attempt and j.fence == fence and j.state == "running",
            outcome_kind=kind, outcome=outcome,
        )  # fmt: skip

    def settle(
        self, job_id: str, attempt: int, fence: int | None, state: str, run_at: float | None
    ) -> bool:
        def ok(j: Job) -> bool:
            return j.attempt == attempt and j.fence == fence and j.state == "running"

        if state == "pending":
            assert run_at is not None
            return self._swap(
                job_id, ok, state="pending", attempt=attempt + 1, run_at=run_at,
                fence=None, claim_id=None, failures=self._rows[job_id].failures + 1,
            )  # fmt: skip
        return self._swap(job_id, ok, state=state)


_memory_tables: weakref.WeakKeyDictionary[Store, MemoryJobs] = weakref.WeakKeyDictionary()
_memory_lock = threading.Lock()  # guards _memory_tables


def job_table(store: Store) -> JobTable:
    """The job table that lives next to ``store``.

    Raises :class:`~dibs.InvalidInput` for a store kind that has none yet.
    """
    path = getattr(store, "path", None)
    if store.scheme == "sqlite" and isinstance(path, str):
        return SQLiteJobs(path, float(getattr(store, "busy_timeout", 60.0)))
    if store.scheme == "memory":
        with _memory_lock:
            table = _memory_tables.get(store)
            if table is None:
                table = _memory_tables[store] = MemoryJobs()
            return table
    raise InvalidInput(
        f"durable tasks have no job table for {store.scheme}:// stores yet",
        field="store",
        value=store,
    )
