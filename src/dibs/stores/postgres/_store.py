"""``postgresql://``: the arbiter for many application hosts sharing one PostgreSQL.

Each operation is one statement — a call of a server-side function (see
:mod:`dibs.stores.postgres._sql`), or for a free single unit one plain
``INSERT`` CTE — so it is one round trip and one transaction in autocommit
mode:

* a unit is claimed by ``INSERT … ON CONFLICT DO NOTHING`` against the primary
  key ``(resource, slot)`` of the ``units`` table — the insert is the check;
* an expired hold is taken over by a conditional ``UPDATE`` of the unit row it
  was observed on, row-locked, in the claimant's transaction;
* a span is claimed by an insert against ``EXCLUDE USING gist (resource WITH =,
  span WITH &&)``; expired holds in its way are deleted, and their claims
  marked taken over, in the same transaction;
* the fence comes from a sequence, drawn after every target is held;
* confirm, extend and release are conditional updates of the claim row after
  its unit and span rows are locked (the lock order that rules out deadlock);
* expiry is judged on the database's ``clock_timestamp()``, never the client's.

Errors are translated at one boundary (:meth:`PostgresStore._call`), and no
driver error escapes it: serialization failures and deadlocks are retried with
jittered backoff; input PostgreSQL cannot store (a NUL, a lone surrogate,
SQLSTATE class 22) is :class:`~dibs.InvalidInput`; a pool closed by
:meth:`~dibs.Store.close` is :class:`~dibs.StoreClosed`; everything else (a
lost connection, a pool timeout, a server shutting down, ``statement_timeout``,
``lock_timeout``, a read-only standby, retries used up) is
:class:`~dibs.StoreUnavailable`. After that the claim may or may not have
committed: retry with the same request ID to learn which.

The rules (which statement, its parameters, what its answer means, the
result and the error) live in :mod:`dibs.stores.postgres._ops`, shared with
the asyncio store (``dibs.aio.open``); this class only runs their statements
on a thread's pooled connection.
"""

from __future__ import annotations

import inspect
import logging
import os
import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

import psycopg
from psycopg.rows import TupleRow

from dibs._clock import Clock
from dibs._drive import drive
from dibs._model import Claim, ClaimResult, Span, SweepResult, Unit, check_retention
from dibs._request import ClaimRequest
from dibs.exceptions import StoreClosed
from dibs.stores._fork import abandon
from dibs.stores._retry import Backoff
from dibs.stores.base import DEFAULT_REQUEST_RETENTION, Store
from dibs.stores.capabilities import ChangeFeed, ClaimLog, ClaimReader
from dibs.stores.durability import Finding
from dibs.stores.jobs import JobTable
from dibs.stores.postgres._connect import (
    RecordingPool,
    configure,
    describe,
    first_connection,
    unreplicated,
)
from dibs.stores.postgres._durability import findings as durability_findings
from dibs.stores.postgres._durability import warn_once
from dibs.stores.postgres._jobs import PostgresJobs
from dibs.stores.postgres._ops import (
    RETRY,
    LeaveItToTheFunction,
    Operations,
    Outage,
    Params,
    Plan,
    create_schema,
    cursor_of,
    found_version,
    parse_id,
    pool_options,
    schema_moved,
    split_url,
    translate,
)
from dibs.stores.postgres._ops import backoff as _backoff
from dibs.stores.postgres._sql import SCHEMA_VERSION, schema_version

__all__ = ["SCHEMA_VERSION", "PostgresStore", "parse_id", "split_url"]

logger = logging.getLogger("dibs.stores.postgres")

_T = TypeVar("_T")


