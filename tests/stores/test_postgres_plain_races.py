"""Races on schema version 4's plain statements: one unit row, many hands.

The single-unit claim, confirm, extend and release are each one plain
statement on the unit row (no PL/pgSQL, no row lock taken first), so these
tests race them where they meet: claimers on one unit (free, released, or held
by a dead hold), a confirm against a takeover and a sweep, and a retry
against its first attempt still in flight. Each round starts its threads at a
barrier; no assertion depends on timing.

A planted bug fails these (checked by hand when they were written): dropping
the re-check from the plain claim's UPDATE (``x.fence = o.fence`` and the
state condition) lets two claimers of a released unit both win; dropping the
liveness condition from the plain confirm lets a dead hold confirm; sending a
confirm straight to ``transition_v4`` shows up in the server's function count.
"""

from __future__ import annotations

import secrets
import threading
from collections.abc import Callable, Iterator
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import psycopg
import pytest

import dibs
from _race import race_outcomes
from dibs import ClaimState, FakeClock, HoldLost, HoldLostReason, Unit
from eventually import eventually
from pg_fixtures import drop_schema, schema_url

pytestmark = pytest.mark.timeout(300)

THREADS = 8
ROUNDS = 100


@pytest.fixture
def racing(pg_url: str) -> Iterator[tuple[dibs.Store, FakeClock, str]]:
    clock = FakeClock()
    url = schema_url(pg_url)
    store = dibs.open(url, clock=clock, pool_min=THREADS, pool_max=THREADS)
    try:
        yield store, clock, url
    finally:
        store.close()
        drop_schema(pg_url, url.rsplit("schema=", 1)[1])


@pytest.mark.parametrize("before", ["free", "released", "dead", "swept"])
def test_claimers_of_one_unit_have_one_winner_and_rising_fences(
    racing: tuple[dibs.Store, FakeClock, str], before: str
) -> None:
    store, clock, _ = racing
    last_fence = 0
    for r in range(ROUNDS):
        unit = Unit("seat", str(r) if before == "free" else "1")
        previous = None
        if before != "free":
            previous = store.claim(unit, holder="prev", ttl=5).claim
            assert previous is not None
            if before == "released":
                assert store.release(previous.id, holder="prev", fence=previous.fence)
            else:
                clock.advance(6)
                if before == "swept":
                    assert store.sweep().expired == 1
        results = race_outcomes(
            [lambda n=n, u=unit: store.claim(u, holder=f"h{n}", ttl=5) for n in range(THREADS)]
        )
        assert not [r for r in results if isinstance(r, Exception)], results
        winners = [r.claim for r in results if r.granted]
        assert len(winners) == 1, (before, r, winners)
        assert all(r.taken == (unit,) for r in results if not r.granted)
        won = winners[0]
        assert won.fence > last_fence and store.holder_of(unit) == won.holder
        last_fence = won.fence
        if previous is not None:
            old = store.get(previous.id)
            assert old is not None and old.fence < won.fence
            expect = ClaimState.RELEASED if before == "released" else ClaimState.EXPIRED
            assert old.state is expect and old.taken_over == (before != "released")
        assert store.release(won.id, holder=won.holder, fence=won.fence) or before == "free"


