"""``postgresql://`` for asyncio: the PostgreSQL store, native on psycopg's async pool.

:class:`AsyncPostgresStore` runs the very plans of the sync
:class:`~dibs.stores.postgres.PostgresStore` (:mod:`dibs.stores.postgres._ops`:
the statements, their parameters, the fallbacks to the server-side functions,
the result building and the errors), awaiting each statement on an
:class:`psycopg_pool.AsyncConnectionPool` connection instead of blocking on a
thread's. The two classes differ only in how a statement is run.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Coroutine
from typing import Any, Self, TypeVar

from dibs._extras import needs

with needs("postgres", "the postgresql:// store"):
    import psycopg

from dibs._clock import Clock, SystemClock
from dibs._drive import adrive
from dibs._model import Claim, ClaimResult, Span, SweepResult, Unit, check_retention
from dibs._request import ClaimRequest
from dibs.stores._fork import abandon
from dibs.stores.base import DEFAULT_REQUEST_RETENTION
from dibs.stores.base_async import AsyncStore, TokenFeed
from dibs.stores.postgres._aconn import AsyncStoreConnection
from dibs.stores.postgres._connect import (
    AsyncRecordingPool,
    aconfigure,
    describe,
    first_connection,
    unreplicated,
)
from dibs.stores.postgres._durability import warn_once
from dibs.stores.postgres._ops import (
    RETRY,
    LeaveItToTheFunction,
    Operations,
    Outage,
    Params,
    Plan,
    Step,
    backoff,
    create_schema,
    cursor_of,
    found_version,
    pool_options,
    schema_moved,
    split_url,
    translate,
)

__all__ = ["AsyncPostgresStore"]

logger = logging.getLogger("dibs.stores.postgres")

_T = TypeVar("_T")


async def _rest(work: Coroutine[Any, Any, None], waiting: object) -> None:
    """Run a coroutine that stopped at its first wait (for ``waiting``) to its end."""
    try:
        while True:
            if isinstance(waiting, asyncio.Future):
                await asyncio.wait([waiting])  # the coroutine reads the outcome itself
            else:  # a bare yield (asyncio.sleep(0))
                await asyncio.sleep(0)
            try:
                waiting = work.send(None)
            except StopIteration:
                return
    except Exception as exc:  # pragma: no cover (the pool closes what it cannot take)
        logger.debug("returning a connection to the pool failed: %r", exc)
    finally:
        work.close()


class AsyncPostgresStore(AsyncStore):
    """Claims in a PostgreSQL database, for asyncio code; safe across tasks, processes and hosts.

    The sync :class:`~dibs.stores.postgres.PostgresStore`'s options, URL,
    schema, statements, results and errors, as coroutines on psycopg's
    :class:`~psycopg_pool.AsyncConnectionPool`: no thread is involved in a
    call. Opening the store (the first ``await``) connects once directly, so a
    refusal is raised at once with libpq's words, and creates or upgrades the
    schema on a worker thread (a one-time setup); then it opens the pool of
    ``pool_min`` to ``pool_max`` connections. A call waits up to
    ``pool_timeout`` seconds for a connection, then raises
    :class:`~dibs.StoreUnavailable`. One store belongs to one event loop.

    **Cancellation.** A call runs in its caller's task, on a pooled
    :class:`~dibs.stores.postgres._aconn.AsyncStoreConnection`. Cancelling the
    caller returns at once; what happens to the call depends on how far it got:

    * no statement sent yet (it was waiting for a pool connection or a retry's
      pause): none is sent, no claim is made;
    * a statement sent: it finishes on the server (the store never asks the
      server to cancel it), the connection's own task reads its answer to the
      end, and then a task of the store's puts the connection back in the pool
      idle, never mid-statement or mid-transaction. Each statement is one
      transaction, so the claim either committed or did not; a retry with the
      same request ID learns which, and never makes a second claim. (A claim
      without a request ID that committed is a claim nobody knows the ID of,
      as after :class:`~dibs.StoreUnavailable`: a hold expires with its
      ``ttl``; a claim confirmed at once stays until released, and
      ``claims_of(holder)`` finds it.)

    :meth:`close` waits for the calls in flight, and for such statements, to
    finish before closing the pool.

    ``clock`` is for tests only, as on the sync store.
    """

    scheme = "postgresql"
    shared_holds = True

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
        super().__init__()
        self._logger = logger  # the sync store's logger: one name for both faces
        self.request_retention = check_retention(request_retention)
        self.clock: Clock = clock if clock is not None else SystemClock()
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
        self._create_extension = create_extension
        self._ops = Operations(schema, clock, lambda: self.request_retention)
        self._conninfo = conninfo
        self._where = describe(conninfo)
        self._outage = Outage(self._where)
        self._own_pool: AsyncRecordingPool | None = None
        self._pid = os.getpid()
        self._fork_locks: dict[int, asyncio.Lock] = {}
        self._inflight: set[asyncio.Task[Any]] = set()
        """Tasks returning cancelled calls' connections, once their statements ended."""
        self._calls = 0  # calls in flight, for close() to wait for
        self._drained: asyncio.Future[None] | None = None

    @classmethod
    def from_url(cls, url: str, **options: Any) -> Self:
        """``postgresql://user:pass@host:port/db?schema=dibs&pool_max=10``, not yet opened.

        Takes the sync store's URL and options (see
        :meth:`dibs.stores.postgres.PostgresStore.from_url`). Raises
        :class:`~dibs.InvalidInput` for a malformed option, without I/O.
        """
        conninfo, ours = split_url(url)
        return cls(conninfo, **{**ours, **options})

    # --- opening and closing --------------------------------------------------------------------

    async def _open(self) -> None:
        # The one-time schema setup is blocking psycopg code shared with the sync
        # store: it runs on a worker thread, once; no call after it uses a thread.
        await asyncio.to_thread(self._prepare)
        pool = self._new_pool()
        await pool.open(wait=False)
        self._own_pool = pool
        logger.debug("opened the async PostgreSQL store at %s, schema %r", self._where, self.schema)

    def _prepare(self) -> None:
        with first_connection(self._conninfo, self._pool_options["timeout"]) as conn:
            create_schema(conn, self.schema, self._create_extension)
            warn_once(conn, self._where)  # what `dibs doctor` would flag, once per database

    def _new_pool(self) -> AsyncRecordingPool:
        return AsyncRecordingPool(
            self._conninfo,
            kwargs={"autocommit": True},
            connection_class=AsyncStoreConnection,
            name=f"dibs-aio-{self.schema}",
            configure=aconfigure,
            open=False,
            **self._pool_options,
        )

    async def _pool(self) -> AsyncRecordingPool:
        """This process's pool. A forked child opens its own and never touches the parent's.

        The parent's connections share their sockets with the child (see
        :mod:`dibs.stores._fork`), and its tasks belong to the parent's loop.
        """
        pool = self._own_pool
        assert pool is not None
        if self._pid == os.getpid():
            return pool
        lock = self._fork_locks.setdefault(os.getpid(), asyncio.Lock())
        async with lock:
            if self._pid != os.getpid():
                abandon(pool, *self._inflight)
                self._inflight = set()
                self._calls, self._drained = 0, None
                fresh = self._new_pool()
                await fresh.open(wait=False)
                self._own_pool = fresh
                logger.info(
                    "forked child %d: the parent's (%d) PostgreSQL connections are left "
                    "alone, and this process opened a pool of its own",
                    os.getpid(),
                    self._pid,
                )
                self._pid = os.getpid()
        assert self._own_pool is not None
        return self._own_pool

    async def _close(self) -> None:
        pool = self._own_pool
        if self._pid != os.getpid():
            # Forked: the in-flight tasks and the pool are the parent's loop's; never
            # wait on them here, and leave the parent's sessions alone.
            if pool is not None:
                abandon(pool)
            return
        if self._calls:  # calls in flight: let them end
            self._drained = asyncio.get_running_loop().create_future()
            await asyncio.wait([self._drained])
        if self._inflight:  # statements whose callers were cancelled: let them finish
            await asyncio.wait(set(self._inflight))
        if pool is not None:
            await pool.close()

    # --- the one boundary with the driver -------------------------------------------------------

    async def _run(self, plan: Plan[_T]) -> _T:
        """Run an operation's statements in the caller's task; see the class docstring."""
        try:
            step = next(plan)
        except StopIteration as done:  # settled without the server (an ID never given out)
            result: _T = done.value
            return result
        pool = self._own_pool
        if pool is None or self._pid != os.getpid():  # not yet open, or forked
            pool = await self._pool()
        self._calls += 1
        try:
            return await self._plan(pool, plan, step)
        finally:
            self._calls -= 1
            if not self._calls and self._drained is not None and not self._drained.done():
                self._drained.set_result(None)

    async def _plan(self, pool: AsyncRecordingPool, plan: Plan[_T], step: Step) -> _T:
        """Run a plan on one pooled connection; a cancelled caller leaves it as documented."""
        try:
            try:
                conn = await pool.getconn()  # cancelled here: the pool keeps the connection
            except BaseException:
                plan.close()
                raise

            async def perform(now: Step) -> Any:
                nonlocal step
                step = now
                return await self._statement(conn, now)

            try:
                result = await adrive(plan, perform, LeaveItToTheFunction, first=step)
            except asyncio.CancelledError:
                # The caller left. A statement it sent finishes on the server and is
                # read to its end by the connection's own task; the connection goes
                # back to the pool after that, in a task of the store's.
                self._give_back_later(pool, conn)
                raise
            except BaseException:
                await self._put(pool, conn)
                raise
            await self._put(pool, conn)
            return result
        except (psycopg.Error, UnicodeError) as exc:  # the pool's: closed, timed out, connecting
            error = await self._translate(exc, step[1], answered=False)
            self._outage.failed(error)
            raise error from exc

    async def _put(self, pool: AsyncRecordingPool, conn: AsyncStoreConnection) -> None:
        """``pool.putconn(conn)``, which a cancellation must not stop halfway.

        psycopg_pool's ``putconn`` may wait for a lock of the pool's, and a
        cancellation landing there would lose the connection (and the waiting
        caller it was being handed to). It runs here inline up to its first
        wait, which it nearly never meets; if it does, a task runs the rest.
        """
        work = pool.putconn(conn)
        try:
            waiting = work.send(None)
        except StopIteration:
            return
        await asyncio.shield(self._track(_rest(work, waiting)))

    def _track(self, work: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        task = asyncio.get_running_loop().create_task(work)
        self._inflight.add(task)
        task.add_done_callback(self._inflight.discard)
        return task

    def _give_back_later(self, pool: AsyncRecordingPool, conn: AsyncStoreConnection) -> None:
        finishing, conn.finishing = conn.finishing, None
        self._track(self._give_back(pool, conn, finishing))

    async def _give_back(
        self,
        pool: AsyncRecordingPool,
        conn: AsyncStoreConnection,
        finishing: asyncio.Task[None] | None,
    ) -> None:
        """Return a cancelled call's connection once its statement (if any) has ended."""
        if finishing is not None:
            await asyncio.wait([finishing])
        try:
            await pool.putconn(conn)
        except Exception as exc:  # pragma: no cover (the pool closes what it cannot take)
            logger.debug("returning a cancelled call's connection failed: %r", exc)

    async def _statement(self, conn: AsyncStoreConnection, step: Step) -> Any:
        """One statement's answer, retrying serialization failures and deadlocks."""
        query, params, many, explain = step
        retry = None  # made on the first transient error only
        while True:
            answered = False
            try:
                # Many rows on a throwaway cursor: the kept one would pin them.
                cur = (
                    conn.cursor()
                    if many
                    else getattr(conn, "_dibs_cursor", None) or cursor_of(conn)
                )
                await cur.execute(query, params)
                answered = True
                answer = await (cur.fetchall() if many else cur.fetchone())
                # A commit whose wait for the synchronous standbys was cancelled
                # reports success: never pass it on as one.
                lost = unreplicated(conn, self._where)
            except (psycopg.Error, UnicodeError) as exc:
                if isinstance(exc, RETRY):  # rolled back whole: run it again, after a pause
                    retry = retry or backoff(self.max_retries)
                    pause = retry.pause(exc)  # raises StoreUnavailable when out of tries
                    assert pause is not None
                    await asyncio.sleep(pause)
                    continue
                mapped = explain(exc) if explain and isinstance(exc, psycopg.Error) else None
                error = mapped or await self._translate(exc, params, answered=answered)
                self._outage.failed(error)
                raise error from exc
            if lost is not None:
                self._outage.failed(lost)
                raise lost
            if self._outage.failing:
                self._outage.answered()
            return answer

    async def _translate(
        self, exc: psycopg.Error | UnicodeError, params: Params, *, answered: bool
    ) -> Exception:
        error = translate(
            exc,
            params,
            answered=answered,
            closed=self._closed,
            last_error=None if self._own_pool is None else self._own_pool.last_error,
            where=self._where,
            store=type(self).__name__,
        )
        if error is not None:
            return error
        # Another dibs version changed the schema underneath: say which version is there
        # (read on a worker thread; this is an error path, never a claim's).
        found = await asyncio.to_thread(found_version, self._conninfo, self.schema)
        return schema_moved(self.schema, found, exc)

    # --- the contract ---------------------------------------------------------------------------

    async def _claim(self, request: ClaimRequest) -> ClaimResult:
        return await self._run(self._ops.claim(request))

    async def _confirm(self, claim_id: str, holder: str, fence: int) -> Claim:
        return await self._run(self._ops.confirm(claim_id, holder, fence))

    async def _extend(self, claim_id: str, holder: str, fence: int, ttl: float) -> Claim:
        return await self._run(self._ops.extend(claim_id, holder, fence, ttl))

    async def _release(self, claim_id: str, holder: str, fence: int) -> bool:
        return await self._run(self._ops.release(claim_id, holder, fence))

    async def _get(self, claim_id: str) -> Claim | None:
        return await self._run(self._ops.get(claim_id))

    async def _holder_of(self, target: Unit | Span) -> str | None:
        return await self._run(self._ops.holder_of(target))

    async def _claims_of(self, holder: str) -> list[Claim]:
        return await self._run(self._ops.claims_of(holder))

    async def _sweep(self) -> SweepResult:
        return await self._run(self._ops.sweep())

    async def _now(self) -> float:
        return await self._run(self._ops.now())

    # --- capabilities ---------------------------------------------------------------------------

    def change_feed(self) -> TokenFeed:
        """The server's WAL position, read on a connection of this store's pool.

        The sync store's feed keeps a connection of its own; this one borrows a
        pooled connection for each read, so an async service has one pool.
        """
        return TokenFeed(self, lambda: self._run(self._ops.wal_position()))
