"""The async PostgreSQL store's own connection and call path (issue 27): what they can get wrong.

``AsyncStoreConnection`` keeps one reader on its socket for the socket's life
and hands a cancelled task's statement to a task of its own; the store runs a
call in its caller's task. Here, on asyncio's loop and on uvloop (the one
``dibs serve`` runs): a cancelled statement finishes on the server and is never
cancelled there; answers and statements larger than a socket buffer; bytes
that arrive while no call waits; a socket libpq closed leaves the loop before
its number is reused; the connection's return to the pool survives a cancel;
``close()`` waits for the calls in flight. Statements are parked on the server
behind a table lock and seen there in ``pg_stat_activity``, never by time.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
from collections.abc import Awaitable, Callable, Iterator
from typing import Any, TypeVar
from urllib.parse import parse_qs, urlsplit

import psycopg
import pytest

import dibs
import dibs.aio
from dibs import Unit
from dibs.stores.postgres._aconn import AsyncStoreConnection
from dibs.stores.postgres._aio import AsyncPostgresStore
from eventually import aeventually
from pg_fixtures import lock_waiters

_T = TypeVar("_T")


@pytest.fixture(params=["asyncio", "uvloop"])
def run(request: pytest.FixtureRequest) -> Callable[[Awaitable[Any]], Any]:
    """Run a coroutine to its end on a fresh loop of each kind."""
    factory: Any = asyncio.new_event_loop
    if request.param == "uvloop":
        import uvloop  # the service extra's, which the test command installs

        factory = uvloop.new_event_loop

    def runner(coroutine: Awaitable[_T]) -> _T:
        async def main() -> _T:
            return await coroutine

        with asyncio.Runner(loop_factory=factory) as r:
            return r.run(main())

    return runner


@pytest.fixture
def app() -> str:
    return f"dibs-wait-{secrets.token_hex(4)}"


@pytest.fixture
def watch(pg_url: str) -> Iterator[psycopg.Connection[Any]]:
    with psycopg.connect(pg_url, autocommit=True) as conn:
        yield conn


def _schema(url: str) -> str:
    return parse_qs(urlsplit(url).query)["schema"][0]


@contextlib.contextmanager
def _table_locked(url: str, table: str) -> Iterator[psycopg.Connection[Any]]:
    """Hold ``table`` in ACCESS EXCLUSIVE mode until the block ends (then roll back)."""
    with psycopg.connect(url) as locker:
        locker.execute(f"LOCK TABLE {table} IN ACCESS EXCLUSIVE MODE")
        try:
            yield locker
        finally:
            locker.rollback()


async def _parked(watch: psycopg.Connection[Any], app: str, n: int = 1) -> None:
    await aeventually(lambda: lock_waiters(watch, app) == n, f"{n} statement(s) wait for the lock")


# --- the connection -------------------------------------------------------------------------------


def test_psycopg_still_has_the_wait_this_connection_replaces() -> None:
    # AsyncStoreConnection overrides AsyncConnection.wait and speaks psycopg's
    # generator protocol (Wait/Ready); a psycopg that changed either must fail here,
    # not in production.
    import inspect

    from psycopg.waiting import Ready, Wait

    params = list(inspect.signature(psycopg.AsyncConnection.wait).parameters)
    assert params[:2] == ["self", "gen"] and set(params[2:]) <= {"interval", "timeout"}
    assert {int(Wait.R), int(Wait.W), int(Wait.RW)} == {1, 2, 3}
    assert {int(Ready.R), int(Ready.W)} == {1, 2}
    assert callable(psycopg.pq.PGconn.consume_input) and callable(psycopg.pq.PGconn.is_busy)


def test_a_cancelled_statement_finishes_on_the_server_and_the_connection_ends_idle(
    pg_url: str, watch: psycopg.Connection[Any], app: str, run: Any
) -> None:
    """psycopg's own wait would ask the server to cancel the statement; this one never does."""
    table = f"t_{secrets.token_hex(4)}"
    watch.execute(f"CREATE TABLE {table} (n int)")

    async def main() -> None:
        conn = await AsyncStoreConnection.connect(pg_url, autocommit=True, application_name=app)
        await (await conn.execute("SELECT 1")).fetchone()  # the reader is on
        with _table_locked(pg_url, table):
            insert = asyncio.ensure_future(conn.execute(f"INSERT INTO {table} VALUES (1)"))
            await _parked(watch, app)
            insert.cancel()
            with pytest.raises(asyncio.CancelledError):
                await insert
            finishing = conn.finishing
            assert finishing is not None and not finishing.done()
        await finishing  # the lock is gone: the statement ends, and its answer is read
        assert conn.pgconn.transaction_status == psycopg.pq.TransactionStatus.IDLE
        assert await (await conn.execute(f"SELECT count(*) FROM {table}")).fetchone() == (1,)
        await conn.close()

    run(main())


def test_answers_and_statements_larger_than_a_socket_buffer(pg_url: str, run: Any) -> None:
    """An answer that arrives in many reads wakes its task once; a statement that fills the
    socket's send buffer waits for it to drain (the writer's path)."""
    big = "x" * 8_000_000

    async def main() -> None:
        conn = await AsyncStoreConnection.connect(pg_url, autocommit=True)
        row = await (await conn.execute("SELECT repeat('y', 6000000)")).fetchone()
        assert row is not None and len(row[0]) == 6_000_000
        assert await (await conn.execute("SELECT length(%s)", (big,))).fetchone() == (len(big),)
        rows = await (await conn.execute("SELECT generate_series(1, 200000)")).fetchall()
        assert len(rows) == 200_000 and rows[-1] == (200_000,)
        await conn.close()

    run(main())


