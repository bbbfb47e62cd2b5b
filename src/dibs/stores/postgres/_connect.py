"""Opening connections to PostgreSQL, and telling a mistake from an outage.

A store's first open makes one direct connection (no pool yet), so a refusal
comes back at once with libpq's own words instead of after ``pool_timeout``
of background retries and their log lines. libpq gives no SQLSTATE for a
connection it could not open, only a message, so :func:`connect_error` reads
it: the server's refusals that no retry can fix (authentication, a missing
database or role, ``pg_hba.conf``, a rejected option) are
:class:`~dibs.StoreMisconfigured`; everything else (refused, timed out, the
server starting up or full, a name that does not resolve yet) is
:class:`~dibs.StoreUnavailable`, with the cause. A server whose messages are
not in English falls on the retryable side, still with its cause.
"""

from __future__ import annotations

import logging
import math
import re
from typing import Any

import psycopg
from psycopg.conninfo import conninfo_to_dict
from psycopg.rows import TupleRow
from psycopg_pool import AsyncConnectionPool, ConnectionPool

from dibs.exceptions import StoreMisconfigured, StoreUnavailable
from dibs.stores.postgres._aconn import AsyncStoreConnection

__all__ = [
    "IDLE_IN_TRANSACTION",
    "AsyncRecordingPool",
    "RecordingPool",
    "aconfigure",
    "configure",
    "connect_error",
    "first_connection",
    "forget_replication",
    "unreplicated",
    "watch_replication",
]

logger = logging.getLogger("dibs.stores.postgres")

_QUOTED = re.compile(r"\"[^\"]*\"|'[^']*'")

# Fragments of libpq's and the server's messages for refusals a retry cannot fix.
_MISTAKES = (
    "authentication failed",  # password, scram, md5, ident, peer, cert
    "no password supplied",
    "does not exist",  # database "x" / role "x"
    "no pg_hba.conf entry",
    "not permitted to log in",
    "permission denied for database",
    "invalid",  # libpq's own: invalid sslmode value, invalid port number, ...
    "but ssl was required",
    "unrecognized configuration parameter",
)
# Refusals that look like the above but pass: checked first.
_PASSING = (
    "the database system is starting up",
    "the database system is shutting down",
    "the database system is in recovery mode",
    "too many connections",
    "remaining connection slots are reserved",
)


def cause_of(exc: BaseException) -> str:
    """libpq's message on one line, without the repeated "connection failed:" prefix."""
    text = " ".join(str(exc).split())
    return text.removeprefix("connection failed: ")


def connect_error(exc: psycopg.Error, where: str) -> StoreMisconfigured | StoreUnavailable:
    """The dibs error for a connection to ``where`` that could not be opened."""
    cause = cause_of(exc)
    # Names the message quotes (a host "invalid.example", a database "x_does_not_exist")
    # must not decide; only libpq's and the server's own words do.
    low = _QUOTED.sub("", cause).lower()
    pgconn = getattr(exc, "pgconn", None)
    mistake = (pgconn is not None and bool(getattr(pgconn, "needs_password", False))) or (
        not any(p in low for p in _PASSING) and any(m in low for m in _MISTAKES)
    )
    if mistake or isinstance(exc, psycopg.ProgrammingError):
        return StoreMisconfigured(
            f"cannot open the PostgreSQL store at {where}: {cause}. Retrying will not help: "
            "check the user, password, database and options in the URL",
            cause=cause,
        )
    return StoreUnavailable(f"cannot reach the PostgreSQL store at {where}: {cause}", cause=cause)


def describe(conninfo: str) -> str:
    """Where a conninfo points, for messages: hosts, ports, database and user, never a password.

    A multi-host conninfo (``host=a,b port=5432,5433``) reads ``a:5432,b:5433/db``.
    """
    try:
        params = conninfo_to_dict(conninfo)
    except psycopg.Error:
        return "(unparsable conninfo)"
    hosts = str(params.get("host") or params.get("hostaddr") or "localhost").split(",")
    ports = str(params.get("port") or "5432").split(",")
    if len(ports) == 1:  # libpq: one port serves every host
        ports *= len(hosts)
    where = ",".join(
        f"{h or 'localhost'}:{p or '5432'}" for h, p in zip(hosts, ports, strict=False)
    )
    db = params.get("dbname") or params.get("user") or "?"
    user = params.get("user")
    return f"{where}/{db}" + (f" as {user!r}" if user else "")


