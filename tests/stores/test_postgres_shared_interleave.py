"""A reader joins a unit inside a writer's read-to-update window: the writer is refused.

On PostgreSQL a unit held by readers has a marker row ('member', id 0, fence
0) whose expiry is the latest of its readers'. A writer finds a dead or freed
marker by a plain read and takes it by a conditional write on the row it saw
(``take_unit_v4``; for one unit, ``claim_reuse`` first); since the marker's ID
and fence never change, only the write's liveness condition, re-checked under
the row lock, stops a writer from taking a marker a reader joined after the
read. The six-process race (test_shared_processes_postgres.py) did not catch
that condition's loss: the window is rare.

Here it is forced, as test_postgres_stamp_order.py forces its orders. The
reader's join runs by hand (the store's own claim statement) on a connection of
its own and stays uncommitted, holding the marker's row lock, the marker made
live in its transaction. The writer, started through the store (either face),
reads the committed marker, still dead or free, and is seen waiting for the row
lock in pg_stat_activity; only then does the reader commit, so its join lands
between the writer's read and its write. The writer must then be refused, the
reader keep its hold. No assertion depends on timing.

A planted bug fails its cases' first round: the conditional UPDATE of
``take_unit_v4`` without the marker's expiry re-check (``OR u.state =
'member'`` in place of ``u.state IN ('held', 'member') AND u.expires_at <=
p_now``) fails the four group cases (a group member's write is that UPDATE
alone); the same in the row lock before it too fails the dead one-unit cases
as well. A one-unit writer on a freed marker waits in ``claim_reuse`` instead,
whose re-check under the lock finds a 'member' row no longer free. (Each
checked by hand when this test was written.)
"""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import pytest
from psycopg import sql

import dibs
import dibs.aio
from dibs import ClaimResult, ClaimState, Unit
from eventually import eventually
from pg_fixtures import answer_in_thread, drop_schema, lock_waiters, schema_url

pytestmark = pytest.mark.timeout(300)

ROUNDS = 3
TTL = 0.005  # the first reader's hold, which dies; the test waits until the store says so


class _Setup:
    def __init__(self, pg_url: str) -> None:
        self.pg_url = pg_url
        self.app = f"interleave-{secrets.token_hex(4)}"  # marks this test's own sessions
        self.url = schema_url(f"{pg_url}{'&' if '?' in pg_url else '?'}application_name={self.app}")
        self.schema = self.url.rsplit("schema=", 1)[1]
        self.store = dibs.open(self.url, pool_min=1, pool_max=2)
        self.sql: Any = self.store._sql  # type: ignore[attr-defined]

    def connect(self, *, autocommit: bool = False) -> psycopg.Connection[Any]:
        return psycopg.connect(self.pg_url, autocommit=autocommit, application_name=self.app)

    def marker(self, watch: psycopg.Connection[Any], unit: Unit) -> tuple[Any, ...]:
        """The unit's row as committed: (id, state, fence, live)."""
        query = sql.SQL(
            "SELECT id, state, fence, expires_at IS NULL OR expires_at > clock_timestamp() "
            "FROM {s}.units_v4 WHERE resource = %s AND slot = %s"
        ).format(s=sql.Identifier(self.schema))
        row = watch.execute(query, (unit.resource, unit.slot)).fetchone()
        assert row is not None, unit
        return tuple(row)

    def leave_marker(self, unit: Unit, how: str, watch: psycopg.Connection[Any]) -> None:
        """Leave ``unit`` with a dead marker (its reader's hold died) or a freed one."""
        ttl = 60.0 if how == "freed" else TTL
        first = self.store.claim(unit, holder="first", ttl=ttl, mode="shared").claim
        assert first is not None
        if how == "freed":  # its last reader left: the row is 'free'
            assert self.store.release(first.id, holder="first", fence=first.fence)
            assert self.marker(watch, unit)[1] == "free"
            return

        def dead() -> bool:  # as the store itself judges it (no timed assertion)
            seen = self.store.get(first.id)
            assert seen is not None
            return seen.state is ClaimState.EXPIRED

        eventually(dead, "the first reader's hold expired on the database clock")
        assert self.marker(watch, unit)[:3] == (0, "member", 0)
        assert not self.marker(watch, unit)[3]

    def join(self, conn: psycopg.Connection[Any], unit: Unit) -> int:
        """A reader's claim of ``unit`` on ``conn`` (left uncommitted); its ID."""
        params = {
            "holder": "reader",
            "targets": dibs._model.targets_to_text((unit,)),
            "ttl": 60.0,
            "rid": None,
            "fp": None,
            "now": None,
            "retention": self.store.request_retention,
            "ures": [unit.resource],
            "uslot": [unit.slot],
            "sres": None,
            "skind": None,
            "slo": None,
            "shi": None,
            "mode": "shared",
            "undo": False,  # the store's first try
        }
        row = conn.execute(self.sql.claim, params).fetchone()
        assert row is not None and row[0] == "granted", row
        return int(row[2])

    def waiting(self, watch: psycopg.Connection[Any]) -> int:
        """How many of this test's sessions wait for a lock."""
        return lock_waiters(watch, self.app)

    def close(self) -> None:
        self.store.close()
        drop_schema(self.pg_url, self.schema)


