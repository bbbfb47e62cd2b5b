"""The job table in a PostgreSQL store's schema: ``jobs`` and ``job_schedules``.

The shared SQL job table (:mod:`dibs.stores._sql_jobs`) on the store's
connection pool. A schedule's evaluation locks its ``job_schedules`` row
(``SELECT … FOR UPDATE``) before counting its live jobs, so evaluations of one
schedule on any number of hosts are serialized. Every insert sends ``NOTIFY``
on the schema's channel in its transaction; :meth:`PostgresJobs.listen` keeps
one connection in ``LISTEN`` and wakes the runner, whose poll stays as the
fallback (a notification is lost while that connection is down).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

import psycopg
from psycopg import sql
from psycopg.rows import TupleRow
from psycopg_pool import ConnectionPool, PoolTimeout

from dibs.exceptions import StoreUnavailable
from dibs.stores._sql_jobs import Dialect, SQLJobs
from dibs.stores.postgres._sql import JOBS, upgrade

__all__ = ["PostgresJobs"]

log = logging.getLogger("dibs.tasks")

_ERRORS = (psycopg.Error, PoolTimeout)
_T = TypeVar("_T")


class PostgresJobs(SQLJobs):
    """``jobs`` in the PostgreSQL store's schema, on the store's pool."""

    def __init__(
        self, schema: str, pool: Callable[[], ConnectionPool[psycopg.Connection[TupleRow]]]
    ) -> None:
        s = sql.Identifier(schema).as_bytes(None).decode()
        super().__init__(
            Dialect(
                jobs=f"{s}.jobs",
                schedules=f"{s}.job_schedules",
                param="%s",
                same="IS NOT DISTINCT FROM",
                lock_schedule=True,
            )
        )
        self.schema = schema
        self._pool = pool  # the store's pool of this process (a forked child has its own)
        self.channel = f"dibs_jobs_{self.schema}"
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
            with self._pool().connection() as conn, conn.transaction():
                yield conn
        except _ERRORS as exc:
            raise StoreUnavailable(f"PostgreSQL job table: {exc}") from exc

    def _prepare(self, text: str) -> bytes:
        return text.encode()

    def _atomic(self, work: Callable[[Any], _T]) -> _T:
        with self._transaction() as conn:
            return work(conn)

    def _single(self, work: Callable[[Any], _T]) -> _T:
        try:
            with self._pool().connection() as conn:
                return work(conn)
        except _ERRORS as exc:
            raise StoreUnavailable(f"PostgreSQL job table: {exc}") from exc

    def _added(self, conn: Any) -> None:
        conn.execute("SELECT pg_notify(%s, '')", (self.channel,))

    def listen(self, wake: Callable[[], None]) -> Callable[[], None]:
        stopped = threading.Event()
        conninfo = self._pool().conninfo
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