class PostgresStore(Store):
    """Claims in a PostgreSQL database; safe across threads, processes and hosts.

    ``conninfo`` is a libpq URL or key/value string. Connections come from a
    pool of ``pool_min`` to ``pool_max`` connections; a call waits up to
    ``pool_timeout`` seconds for one, then raises
    :class:`~dibs.StoreUnavailable`. Tables live in the schema ``schema``,
    created on first use with a version stamp.

    ``clock`` is for tests only: when given, the store judges expiry by that
    clock (passing its time to every statement) instead of the database's
    ``clock_timestamp()``, so a :class:`~dibs.FakeClock` can move time. Never
    pass one in production: application hosts' clocks disagree, the
    database's is the one clock they share.

    Raises :class:`~dibs.StoreUnavailable` when the database cannot be reached,
    :class:`~dibs.SchemaError` when its schema is newer than this code or
    ``btree_gist`` is missing and the role may not create it.
    """

    scheme = "postgresql"
    shared_holds = True
    async_store = "dibs.stores.postgres._aio:AsyncPostgresStore"
    verify_faults = frozenset({"terminate", "restart"})

    def __init__(
        self,
        conninfo: str,
        *,
        clock: Clock | None = None,
        request_retention: float = DEFAULT_REQUEST_RETENTION,
        schema: str = "dibs",
        pool_min: int = 1,
        pool_max: int = 10,
        pool_timeout: float = 10.0,
        max_retries: int = 8,
        create_extension: bool = True,
    ) -> None:
        super().__init__(clock=clock, request_retention=request_retention)
        self._pool_options = pool_options(
            conninfo,
            schema=schema,
            pool_min=pool_min,
            pool_max=pool_max,
            pool_timeout=pool_timeout,
            max_retries=max_retries,
        )
        self.schema = schema
        self.max_retries = max_retries
        self._test_clock = clock is not None
        self._ops = Operations(schema, clock, lambda: self.request_retention)
        self._sql = self._ops.sql
        self._conninfo = conninfo
        self._fork_lock = threading.Lock()
        # Statements in flight on the pool; close() waits for them before closing it, so
        # no call waits for a connection of a closed pool (psycopg_pool queues a getconn
        # that passed its open check after close() failed the queue: it would wait out
        # pool_timeout, then fail as unavailable).
        self._calls = 0
        self._drained = threading.Condition()  # guards _calls
        self._pid = os.getpid()
        self._where = describe(conninfo)
        self._outage = Outage(self._where)
        # The first open connects directly, not through a pool: a refusal is raised now
        # with libpq's cause, where a pool would retry it quietly until pool_timeout.
        with first_connection(conninfo, self._pool_options["timeout"]) as conn:
            create_schema(conn, schema, create_extension)
            warn_once(conn, self._where)  # what `dibs doctor` would flag, once per database
        self._own_pool = self._new_pool()
        logger.debug("opened the PostgreSQL store at %s, schema %r", self._where, schema)

    def _new_pool(self) -> RecordingPool:
        pool = RecordingPool(
            self._conninfo,
            kwargs={"autocommit": True},
            name=f"dibs-{self.schema}",
            configure=configure,
            open=False,
            **self._pool_options,
        )
        pool.open(wait=False)
        return pool

    @property
    def _pool(self) -> RecordingPool:
        """This process's pool. A forked child opens its own and never touches the parent's.

        The parent's connections share their sockets with the child: a query
        from the child would interleave with the parent's on one session, and
        closing them would end the parent's sessions (libpq sends Terminate).
        """
        if self._pid != os.getpid():
            with self._fork_lock:
                if self._pid != os.getpid():
                    abandon(self._own_pool)
                    self._own_pool = self._new_pool()
                    logger.info(
                        "forked child %d: the parent's (%d) PostgreSQL connections are left "
                        "alone, and this process opened a pool of its own",
                        os.getpid(),
                        self._pid,
                    )
                    self._pid = os.getpid()
        return self._own_pool

    @classmethod
    def from_url(cls, url: str, **options: Any) -> PostgresStore:
        """Open from ``postgresql://user:pass@host:port/db?schema=dibs&pool_max=10``.

        dibs's own query options (``schema``, ``pool_min``, ``pool_max``,
        ``pool_timeout``, ``request_retention``, ``max_retries``,
        ``create_extension``) are taken out; the rest go to libpq (for example
        ``sslmode`` or ``connect_timeout``). Keyword options win over the URL.
        Raises :class:`~dibs.InvalidInput` for a malformed option.
        """
        conninfo, ours = split_url(url)
        return cls(conninfo, **{**ours, **options})

    @classmethod
    def check_url(cls, url: str, **options: Any) -> None:
        """Refuse what :meth:`from_url` would refuse before it connects; no I/O."""
        conninfo, ours = split_url(url)
        # The constructor's defaults, from its signature: one copy of them.
        given = {
            name: param.default
            for name, param in inspect.signature(cls.__init__).parameters.items()
            if param.kind is param.KEYWORD_ONLY
        }
        given.update(ours, **options)
        check_retention(given["request_retention"])
        pool_options(
            conninfo,
            schema=given["schema"],
            pool_min=given["pool_min"],
            pool_max=given["pool_max"],
            pool_timeout=given["pool_timeout"],
            max_retries=given["max_retries"],
        )

    @classmethod
    def durability(cls, url: str, *, timeout: float = 5.0) -> list[Finding]:
        """fsync, page writes, synchronous commit, standbys: :meth:`dibs.Store.durability`."""
        return durability_findings(url, timeout)

    @classmethod
    def exists(cls, url: str, **options: Any) -> bool:
        """Whether the database holds this store's schema; creates nothing.

        Raises :class:`~dibs.StoreMisconfigured` or :class:`~dibs.StoreUnavailable`
        when the database cannot be reached, as opening does.
        """
        cls.check_url(url, **options)  # what opening would refuse, refused alike
        conninfo, ours = split_url(url)
        merged = {**ours, **options}
        with first_connection(conninfo, float(merged.get("pool_timeout", 10.0))) as conn:
            return schema_version(conn, str(merged.get("schema", "dibs"))) > 0

    # --- the one boundary with the driver -------------------------------------------------------

    def _run(self, plan: Plan[_T]) -> _T:
        """Run an operation's statements (see :mod:`dibs.stores.postgres._ops`); its result."""
        call = self._call
        return drive(plan, lambda step: call(*step), LeaveItToTheFunction)

    def _call(
        self,
        query: bytes,
        params: Params,
        fetch_all: bool = False,
        explain: Callable[[psycopg.Error], Exception | None] | None = None,
    ) -> Any:
        """Run one statement on a pooled connection, translating the driver's errors.

        Retries serialization failures and deadlocks with full jitter, then
        raises :class:`~dibs.StoreUnavailable`, as it does for every other
        failure of the server or the connection. Raises
        :class:`~dibs.InvalidInput` for input PostgreSQL cannot take, and
        :class:`~dibs.StoreClosed` once the store is closed. ``explain`` may
        translate a server error first (the claim's own SQLSTATEs).
        """
        with self._drained:
            if self._closed:
                raise StoreClosed(f"this {type(self).__name__} is closed")
            self._calls += 1
        try:
            return self._statement(query, params, fetch_all, explain)
        finally:
            with self._drained:
                self._calls -= 1
                if not self._calls:
                    self._drained.notify_all()

    def _statement(
        self,
        query: bytes,
        params: Params,
        fetch_all: bool,
        explain: Callable[[psycopg.Error], Exception | None] | None,
    ) -> Any:
        backoff: Backoff | None = None  # made on the first transient error only
        while True:
            answered = False
            try:
                # getconn and putconn, not the pool's connection() context: that one adds
                # a generator and the connection's own context (a commit call, a no-op in
                # autocommit) to every statement; putconn rolls back or replaces a
                # connection left in a transaction or broken, as the context would.
                pool = self._pool
                conn = pool.getconn()
                try:
                    # Many rows on a throwaway cursor: the kept one would pin them.
                    cur = (
                        conn.cursor()
                        if fetch_all
                        else getattr(conn, "_dibs_cursor", None) or cursor_of(conn)
                    )
                    cur.execute(query, params)
                    answered = True
                    answer = cur.fetchall() if fetch_all else cur.fetchone()
                    # A commit whose wait for the synchronous standbys was cancelled
                    # reports success: never pass it on as one.
                    lost = unreplicated(conn, self._where)
                finally:
                    pool.putconn(conn)
            except (psycopg.Error, UnicodeError) as exc:
                if isinstance(exc, RETRY):  # rolled back whole: run it again, after a pause
                    backoff = backoff or _backoff(self.max_retries)
                    pause = backoff.pause(exc)  # raises StoreUnavailable when out of tries
                    assert pause is not None
                    time.sleep(pause)
                    continue
                mapped = explain(exc) if explain and isinstance(exc, psycopg.Error) else None
                error = mapped or self._translate(exc, params, answered=answered)
                self._outage.failed(error)
                raise error from exc
            if lost is not None:
                self._outage.failed(lost)
                raise lost
            if self._outage.failing:
                self._outage.answered()
            return answer

    def _translate(
        self, exc: psycopg.Error | UnicodeError, params: Params, *, answered: bool
    ) -> Exception:
        """The dibs error for a driver error (see the module docstring for the mapping)."""
        error = translate(
            exc,
            params,
            answered=answered,
            closed=self._closed,
            last_error=self._own_pool.last_error,
            where=self._where,
            store=type(self).__name__,
        )
        return error or schema_moved(self.schema, found_version(self._conninfo, self.schema), exc)

    def _now_param(self) -> Any:
        """The test clock's time for statements, or None to use the database clock."""
        return self._ops.now_param()

    def _now(self) -> float:
        return self._run(self._ops.now())

    # --- the contract -----------------------------------------------------------------------------

    def _claim(self, request: ClaimRequest) -> ClaimResult:
        return self._run(self._ops.claim(request))

    def _confirm(self, claim_id: str, holder: str, fence: int) -> Claim:
        return self._run(self._ops.confirm(claim_id, holder, fence))

    def _extend(self, claim_id: str, holder: str, fence: int, ttl: float) -> Claim:
        return self._run(self._ops.extend(claim_id, holder, fence, ttl))

    def _release(self, claim_id: str, holder: str, fence: int) -> bool:
        return self._run(self._ops.release(claim_id, holder, fence))

    def _get(self, claim_id: str) -> Claim | None:
        return self._run(self._ops.get(claim_id))

    def _holder_of(self, target: Unit | Span) -> str | None:
        return self._run(self._ops.holder_of(target))

    def _claims_of(self, holder: str) -> list[Claim]:
        return self._run(self._ops.claims_of(holder))

    def _sweep(self) -> SweepResult:
        return self._run(self._ops.sweep())

    # --- capabilities ---------------------------------------------------------------------------

    def _jobs_clock(self) -> float | None:
        """The job table's ``now``: the test clock's, or None for the server's own."""
        return self.clock.now() if self._test_clock else None

    def job_table(self) -> JobTable:
        """``jobs`` in this store's schema, on this store's pool (created on first use)."""
        return self._once(
            "job_table",
            lambda: PostgresJobs(self.schema, lambda: self._pool, self._jobs_clock),
        )

    def change_feed(self) -> ChangeFeed:
        """The server's WAL position, read on a connection of its own."""
        return _WalPosition(self._conninfo)

    def claim_log(self) -> ClaimLog:
        """Every row of the schema's ``claims`` table, in one statement."""
        return ClaimReader(self._log)

    def _log(self) -> list[Claim]:
        return self._run(self._ops.log())

    def _close(self) -> None:
        if self._pid == os.getpid():
            # The calls already in flight end first (each within pool_timeout plus one
            # statement), as on the async store; new ones raise StoreClosed.
            with self._drained:
                self._drained.wait_for(lambda: not self._calls, self._pool_options["timeout"])
            self._own_pool.close()
        else:  # the parent's pool, inherited and never used here: leave its sessions alone
            abandon(self._own_pool)


