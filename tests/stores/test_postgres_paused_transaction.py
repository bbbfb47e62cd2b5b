"""A process paused inside one of dibs's own PostgreSQL transactions lets go of its locks.

A worker stopped between two statements of a transaction (``SIGSTOP``, a frozen
VM) keeps its connection, so without a limit the server keeps its transaction
and row locks for the whole pause, and everything that needs those rows waits
as long: a loaded CI run once stalled a fleet of durable workers behind one
stopped in a schedule's evaluation. Every connection a store makes carries
``idle_in_transaction_session_timeout`` (``dibs.stores.postgres._connect.
IDLE_IN_TRANSACTION``), so the server ends such a transaction and the waiters go
on. The tests hold a store's own pooled connection idle inside a transaction
that locks a claim's row, and release the claim from another connection: it
must get through, on both faces. Waits are hang guards, not timing claims.
"""

from __future__ import annotations

import asyncio
import threading
from urllib.parse import quote

import psycopg
import pytest

import dibs
import dibs.aio
from dibs import Unit
from dibs.stores.postgres import _connect

pytestmark = pytest.mark.timeout(180)

GUARD = 120.0
UNIT = Unit("paused-seat", "show-1")


@pytest.fixture
def short_limit(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_connect, "IDLE_IN_TRANSACTION", 0.5)


def _locking(schema: str) -> str:
    # One query string, so the limit cannot end the transaction between its BEGIN
    # and its lock however long this process is descheduled; then it "pauses".
    return f'BEGIN; SELECT 1 FROM "{schema}".units_v4 FOR UPDATE'


@pytest.mark.usefixtures("short_limit")
def test_a_paused_transaction_of_the_store_does_not_block_others(pg_schema_url: str) -> None:
    with dibs.open(pg_schema_url) as store:
        claim = store.claim(UNIT, holder="a").claim
        assert claim is not None
        done = threading.Event()
        released: list[bool] = []

        def release() -> None:
            released.append(store.release(claim.id, holder="a", fence=claim.fence))
            done.set()

        with store._pool.connection() as paused:
            paused.execute(_locking(store.schema))
            thread = threading.Thread(target=release)
            thread.start()
            assert done.wait(GUARD), "the release waited on a paused transaction's lock"
            thread.join()
            with pytest.raises(psycopg.Error):  # IdleInTransactionSessionTimeout
                paused.execute("SELECT 1")  # the server ended the paused session
        assert released == [True]
        assert store.holder_of(UNIT) is None
        assert store.claim(UNIT, holder="b")  # the pool replaced the closed connection


@pytest.mark.usefixtures("short_limit")
def test_a_paused_transaction_of_the_async_store_does_not_block_others(
    pg_schema_url: str,
) -> None:
    async def main() -> None:
        async with dibs.aio.open(pg_schema_url) as store:
            claim = (await store.claim(UNIT, holder="a")).claim
            assert claim is not None
            pool = await store._pool()  # type: ignore[attr-defined]
            async with pool.connection() as paused:
                await paused.execute(_locking(store.schema))  # type: ignore[attr-defined]
                released = await asyncio.wait_for(
                    store.release(claim.id, holder="a", fence=claim.fence), GUARD
                )
                assert released
                with pytest.raises(psycopg.Error):  # IdleInTransactionSessionTimeout
                    await paused.execute("SELECT 1")
            assert await store.holder_of(UNIT) is None
            assert await store.claim(UNIT, holder="b")

    asyncio.run(main())


def _limit_of(url: str) -> str:
    with dibs.open(url) as store, store._pool.connection() as conn:
        row = conn.execute("SHOW idle_in_transaction_session_timeout").fetchone()
        assert row is not None
        return str(row[0])


@pytest.mark.parametrize(
    ("theirs", "ours"), [(None, "10s"), ("0", "10s"), ("3600000", "10s"), ("200", "200ms")]
)
def test_a_lower_limit_already_set_is_kept(
    pg_schema_url: str, theirs: str | None, ours: str
) -> None:
    url = pg_schema_url
    if theirs is not None:
        options = quote(f"-c idle_in_transaction_session_timeout={theirs}")
        url += ("&" if "?" in url else "?") + f"options={options}"
    assert _limit_of(url) == ours
