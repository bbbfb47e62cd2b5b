"""PostgreSQL across processes that behave like separate hosts: races, pauses, faults.

Every test here runs on the database's real clock (no FakeClock): expiry is
judged by ``clock_timestamp()``, as in production. Each verdict is read back
from the database afterwards, not taken from what the callers were told.
"""

from __future__ import annotations

import itertools
import multiprocessing
import os
import random
import signal
import threading
import time
from collections import defaultdict
from datetime import datetime
from typing import Any

import psycopg
import pytest

import dibs
from dibs import ClaimState, HoldLost, HoldLostReason, Span, StoreUnavailable, Unit
from dibs.verify.harness import PostgresServer
from eventually import eventually
from pg_fixtures import drop_schema, schema_url

pytestmark = pytest.mark.timeout(300)

_spawn = multiprocessing.get_context("spawn")


# --- reading the history back from the database ------------------------------------------------


def _claims(url: str, schema: str) -> list[dict[str, Any]]:
    with psycopg.connect(url) as conn:
        rows = conn.execute(
            "SELECT u.id, u.holder, jsonb_build_array(jsonb_build_array('u', u.resource, "
            "u.slot))::text, u.state, u.fence, u.expires_at, u.created_at, u.updated_at, "
            f"u.taken_over FROM {schema}.units_v4 u "
            "WHERE u.state IN ('held', 'confirmed', 'released', 'expired') UNION ALL "
            "SELECT id, holder, targets, state, fence, expires_at, created_at, updated_at, "
            f"taken_over FROM {schema}.claims_v4 ORDER BY 5"
        ).fetchall()
    from dibs._model import targets_from_text

    return [
        {
            "id": str(r[0]),
            "holder": r[1],
            "targets": targets_from_text(r[2]),
            "state": r[3],
            "fence": r[4],
            "expires_at": r[5],
            "created_at": r[6],
            "updated_at": r[7],
            "taken_over": r[8],
        }
        for r in rows
    ]


def _end(claim: dict[str, Any]) -> datetime | None:
    """When the claim stopped occupying its targets (None: it still does, for good)."""
    if claim["state"] == "released":
        end: datetime = claim["updated_at"]
        return end
    if claim["state"] == "confirmed":
        return None
    expires: datetime = claim["expires_at"]  # held or expired: it ended at its expiry
    return expires


def _assert_no_double_booking(claims: list[dict[str, Any]]) -> int:
    """No two claims ever occupied one unit, or overlapping spans, at the same time.

    Claims are in fence order; for each unit (and each pair of overlapping
    spans) a later claim must start no earlier than the earlier one ended.
    Returns how many successions (one claim after another on a target) it checked.
    """
    by_unit: dict[Unit, list[dict[str, Any]]] = defaultdict(list)
    by_resource: dict[str, list[tuple[Span, dict[str, Any]]]] = defaultdict(list)
    for claim in claims:
        for target in claim["targets"]:
            if isinstance(target, Unit):
                by_unit[target].append(claim)
            else:
                by_resource[target.resource].append((target, claim))
    checked = 0
    for unit, history in by_unit.items():
        for before, after in itertools.pairwise(history):
            assert before["fence"] < after["fence"]
            end = _end(before)
            assert end is not None, f"{unit}: claimed again after a confirmed claim {before}"
            assert after["created_at"] >= end, f"{unit}: {after} began before {before} ended"
            checked += 1
    for resource, spans in by_resource.items():
        for i, (span_a, a) in enumerate(spans):
            for span_b, b in spans[i + 1 :]:
                if a is b or not span_a.overlaps(span_b):
                    continue
                end = _end(a)  # a has the smaller fence
                assert end is not None and b["created_at"] >= end, (
                    f"{resource}: {span_b} of {b['id']} overlapped {span_a} of {a['id']}"
                )
                checked += 1
    return checked


# --- many hosts racing ---------------------------------------------------------------------------

UNITS = [Unit(f"seat-{i // 20}", f"show-{i % 20}") for i in range(300)]
SPAN_ROOMS = [f"room-{i}" for i in range(12)]


