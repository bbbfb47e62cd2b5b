"""A dead hold's loss and the takeover of its unit, in the order their stamps say.

On PostgreSQL a takeover reads its clock (the new claim's ``created_at``)
inside its transaction, before it commits. A confirm or extend of the dead hold
that begins after that instant must answer ``taken_over`` (the reason rule),
and a takeover that waited for such a confirm must be dated after the confirm
judged the hold dead. ``dibs verify``'s 100,000-operation run under faults
found the first broken: the confirm's fallback (``transition_v4``) judged the
unit row on a plain read, saw the takeover's row before it committed, and
answered ``expired`` from a clock read after the takeover's stamp.

Both tests hold one side's transaction open on a connection of their own
(the store's own statement or function, run by hand), start the other side
through the store, and let the first commit only once the second has either
answered or is seen waiting for the row lock. No assertion depends on timing,
and a planted bug fails the first round: judging the loss without the row
lock (``transition_v4``) fails the first test; dating a takeover from a clock
read before the row lock fails the second (``take_unit_v4``'s, or the plain
``claim_reuse`` statement's without ``FOR UPDATE OF u``). (Each checked by
hand when these tests were written.)

The store runs on the database's clock here, not a FakeClock: with a test
clock every time is read in Python before the statement starts, which is not
the order under test.
"""

from __future__ import annotations

import secrets
import threading
from collections.abc import Iterator
from datetime import datetime
from typing import Any

import psycopg
import pytest

import dibs
from dibs import ClaimState, HoldLost, HoldLostReason, Unit
from eventually import eventually
from pg_fixtures import answer_in_thread, drop_schema, lock_waiters, schema_url

pytestmark = pytest.mark.timeout(300)

ROUNDS = 15
TTL = 0.005  # the hold that dies; the test waits until the store judges it dead


class _Setup:
    def __init__(self, pg_url: str) -> None:
        self.pg_url = pg_url
        self.app = f"stamp-{secrets.token_hex(4)}"  # marks this test's own sessions
        self.url = schema_url(f"{pg_url}{'&' if '?' in pg_url else '?'}application_name={self.app}")
        self.schema = self.url.rsplit("schema=", 1)[1]
        self.store = dibs.open(self.url, pool_min=1, pool_max=2)
        self.sql: Any = self.store._sql  # type: ignore[attr-defined]

    def connect(self, *, autocommit: bool = False) -> psycopg.Connection[Any]:
        return psycopg.connect(self.pg_url, autocommit=autocommit, application_name=self.app)

    def dead_hold(self, unit: Unit) -> dibs.Claim:
        hold = self.store.claim(unit, holder="alice", ttl=TTL).claim
        assert hold is not None

        def dead() -> bool:  # as the store itself judges it (no timed assertion)
            seen = self.store.get(hold.id)
            assert seen is not None
            return seen.state is ClaimState.EXPIRED

        eventually(dead, "the hold expired on the database clock")
        return hold

    def claim_params(self, unit: Unit, holder: str) -> dict[str, Any]:
        """The parameters of the plain claim statements (as PostgresStore._claim_unit sends)."""
        return {
            "r": unit.resource,
            "sl": unit.slot,
            "h": holder,
            "st": "held",
            "ttl": 60.0,
            "rid": None,
            "fp": None,
            "retention": self.store.request_retention,
            "now": None,
        }

    def function_params(self, unit: Unit, holder: str) -> dict[str, Any]:
        """The parameters of claim_v4 for one unit (as PostgresStore._claim sends)."""
        return {
            "holder": holder,
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
            "mode": "exclusive",
            "undo": False,  # the store's first try
        }

    def take_over(self, conn: psycopg.Connection[Any], unit: Unit, how: str) -> datetime:
        """Run a takeover of ``unit`` on ``conn`` (left uncommitted); its created_at."""
        if how == "statement":
            row = conn.execute(self.sql.claim_reuse, self.claim_params(unit, "rival")).fetchone()
            assert row is not None and row[0] == "new", row
            return row[5]  # type: ignore[no-any-return]
        row = conn.execute(self.sql.claim, self.function_params(unit, "rival")).fetchone()
        assert row is not None and row[0] == "granted", row
        return row[10]  # type: ignore[no-any-return]

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


