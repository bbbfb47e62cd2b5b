"""The job table in a SQLite store's file: ``dibs_jobs`` and ``dibs_job_schedules``.

The shared SQL job table (:mod:`dibs.stores._sql_jobs`) on the store's own
connections. Every write runs in ``BEGIN IMMEDIATE``, which takes the file's
write lock first, so operations on the file are serialized and a statement
never has to upgrade a stale read snapshot. Writers wait for that lock on a
mutex (this process) and an advisory ``flock`` on ``<file>-jobs.lock`` (other
processes) rather than in SQLite's busy handler, which sleeps 1, 2, 5, 10 …
ms between tries; ``BEGIN IMMEDIATE`` still decides, so a process that skips
the file lock is slower, never wrong.

Wake-ups: an add in this process wakes this process's workers at once. Other
processes learn of it from ``PRAGMA data_version``, which moves whenever
another connection commits to the file: :meth:`SQLiteJobs.listen` keeps one
connection that reads it every :data:`WAKE_MIN` seconds after a change,
backing off to :data:`WAKE_MAX` while nothing changes. That read touches only
the WAL index in shared memory. benchmarks/bench_sqlite_wake.py measured the
options (docs/benchmarks.md): a wake-up socket per worker process noticed a
commit as fast as a fixed 1 ms read and cost less CPU while idle, but only
for writers that know to send to it, and a job enqueued inside the caller's
own transaction (``connection=``) is committed by the caller, where no wake-up
can be sent; ``data_version`` sees every commit, whoever makes it. The
back-off keeps an idle watcher near 1 % of a core.
"""

from __future__ import annotations

import logging
import os
import sqlite3
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from typing import Any, TypeVar

try:
    import fcntl
except ImportError:  # Windows: SQLite's busy handler alone
    fcntl = None  # type: ignore[assignment]

from dibs.exceptions import InvalidInput, StoreUnavailable, TransactionConflict
from dibs.stores._sql_jobs import Dialect, SQLJobs
from dibs.stores.sqlite._conn import SQLitePool, file_id
from dibs.stores.sqlite._schema import JOBS, upgrade

__all__ = ["WAKE_MAX", "WAKE_MIN", "SQLiteJobs"]

log = logging.getLogger("dibs.tasks")

_T = TypeVar("_T")

WAKE_MIN = 0.001
"""Seconds between reads of ``PRAGMA data_version`` right after a change."""
WAKE_MAX = 0.008
"""Seconds between reads once nothing has changed for a while (doubling from the minimum)."""

_DIALECT = Dialect(
    jobs="dibs_jobs",
    schedules="dibs_job_schedules",
    named=":{}",
    now=":now",
    in_list="{col} IN (SELECT value FROM json_each(:{name}))",
    held="(id, fence) IN (SELECT json_extract(value, '$[0]'), json_extract(value, '$[1]') "
    "FROM json_each(:held))",
    batch="(SELECT json_extract(value, '$[0]') AS b_id, json_extract(value, '$[1]') AS b_fence, "
    "json_extract(value, '$[2]') AS b_kind, json_extract(value, '$[3]') AS b_outcome, "
    "json_extract(value, '$[4]') AS b_delay FROM json_each(:batch))",
    log_append="json_insert(COALESCE(attempts_log, '[]'), '$[#]', json_object('attempt', "
    "attempt, 'holder', holder, 'started_at', started_at, 'ended_at', {now}, "
    "'outcome_kind', {kind}))",
    put_backs="(SELECT count(*) FROM json_each(COALESCE(attempts_log, '[]')) "
    "WHERE json_extract(value, '$.outcome_kind') = 'put_back')",
    lock_schedule=False,
    skip_locked="",
    json_lists=True,
    insert_returning="{insert} RETURNING CAST(id AS BLOB)",
    id_out="CAST(id AS BLOB)",
    precheck=True,
)