def _race_worker(url: str, worker: int, claims: int, seed: int) -> list[tuple[str, int, str]]:
    """One "host": its own store and pool, claiming hot targets as fast as it can."""
    rng = random.Random(seed)
    granted: list[tuple[str, int, str]] = []
    with dibs.open(url, pool_min=1, pool_max=2) as store:
        for i in range(claims):
            holder = f"w{worker}-{i}"
            roll = rng.random()
            if roll < 0.45:
                targets: list[Unit | Span] = [rng.choice(UNITS)]
            elif roll < 0.7:
                targets = rng.sample(UNITS[:60], 2)
            else:
                start = rng.randrange(0, 96)
                targets = [Span(rng.choice(SPAN_ROOMS), start, start + rng.randrange(1, 5))]
                if roll > 0.9:
                    targets.append(rng.choice(UNITS))
            ttl = rng.choice([None, 0.02, 0.05, 0.2, 1.0])
            result = store.claim(targets, holder=holder, ttl=ttl)
            if not result:
                assert result.taken
                continue
            claim = result.claim
            assert claim is not None and claim.holder == holder
            granted.append((claim.id, claim.fence, holder))
            action = rng.random()
            try:
                if action < 0.3:
                    store.release(claim.id, holder=holder, fence=claim.fence)
                elif action < 0.4 and ttl is not None:
                    store.confirm(claim.id, holder=holder, fence=claim.fence)
                elif action < 0.5 and ttl is not None:
                    store.extend(claim.id, holder=holder, fence=claim.fence, ttl=0.05)
            except HoldLost as lost:
                assert lost.reason in (HoldLostReason.EXPIRED, HoldLostReason.TAKEN_OVER)
            if action > 0.97:
                store.sweep()
    return granted


def test_hosts_racing_for_units_and_spans_never_double_book(pg_url: str) -> None:
    schema = f"race_{os.getpid()}"
    url = schema_url(pg_url, schema)
    dibs.open(url).close()  # create the schema once, before the storm
    hosts, per_host = 4, 2600
    try:
        with _spawn.Pool(hosts) as pool:
            results = pool.starmap(
                _race_worker, [(url, n, per_host, 1000 + n) for n in range(hosts)]
            )
        told = {claim_id: (fence, holder) for per in results for claim_id, fence, holder in per}
        claims = _claims(pg_url, schema)
        stored = {c["id"]: (c["fence"], c["holder"]) for c in claims}
        # Every grant a host was told of is in the database as told, and nothing else is.
        assert stored == told
        assert len({c["fence"] for c in claims}) == len(claims)
        successions = _assert_no_double_booking(claims)
        # The race must have been a race: plenty of hand-overs and takeovers.
        assert successions > 2000, successions
        assert sum(c["taken_over"] for c in claims) > 50
        assert hosts * per_host >= 10_000
    finally:
        drop_schema(pg_url, schema)


# --- a late confirmation racing a takeover at the expiry boundary --------------------------------