def test_a_confirm_racing_a_takeover_and_a_sweep_never_both_win(
    racing: tuple[dibs.Store, FakeClock, str],
) -> None:
    store, clock, _ = racing
    outcomes: set[str] = set()
    unit = Unit("seat", "1")
    for _ in range(ROUNDS):
        hold = store.claim(unit, holder="alice", ttl=5).claim
        assert hold is not None

        def confirm(hold: dibs.Claim = hold) -> Any:
            return store.confirm(hold.id, holder="alice", fence=hold.fence)

        def take_over() -> Any:
            clock.advance(6)  # the hold dies now: before or after the confirm lands
            return store.claim(unit, holder="rival", ttl=5)

        calls: list[Callable[[], Any]] = [confirm, take_over, store.sweep]
        confirmed, rival, swept = race_outcomes(calls)
        assert not isinstance(swept, Exception), swept
        if isinstance(confirmed, dibs.Claim):
            outcomes.add("confirmed")
            assert confirmed.state is ClaimState.CONFIRMED
            assert hold.expires_at is not None and confirmed.updated_at < hold.expires_at
            assert not rival.granted and store.holder_of(unit) == "alice"
            after = store.get(hold.id)
            assert after is not None and after.state is ClaimState.CONFIRMED
            assert store.release(hold.id, holder="alice", fence=hold.fence)
        else:
            outcomes.add(f"lost:{getattr(confirmed, 'reason', confirmed)}")
            assert isinstance(confirmed, HoldLost), confirmed
            assert rival.granted and store.holder_of(unit) == "rival"
            assert confirmed.reason in (HoldLostReason.EXPIRED, HoldLostReason.TAKEN_OVER)
            after = store.get(hold.id)
            assert after is not None and after.state is ClaimState.EXPIRED and after.taken_over
            with pytest.raises(HoldLost) as lost:
                confirm()
            assert lost.value.reason is HoldLostReason.TAKEN_OVER
            assert rival.claim is not None
            assert store.release(rival.claim.id, holder="rival", fence=rival.claim.fence)
    assert outcomes  # (which of them happened is up to the scheduler)


def test_retries_of_one_request_all_answer_its_one_claim(
    racing: tuple[dibs.Store, FakeClock, str],
) -> None:
    store, _, _ = racing
    for r in range(ROUNDS):
        unit = Unit("order", str(r % 3))
        results = race_outcomes(
            [
                lambda u=unit, r=r: store.claim(u, holder="alice", ttl=60, request_id=f"req-{r}")
                for _ in range(THREADS)
            ]
        )
        assert not [x for x in results if isinstance(x, Exception)], results
        claims = {x.claim.id for x in results if x.claim is not None}
        granted = [x for x in results if x.granted]
        if granted:  # the unit was free: one first attempt, every other a replay of it
            assert len(claims) == 1 and len(granted) == THREADS
            assert sum(not x.replayed for x in results) == 1
            claim = granted[0].claim
            assert store.release(claim.id, holder="alice", fence=claim.fence)
        else:  # impossible: each round's unit was released by the round before
            pytest.fail(f"round {r}: {results}")


def test_one_request_id_with_other_inputs_at_once_grants_one(
    racing: tuple[dibs.Store, FakeClock, str],
) -> None:
    store, _, _ = racing
    for r in range(ROUNDS):
        results = race_outcomes(
            [
                lambda n=n, r=r: store.claim(
                    Unit("order", f"{r}-{n}"), holder="alice", ttl=60, request_id=f"mixed-{r}"
                )
                for n in range(THREADS)
            ]
        )
        granted = [x for x in results if isinstance(x, dibs.ClaimResult) and x.granted]
        conflicts = [x for x in results if isinstance(x, dibs.RequestConflict)]
        assert len(granted) == 1 and len(conflicts) == THREADS - 1, results


def _waiting(conn: psycopg.Connection[Any]) -> int:
    row = conn.execute(
        "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
        "AND datname = current_database()"
    ).fetchone()
    assert row is not None
    return int(row[0])


@pytest.mark.parametrize("first_commits", [True, False])
def test_a_retry_waits_for_its_first_attempt_in_flight(
    racing: tuple[dibs.Store, FakeClock, str], pg_url: str, first_commits: bool
) -> None:
    store, clock, url = racing
    schema = url.rsplit("schema=", 1)[1]
    sql = store._sql  # type: ignore[attr-defined]
    fp = dibs._model.fingerprint("alice", (Unit("order", "1"),), 60.0)
    with psycopg.connect(pg_url) as first, psycopg.connect(pg_url, autocommit=True) as watch:
        # The first attempt: the plain statement, its transaction still open.
        row = first.execute(
            sql.claim_unit,
            {
                "r": "order",
                "sl": "1",
                "h": "alice",
                "st": "held",
                "ttl": 60.0,
                "rid": "req-1",
                "fp": fp,
                "retention": 3600.0,
                "now": store._now_param(),  # type: ignore[attr-defined]
            },
        ).fetchone()
        assert row is not None and row[0] == "new"
        answer: list[Any] = []
        retry = threading.Thread(
            target=lambda: answer.append(
                store.claim(Unit("order", "1"), holder="alice", ttl=60, request_id="req-1")
            )
        )
        retry.start()
        # The retry waits on the first attempt's index entry.
        eventually(lambda: _waiting(watch) >= 1, "the retry waits for the first attempt")
        assert retry.is_alive()
        if first_commits:
            first.commit()
        else:
            first.rollback()
        retry.join()
    (result,) = answer
    assert result.granted and result.claim is not None
    assert result.replayed is first_commits
    if first_commits:
        assert int(result.claim.id) == row[1]
    with psycopg.connect(pg_url) as conn:
        (n,) = conn.execute(
            f"SELECT count(*) FROM {schema}.units_v4 WHERE request_id = 'req-1'"
        ).fetchone() or (0,)
    assert n == 1
    _ = clock


