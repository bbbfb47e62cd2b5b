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
import os
import secrets
import threading
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

import psycopg
import psycopg.errors
from psycopg import sql
from psycopg.pq import TransactionStatus
from psycopg.rows import TupleRow, tuple_row
from psycopg_pool import ConnectionPool, PoolClosed, PoolTimeout

from dibs.exceptions import InvalidInput, StoreClosed, StoreUnavailable, TransactionConflict
from dibs.stores._sql_jobs import Dialect, SQLJobs
from dibs.stores.postgres._connect import unreplicated
from dibs.stores.postgres._sql import JOBS, upgrade

__all__ = ["PostgresJobs"]

log = logging.getLogger("dibs.tasks")

_ERRORS = (psycopg.Error, PoolTimeout)
_T = TypeVar("_T")


def _unavailable(exc: Exception) -> StoreUnavailable | StoreClosed:
    """The pool's or the server's error as a dibs error: the store's close() is StoreClosed."""
    if isinstance(exc, PoolClosed):
        return StoreClosed(f"PostgreSQL job table: the store is closed ({exc})")
    return StoreUnavailable(f"PostgreSQL job table: {exc}")


class PostgresJobs(SQLJobs):
    """``jobs`` in the PostgreSQL store's schema, on the store's pool."""

    def __init__(
        self,
        schema: str,
        pool: Callable[[], ConnectionPool[psycopg.Connection[TupleRow]]],
        clock: Callable[[], float | None] = lambda: None,
    ) -> None:
        s = sql.Identifier(schema).as_bytes(None).decode()
        channel = f"dibs_jobs_{schema}"
        super().__init__(
            Dialect(
                jobs=f"{s}.jobs",
                schedules=f"{s}.job_schedules",
                named="%({})s",
                now="COALESCE(CAST(:now AS DOUBLE PRECISION), "
                "CAST(extract(epoch FROM statement_timestamp()) AS DOUBLE PRECISION))",
                in_list="{col} = ANY(CAST(:{name} AS TEXT[]))",
                held="(id, fence) IN (SELECT e ->> 0, CAST(e ->> 1 AS BIGINT) "
                "FROM json_array_elements(CAST(:held AS JSON)) AS e)",
                batch="(SELECT e ->> 0 AS b_id, CAST(e ->> 1 AS BIGINT) AS b_fence, "
                "e ->> 2 AS b_kind, e ->> 3 AS b_outcome, "
                "CAST(e ->> 4 AS DOUBLE PRECISION) AS b_delay "
                "FROM json_array_elements(CAST(:batch AS JSON)) AS e)",
                log_append="CAST(COALESCE(CAST(attempts_log AS JSONB), '[]'::jsonb) || "
                "jsonb_build_array(jsonb_build_object('attempt', attempt, 'holder', holder, "
                "'started_at', started_at, 'ended_at', {now}, 'outcome_kind', {kind})) AS TEXT)",
                put_backs="(SELECT count(*) FROM jsonb_array_elements("
                "COALESCE(CAST(attempts_log AS JSONB), '[]'::jsonb)) AS e "
                "WHERE e ->> 'outcome_kind' = 'put_back')",
                lock_schedule=True,
                skip_locked=" FOR UPDATE SKIP LOCKED",
                json_lists=False,
                insert_returning="WITH ins AS ({insert} RETURNING id) "
                "SELECT id, pg_notify(CAST(:channel AS TEXT), CAST(:origin AS TEXT)) FROM ins",
                channel=channel,
            ),
            clock,
        )
        self.schema = schema
        self._pool = pool  # the store's pool of this process (a forked child has its own)
        self.channel = channel
        self._token = secrets.token_hex(6)
        with self._transaction() as conn:
            # One creator at a time: concurrent CREATE … IF NOT EXISTS can still collide.
            conn.execute(
                "SELECT pg_advisory_xact_lock(hashtext(%s))", (f"dibs-jobs:{self.schema}",)
            )
            upgrade(conn, self.schema, JOBS)
            # The store's identity, created once: a caller's connection must reach this row
            # (this database and schema), not merely some job table of the same name.
            # Read first: opening a store that has one writes nothing.
            if _identity(conn, schema, has_meta=True)[1] is None:
                conn.execute(
                    sql.SQL(
                        "INSERT INTO {}.meta (key, value) VALUES ('store_id', %s) "
                        "ON CONFLICT DO NOTHING"
                    ).format(sql.Identifier(schema)),
                    (secrets.token_hex(16),),
                )
            self._identity = _identity(conn, schema, has_meta=True)
        self._verified: weakref.WeakSet[psycopg.Connection[Any]] = weakref.WeakSet()

    def close(self) -> None:
        pass  # the pool belongs to the store

    @contextmanager
    def _transaction(self) -> Iterator[psycopg.Connection[TupleRow]]:
        try:
            with self._pool().connection() as conn:
                with conn.transaction():
                    yield conn
                _replicated(conn)  # the COMMIT just sent
        except _ERRORS as exc:
            raise _unavailable(exc) from exc

    def _origin(self) -> str:
        # The pid too: a forked child shares this object, and must wake its parent.
        return f"{os.getpid()}:{self._token}"

    def _prepare(self, text: str) -> bytes:
        return text.encode()

    def _run(self, conn: Any, statement: Any, params: dict[str, Any]) -> Any:
        # A cursor of our own kind: a caller's connection may make others (RawCursor takes
        # $1 parameters, ClientCursor binds on the client) and rows of any factory.
        return psycopg.Cursor(conn, row_factory=tuple_row).execute(statement, params)

    def _atomic(self, work: Callable[[Any], _T]) -> _T:
        with self._transaction() as conn:
            return work(conn)

    def _single(self, work: Callable[[Any], _T], write: bool = True) -> _T:
        try:
            with self._pool().connection() as conn:  # autocommit: one statement, one commit
                result = work(conn)
                _replicated(conn)
                return result
        except _ERRORS as exc:
            raise _unavailable(exc) from exc

    def _on_caller(self, connection: object, work: Callable[[Any], _T]) -> _T:
        if not isinstance(connection, psycopg.Connection):
            raise InvalidInput(
                "connection must be a psycopg.Connection to the store's database, got "
                f"{type(connection).__name__}",
                field="connection",
                value=connection,
            )
        if connection.closed:
            raise InvalidInput("connection is closed", field="connection", value=connection)
        if connection.info.transaction_status == TransactionStatus.INERROR:
            raise InvalidInput(
                "connection is in a failed transaction: roll it back first",
                field="connection", value=connection,
            )  # fmt: skip
        try:
            if connection not in self._verified:  # its database never changes: once is enough
                self._check_identity(connection)
                self._verified.add(connection)
            if connection.autocommit:  # no transaction of the caller's: a batch is still one
                with connection.transaction():
                    return work(connection)
            return work(connection)
        except _CALLERS_MISTAKES as exc:
            # Another database, a transaction to roll back, rights or a mode it lacks.
            raise InvalidInput(
                f"connection must be an open psycopg.Connection to the store's database, "
                f"in a usable transaction: {exc}",
                field="connection",
                value=connection,
            ) from exc
        except _CALLERS_CONFLICTS as exc:
            # The caller's transaction is aborted (its snapshot lost to a concurrent
            # commit): only the caller can retry it, as a whole, so not StoreUnavailable.
            raise TransactionConflict(
                f"your transaction was aborted by a concurrent one ({exc.sqlstate}: "
                f"{exc}); roll back and run the whole transaction again",
                sqlstate=exc.sqlstate or "",
            ) from exc
        except psycopg.Error as exc:
            raise StoreUnavailable(
                f"PostgreSQL job table, on the caller's connection: {exc}"
            ) from exc

    def _check_identity(self, connection: psycopg.Connection[Any]) -> None:
        """Raise :class:`~dibs.InvalidInput` unless ``connection`` reaches this store's
        database and schema (its ``store_id`` row), rather than a job table elsewhere."""
        theirs = _identity(connection, self.schema)
        if theirs != self._identity:
            database, token = theirs
            where = "no dibs store" if token is None else "another dibs store"
            raise InvalidInput(
                f"connection must be a psycopg.Connection to the store's database "
                f"{self._identity[0]!r} (schema {self.schema!r}); it reaches {where} "
                f"in database {database!r}",
                field="connection", value=connection,
            )  # fmt: skip

    def listen(self, wake: Callable[[], None]) -> Callable[[], None]:
        stop_local = self._add_local(wake)
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
                            for note in conn.notifies(timeout=0.5, stop_after=1):
                                # This process's own adds woke its workers at their commit.
                                if note.payload != self._origin():
                                    wake()
                except psycopg.Error as exc:
                    log.warning("job table LISTEN failed (%s); polling until it is back", exc)
                    stopped.wait(1.0)

        thread = threading.Thread(target=loop, name="dibs-tasks-listen", daemon=True)
        thread.start()

        def stop() -> None:
            stop_local()
            stopped.set()
            thread.join()

        return stop