# --- commits the synchronous standbys may not have ----------------------------------------------

_WATCH = "_dibs_replication"


class _ReplicationWatch:
    """What a connection's server said about its last commit's synchronous replication.

    PostgreSQL commits locally, then waits for the synchronous standbys. When
    that wait is cancelled (``pg_cancel_backend``, a statement cancelled by
    its client) the server still reports success, with only a WARNING
    "canceling wait for synchronous replication": the commit may exist on the
    primary alone, and a failover would lose it. When the backend is
    terminated in the wait, the WARNING comes just before the connection
    drops. The notice is known by its source function, ``SyncRepWaitForLSN``,
    which the server sends in every language (its message is translated).
    """

    __slots__ = ("cancelled",)

    def __init__(self) -> None:
        self.cancelled: str | None = None

    def __call__(self, diag: psycopg.errors.Diagnostic) -> None:
        if diag.source_function == "SyncRepWaitForLSN" or (
            diag.message_primary is not None
            and "wait for synchronous replication" in diag.message_primary
        ):
            self.cancelled = diag.message_primary or "canceling wait for synchronous replication"


def watch_replication(conn: psycopg.Connection[Any] | psycopg.AsyncConnection[Any]) -> None:
    """Have ``conn`` remember a cancelled synchronous-replication wait (see :func:`unreplicated`).

    Part of the pools' ``configure`` step (:func:`configure`): every connection a store uses
    is watched.
    """
    watch = _ReplicationWatch()
    setattr(conn, _WATCH, watch)
    conn.add_notice_handler(watch)


# --- a paused process must not hold its locks ---------------------------------------------------

IDLE_IN_TRANSACTION = 10.0
"""Seconds a store's own connection may wait inside an open transaction before the server ends
it (``idle_in_transaction_session_timeout``).

A process stopped between two statements of a transaction (``SIGSTOP``, a
frozen VM, a debugger) keeps its TCP connection, so the server keeps its
transaction and its row locks for as long as the pause lasts: a durable
schedule's row, say, which every other worker's evaluation and every skip
run's completion then wait on. dibs sends a transaction's statements back to
back and runs no caller code inside its own transactions, so a wait this long
means the client is not running; the server then rolls the transaction back
and closes the session, the locks go, and the paused process meets a closed
connection when it resumes (:class:`~dibs.StoreUnavailable`, retried like any
outage; nothing it did in that transaction was committed). A lower limit
already set for the role, the database or the server is kept. Transactions on
a caller's own ``connection=`` are the caller's, and untouched.
"""

_LIMIT_IDLE = (
    "SELECT set_config('idle_in_transaction_session_timeout', %(ms)s, false) FROM pg_settings "
    "WHERE name = 'idle_in_transaction_session_timeout' "
    "AND (CAST(setting AS BIGINT) = 0 OR CAST(setting AS BIGINT) > CAST(%(ms)s AS BIGINT))"
)


def _limit() -> dict[str, str]:
    return {"ms": str(max(1, round(IDLE_IN_TRANSACTION * 1000)))}


def configure(conn: psycopg.Connection[Any]) -> None:
    """The pool's ``configure`` step: watch replication, and bound a paused transaction."""
    watch_replication(conn)
    conn.execute(_LIMIT_IDLE, _limit())


async def aconfigure(conn: psycopg.AsyncConnection[Any]) -> None:
    """:func:`configure` as the async pool's ``configure`` step."""
    watch_replication(conn)
    await conn.execute(_LIMIT_IDLE, _limit())