class _WalPosition:
    """PostgreSQL's current WAL position: it moves on every write to the cluster.

    Writes to other databases move it too, which costs a needless refresh,
    never a missed one. Any error answers "changed" and reconnects next time.
    """

    def __init__(self, conninfo: str) -> None:
        self._conninfo = conninfo
        self._lock = threading.Lock()  # guards _conn
        self._conn: psycopg.Connection[TupleRow] | None = None
        self._closed = False

    def read(self) -> object:
        """The token; a fresh ``object()`` ("maybe changed") on a failing read, and
        :class:`~dibs.StoreClosed` once the feed is closed (a read racing close must
        not open a connection nobody closes)."""
        with self._lock:
            if self._closed:
                raise StoreClosed("this PostgreSQL change feed is closed")
            try:
                if self._conn is None:
                    self._conn = psycopg.connect(self._conninfo, autocommit=True, connect_timeout=5)
                row = self._conn.execute("SELECT pg_current_wal_lsn()::text").fetchone()
                return row[0] if row else object()
            except psycopg.Error:
                self._drop()
                return object()

    def _drop(self) -> None:
        if self._conn is not None:
            conn, self._conn = self._conn, None
            conn.close()

    def close(self) -> None:
        with self._lock:
            self._closed = True
            self._drop()