class SQLiteJobs(SQLJobs):
    """``dibs_jobs`` in the SQLite store's file, on the store's own connections.

    Sharing the store's pool gives the job table the same fork rules, pragmas, busy
    retries and bounded connections (see :mod:`dibs.stores.sqlite._conn`); closing the
    store closes them.
    """

    def __init__(self, pool: SQLitePool, clock: Callable[[], float]) -> None:
        super().__init__(_DIALECT, clock)
        self._pool = pool
        self._write_lock = threading.Lock()  # one writer of this process at a time
        self._turn_owner: int | None = None  # the thread holding both locks, in turn()
        self._lock_fd: int | None = None  # the advisory lock file, opened by _lock_pid
        self._lock_pid = -1

        def create() -> None:
            with pool.transaction("BEGIN IMMEDIATE") as conn:
                upgrade(conn, JOBS, pool.path)

        pool.retrying(create)

    def close(self) -> None:
        """Nothing of its own to close: the connections are the store's."""

    def listen(self, wake: Callable[[], None]) -> Callable[[], None]:
        stop_local = self._add_local(wake)
        if self._pool.memory:
            return stop_local  # one process: the local wake-ups are all there is
        stopped = threading.Event()
        path = self._pool.path
        conn: sqlite3.Connection | None = None
        seen: int | None = None
        try:  # the baseline, before returning: every commit from now on wakes
            conn = sqlite3.connect(path, check_same_thread=False)
            (seen,) = conn.execute("PRAGMA data_version").fetchone()
        except sqlite3.Error as exc:
            log.warning("job table watcher failed (%s); polling until it is back", exc)

        def watch() -> None:
            nonlocal conn, seen
            pause = WAKE_MIN
            while not stopped.wait(pause):
                try:
                    if conn is None:
                        conn = sqlite3.connect(path, check_same_thread=False)
                    (version,) = conn.execute("PRAGMA data_version").fetchone()
                except sqlite3.Error as exc:
                    log.warning("job table watcher failed (%s); polling until it is back", exc)
                    if conn is not None:
                        conn.close()
                    conn, seen, pause = None, None, 1.0
                    continue
                if version != seen:
                    seen, pause = version, WAKE_MIN
                    wake()  # after a failure too: commits may have been missed
                else:
                    pause = min(pause * 2, WAKE_MAX)
            if conn is not None:
                conn.close()

        thread = threading.Thread(target=watch, name="dibs-tasks-watch", daemon=True)
        thread.start()

        def stop() -> None:
            stop_local()
            stopped.set()
            thread.join()

        return stop

    def _run(self, conn: Any, statement: Any, params: dict[str, Any]) -> Any:
        cursor = conn.cursor()
        cursor.row_factory = None  # a caller's connection may have one
        return cursor.execute(statement, params)

    def _atomic(self, work: Callable[[Any], _T]) -> _T:
        def attempt() -> _T:
            # Writers queue here, not in SQLite's busy handler, which sleeps 1, 2, 5,
            # 10 … ms between tries: this process's on a mutex, other processes' on
            # an advisory file lock, each handed over as soon as it is released.
            # (Only an optimization: BEGIN IMMEDIATE still decides who writes.)
            with self.turn(), self._pool.transaction("BEGIN IMMEDIATE") as conn:
                return work(conn)

        return self._pool.retrying(attempt)

    @contextmanager
    def turn(self) -> Iterator[None]:
        """Hold this process's write mutex and the advisory file lock (re-entrant per thread).

        A recording gathers the outcomes queued while it waited for them: with
        several processes a turn comes round only after the others' transactions,
        and the worker threads that finished meanwhile share it.
        """
        me = threading.get_ident()
        if self._turn_owner == me:
            yield
            return
        with self._write_lock, self._file_lock():
            self._turn_owner = me
            try:
                yield
            finally:
                self._turn_owner = None

    @contextmanager
    def _file_lock(self) -> Iterator[None]:
        """Hold ``<file>-jobs.lock`` exclusively (flock), if the platform and folder allow."""
        if fcntl is None or self._pool.memory:
            yield
            return
        if self._lock_pid != os.getpid():  # a forked child must not share the parent's
            self._lock_fd = None
            self._lock_pid = os.getpid()
            with suppress(OSError):  # a read-only folder: SQLite's busy handler alone
                self._lock_fd = os.open(self._pool.path + "-jobs.lock", os.O_RDWR | os.O_CREAT)
        fd = self._lock_fd
        if fd is None:
            yield
            return
        fcntl.flock(fd, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)

    def _single(self, work: Callable[[Any], _T], write: bool = True) -> _T:
        if write:
            return self._atomic(work)

        def attempt() -> _T:
            with self._pool.connection() as conn:
                return work(conn)

        return self._pool.retrying(attempt)

    def _on_caller(self, connection: object, work: Callable[[Any], _T]) -> _T:
        if not isinstance(connection, sqlite3.Connection):
            raise InvalidInput(
                "connection must be a sqlite3.Connection to the store's file, got "
                f"{type(connection).__name__}",
                field="connection",
                value=connection,
            )
        try:
            self._check_file(connection)
            if not _autocommits(connection):
                return work(connection)  # in the caller's transaction, open or implicit
            # No transaction of the caller's, and none implicit: a batch is still one.
            connection.execute("BEGIN IMMEDIATE")
            try:
                result = work(connection)
            except BaseException:
                connection.execute("ROLLBACK")
                raise
            connection.execute("COMMIT")
            return result
        except sqlite3.ProgrammingError as exc:  # closed, or used from another thread
            raise _unusable(connection, exc) from exc
        except sqlite3.OperationalError as exc:
            # Missing tables (a store not yet opened there), or a read-only connection.
            if "no such table" in str(exc) or _code(exc) == sqlite3.SQLITE_READONLY:
                raise _unusable(connection, exc) from exc
            if getattr(exc, "sqlite_errorcode", None) == _BUSY_SNAPSHOT:
                # The caller's read snapshot is older than a commit since: no wait can
                # mend it, only a new transaction (the caller's to run again, whole).
                raise TransactionConflict(
                    f"your transaction's snapshot is older than a concurrent commit "
                    f"({exc}); roll back and run the whole transaction again",
                    sqlstate="SQLITE_BUSY_SNAPSHOT",
                ) from exc
            raise StoreUnavailable(f"SQLite job table, on the caller's connection: {exc}") from exc
        except sqlite3.Error as exc:
            raise StoreUnavailable(f"SQLite job table, on the caller's connection: {exc}") from exc

    def _check_file(self, connection: sqlite3.Connection) -> None:
        """Raise :class:`~dibs.InvalidInput` unless ``connection``'s main database is this
        store's file (the same inode, whatever the path), with no temporary ``dibs_jobs``
        hiding it: a job table elsewhere would take the job, and this store would never
        know it."""
        if self._pool.memory:
            raise InvalidInput(
                "a sqlite:///:memory: store's database belongs to its own connection: "
                "enqueue there without connection=",
                field="connection", value=connection,
            )  # fmt: skip
        cursor = connection.cursor()
        cursor.row_factory = None
        # BLOBs: the caller's text_factory and converters do not touch them.
        row = cursor.execute(
            "SELECT CAST(file AS BLOB), (SELECT count(*) FROM temp.sqlite_master "
            "WHERE name IN ('dibs_jobs', 'dibs_job_schedules')) "
            "FROM pragma_database_list WHERE name = 'main'"
        ).fetchone()
        path = os.fsdecode(bytes(row[0] or b"")) if row else ""
        theirs = file_id(path) if path else None
        if theirs is None or theirs != file_id(self._pool.path):
            raise InvalidInput(
                f"connection must be a sqlite3.Connection to the store's file "
                f"{self._pool.path!r}, not to {path or 'a temporary or in-memory database'!r}",
                field="connection", value=connection,
            )  # fmt: skip
        if row[1]:
            raise InvalidInput(
                "connection has a temporary table named like the store's job table, which "
                "would take the job instead",
                field="connection", value=connection,
            )  # fmt: skip


def _autocommits(connection: sqlite3.Connection) -> bool:
    """Whether each statement on ``connection`` would commit on its own: not in a
    transaction, and none begun implicitly (``autocommit=True`` on Python 3.12+, or
    ``isolation_level=None``)."""
    if connection.in_transaction:
        return False
    autocommit = getattr(connection, "autocommit", None)  # Python 3.12+
    if isinstance(autocommit, bool):
        return autocommit
    return connection.isolation_level is None


_BUSY_SNAPSHOT = 517
"""SQLITE_BUSY_SNAPSHOT: a write in a read transaction whose snapshot a commit has outdated."""


def _code(exc: sqlite3.Error) -> int:
    """The primary result code of ``exc`` (extended codes carry it in the low byte)."""
    return int(getattr(exc, "sqlite_errorcode", 0) or 0) & 0xFF


def _unusable(connection: sqlite3.Connection, exc: sqlite3.Error) -> InvalidInput:
    """The caller's mistake, not the store's: trying again cannot help."""
    return InvalidInput(
        f"connection must be an open sqlite3.Connection to the store's file: {exc}",
        field="connection",
        value=connection,
    )