def forget_replication(conn: psycopg.Connection[Any] | psycopg.AsyncConnection[Any]) -> None:
    """Drop what ``conn`` remembers of a cancelled wait, as it goes back to its pool.

    A connection goes back to the pool with a warning unread when its call left
    by an exception after the commit (Ctrl-C in the wait: psycopg cancels the
    statement, which the server turns into the warning and a success, then
    raises KeyboardInterrupt). That call reported no success; the warning is
    not the next call's, which must not raise for it.
    """
    watch: _ReplicationWatch | None = getattr(conn, _WATCH, None)
    if watch is not None:
        watch.cancelled = None


def unreplicated(
    conn: psycopg.Connection[Any] | psycopg.AsyncConnection[Any], where: str
) -> StoreUnavailable | None:
    """The error for a commit on ``conn`` whose synchronous-replication wait was cancelled, once.

    None when the last statements committed normally. The outcome is
    unknown to the caller: the commit stands on the primary, but the
    standbys may not have it, so it must not be acknowledged (a failover
    would lose it). Retry with the same request ID.
    """
    watch: _ReplicationWatch | None = getattr(conn, _WATCH, None)
    if watch is None or watch.cancelled is None:
        return None
    message, watch.cancelled = watch.cancelled, None
    return StoreUnavailable(
        f"PostgreSQL store ({where}): the commit's wait for synchronous replication was "
        f"cancelled ({message}); it committed on the primary but may be missing on the "
        "standbys, so its outcome is unknown: retry with the same request ID",
        cause=message,
    )


def first_connection(conninfo: str, timeout: float) -> psycopg.Connection[TupleRow]:
    """One autocommit connection, made now; raises at once with libpq's cause.

    ``timeout`` bounds a connect that hangs (a host that drops packets) when
    the conninfo sets no ``connect_timeout`` of its own.
    """
    extra: dict[str, Any] = {}
    if "connect_timeout" not in conninfo_to_dict(conninfo):
        extra["connect_timeout"] = max(2, math.ceil(timeout))  # libpq's minimum is 2
    try:
        conn = psycopg.connect(conninfo, autocommit=True, **extra)
    except psycopg.Error as exc:
        error = connect_error(exc, describe(conninfo))
        logger.debug("%s", error)  # raised, not logged louder: the caller reports it
        raise error from exc
    try:
        configure(conn)
    except psycopg.Error as exc:
        conn.close()
        raise StoreUnavailable(f"PostgreSQL at {describe(conninfo)}: {cause_of(exc)}") from exc
    return conn


class RecordingPool(ConnectionPool[psycopg.Connection[TupleRow]]):
    """A pool that remembers why its last connection attempt failed, for the timeout's message.

    psycopg_pool's own timeout says only "couldn't get a connection after N sec".
    """

    last_error: str | None = None

    def _connect(self, timeout: float | None = None) -> psycopg.Connection[TupleRow]:
        try:
            conn = super()._connect(timeout)
        except psycopg.Error as exc:
            self.last_error = cause_of(exc)
            raise
        self.last_error = None
        return conn

    def putconn(self, conn: psycopg.Connection[TupleRow]) -> None:
        # A warning its last call left unread is no one's. Dropped here, not in the
        # pool's ``reset`` step: with one, psycopg_pool hands every returned
        # connection to a worker thread, and the next call waits for that thread.
        forget_replication(conn)
        super().putconn(conn)


class AsyncRecordingPool(AsyncConnectionPool[AsyncStoreConnection]):
    """:class:`RecordingPool` for asyncio: remembers why its last connection attempt failed.

    Its connections are :class:`~dibs.stores.postgres._aconn.AsyncStoreConnection`.
    """

    last_error: str | None = None

    async def _connect(self, timeout: float | None = None) -> AsyncStoreConnection:
        try:
            conn = await super()._connect(timeout)
        except psycopg.Error as exc:
            self.last_error = cause_of(exc)
            raise
        self.last_error = None
        return conn

    async def putconn(self, conn: AsyncStoreConnection) -> None:
        # As RecordingPool.putconn: a ``reset`` step would send each return
        # through a worker task, two loop hops before the next call has it.
        forget_replication(conn)
        conn.unwatch_if_broken()  # the pool drops a broken one without closing it
        await super().putconn(conn)
