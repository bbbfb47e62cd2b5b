"""What a hold+confirm pair costs on PostgreSQL, counted: statements, transactions, plans.

Issue 27 measured the pair against Redis (``benchmarks/cost_pg_pairs.py``):
a pair is two statements, each its own autocommit transaction (one round
trip, one commit and its WAL flush: a confirmed claim is durable when the call
returns), and a confirm, extend or release finds its row by the claim's ID.
These pin those counts, on both faces:

* statements sent per hold, confirm, extend and release of a single unit (the
  driver's cursor ``execute`` calls; in autocommit psycopg sends no BEGIN or
  COMMIT of its own);
* transaction IDs the server assigns per pair: exactly one per call that
  writes (no extra transaction, no subtransaction);
* the plan of the confirm, extend and release statements, on a table the
  planner has no statistics for and one holder with many claims: it never
  reads the holder index (which made a confirm read every claim of its
  holder: 170 index entries read per pair in ``cost_pg_pairs.py``, 1 now).

A planted bug fails them (checked by hand): a confirm that also asks
``transition_v4`` adds a statement per confirm; a hold that writes its row
in a second statement adds a statement and a transaction per pair; dropping
``COLLATE "C"`` from the confirm's holder test brings back the holder index.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

import dibs
import dibs.aio
from dibs import Unit
from dibs.stores.postgres._sql import Statements
from pg_fixtures import drop_schema, schema_url

PAIRS = 20


@pytest.fixture
def url(pg_url: str) -> Iterator[str]:
    url = schema_url(pg_url)
    yield url
    drop_schema(pg_url, url.rsplit("schema=", 1)[1])


@pytest.fixture
def sent(monkeypatch: pytest.MonkeyPatch) -> list[bytes]:
    """Every statement a psycopg cursor (sync or async) executes in this test's thread.

    Only this thread's: a pool's worker thread, or a store some earlier test of
    the process left running, must not count (the async face runs its loop here).
    """
    log: list[bytes] = []
    execute, aexecute = psycopg.Cursor.execute, psycopg.AsyncCursor.execute
    mine = threading.get_ident()

    def note(query: Any) -> None:
        if threading.get_ident() == mine:
            log.append(query if isinstance(query, bytes) else str(query).encode())

    def counting(self: Any, query: Any, *args: Any, **kwargs: Any) -> Any:
        note(query)
        return execute(self, query, *args, **kwargs)

    async def acounting(self: Any, query: Any, *args: Any, **kwargs: Any) -> Any:
        note(query)
        return await aexecute(self, query, *args, **kwargs)

    monkeypatch.setattr(psycopg.Cursor, "execute", counting)
    monkeypatch.setattr(psycopg.AsyncCursor, "execute", acounting)
    return log


def _pairs_sync(store: dibs.Store, tag: str, sent: list[bytes]) -> list[int]:
    """Statements per call: hold, confirm, then a second hold's extend and release."""
    counts = []
    for i in range(PAIRS):
        for step in range(4):
            before = len(sent)
            if step == 0:
                hold = store.claim(Unit(f"seat-{tag}", str(i)), holder="h", ttl=300).claim
                assert hold is not None
            elif step == 1:
                store.confirm(hold.id, holder="h", fence=hold.fence)
            elif step == 2:
                other = store.claim(Unit(f"row-{tag}", str(i)), holder="h", ttl=300).claim
                assert other is not None
                store.extend(other.id, holder="h", fence=other.fence, ttl=300)
            else:
                assert store.release(other.id, holder="h", fence=other.fence)
            counts.append(len(sent) - before)
    return counts


async def _pairs_async(store: dibs.aio.AsyncStore, tag: str, sent: list[bytes]) -> list[int]:
    counts = []
    for i in range(PAIRS):
        for step in range(4):
            before = len(sent)
            if step == 0:
                hold = (await store.claim(Unit(f"seat-{tag}", str(i)), holder="h", ttl=300)).claim
                assert hold is not None
            elif step == 1:
                await store.confirm(hold.id, holder="h", fence=hold.fence)
            elif step == 2:
                other = (await store.claim(Unit(f"row-{tag}", str(i)), holder="h", ttl=300)).claim
                assert other is not None
                await store.extend(other.id, holder="h", fence=other.fence, ttl=300)
            else:
                assert await store.release(other.id, holder="h", fence=other.fence)
            counts.append(len(sent) - before)
    return counts