_CALLERS_MISTAKES = (
    psycopg.errors.UndefinedTable,
    psycopg.errors.InvalidSchemaName,
    psycopg.errors.InFailedSqlTransaction,
    psycopg.errors.InsufficientPrivilege,
    psycopg.errors.ReadOnlySqlTransaction,
)
"""Errors on a caller's connection that retrying cannot mend: :class:`~dibs.InvalidInput`."""

_CALLERS_CONFLICTS = (psycopg.errors.SerializationFailure, psycopg.errors.DeadlockDetected)
"""Errors that abort the caller's transaction: :class:`~dibs.TransactionConflict`."""


def _identity(
    conn: psycopg.Connection[Any], schema: str, *, has_meta: bool = False
) -> tuple[str, str | None]:
    """``(database, store_id)`` as ``conn`` sees them; ``store_id`` None without a store.

    Reads that cannot fail on a connection to the wrong place (``to_regclass`` answers
    NULL for a missing schema or table), so a caller's transaction stays usable.
    ``has_meta``: the store's own transaction, which has just made sure of the table;
    no ``to_regclass``, whose cache may miss a table another process just created.
    """
    cur = psycopg.Cursor(conn, row_factory=tuple_row)
    meta = sql.SQL("{}.meta").format(sql.Identifier(schema)).as_string(conn)
    row = cur.execute(
        "SELECT current_database()::text, %s OR to_regclass(CAST(%s AS text)) IS NOT NULL",
        (has_meta, meta),
    ).fetchone()
    assert row is not None
    database, found = str(row[0]), bool(row[1])
    if not found:
        return database, None
    token = cur.execute(
        sql.SQL("SELECT value FROM {}.meta WHERE key = 'store_id'").format(sql.Identifier(schema))
    ).fetchone()
    return database, None if token is None else str(token[0])


def _replicated(conn: psycopg.Connection[TupleRow]) -> None:
    """Raise :class:`~dibs.StoreUnavailable` if the commit's synchronous-replication wait was
    cancelled: it reported success, but the standbys may not have it."""
    lost = unreplicated(conn, "job table")
    if lost is not None:
        raise lost