def _race_one_boundary(
    holder_store: dibs.Store, rival_store: dibs.Store, unit: Unit, ttl: float
) -> tuple[dibs.Claim, object, dibs.ClaimResult]:
    """Confirm a hold and take it over, both aimed at its expiry; return both answers."""
    held = holder_store.claim(unit, holder="late", ttl=ttl).claim
    assert held is not None
    barrier = threading.Barrier(2)
    deadline = time.monotonic() + ttl
    answers: dict[str, Any] = {}

    def at_the_boundary() -> None:
        barrier.wait()
        # Real time, the point: both calls land around the expiry on the database's clock.
        time.sleep(max(0.0, deadline - time.monotonic() + random.uniform(-0.4, 0.4) * ttl))

    def confirm() -> None:
        at_the_boundary()
        try:
            answers["confirm"] = holder_store.confirm(held.id, holder="late", fence=held.fence)
        except HoldLost as lost:
            answers["confirm"] = lost

    def take_over() -> None:
        at_the_boundary()

        # The rival keeps trying until the unit is decided one way or the other.
        def decided() -> list[dibs.ClaimResult]:
            result = rival_store.claim(unit, holder="rival", ttl=60)
            current = rival_store.get(held.id)
            if result or (current is not None and current.state is ClaimState.CONFIRMED):
                return [result]
            return []

        (answers["rival"],) = eventually(decided, "the unit is confirmed or taken over")

    threads = [threading.Thread(target=confirm), threading.Thread(target=take_over)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return held, answers["confirm"], answers["rival"]


def test_late_confirm_racing_takeover_has_exactly_one_winner(pg_schema_url: str) -> None:
    rounds = 150
    outcomes: dict[str, int] = defaultdict(int)
    with dibs.open(pg_schema_url) as holder_store, dibs.open(pg_schema_url) as rival_store:
        # At least `rounds`, and on until each side has won once: the boundary was
        # really raced (load can skew the aim, so no count of rounds is promised).
        for n in itertools.count():
            confirms = outcomes.get("confirm", 0)
            if n >= rounds and 0 < confirms < sum(outcomes.values()):
                break
            unit = Unit("boundary", str(n))
            held, confirmed, rival = _race_one_boundary(holder_store, rival_store, unit, 0.04)
            final = holder_store.get(held.id)
            assert final is not None
            if isinstance(confirmed, HoldLost):
                assert rival, "the hold was lost, so the rival must have won"
                assert confirmed.reason in (HoldLostReason.TAKEN_OVER, HoldLostReason.EXPIRED)
                assert final.state is ClaimState.EXPIRED
                assert rival_store.holder_of(unit) == "rival"
                assert rival.claim is not None and rival.claim.fence > held.fence
                outcomes[f"rival ({confirmed.reason})"] += 1
            else:
                assert not rival, "the hold was confirmed, so the rival must have lost"
                assert final.state is ClaimState.CONFIRMED
                assert rival_store.holder_of(unit) == "late"
                outcomes["confirm"] += 1
    assert sum(outcomes.values()) == n, dict(outcomes)


# --- a paused holder -----------------------------------------------------------------------------


def _paused_holder(url: str, ledger_url: str, conn: Any) -> None:
    """Claim, report, 'work' (we get SIGSTOPped here), then confirm and write fenced."""
    with dibs.open(url) as store:
        claim = store.claim(Unit("printer", "job-1"), holder="paused", ttl=0.5).claim
        assert claim is not None
        conn.send((claim.id, claim.fence))
        conn.recv()  # "go on": sent after we were stopped and continued
        try:
            store.confirm(claim.id, holder="paused", fence=claim.fence)
            conn.send(("confirmed", None))
        except HoldLost as lost:
            conn.send(("lost", lost.reason.value))
        conn.send(("ledger", _fenced_write(ledger_url, claim.fence, "paused")))


def _fenced_write(url: str, fence: int, writer: str) -> bool:
    """A downstream resource that accepts a write only with a fence newer than any it saw."""
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute(
            "UPDATE fenced_ledger SET fence = %s, writer = %s WHERE fence < %s RETURNING 1",
            (fence, writer, fence),
        ).fetchone()
    return row is not None


def test_paused_holder_is_fenced_off_after_a_takeover(pg_url: str, pg_schema_url: str) -> None:
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute("DROP TABLE IF EXISTS fenced_ledger")
        conn.execute("CREATE TABLE fenced_ledger (fence bigint NOT NULL, writer text)")
        conn.execute("INSERT INTO fenced_ledger VALUES (0, NULL)")
    parent_end, child_end = _spawn.Pipe()
    child = _spawn.Process(target=_paused_holder, args=(pg_schema_url, pg_url, child_end))
    child.start()
    try:
        claim_id, fence = parent_end.recv()
        os.kill(child.pid, signal.SIGSTOP)  # type: ignore[arg-type]
        with dibs.open(pg_schema_url) as store:
            # While the holder is frozen its hold runs out on the database clock.
            taken = eventually(
                lambda: store.claim(Unit("printer", "job-1"), holder="rescuer", ttl=30),
                "the frozen holder's hold runs out",
            )
            assert taken.claim is not None and taken.claim.fence > fence
            assert _fenced_write(pg_url, taken.claim.fence, "rescuer")
            os.kill(child.pid, signal.SIGCONT)  # type: ignore[arg-type]
            parent_end.send("go on")
            assert parent_end.recv() == ("lost", HoldLostReason.TAKEN_OVER.value)
            assert parent_end.recv() == ("ledger", False)  # its stale fence is refused
            old = store.get(claim_id)
            assert old is not None and old.state is ClaimState.EXPIRED and old.taken_over
            assert store.holder_of(Unit("printer", "job-1")) == "rescuer"
        with psycopg.connect(pg_url) as conn:
            assert conn.execute("SELECT writer FROM fenced_ledger").fetchone() == ("rescuer",)
    finally:
        if child.is_alive():
            os.kill(child.pid, signal.SIGCONT)  # type: ignore[arg-type]
        child.join(30)
        assert child.exitcode == 0


# --- connection faults ---------------------------------------------------------------------------


def _storm(
    store: dibs.Store,
    units: list[Unit],
    workers: int,
    deadline: float,
    answers: dict[tuple[int, Unit], dibs.ClaimResult],
) -> int:
    """Workers claim every unit (confirmed, with request IDs), retrying StoreUnavailable.

    Fills ``answers`` with every worker's final answer per unit as it goes;
    returns how many StoreUnavailable errors the workers saw on the way.
    """
    lock = threading.Lock()  # guards answers and errors
    errors = [0]

    def work(n: int) -> None:
        order = units[:]
        random.Random(n).shuffle(order)
        for unit in order:
            request_id = f"w{n}-{unit.resource}-{unit.slot}"
            while True:
                try:
                    result = store.claim(unit, holder=f"w{n}", request_id=request_id)
                    break
                except StoreUnavailable:
                    with lock:
                        errors[0] += 1
                    assert time.monotonic() < deadline, "the store never came back"
                    time.sleep(random.uniform(0.005, 0.05))  # a jittered retry, as a client would
            with lock:
                answers[(n, unit)] = result

    threads = [threading.Thread(target=work, args=(n,)) for n in range(workers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return errors[0]


class _Paced(dict[tuple[int, Unit], dibs.ClaimResult]):
    """Storm answers that call ``at(count)`` when their count reaches one of ``points``.

    ``_storm`` records under its lock, so the whole storm waits for ``at``: a
    fault lands at a set point of the run, however fast or slow the machine.
    """

    def __init__(self, points: set[int], at: Any) -> None:
        super().__init__()
        self.points, self.at = points, at

    def __setitem__(self, key: tuple[int, Unit], value: dibs.ClaimResult) -> None:
        super().__setitem__(key, value)
        if len(self) in self.points:
            self.at(len(self))


class _Failing:
    """A store whose claims set ``failed`` when they raise StoreUnavailable."""

    def __init__(self, store: dibs.Store) -> None:
        self.store, self.failed = store, threading.Event()

    def claim(self, *args: Any, **kwargs: Any) -> dibs.ClaimResult:
        try:
            return self.store.claim(*args, **kwargs)
        except StoreUnavailable:
            self.failed.set()
            raise


def _assert_storm_converged(
    store: dibs.Store,
    answers: dict[tuple[int, Unit], dibs.ClaimResult],
    units: list[Unit],
    workers: int,
) -> None:
    for unit in units:
        winners = [n for n in range(workers) if answers[(n, unit)]]
        # Exactly one worker was told it won, and the database agrees.
        assert len(winners) == 1, (unit, winners)
        (winner,) = winners
        assert store.holder_of(unit) == f"w{winner}"
        claim = answers[(winner, unit)].claim
        assert claim is not None
        stored = store.get(claim.id)
        assert stored is not None and stored.state is ClaimState.CONFIRMED  # nothing lost
        for n in range(workers):
            if n != winner:
                assert answers[(n, unit)].taken == (unit,)
                # A retry now replays the recorded answer.
                again = store.claim(
                    unit, holder=f"w{n}", request_id=f"w{n}-{unit.resource}-{unit.slot}"
                )
                assert not again and again.replayed


def test_terminated_connections_mid_storm_converge(pg_url: str, pg_admin_url: str) -> None:
    schema = f"kill_{os.getpid()}"
    app = f"dibs-kill-{os.getpid()}"
    url = schema_url(f"{pg_url}?application_name={app}", schema)
    units = [Unit("kill", str(i)) for i in range(150)]
    workers = 6
    bursts = 15
    killed: list[int] = []

    try:
        with (
            dibs.open(url, pool_max=workers, pool_timeout=5) as store,
            psycopg.connect(pg_admin_url, autocommit=True) as admin,
        ):

            def burst(count: int) -> None:
                # Kill every connection the store has, mid-storm: the recording
                # worker's own (idle, just used), and others mid-query.
                row = admin.execute(
                    "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                    "WHERE application_name = %s",
                    (app,),
                ).fetchone()
                killed.append(row[0] if row else 0)

            total = len(units) * workers  # bursts spread evenly over the run, none at its end
            answers = _Paced({total * (i + 1) // (bursts + 1) for i in range(bursts)}, burst)
            errors = _storm(store, units, workers, time.monotonic() + 120, answers)
            # Each burst found at least the connection that had just answered, and
            # the next claim on it failed: the storm went on after every burst.
            assert len(killed) == bursts and min(killed) >= 1 and errors >= 1, (killed, errors)
            _assert_storm_converged(store, answers, units, workers)
    finally:
        drop_schema(pg_url, schema)


def test_server_restart_mid_run_converges(private_pg_server: PostgresServer) -> None:
    url = private_pg_server.create_database("restart")
    units = [Unit("restart", str(i)) for i in range(120)]
    workers = 4
    with dibs.open(url, pool_max=workers, pool_timeout=2) as store:
        failing = _Failing(store)
        restarted = threading.Event()

        def crash(count: int) -> None:
            private_pg_server.stop("immediate")  # a crash: no shutdown checkpoint

        def restart() -> None:
            # Down until a worker has been refused: the storm really met the crash.
            if failing.failed.wait(60):
                private_pg_server.start()
                restarted.set()

        answers = _Paced({len(units)}, crash)  # a quarter of the way through
        thread = threading.Thread(target=restart)
        thread.start()
        try:
            errors = _storm(failing, units, workers, time.monotonic() + 120, answers)  # type: ignore[arg-type]
        finally:
            failing.failed.set()  # free the restarter if the storm ended early
            thread.join()
        assert restarted.is_set() and errors > 0
        _assert_storm_converged(store, answers, units, workers)
