"""The job table in a PostgreSQL store's schema: ``jobs`` and ``job_schedules``.

Statements run on the store's connection pool. A schedule's evaluation locks
its ``job_schedules`` row (``SELECT … FOR UPDATE``) before counting its live
jobs, so evaluations of one schedule on any number of hosts are serialized.
Every insert sends ``NOTIFY`` on the schema's channel in its transaction;
:meth:`PostgresJobs.listen` keeps one connection in ``LISTEN`` and wakes the
runner, whose poll stays as the fallback (a notification is lost while that
connection is down).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import psycopg
from psycopg import sql
from psycopg.rows import TupleRow
from psycopg_pool import ConnectionPool, PoolTimeout

from dibs.exceptions import StoreUnavailable
from dibs.stores.jobs import COLUMNS, Decide, Job, job_from_row, row_values
from dibs.stores.postgres._sql import JOBS, upgrade

__all__ = ["PostgresJobs"]

log = logging.getLogger("dibs.tasks")

_ERRORS = (psycopg.Error, PoolTimeout)


class PostgresJobs:
    """``jobs`` in the PostgreSQL store's schema, on the store's pool."""

    def __init__(self, schema: str, pool: ConnectionPool[psycopg.Connection[TupleRow]]) -> None:
        self.schema = schema
        self._pool = pool
        self.channel = f"dibs_jobs_{self.schema}"
        self._s = sql.Identifier(self.schema)
        self._insert = sql.SQL(
            f"INSERT INTO {{}}.jobs ({COLUMNS}) VALUES ({', '.join(['%s'] * 17)}) "
            "ON CONFLICT DO NOTHING"
        ).format(self._s)
        with self._transaction() as conn:
            # One creator at a time: concurrent CREATE … IF NOT EXISTS can still collide.
            conn.execute(
                "SELECT pg_advisory_xact_lock(hashtext(%s))", (f"dibs-jobs:{self.schema}",)
            )
            upgrade(conn, self.schema, JOBS)

    def close(self) -> None:
        pass  # the pool belongs to the store

    @contextmanager
    def _transaction(self) -> Iterator[psycopg.Connection[TupleRow]]:
        try:
            with self._pool.connection() as conn, conn.transaction():
                yield conn
        except _ERRORS as exc:
            raise StoreUnavailable(f"PostgreSQL job table: {exc}") from exc

    def _run(self, query: str, params: Sequence[Any]) -> list[Any]:
        with self._transaction() as conn:
            cur = conn.execute(sql.SQL(query).format(self._s), params)
            return cur.fetchall() if cur.description is not None else [cur.rowcount]

    def _write(self, query: str, params: Sequence[Any]) -> bool:
        return bool(self._run(query, params)[0] == 1)

    def _notify(self, conn: psycopg.Connection[TupleRow]) -> None:
        conn.execute("SELECT pg_notify(%s, '')", (self.channel,))

    def listen(self, wake: Callable[[], None]) -> Callable[[], None]:
        stopped = threading.Event()
        conninfo = self._pool.conninfo
        assert isinstance(conninfo, str)  # PostgresStore passes its conninfo as a string

        def loop() -> None:
            while not stopped.is_set():
                try:
                    with psycopg.connect(conninfo, autocommit=True) as conn:
                        conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(self.channel)))
                        wake()  # rows may have come while we were not listening
                        while not stopped.is_set():
                            for _ in conn.notifies(timeout=0.5, stop_after=1):
                                wake()
                except psycopg.Error as exc:
                    log.warning("job table LISTEN failed (%s); polling until it is back", exc)
                    stopped.wait(1.0)

        thread = threading.Thread(target=loop, name="dibs-tasks-listen", daemon=True)
        thread.start()

        def stop() -> None:
            stopped.set()
            thread.join()

        return stop

    def add(self, job: Job) -> str:
        with self._transaction() as conn:
            if conn.execute(self._insert, row_values(job)).rowcount == 1:
                self._notify(conn)
                return job.id
            row = conn.execute(
                sql.SQL(
                    "SELECT id FROM {}.jobs WHERE id = %s "
                    "OR (key = %s AND state IN ('pending', 'running')) LIMIT 1"
                ).format(self._s),
                (job.id, job.key),
            ).fetchone()
        if row is None:
            return self.add(job)  # the live job with that key finished in between
        return str(row[0])

    def get(self, job_id: str) -> Job | None:
        rows = self._run(f"SELECT {COLUMNS} FROM {{}}.jobs WHERE id = %s", (job_id,))
        return job_from_row(rows[0]) if rows else None

    def due(self, now: float, limit: int) -> list[Job]:
        rows = self._run(
            f"SELECT {COLUMNS} FROM {{}}.jobs WHERE state IN ('pending', 'running') "
            "AND run_at <= %s ORDER BY run_at LIMIT %s",
            (now, limit),
        )
        return [job_from_row(row) for row in rows]

    def start(
        self, job_id: str, seen_attempt: int, seen_fence: int | None, attempt: int, fence: int,
        claim_id: str,
    ) -> bool:  # fmt: skip
        return self._write(
            "UPDATE {}.jobs SET state = 'running', attempt = %s, fence = %s, claim_id = %s, "
            "outcome_kind = NULL, outcome = NULL WHERE id = %s AND attempt = %s "
            "AND fence IS NOT DISTINCT FROM %s AND state IN ('pending', 'running')",
            (attempt, fence, claim_id, job_id, seen_attempt, seen_fence),
        )

    def propose(self, job_id: str, attempt: int, fence: int, kind: str, outcome: str) -> bool:
        return self._write(
            "UPDATE {}.jobs SET outcome_kind = %s, outcome = %s "
            "WHERE id = %s AND attempt = %s AND fence = %s AND state = 'running'",
            (kind, outcome, job_id, attempt, fence),
        )

    def settle(
        self, job_id: str, attempt: int, fence: int | None, state: str, run_at: float | None,
        now: float,
    ) -> bool:  # fmt: skip
        if state == "pending":
            return self._write(
                "UPDATE {}.jobs SET state = 'pending', attempt = attempt + 1, run_at = %s, "
                "failures = failures + 1, fence = NULL, claim_id = NULL WHERE id = %s "
                "AND attempt = %s AND fence IS NOT DISTINCT FROM %s AND state = 'running'",
                (run_at, job_id, attempt, fence),
            )
        return self._write(
            "UPDATE {}.jobs SET state = %s, finished_at = %s WHERE id = %s AND attempt = %s "
            "AND fence IS NOT DISTINCT FROM %s AND state = 'running'",
            (state, now, job_id, attempt, fence),
        )

    def cancel(self, job_id: str, now: float) -> bool:
        rows = self._run(
            "UPDATE {}.jobs SET "
            "state = CASE WHEN state = 'pending' THEN 'cancelled' ELSE state END, "
            "outcome_kind = CASE WHEN state = 'pending' THEN 'cancelled' ELSE outcome_kind END, "
            "finished_at = CASE WHEN state = 'pending' THEN %s ELSE finished_at END, "
            "cancel_requested = (state = 'running') "
            "WHERE id = %s AND state IN ('pending', 'running') RETURNING id",
            (now, job_id),
        )
        return bool(rows)

    def cancel_requested(self, job_ids: list[str]) -> set[str]:
        if not job_ids:
            return set()
        rows = self._run(
            "SELECT id FROM {}.jobs WHERE cancel_requested AND state = 'running' AND id = ANY(%s)",
            (job_ids,),
        )
        return {row[0] for row in rows}

    def advance(self, schedule_id: str, decide: Decide) -> list[Job]:
        with self._transaction() as conn:
            conn.execute(
                sql.SQL(
                    "INSERT INTO {}.job_schedules (id, watermark) VALUES (%s, NULL) "
                    "ON CONFLICT DO NOTHING"
                ).format(self._s),
                (schedule_id,),
            )
            # Linearization point: this row lock serializes the schedule's evaluations.
            (watermark,) = conn.execute(
                sql.SQL("SELECT watermark FROM {}.job_schedules WHERE id = %s FOR UPDATE").format(
                    self._s
                ),
                (schedule_id,),
            ).fetchone() or (None,)
            (live,) = conn.execute(
                sql.SQL(
                    "SELECT count(*) FROM {}.jobs WHERE schedule_id = %s "
                    "AND state IN ('pending', 'running')"
                ).format(self._s),
                (schedule_id,),
            ).fetchone() or (0,)
            decision = decide(None if watermark is None else float(watermark), int(live))
            if decision is None:
                return []
            new_watermark, jobs = decision
            conn.execute(
                sql.SQL("UPDATE {}.job_schedules SET watermark = %s WHERE id = %s").format(self._s),
                (new_watermark, schedule_id),
            )
            added = [job for job in jobs if conn.execute(self._insert, row_values(job)).rowcount]
            if added:
                self._notify(conn)
            return added

    def purge(self, before: float) -> int:
        rows = self._run(
            "DELETE FROM {}.jobs WHERE state IN ('done', 'failed', 'cancelled') "
            "AND finished_at < %s",
            (before,),
        )
        return int(rows[0])
