"""The native async PostgreSQL store (dibs.stores.postgres._aio): what only it can get wrong.

The store contract and the state machine run on it through tests/support/aio_face.py
(every store, both faces). Here: that ``dibs.aio.open`` gives the native store
and opens lazily; the sync store's URL options and open errors; tasks racing
for seats with threads of the sync store on the same schema; cancellation at
many points of a claim's life, with the pool's connections checked on the
server afterwards; the server going away and coming back; closing.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import random
import threading
from collections import Counter
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar
from urllib.parse import urlsplit, urlunsplit

import psycopg
import pytest

import dibs
import dibs.aio
from dibs import (
    ClaimState,
    FakeClock,
    HoldLost,
    InvalidInput,
    SchemaError,
    StoreClosed,
    StoreMisconfigured,
    StoreUnavailable,
    Unit,
)
from dibs.stores.postgres._aio import AsyncPostgresStore
from dibs.verify.harness import PostgresServer, free_ports
from eventually import aeventually

_T = TypeVar("_T")

HOUR = "pool_timeout=3600"


def run(coroutine: Awaitable[_T]) -> _T:
    async def main() -> _T:
        return await coroutine

    return asyncio.run(main())


def _with(url: str, **parts: str) -> str:
    split = urlsplit(url)
    user = split.username or ""
    password = parts.get("password", split.password or "")
    host = split.hostname or "127.0.0.1"
    port = parts.get("port", str(split.port or 5432))
    netloc = f"{user}:{password}@{host}:{port}"
    return urlunsplit(split._replace(netloc=netloc, path=parts.get("path", split.path)))


def _sep(url: str) -> str:
    return "&" if "?" in url else "?"


def _in_transaction(admin_url: str, database: str) -> list[tuple[Any, ...]]:
    """Sessions of ``database`` left in a transaction or in a statement, seen by the server."""
    with psycopg.connect(admin_url, autocommit=True) as conn:
        return conn.execute(
            "SELECT pid, state, query FROM pg_stat_activity WHERE datname = %s "
            "AND pid <> pg_backend_pid() AND backend_type = 'client backend' "
            "AND state <> 'idle'",
            (database,),
        ).fetchall()


def _database(url: str) -> str:
    return urlsplit(url).path.lstrip("/")


# --- opening ----------------------------------------------------------------------------------


def test_open_gives_the_native_store_and_does_no_io_until_awaited() -> None:
    # Nothing listens on this port: only an await would find out.
    store = dibs.aio.open(f"postgresql://nobody:x@127.0.0.1:{free_ports(1)[0]}/db?{HOUR}")
    assert type(store) is AsyncPostgresStore
    assert dibs.stores.store_class("postgresql://h/db").async_store == (
        "dibs.stores.postgres._aio:AsyncPostgresStore"
    )
    assert not store.closed


@pytest.mark.parametrize(
    ("query", "field"),
    [
        ("schema=Bad-Name", "schema"),
        ("pool_min=-1", "pool_min"),
        ("pool_max=0", "pool_max"),
        ("pool_min=5&pool_max=2", "pool_min"),
        ("pool_timeout=nan", "pool_timeout"),
        ("pool_timeout=soon", "pool_timeout"),
        ("max_retries=-1", "max_retries"),
        ("request_retention=-5", "request_retention"),
    ],
)
def test_bad_url_options_are_invalid_input_at_once_as_on_the_sync_store(
    pg_url: str, query: str, field: str
) -> None:
    url = f"{pg_url}{_sep(pg_url)}{query}"
    with pytest.raises(InvalidInput) as sync_error:
        dibs.open(url)
    with pytest.raises(InvalidInput) as async_error:
        dibs.aio.open(url)  # no await: refused without I/O
    assert async_error.value.field == sync_error.value.field == field
    assert str(async_error.value) == str(sync_error.value)


def test_a_wrong_password_is_misconfigured_with_libpq_words(pg_url: str) -> None:
    secret = "not-the-password-5d2a"
    url = _with(pg_url, password=secret)
    store = dibs.aio.open(f"{url}{_sep(url)}{HOUR}")
    with pytest.raises(StoreMisconfigured) as raised:
        run(store.open())
    assert "password authentication failed" in raised.value.cause
    assert secret not in str(raised.value)
    assert isinstance(raised.value.__cause__, psycopg.OperationalError)


def test_a_missing_database_is_misconfigured_and_a_closed_port_unavailable(pg_url: str) -> None:
    missing = _with(pg_url, path="/no_such_database_4b1")
    with pytest.raises(StoreMisconfigured, match='"no_such_database_4b1" does not exist'):
        run(dibs.aio.open(f"{missing}{_sep(missing)}{HOUR}").open())
    closed = _with(pg_url, port=str(free_ports(1)[0]))
    with pytest.raises(StoreUnavailable) as raised:
        run(dibs.aio.open(f"{closed}{_sep(closed)}{HOUR}").claim(Unit("a", "1"), holder="h"))
    assert "refused" in raised.value.cause.lower()  # type: ignore[attr-defined]


def test_a_newer_schema_is_refused_and_the_schema_is_the_sync_stores(pg_schema_url: str) -> None:
    async def main() -> None:
        async with dibs.aio.open(pg_schema_url) as store:
            claim = (await store.claim(Unit("seat", "1"), holder="alice")).claim
            assert claim is not None
        with dibs.open(pg_schema_url) as sync:  # the async open made the sync store's schema
            assert sync.get(claim.id) == claim
        schema = pg_schema_url.rsplit("schema=", 1)[1]
        with psycopg.connect(pg_schema_url.split("?", maxsplit=1)[0], autocommit=True) as conn:
            conn.execute(f"UPDATE {schema}.meta SET value = '99' WHERE key = 'schema_version'")
        with pytest.raises(SchemaError):
            await dibs.aio.open(pg_schema_url).open()

    run(main())


# --- the contract's results, natively ---------------------------------------------------------


def test_each_operation_answers_as_the_sync_store_does(pg_schema_url: str) -> None:
    clock = FakeClock()

    async def main() -> None:
        with dibs.open(pg_schema_url, clock=clock) as sync:
            async with dibs.aio.open(pg_schema_url, clock=clock) as store:
                a = await store.claim(Unit("s", "1"), holder="alice", ttl=60, request_id="r1")
                assert a.claim is not None and a.claim.state is ClaimState.HELD
                assert sync.get(a.claim.id) == a.claim
                again = await store.claim(Unit("s", "1"), holder="alice", ttl=60, request_id="r1")
                assert again.replayed and again.claim == a.claim
                assert sync.claim(Unit("s", "1"), holder="alice", ttl=60, request_id="r1") == again
                group = await store.claim([Unit("s", "2"), Unit("s", "3")], holder="bob", ttl=60)
                assert group.claim is not None
                taken = await store.claim([Unit("s", "3"), Unit("s", "4")], holder="carol")
                assert not taken.granted and taken.taken == (Unit("s", "3"),)
                confirmed = await store.confirm(a.claim.id, holder="alice", fence=a.claim.fence)
                assert confirmed == sync.get(a.claim.id)
                assert await store.holder_of(Unit("s", "2")) == "bob"
                assert await store.claims_of("bob") == sync.claims_of("bob")
                clock.advance(61)
                with pytest.raises(HoldLost) as lost:
                    await store.extend(
                        group.claim.id, holder="bob", fence=group.claim.fence, ttl=10
                    )
                assert lost.value.reason.value == "expired"
                assert await store.release(a.claim.id, holder="alice", fence=a.claim.fence)
                assert (await store.sweep()).expired == 1
                assert (await store.now()).timestamp() == clock.now()

    run(main())


def test_a_takeover_is_logged_at_debug(
    pg_schema_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    clock = FakeClock()

    async def main() -> None:
        async with dibs.aio.open(pg_schema_url, clock=clock) as store:
            first = (await store.claim(Unit("s", "1"), holder="alice", ttl=5)).claim
            assert first is not None
            clock.advance(6)
            with caplog.at_level(logging.DEBUG, logger="dibs.stores.postgres"):
                assert await store.claim(Unit("s", "1"), holder="bob", ttl=5)
        assert f"hold {first.id} expired and was taken over" in caplog.messages

    run(main())


# --- races --------------------------------------------------------------------------------------

TASKS = 64
ROUNDS = 25
SEATS = 4


def test_tasks_and_threads_racing_for_seats_never_double_grant(pg_schema_url: str) -> None:
    """64 tasks on one loop and 4 threads of the sync store race for 4 seats, round after round.

    Each claimant asks for one seat, two adjacent seats (a group: the claim
    function) or a seat with a request ID; some release at once so that later
    claims reuse the row. Whoever wins, at any moment no seat has two live
    holders, and every seat's winners are told apart by fences.
    """
    grants: list[tuple[int, str, str, int]] = []  # (round, seat, holder, fence)
    lock = threading.Lock()

    def record(rnd: int, result: dibs.ClaimResult, holder: str) -> None:
        if result.claim is not None:
            with lock:
                for t in result.claim.targets:
                    assert isinstance(t, Unit)
                    grants.append((rnd, t.slot, holder, result.claim.fence))

    def wants(rng: random.Random) -> list[Unit]:
        seat = rng.randrange(SEATS)
        if rng.random() < 0.3 and seat + 1 < SEATS:
            return [Unit("race", str(seat + 1)), Unit("race", str(seat))]
        return [Unit("race", str(seat))]

    async def main() -> None:
        async with dibs.aio.open(f"{pg_schema_url}&pool_max=8") as store:
            sync = dibs.open(f"{pg_schema_url}&pool_max=4")
            try:
                for rnd in range(ROUNDS):

                    async def task(n: int, rnd: int = rnd) -> None:
                        rng = random.Random(rnd * 1000 + n)
                        holder = f"task-{n}"
                        rid = f"{rnd}-{n}" if rng.random() < 0.3 else None
                        result = await store.claim(wants(rng), holder=holder, request_id=rid)
                        record(rnd, result, holder)

                    def thread(n: int, rnd: int = rnd) -> None:
                        rng = random.Random(-rnd * 1000 - n)
                        holder = f"thread-{n}"
                        result = sync.claim(wants(rng), holder=holder)
                        record(rnd, result, holder)

                    threads = [threading.Thread(target=thread, args=(n,)) for n in range(4)]
                    for t in threads:
                        t.start()
                    await asyncio.gather(*(task(n) for n in range(TASKS)))
                    for t in threads:
                        await asyncio.to_thread(t.join)
                    # Every winner of this round holds its seats now: one per seat.
                    winners = Counter(seat for r, seat, _, _ in grants if r == rnd)
                    assert all(count == 1 for count in winners.values()), winners
                    for seat in range(SEATS):
                        holder = await store.holder_of(Unit("race", str(seat)))
                        expected = [h for r, s, h, _ in grants if r == rnd and s == str(seat)]
                        assert [holder] == expected or (holder is None and not expected)
                    # Free the seats for the next round: release every winner's claim.
                    for who in {h for r, _, h, _ in grants if r == rnd}:
                        for claim in await store.claims_of(who):
                            await store.release(claim.id, holder=who, fence=claim.fence)
            finally:
                sync.close()

    run(main())
    fences = [f for _, _, _, f in grants]
    assert len(fences) == len(grants)
    by_seat: dict[str, list[int]] = {}
    for _, seat, _, fence in grants:
        by_seat.setdefault(seat, []).append(fence)
    for seat_fences in by_seat.values():  # each seat's winners, in order, with rising fences
        assert len(set(seat_fences)) == len(seat_fences)


# --- cancellation -------------------------------------------------------------------------------

CANCEL_ROUNDS = 240
STEPS = [0, 1, 2, 3, 5, 8]
# Real time, the point: cancellations land at spread moments of a claim in flight.
SLEEPS = [0.0, 5e-5, 2e-4, 5e-4, 1e-3, 2e-3, 4e-3]


def test_a_cancelled_claim_leaves_no_claim_or_one_its_retry_learns(
    pg_url: str, pg_admin_url: str, pg_schema_url: str
) -> None:
    """Cancel ``await store.claim`` after a random number of loop steps or a random sleep.

    The retry with the same request ID must find either nothing (and claim)
    or the very claim the cancelled call made (and replay it); the holder
    then has one claim. Other tasks keep the pool busy in half the rounds, so
    some cancels land while the call waits for a connection. At the end no
    session of the database is in a transaction or a statement, and the pool
    never got a connection back mid-statement.
    """
    tally: Counter[str] = Counter()

    async def main() -> None:
        store = dibs.aio.open(f"{pg_schema_url}&pool_max=2")
        assert isinstance(store, AsyncPostgresStore)
        await store.open()
        rng = random.Random(18)

        async def busy(n: int) -> None:
            for i in range(6):
                await store.claim(Unit("busy", f"{n}-{i}"), holder="busy")

        for rnd in range(CANCEL_ROUNDS):
            unit, holder, rid = Unit("cancel", str(rnd)), f"h{rnd}", f"r{rnd}"
            noise = [asyncio.ensure_future(busy(rnd * 10 + k)) for k in range(3)] if rnd % 2 else []
            call = asyncio.ensure_future(store.claim(unit, holder=holder, request_id=rid, ttl=60))
            if rng.random() < 0.5:
                for _ in range(rng.choice(STEPS)):
                    await asyncio.sleep(0)
            else:
                await asyncio.sleep(rng.choice(SLEEPS))
            call.cancel()
            try:
                await call
                tally["finished"] += 1
            except asyncio.CancelledError:
                tally["cancelled"] += 1
            retry = await store.claim(unit, holder=holder, request_id=rid, ttl=60)
            assert retry.granted and retry.claim is not None
            tally["replayed" if retry.replayed else "claimed by the retry"] += 1
            assert [c.id for c in await store.claims_of(holder)] == [retry.claim.id]
            await asyncio.gather(*noise)
        pool = store._own_pool
        assert pool is not None
        await asyncio.wait(store._inflight or {asyncio.ensure_future(asyncio.sleep(0))})
        assert _in_transaction(pg_admin_url, _database(pg_url)) == []
        stats = pool.get_stats()
        assert stats.get("returns_bad", 0) == 0, stats
        assert stats.get("connections_lost", 0) == 0, stats
        await store.close()

    run(main())
    # Both outcomes were met (the counts are not asserted: timing decides them).
    print(dict(tally))


def test_a_claim_cancelled_while_waiting_for_a_connection_is_never_sent(
    pg_schema_url: str,
) -> None:
    async def main() -> None:
        store = dibs.aio.open(f"{pg_schema_url}&pool_min=1&pool_max=1")
        assert isinstance(store, AsyncPostgresStore)
        await store.open()
        pool = store._own_pool
        assert pool is not None
        taken = await pool.getconn()  # the pool's only connection: the claim must wait
        call = asyncio.ensure_future(store.claim(Unit("seat", "1"), holder="alice", ttl=60))
        for _ in range(5):
            await asyncio.sleep(0)
        assert not call.done()
        call.cancel()
        with pytest.raises(asyncio.CancelledError):
            await call
        await pool.putconn(taken)
        await asyncio.wait(store._inflight or {asyncio.ensure_future(asyncio.sleep(0))})
        assert await store.holder_of(Unit("seat", "1")) is None
        await store.close()

    run(main())


def test_close_waits_for_a_cancelled_calls_statement(pg_schema_url: str) -> None:
    async def main() -> None:
        store = dibs.aio.open(pg_schema_url)
        await store.open()
        calls = [
            asyncio.ensure_future(store.claim(Unit("seat", str(n)), holder="a", request_id=str(n)))
            for n in range(20)
        ]
        await asyncio.sleep(0)
        await asyncio.sleep(0)
        for call in calls:
            call.cancel()
        await asyncio.gather(*calls, return_exceptions=True)
        await store.close()
        # close() returned after the statements it waited for: none is still running.
        assert [t for t in asyncio.all_tasks() if t is not asyncio.current_task()] == []
        assert not store._inflight  # and each left the in-flight set as it ended
        with pytest.raises(StoreClosed):
            await store.claim(Unit("seat", "1"), holder="a")
        await store.close()  # a second close does nothing
        with dibs.open(pg_schema_url) as sync:  # whatever was sent finished: replays agree
            for n in range(20):
                result = sync.claim(Unit("seat", str(n)), holder="a", request_id=str(n))
                assert result.granted

    run(main())


# --- the server going away ----------------------------------------------------------------------


def _terminate(admin_url: str, database: str) -> int:
    with psycopg.connect(admin_url, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT pg_terminate_backend(pid, 5000) FROM pg_stat_activity WHERE datname = %s "
            "AND pid <> pg_backend_pid() AND backend_type = 'client backend'",
            (database,),
        ).fetchall()
    return len(rows)


async def _until_it_answers(call: Callable[[], Awaitable[_T]]) -> _T:
    answers: list[_T] = []

    async def answered() -> bool:  # the pool reconnects in the background
        try:
            answers.append(await call())
        except StoreUnavailable:
            return False
        return True

    await aeventually(answered, "the pool reconnects")
    return answers[0]


def test_terminated_sessions_are_store_unavailable_then_it_recovers(
    pg_url: str, pg_admin_url: str, pg_schema_url: str
) -> None:
    async def main() -> None:
        async with dibs.aio.open(f"{pg_schema_url}&pool_min=4&pool_max=4") as store:
            first = await store.claim(Unit("seat", "1"), holder="alice", request_id="r1")
            assert first.claim is not None
            seen: Counter[str] = Counter()
            for rnd in range(3):
                assert _terminate(pg_admin_url, _database(pg_url)) >= 1
                results = await asyncio.gather(
                    *(
                        store.claim(
                            Unit("seat", f"{rnd}-{n}"), holder="bob", request_id=f"{rnd}-{n}"
                        )
                        for n in range(8)
                    ),
                    return_exceptions=True,
                )
                for result in results:
                    if isinstance(result, BaseException):
                        assert isinstance(result, StoreUnavailable), repr(result)
                        assert isinstance(result, ConnectionError)
                        seen["unavailable"] += 1
                    else:
                        seen["answered"] += 1
                for n in range(8):  # every claim, answered or not, is learned by its retry
                    unit, rid = Unit("seat", f"{rnd}-{n}"), f"{rnd}-{n}"
                    again = await _until_it_answers(
                        lambda u=unit, r=rid: store.claim(u, holder="bob", request_id=r)
                    )
                    assert again.granted
            assert seen["unavailable"] >= 1  # the terminations were felt
            replay = await store.claim(Unit("seat", "1"), holder="alice", request_id="r1")
            assert replay.replayed and replay.claim == first.claim

    run(main())


def test_a_stopped_server_is_store_unavailable_until_it_returns(
    private_pg_server: PostgresServer,
) -> None:
    url = private_pg_server.create_database("aiobounce")

    async def main() -> None:
        async with dibs.aio.open(f"{url}?pool_timeout=0.5") as store:
            claim = (await store.claim(Unit("seat", "1"), holder="alice", request_id="r1")).claim
            assert claim is not None
            await asyncio.to_thread(private_pg_server.stop)
            for call in (
                lambda: store.claim(Unit("seat", "2"), holder="bob"),
                lambda: store.get(claim.id),
                lambda: store.confirm(claim.id, holder="alice", fence=claim.fence),
                store.sweep,
            ):
                with pytest.raises(StoreUnavailable):
                    await call()
            await asyncio.to_thread(private_pg_server.start)
            again = await _until_it_answers(
                lambda: store.claim(Unit("seat", "1"), holder="alice", request_id="r1")
            )
            assert again.replayed and again.claim == claim

    run(main())


def test_bad_input_postgres_cannot_store_is_invalid_input(pg_schema_url: str) -> None:
    async def main() -> None:
        async with dibs.aio.open(pg_schema_url) as store:
            with pytest.raises(InvalidInput):
                await store.claim(Unit("seat", "a\x00b"), holder="alice")
            with pytest.raises(InvalidInput):
                await store.claim(Unit("seat", "1"), holder="al\ud800ice")
            assert await store.claim(Unit("seat", "1"), holder="alice")  # the pool is fine

    run(main())


def test_a_forked_child_opens_a_pool_of_its_own_and_leaves_the_parents(
    pg_schema_url: str,
) -> None:
    loop = asyncio.new_event_loop()
    store = dibs.aio.open(pg_schema_url)
    try:
        first = loop.run_until_complete(store.claim(Unit("fork", "parent"), holder="p"))
        assert first.granted
        pid = os.fork()
        if pid == 0:  # the child: a loop of its own, the same store object
            code = 1
            try:

                async def child() -> bool:
                    result = await store.claim(Unit("fork", "child"), holder="c")
                    await store.close()
                    return result.granted

                code = 0 if asyncio.run(child()) else 2
            finally:
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        # The parent's sessions were neither used nor closed by the child.
        assert loop.run_until_complete(store.holder_of(Unit("fork", "child"))) == "c"
        assert loop.run_until_complete(store.holder_of(Unit("fork", "parent"))) == "p"
    finally:
        loop.run_until_complete(store.close())
        loop.close()


class _FlakyConnection:
    """A pooled connection whose next ``failures`` statements raise ``error`` unsent."""

    def __init__(self, conn: Any, owner: _FlakyPool) -> None:
        self._conn = conn
        self._owner = owner
        self._cursor = conn.cursor()

    def cursor(self) -> _FlakyConnection:
        return self

    async def execute(self, query: bytes, params: Any) -> Any:
        self._owner.calls += 1
        if self._owner.failures > 0:
            self._owner.failures -= 1
            raise self._owner.error
        return await self._cursor.execute(query, params)

    async def fetchone(self) -> Any:
        return await self._cursor.fetchone()

    async def fetchall(self) -> Any:
        return await self._cursor.fetchall()


class _FlakyPool:
    def __init__(self, pool: Any, error: Exception, failures: int) -> None:
        self.pool = pool
        self.error = error
        self.failures = failures
        self.calls = 0
        self.last_error = None

    async def getconn(self) -> Any:
        return _FlakyConnection(await self.pool.getconn(), self)

    async def putconn(self, conn: _FlakyConnection) -> None:
        await self.pool.putconn(conn._conn)

    async def close(self) -> None:
        await self.pool.close()


@pytest.mark.parametrize(
    "error", [psycopg.errors.SerializationFailure(), psycopg.errors.DeadlockDetected()]
)
def test_serialization_failures_and_deadlocks_are_retried(
    pg_schema_url: str, error: Exception, caplog: pytest.LogCaptureFixture
) -> None:
    async def main() -> None:
        store = dibs.aio.open(pg_schema_url, max_retries=3)
        assert isinstance(store, AsyncPostgresStore)
        await store.open()
        flaky = _FlakyPool(store._own_pool, error, failures=3)
        store._own_pool = flaky  # type: ignore[assignment]
        assert await store.claim(Unit("seat", "1"), holder="alice")
        assert flaky.calls == 4
        flaky.failures = 4
        with pytest.raises(StoreUnavailable) as raised:
            await store.claim(Unit("seat", "2"), holder="alice")
        assert isinstance(raised.value.__cause__, type(error))
        assert await store.holder_of(Unit("seat", "2")) is None
        await store.close()

    with caplog.at_level(logging.DEBUG, logger="dibs.stores.postgres"):
        run(main())
    assert sum("transient error, retry" in m for m in caplog.messages) == 3 + 3


def test_an_outage_logs_one_warning_and_its_end(
    pg_url: str, pg_admin_url: str, pg_schema_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    async def main() -> None:
        async with dibs.aio.open(f"{pg_schema_url}&pool_min=2&pool_max=2") as store:
            assert await store.claim(Unit("seat", "0"), holder="a")
            _terminate(pg_admin_url, _database(pg_url))
            # Both pooled sessions are gone: the next call meets one of them. The call
            # after it may meet the other, or a session the pool has opened meanwhile in
            # the background (a race the pool decides): one outage either way.
            with pytest.raises(StoreUnavailable):
                await store.claim(Unit("seat", "1"), holder="a")
            with contextlib.suppress(StoreUnavailable):
                await store.claim(Unit("seat", "2"), holder="a")
            await _until_it_answers(lambda: store.claim(Unit("seat", "9"), holder="a"))

    with caplog.at_level(logging.INFO, logger="dibs.stores.postgres"):
        run(main())
    ours = [r for r in caplog.records if r.name == "dibs.stores.postgres"]
    assert [r.levelname for r in ours if r.levelno >= logging.WARNING] == ["WARNING"]
    assert any("answers again" in r.getMessage() for r in ours)