def test_a_replay_of_a_committed_request_writes_no_wal(
    racing: tuple[dibs.Store, FakeClock, str], pg_url: str
) -> None:
    store, _, _ = racing
    first = store.claim(Unit("order", "1"), holder="alice", ttl=60, request_id="req-1")
    assert first.granted and not first.replayed
    store.claim(Unit("order", "2"), holder="alice", ttl=60, request_id="req-2")  # a reservation?
    with psycopg.connect(pg_url, autocommit=True) as conn:

        def lsn() -> int:
            row = conn.execute("SELECT pg_current_wal_insert_lsn() - '0/0'::pg_lsn").fetchone()
            assert row is not None
            return int(row[0])

        # Other sessions on the server may write WAL meanwhile: take the quietest of
        # several windows; a replay that wrote would write in every one.
        spent = []
        for _ in range(5):
            before = lsn()
            for _ in range(50):
                again = store.claim(Unit("order", "1"), holder="alice", ttl=60, request_id="req-1")
                assert again.replayed and again.claim == first.claim
            spent.append(lsn() - before)
    assert min(spent) == 0, spent


def test_the_uncontended_single_unit_path_runs_no_function(pg_url: str, pg_admin_url: str) -> None:
    """Hold, extend, confirm, release, reuse and replay: plain statements only.

    Counted by the server (``track_functions``, which only a superuser may
    set, hence the admin role): the sessions' counters reach the statistics
    when they end. A few group claims, which do take the function, are the
    control that the counting works.
    """
    admin = urlunsplit(urlsplit(pg_admin_url)._replace(path=urlsplit(pg_url).path))
    schema = f"f_{secrets.token_hex(4)}"
    url = f"{admin}?schema={schema}&options=-c%20track_functions%3Dpl"
    groups = 3
    with dibs.open(url, pool_min=1, pool_max=1) as store:
        for i in range(20):
            unit = Unit("seat", str(i))
            rid = f"r{i}" if i % 2 else None
            hold = store.claim(unit, holder="a", ttl=60, request_id=rid)
            assert hold.claim is not None and not hold.replayed
            if rid:
                assert store.claim(unit, holder="a", ttl=60, request_id=rid).replayed
            claim = hold.claim
            store.extend(claim.id, holder="a", fence=claim.fence, ttl=60)
            store.confirm(claim.id, holder="a", fence=claim.fence)
            assert store.release(claim.id, holder="a", fence=claim.fence)
            again = store.claim(unit, holder="b", ttl=60).claim  # the released unit, reused
            assert again is not None and again.fence > claim.fence
        for i in range(groups):
            assert store.claim([Unit("row", f"{i}a"), Unit("row", f"{i}b")], holder="g")
    with psycopg.connect(admin, autocommit=True) as conn:

        def counted() -> dict[str, int]:  # once the ended session's counters arrive
            conn.execute("SELECT pg_stat_clear_snapshot()")
            rows = conn.execute(
                "SELECT funcname, calls FROM pg_stat_user_functions WHERE schemaname = %s",
                (schema,),
            ).fetchall()
            calls = {name: int(n) for name, n in rows}
            return calls if calls.get("claim_v4", 0) >= groups else {}

        calls = eventually(counted, "the session's function counters arrive")
        conn.execute(f'DROP SCHEMA "{schema}" CASCADE')
    assert calls.get("claim_v4") == groups and "transition_v4" not in calls, calls