@pytest.mark.parametrize("face", ["sync", "async"])
def test_each_call_of_a_pair_is_one_statement(url: str, sent: list[bytes], face: str) -> None:
    if face == "sync":
        with dibs.open(url, pool_min=1, pool_max=1) as store:
            _pairs_sync(store, "warm", sent)  # psycopg prepares from the fifth execution
            counts = _pairs_sync(store, "seen", sent)
    else:

        async def main() -> list[int]:
            async with dibs.aio.open(url, pool_min=1, pool_max=1) as store:
                await _pairs_async(store, "warm", sent)
                return await _pairs_async(store, "seen", sent)

        counts = asyncio.run(main())
    # hold: 1; confirm: 1; hold + extend: 2; release: 1
    assert counts == [1, 1, 2, 1] * PAIRS, counts


def _xid(conn: psycopg.Connection[Any]) -> int:
    row = conn.execute("SELECT pg_snapshot_xmax(pg_current_snapshot())::text::bigint").fetchone()
    assert row is not None
    return int(row[0])


@pytest.mark.parametrize("face", ["sync", "async"])
def test_a_pair_is_two_transactions(url: str, pg_url: str, face: str) -> None:
    """Two transaction IDs per hold+confirm: one commit, one WAL flush, per call.

    Other sessions on the server may take transaction IDs meanwhile; the
    quietest of several windows counts, and a pair that took more would take
    more in every window.
    """
    windows: list[int] = []
    with psycopg.connect(pg_url, autocommit=True) as conn:
        if face == "sync":
            with dibs.open(url, pool_min=1, pool_max=1) as store:
                for w in range(5):
                    before = _xid(conn)
                    for i in range(PAIRS):
                        hold = store.claim(Unit(f"s{w}", str(i)), holder="h", ttl=300).claim
                        assert hold is not None
                        store.confirm(hold.id, holder="h", fence=hold.fence)
                    windows.append(_xid(conn) - before)
        else:

            async def main() -> None:
                async with dibs.aio.open(url, pool_min=1, pool_max=1) as store:
                    for w in range(5):
                        before = _xid(conn)
                        for i in range(PAIRS):
                            got = await store.claim(Unit(f"s{w}", str(i)), holder="h", ttl=300)
                            assert got.claim is not None
                            await store.confirm(got.claim.id, holder="h", fence=got.claim.fence)
                        windows.append(_xid(conn) - before)

            asyncio.run(main())
    assert min(windows) == 2 * PAIRS, windows


def test_confirm_extend_release_find_the_row_by_claim_id(url: str) -> None:
    """Not through the holder index, even where the planner knows nothing of the table."""
    schema = url.rsplit("schema=", 1)[1]
    with dibs.open(url, pool_min=1, pool_max=1) as store:
        holds = [
            store.claim(Unit("seat", str(i)), holder="busy", ttl=300).claim for i in range(300)
        ]
    claim = holds[150]
    assert claim is not None
    sql = Statements(schema, test_clock=False)
    params = {"id": int(claim.id), "h": "busy", "f": claim.fence, "ttl": 60.0, "now": None}
    with psycopg.connect(url.rsplit("?", 1)[0]) as conn:
        for name, text in (("confirm", sql.confirm), ("extend", sql.extend),
                           ("release", sql.release)):  # fmt: skip
            plan = "\n".join(
                row[0]
                for row in conn.execute(b"EXPLAIN (ANALYZE, COSTS OFF) " + text, params).fetchall()
            )
            conn.rollback()  # EXPLAIN ANALYZE ran the update: undo it
            assert "units_v4_by_holder" not in plan, (name, plan)
            assert "units_v4_by_id" in plan, (name, plan)