def _settle(threads: list[threading.Thread], setup: _Setup, watch: Any) -> None:
    """Until each of ``threads`` has answered or waits for a lock."""
    eventually(
        lambda: setup.waiting(watch) >= sum(t.is_alive() for t in threads),
        "each thread answered or waits for a lock",
    )


@pytest.mark.parametrize("op", ["confirm", "extend"])
@pytest.mark.parametrize("how", ["statement", "function"])
def test_a_dead_hold_begun_after_a_takeover_was_stamped_answers_taken_over(
    setup: _Setup, op: str, how: str
) -> None:
    store = setup.store
    with setup.connect() as rival, setup.connect(autocommit=True) as watch:
        for r in range(ROUNDS):
            unit = Unit("seat", str(r))
            hold = setup.dead_hold(unit)
            # The takeover reads its clock (created_at) and stays uncommitted.
            taken_at = setup.take_over(rival, unit, how)
            # The holder's call begins only now, after that stamp.
            if op == "confirm":
                thread, out = answer_in_thread(
                    lambda h=hold: store.confirm(h.id, holder="alice", fence=h.fence)
                )
            else:
                thread, out = answer_in_thread(
                    lambda h=hold: store.extend(h.id, holder="alice", fence=h.fence, ttl=60)
                )
            _settle([thread], setup, watch)
            rival.commit()
            thread.join()
            (lost,) = out
            assert isinstance(lost, HoldLost), lost
            assert lost.reason is HoldLostReason.TAKEN_OVER, (r, taken_at, lost)
            after = store.get(hold.id)
            assert after is not None and after.taken_over
            assert store.holder_of(unit) == "rival"


@pytest.mark.parametrize("how", ["statement", "function"])
def test_a_takeover_queued_behind_a_dead_holds_loss_is_dated_after_it(
    setup: _Setup, how: str
) -> None:
    """A sweep's batch holds the row; the holder's confirm queues first, the takeover second.

    The confirm then judges the hold dead under the row lock, and the takeover,
    which started before that judgement, must still be dated after it.
    """
    store, sql = setup.store, setup.sql
    with setup.connect() as sweeper, setup.connect(autocommit=True) as watch:
        for r in range(ROUNDS):
            unit = Unit("seat", str(r))
            hold = setup.dead_hold(unit)
            sweeper.execute(
                sql.sweep, {"now": None, "retention": store.request_retention, "batch": 1000}
            )  # marks the dead hold expired, uncommitted: its row stays locked

            def lose(h: dibs.Claim = hold) -> Any:
                with setup.connect(autocommit=True) as conn:
                    params = {"op": "confirm", "id": int(h.id), "h": "alice", "f": h.fence,
                              "ttl": None, "now": None}  # fmt: skip
                    return conn.execute(sql.transition, params).fetchone()

            def take(u: Unit = unit) -> Any:
                if how == "statement":
                    return store.claim(u, holder="rival", ttl=60)
                with setup.connect(autocommit=True) as conn:
                    return conn.execute(sql.claim, setup.function_params(u, "rival")).fetchone()

            loser, lost = answer_in_thread(lose)
            _settle([loser], setup, watch)
            taker, took = answer_in_thread(take)
            _settle([loser, taker], setup, watch)
            sweeper.commit()
            loser.join()
            taker.join()
            (row,) = lost
            (got,) = took
            assert row is not None and row[0] in ("expired", "taken_over"), row
            if how == "statement":
                assert isinstance(got, dibs.ClaimResult) and got.claim is not None, got
                created = got.claim.created_at
            else:
                assert got is not None and got[0] == "granted", got
                created = got[10]
            if row[0] == "expired":  # the confirm was judged first: the takeover is later
                judged: datetime = row[11]
                assert created >= judged, (r, judged, created)
            with pytest.raises(HoldLost) as again:
                store.confirm(hold.id, holder="alice", fence=hold.fence)
            assert again.value.reason is HoldLostReason.TAKEN_OVER
