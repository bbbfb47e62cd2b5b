"""The job table in a SQLite store's file: ``dibs_jobs`` and ``dibs_job_schedules``.

The shared SQL job table (:mod:`dibs.stores._sql_jobs`) on the store's own
connections. Every multi-statement operation runs in ``BEGIN IMMEDIATE``,
which takes the file's write lock first, so operations on the file are
serialized. Wake-ups: none; the runner polls (short and cheap).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from dibs.stores._sql_jobs import Dialect, SQLJobs
from dibs.stores.sqlite._conn import SQLitePool
from dibs.stores.sqlite._schema import JOBS, upgrade

__all__ = ["SQLiteJobs"]

_T = TypeVar("_T")

_DIALECT = Dialect(
    jobs="dibs_jobs", schedules="dibs_job_schedules", param="?", same="IS", lock_schedule=False
)


class SQLiteJobs(SQLJobs):
    """``dibs_jobs`` in the SQLite store's file, on the store's own connections.

    Sharing the store's pool gives the job table the same fork rules, pragmas, busy
    retries and bounded connections (see :mod:`dibs.stores.sqlite._conn`); closing the
    store closes them.
    """

    def __init__(self, pool: SQLitePool) -> None:
        super().__init__(_DIALECT)
        self._pool = pool

        def create() -> None:
            with pool.transaction("BEGIN IMMEDIATE") as conn:
                upgrade(conn, JOBS, pool.path)

        pool.retrying(create)

    def close(self) -> None:
        """Nothing of its own to close: the connections are the store's."""

    def listen(self, wake: Callable[[], None]) -> Callable[[], None]:
        return lambda: None  # no notifications on SQLite: the runner's poll finds new rows

    def _atomic(self, work: Callable[[Any], _T]) -> _T:
        def attempt() -> _T:
            with self._pool.transaction("BEGIN IMMEDIATE") as conn:
                return work(conn)

        return self._pool.retrying(attempt)

    def _single(self, work: Callable[[Any], _T]) -> _T:
        def attempt() -> _T:
            with self._pool.connection() as conn:
                return work(conn)

        return self._pool.retrying(attempt)