def test_bytes_that_arrive_while_no_call_waits_are_kept_for_the_next(
    pg_url: str, watch: psycopg.Connection[Any], run: Any
) -> None:
    """A notification reaches an idle connection: its reader takes it in (the loop must not
    keep seeing it), and the next statement answers and the notification is delivered."""
    channel = f"c_{secrets.token_hex(4)}"

    async def main() -> None:
        conn = await AsyncStoreConnection.connect(pg_url, autocommit=True)
        heard: list[str] = []
        conn.add_notify_handler(lambda n: heard.append(n.payload))
        await conn.execute(f"LISTEN {channel}")
        watch.execute(f"NOTIFY {channel}, 'hello'")
        await aeventually(lambda: conn._unread, "the reader takes the notification in")
        assert await (await conn.execute("SELECT 42")).fetchone() == (42,)
        await aeventually(lambda: heard == ["hello"], "the notification is delivered")
        await conn.close()

    run(main())


def test_a_socket_libpq_closed_leaves_the_loop_before_its_number_is_reused(
    pg_url: str, watch: psycopg.Connection[Any], app: str, run: Any
) -> None:
    """The server ends an idle session: libpq closes its socket as it reads the end. A new
    connection often gets the same descriptor number; it must be watched, not mistaken for
    the old registration (which would leave it never woken)."""

    async def main() -> None:
        old = await AsyncStoreConnection.connect(pg_url, autocommit=True, application_name=app)
        await (await old.execute("SELECT 1")).fetchone()
        old.unwatch_if_broken()  # what the pool's putconn does: a healthy one stays watched
        assert old._fd == old.pgconn.socket
        watch.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = %s",
            (app,),
        )
        await aeventually(lambda: old._fd == -1, "the reader sees the end and leaves the loop")
        for _ in range(3):  # the freed number goes to one of these, usually the first
            new = await AsyncStoreConnection.connect(pg_url, autocommit=True)
            assert await (await new.execute("SELECT 7")).fetchone() == (7,)
            await new.close()
        with pytest.raises(psycopg.OperationalError):
            await old.execute("SELECT 1")
        await old.close()

    run(main())


# --- the store ------------------------------------------------------------------------------------


def test_a_claim_cancelled_on_the_server_is_finished_there_and_its_retry_replays_it(
    pg_url: str, pg_schema_url: str, watch: psycopg.Connection[Any], app: str, run: Any
) -> None:
    table = f"{_schema(pg_schema_url)}.units_v4"

    async def main() -> None:
        store = dibs.aio.open(f"{pg_schema_url}&application_name={app}&pool_min=1&pool_max=1")
        assert isinstance(store, AsyncPostgresStore)
        await store.open()
        await store.claim(Unit("warm", "1"), holder="w")  # the pool's one connection is up
        with _table_locked(pg_url, table):
            call = asyncio.ensure_future(
                store.claim(Unit("seat", "1"), holder="alice", request_id="r1", ttl=60)
            )
            await _parked(watch, app)
            call.cancel()
            with pytest.raises(asyncio.CancelledError):
                await call
            assert len(store._inflight) == 1  # the connection's return waits for the statement
        retry = await store.claim(Unit("seat", "1"), holder="alice", request_id="r1", ttl=60)
        assert retry.granted and retry.replayed  # the cancelled call's claim, never a second
        assert not store._inflight
        pool = store._own_pool
        assert pool is not None
        stats = pool.get_stats()
        assert stats.get("returns_bad", 0) == 0 and stats.get("connections_lost", 0) == 0
        await store.close()

    run(main())


def test_close_waits_for_a_call_in_flight_which_gets_its_answer(
    pg_url: str, pg_schema_url: str, watch: psycopg.Connection[Any], app: str, run: Any
) -> None:
    table = f"{_schema(pg_schema_url)}.units_v4"

    async def main() -> None:
        store = await dibs.aio.open(f"{pg_schema_url}&application_name={app}").open()
        await store.claim(Unit("warm", "1"), holder="w")
        with _table_locked(pg_url, table):
            call = asyncio.ensure_future(store.claim(Unit("seat", "1"), holder="alice", ttl=60))
            await _parked(watch, app)
            closing = asyncio.ensure_future(store.close())
            for _ in range(20):
                await asyncio.sleep(0)
            assert not closing.done()  # it waits for the call parked on the server
        result = await call
        assert result.granted
        await closing

    run(main())


class _SlowPool:
    """A pool whose ``putconn`` waits for a lock, as psycopg_pool's may under contention."""

    def __init__(self) -> None:
        self.lock = asyncio.Lock()
        self.returned: list[object] = []

    async def putconn(self, conn: object) -> None:
        async with self.lock:
            self.returned.append(conn)


def test_a_cancel_landing_while_the_pool_takes_a_connection_back_does_not_lose_it(
    run: Any,
) -> None:
    async def main() -> None:
        store = AsyncPostgresStore("host=unused")
        pool, conn = _SlowPool(), object()
        # The fast path: putconn never waits, so nothing else runs.
        await store._put(pool, conn)  # type: ignore[arg-type]
        assert pool.returned == [conn] and not store._inflight
        await pool.lock.acquire()
        put = asyncio.ensure_future(store._put(pool, conn))  # type: ignore[arg-type]
        for _ in range(3):
            await asyncio.sleep(0)
        put.cancel()
        with pytest.raises(asyncio.CancelledError):
            await put
        assert len(store._inflight) == 1  # the rest of putconn runs in a task of the store's
        pool.lock.release()
        await asyncio.wait(set(store._inflight))
        assert pool.returned == [conn, conn]

    run(main())