@pytest.fixture
def setup(pg_url: str) -> Iterator[_Setup]:
    s = _Setup(pg_url)
    try:
        yield s
    finally:
        s.close()


def _writer(setup: _Setup, face: str, targets: list[Unit]) -> Callable[[], Any]:
    if face == "sync":
        return lambda: setup.store.claim(targets, holder="writer", ttl=60)

    async def claim() -> ClaimResult:
        async with dibs.aio.open(setup.url, pool_min=1, pool_max=1) as store:
            return await store.claim(targets, holder="writer", ttl=60)

    return lambda: asyncio.run(claim())


@pytest.mark.parametrize("face", ["sync", "async"])
@pytest.mark.parametrize("size", ["one", "group"])
@pytest.mark.parametrize("how", ["dead", "freed"])
def test_a_reader_joining_inside_a_writers_read_to_update_window_refuses_the_writer(
    setup: _Setup, face: str, size: str, how: str
) -> None:
    store = setup.store
    with setup.connect() as reader, setup.connect(autocommit=True) as watch:
        for r in range(ROUNDS):
            joined = Unit(f"doc-{face}-{size}-{how}", f"{r}b")
            setup.leave_marker(joined, how, watch)
            before = setup.marker(watch, joined)
            # A group's first unit was never claimed: the writer takes it, then
            # meets the marker, and must give it back.
            targets = [Unit(joined.resource, f"{r}a"), joined] if size == "group" else [joined]
            # The reader joins and holds the marker's row lock, uncommitted.
            reader_id = setup.join(reader, joined)
            assert setup.marker(watch, joined) == before  # the join is not committed yet
            writer, out = answer_in_thread(_writer(setup, face, targets))
            # The writer has read the committed marker (dead or free) and waits
            # for the row lock to write it: only now does the join land.
            eventually(
                lambda w=writer: setup.waiting(watch) >= 1 or not w.is_alive(),
                "the writer waits for the marker's row lock",
            )
            assert writer.is_alive(), out  # it read a marker it could take, so it waits
            reader.commit()
            writer.join()
            (got,) = out
            assert isinstance(got, ClaimResult), got
            assert not got and got.claim is None, (r, got)  # never a writer beside a reader
            assert got.taken == (joined,), got
            assert setup.marker(watch, joined) == (0, "member", 0, True)
            held = store.get(str(reader_id))
            assert held is not None and held.state is ClaimState.HELD, held
            assert not held.taken_over
            if size == "group":  # all or nothing: the unit it took first is free again
                assert store.holder_of(targets[0]) is None
            assert store.release(held.id, holder="reader", fence=held.fence)
