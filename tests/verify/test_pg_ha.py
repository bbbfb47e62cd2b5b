"""PostgreSQL high availability: multi-host URLs, failover, and cancelled synchronous waits.

Real servers on loopback (dibs.verify.harness.ReplicatedCluster): a primary with a streaming
standby, started once for the module; a primary whose synchronous standby
never comes (``synchronous_standby_names = 'ghost'``), so that every commit
waits until it is cancelled; and, for the failover, a pair of its own that
the test kills and promotes.
"""

from __future__ import annotations

import _thread
import asyncio
import secrets
import signal
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import pytest

import dibs
import dibs.aio
from dibs import FakeClock, Span, StoreUnavailable, Unit
from dibs.stores.jobs import Job
from dibs.stores.postgres._connect import describe
from dibs.verify.harness import ReplicatedCluster
from eventually import eventually

pytestmark = pytest.mark.timeout(300)


def _store_url(url: str, schema: str, **options: str) -> str:
    extra = "".join(f"&{k}={v}" for k, v in options.items())
    return f"{url}&schema={schema}{extra}"


# --- multi-host URLs --------------------------------------------------------------------------


@pytest.fixture(scope="module")
def pair() -> Iterator[tuple[ReplicatedCluster, str]]:
    """A primary and one synchronous standby ``s1``, and a database on them."""
    with ReplicatedCluster(1, synchronous="s1") as cluster:
        yield cluster, cluster.create_database()


@pytest.mark.parametrize("order", ["01", "10"], ids=["primary-first", "standby-first"])
def test_a_multi_host_url_writes_to_the_primary_whichever_host_comes_first(
    pair: tuple[ReplicatedCluster, str], order: str
) -> None:
    cluster, db = pair
    url = _store_url(cluster.url(db, order=order), f"m_{secrets.token_hex(4)}")
    with dibs.open(url) as store:
        r = store.claim(Unit("seat", order), holder="alice", request_id=f"r-{order}", ttl=60)
        assert r.granted
        assert store.confirm(r.claim.id, holder="alice", fence=r.claim.fence).state == "confirmed"

    async def on_asyncio() -> None:
        async with dibs.aio.open(url) as astore:
            again = await astore.claim(
                Unit("seat", order), holder="alice", request_id=f"r-{order}", ttl=60
            )
            assert again.replayed and again.claim.id == r.claim.id

    asyncio.run(on_asyncio())


def test_a_url_naming_only_standbys_is_unavailable(pair: tuple[ReplicatedCluster, str]) -> None:
    cluster, db = pair
    with pytest.raises(StoreUnavailable, match="read-only"):
        dibs.open(_store_url(cluster.url(db, order="1"), "nowhere", pool_timeout="1"))


def test_messages_name_every_host_of_a_multi_host_url() -> None:
    where = describe("postgresql://u:secret@h1:5432,h2:5433/app?target_session_attrs=read-write")
    assert where == "h1:5432,h2:5433/app as 'u'"
    assert describe("host=a,b port=6000 dbname=x") == "a:6000,b:6000/x"


# --- failover ---------------------------------------------------------------------------------


def _until_served(call: Callable[[], Any]) -> Any:
    """Retry ``call`` on StoreUnavailable, as the recovery recipe does; any other error fails."""
    answers: list[Any] = []

    def served() -> bool:
        try:
            answers.append(call())
        except StoreUnavailable:
            return False
        return True

    eventually(served, "the store serves again")
    return answers[0]


def test_a_failover_is_store_unavailable_then_retries_replay_the_first_outcome() -> None:
    with ReplicatedCluster(1, synchronous="s1") as cluster:
        db = cluster.create_database()
        url = _store_url(cluster.url(db), "f", pool_timeout="1")
        store = dibs.open(url)
        loop = asyncio.new_event_loop()
        astore = loop.run_until_complete(dibs.aio.open(url).__aenter__())
        try:
            seat, bed = Unit("seat", "1"), Unit("bed", "1")
            first = store.claim(seat, holder="alice", request_id="before", ttl=300)
            afirst = loop.run_until_complete(
                astore.claim(bed, holder="bob", request_id="abefore", ttl=300)
            )
            assert first.granted and afirst.granted

            cluster.kill(cluster.primary)  # kill -9 of the whole server
            for call in (
                lambda: store.claim(Unit("seat", "2"), holder="carol", request_id="during"),
                lambda: store.confirm(first.claim.id, holder="alice", fence=first.claim.fence),
                lambda: store.get(first.claim.id),
                lambda: loop.run_until_complete(astore.claim(Unit("bed", "2"), holder="dan")),
                lambda: loop.run_until_complete(astore.get(afirst.claim.id)),
            ):
                with pytest.raises(StoreUnavailable):
                    call()

            # The promoted standby would keep synchronous_standby_names = 's1' and make
            # every commit wait for a standby that is gone: clear it, as a failover
            # manager does.
            cluster.promote(cluster.standbys[0], synchronous_standby_names="")
            again = _until_served(
                lambda: store.claim(seat, holder="alice", request_id="before", ttl=300)
            )
            assert again.replayed and again.claim == first.claim
            aagain = _until_served(
                lambda: loop.run_until_complete(
                    astore.claim(bed, holder="bob", request_id="abefore", ttl=300)
                )
            )
            assert aagain.replayed and aagain.claim == afirst.claim
            confirmed = store.confirm(first.claim.id, holder="alice", fence=first.claim.fence)
            assert confirmed.state == "confirmed"
            later = store.claim(Unit("seat", "3"), holder="erin", ttl=60)
            assert later.claim.fence > first.claim.fence  # fences never went back
        finally:
            store.close()
            loop.run_until_complete(astore.close())
            loop.close()


def test_a_claim_storm_across_a_failover_loses_no_acknowledged_claim() -> None:
    """Threads claim contended units while the primary is killed; the standby is promoted.

    Each unit is claimed for good (a long TTL, never released), so it can be
    granted once in all history. Every call must answer or raise
    StoreUnavailable; a request retried after StoreUnavailable keeps its ID
    until it is answered. Afterwards every acknowledged grant is on the new
    primary with its fence, and no unit was granted twice.
    """
    threads, units, per_thread = 4, 24, 40
    with ReplicatedCluster(1, synchronous="s1") as cluster:
        db = cluster.create_database()
        store = dibs.open(_store_url(cluster.url(db), "storm", pool_timeout="1"), pool_max=threads)
        granted: list[tuple[str, dibs.Claim]] = []
        others: list[BaseException] = []
        lock = threading.Lock()  # guards granted and others
        acks = threading.Semaphore(0)
        failed_over = threading.Event()

        def claimant(n: int) -> None:
            try:
                for i in range(per_thread):
                    rid = f"t{n}-{i}"
                    unit = Unit("seat", str((n * 7 + i * 5) % units))
                    while True:
                        try:
                            r = store.claim(unit, holder=f"h{n}", request_id=rid, ttl=3600)
                            break
                        except StoreUnavailable:
                            failed_over.wait()  # retry the same request once a primary serves
                            time.sleep(0.02)  # paced, as a client's retry would be
                    if r.granted:
                        with lock:
                            granted.append((rid, r.claim))
                    acks.release()
            except BaseException as exc:
                with lock:
                    others.append(exc)

        workers = [threading.Thread(target=claimant, args=(n,)) for n in range(threads)]
        for w in workers:
            w.start()
        for _ in range(threads * per_thread // 3):  # a third of the answers, then the crash
            acks.acquire()
        cluster.kill(cluster.primary)
        cluster.promote(cluster.standbys[0], synchronous_standby_names="")
        failed_over.set()
        for w in workers:
            w.join()
        try:
            assert not others, others
            # A holder re-claiming a unit it holds gets its claim back: one claim per unit.
            by_unit: dict[Unit | Span, set[str]] = {}
            for rid, claim in granted:
                by_unit.setdefault(claim.targets[0], set()).add(claim.id)
                assert _until_served(lambda c=claim: store.get(c.id)) == claim, rid
            assert all(len(ids) == 1 for ids in by_unit.values()), by_unit
            assert len(by_unit) == units  # every unit was claimed by someone, once
        finally:
            store.close()


# --- a cancelled wait for synchronous replication ---------------------------------------------


class Ghost:
    """A primary whose every commit waits for a synchronous standby that never comes."""

    def __init__(self, cluster: ReplicatedCluster, db: str) -> None:
        self.cluster = cluster
        self.db = db
        self.admin = cluster.primary.admin_url

    def url(self, schema: str, *, wait: bool = True) -> str:
        url = _store_url(self.cluster.url(self.db), schema)
        # synchronous_commit = local: this session's commits do not wait (set-up writes).
        return url if wait else url + "&options=-c%20synchronous_commit%3Dlocal"

    def waiting(self) -> int | None:
        with psycopg.connect(self.admin, autocommit=True) as conn:
            row = conn.execute(
                "SELECT pid FROM pg_stat_activity WHERE wait_event = 'SyncRep' AND datname = %s",
                (self.db,),
            ).fetchone()
        return None if row is None else int(row[0])

    def interrupt(self, call: Callable[[], Any], how: str = "pg_cancel_backend") -> Any:
        """Run ``call`` in a thread, ``how`` its backend once its commit waits; its outcome.

        Returns the call's result or the exception it raised. Fails the test if
        the call ends without its commit ever waiting.
        """
        outcome: list[Any] = []

        def run() -> None:
            try:
                outcome.append(call())
            except BaseException as exc:
                outcome.append(exc)

        thread = threading.Thread(target=run)
        thread.start()
        pid: int | None = None

        def waits() -> bool:
            nonlocal pid
            pid = self.waiting()
            return pid is not None or not thread.is_alive()

        eventually(waits, "the call's commit waits, or the call ends")
        if pid is not None:
            with psycopg.connect(self.admin, autocommit=True) as conn:
                conn.execute(f"SELECT {how}(%s)", (pid,))
        thread.join()
        assert pid is not None, f"the call ended without its commit waiting: {outcome}"
        return outcome[0]


@pytest.fixture(scope="module")
def ghost() -> Iterator[Ghost]:
    with ReplicatedCluster(0) as cluster:
        db = cluster.create_database()
        g = Ghost(cluster, db)
        with psycopg.connect(cluster.primary.url(db), autocommit=True) as conn:
            conn.execute("CREATE TABLE probe (x int)")
        cluster.configure(cluster.primary, synchronous_standby_names="ghost")
        # The setting takes effect a moment after the reload: probe until a commit waits.
        with psycopg.connect(cluster.primary.url(db), autocommit=True) as conn:
            for _ in range(1000):
                thread = threading.Thread(
                    target=conn.execute, args=("INSERT INTO probe VALUES (1)",)
                )
                thread.start()
                pid = None
                while thread.is_alive() and pid is None:
                    pid = g.waiting()
                if pid is not None:
                    with psycopg.connect(g.admin, autocommit=True) as admin:
                        admin.execute("SELECT pg_cancel_backend(%s)", (pid,))
                thread.join()
                if pid is not None:
                    break
            else:
                raise AssertionError("synchronous_standby_names never took effect")
        yield g


Prepare = Callable[[dibs.Store, FakeClock], Callable[[dibs.Store], Any]]


def _claim_unit(setup: dibs.Store, clock: FakeClock) -> Callable[[dibs.Store], Any]:
    return lambda s: s.claim(Unit("u", "1"), holder="a", request_id="rid-unit", ttl=60)


def _claim_fresh(setup: dibs.Store, clock: FakeClock) -> Callable[[dibs.Store], Any]:
    return lambda s: s.claim(Unit("u", "2"), holder="a", ttl=60)


def _claim_group(setup: dibs.Store, clock: FakeClock) -> Callable[[dibs.Store], Any]:
    return lambda s: s.claim([Unit("g", "1"), Unit("g", "2")], holder="a", request_id="rid-g")


def _claim_span(setup: dibs.Store, clock: FakeClock) -> Callable[[dibs.Store], Any]:
    return lambda s: s.claim(Span("room", 0, 10), holder="a", request_id="rid-span", ttl=60)


def _transition(op: str) -> Prepare:
    def prepare(setup: dibs.Store, clock: FakeClock) -> Callable[[dibs.Store], Any]:
        c = setup.claim(Unit("t", op), holder="a", ttl=60).claim
        assert c is not None
        if op == "extend":
            return lambda s: s.extend(c.id, holder="a", fence=c.fence, ttl=120)
        return lambda s: getattr(s, op)(c.id, holder="a", fence=c.fence)

    return prepare


def _sweep(setup: dibs.Store, clock: FakeClock) -> Callable[[dibs.Store], Any]:
    setup.claim(Unit("dead", "1"), holder="a", ttl=1)
    clock.advance(5)
    return lambda s: s.sweep()


def _job(setup: dibs.Store, clock: FakeClock) -> Callable[[dibs.Store], Any]:
    setup.job_table()  # created without waiting
    job = Job(id="", name="send", args="[[], {}]", run_at=None, attempt=1, max_attempts=3,
              state="pending")  # fmt: skip
    return lambda s: s.job_table().add(job)


WRITES: dict[str, Prepare] = {
    "claim-unit": _claim_unit,
    "claim-unit-no-request-id": _claim_fresh,
    "claim-group": _claim_group,
    "claim-span": _claim_span,
    "confirm": _transition("confirm"),
    "extend": _transition("extend"),
    "release": _transition("release"),
    "sweep": _sweep,
    "job-table": _job,
}


@pytest.mark.parametrize("write", list(WRITES))
def test_a_cancelled_synchronous_wait_is_store_unavailable_never_success(
    ghost: Ghost, write: str
) -> None:
    schema = f"g_{secrets.token_hex(4)}"
    clock = FakeClock()
    with (
        dibs.open(ghost.url(schema, wait=False), clock=clock) as setup,
        dibs.open(ghost.url(schema), clock=clock) as store,
    ):
        call = WRITES[write](setup, clock)
        outcome = ghost.interrupt(lambda: call(store))
        assert isinstance(outcome, StoreUnavailable), outcome
        assert "synchronous replication" in str(outcome)
        if write == "claim-unit":  # the commit stands on the primary: a retry replays it
            again = setup.claim(Unit("u", "1"), holder="a", request_id="rid-unit", ttl=60)
            assert again.replayed


@pytest.mark.parametrize("write", ["claim-unit", "confirm", "sweep"])
def test_a_cancelled_synchronous_wait_is_store_unavailable_on_asyncio(
    ghost: Ghost, write: str
) -> None:
    schema = f"ga_{secrets.token_hex(4)}"
    clock = FakeClock()
    with dibs.open(ghost.url(schema, wait=False), clock=clock) as setup:
        call = WRITES[write](setup, clock)

        async def scenario() -> Any:
            async with dibs.aio.open(ghost.url(schema), clock=clock) as astore:
                face = _SyncOver(astore, asyncio.get_running_loop())
                return await asyncio.to_thread(ghost.interrupt, lambda: call(face))

        outcome = asyncio.run(scenario())
    assert isinstance(outcome, StoreUnavailable), outcome


class _SyncOver:
    """The async store's calls, made from another thread on its loop: what WRITES call."""

    def __init__(self, store: Any, loop: asyncio.AbstractEventLoop) -> None:
        self._store = store
        self._loop = loop

    def __getattr__(self, name: str) -> Callable[..., Any]:
        method = getattr(self._store, name)
        return lambda *a, **k: asyncio.run_coroutine_threadsafe(
            method(*a, **k), self._loop
        ).result()


@pytest.mark.parametrize("face", ["sync", "asyncio"])
def test_a_backend_terminated_in_the_wait_is_store_unavailable(ghost: Ghost, face: str) -> None:
    schema = f"gt_{secrets.token_hex(4)}"
    seat = Unit("seat", face)
    dibs.open(ghost.url(schema, wait=False)).close()  # the schema, made without waiting
    if face == "sync":
        with dibs.open(ghost.url(schema)) as store:
            outcome = ghost.interrupt(
                lambda: store.claim(seat, holder="a", request_id="t", ttl=60),
                how="pg_terminate_backend",
            )
    else:

        async def scenario() -> Any:
            async with dibs.aio.open(ghost.url(schema)) as astore:
                face_ = _SyncOver(astore, asyncio.get_running_loop())
                return await asyncio.to_thread(
                    ghost.interrupt,
                    lambda: face_.claim(seat, holder="a", request_id="t", ttl=60),
                    "pg_terminate_backend",
                )

        outcome = asyncio.run(scenario())
    assert isinstance(outcome, StoreUnavailable), outcome
    with dibs.open(ghost.url(schema, wait=False)) as setup:  # committed locally: replayed
        assert setup.claim(seat, holder="a", request_id="t", ttl=60).replayed


@pytest.mark.parametrize("write", ["claim-unit", "claim-group", "claim-span", "confirm", "release"])
def test_a_retry_waits_for_the_standbys_before_it_answers(ghost: Ghost, write: str) -> None:
    """The retry of a write whose wait was cancelled answers only once it is replicated."""
    schema = f"gr_{secrets.token_hex(4)}"
    clock = FakeClock()
    with (
        dibs.open(ghost.url(schema, wait=False), clock=clock) as setup,
        dibs.open(ghost.url(schema), clock=clock) as store,
    ):
        call = WRITES[write](setup, clock)
        assert isinstance(ghost.interrupt(lambda: call(store)), StoreUnavailable)
        # The commit stands on the primary; the replay must wait for the (absent) standby
        # like any commit, and a cancelled wait is StoreUnavailable again, never the claim.
        assert isinstance(ghost.interrupt(lambda: call(store)), StoreUnavailable)
        answer = call(setup)  # a session that does not wait for the standbys answers
        if write.startswith("claim"):
            assert answer.replayed
        elif write == "confirm":
            assert answer.state == "confirmed"
        else:
            assert answer is False  # released by the first attempt


def test_a_wait_interrupted_by_ctrl_c_blames_no_later_call(ghost: Ghost) -> None:
    """Ctrl-C in the wait: psycopg cancels the statement (the server turns that into the
    warning and a success) and raises KeyboardInterrupt. The connection goes back to the
    pool; the next call on it, a plain read, is not that commit and must answer."""
    schema = f"gk_{secrets.token_hex(4)}"
    seat = Unit("seat", "ctrl-c")
    dibs.open(ghost.url(schema, wait=False)).close()  # the schema, made without waiting
    with dibs.open(ghost.url(schema) + "&pool_min=1&pool_max=1") as store:  # one connection

        def press_ctrl_c() -> None:
            eventually(lambda: ghost.waiting() is not None, "the commit waits")
            _thread.interrupt_main()

        # interrupt_main() does nothing while SIGINT is ignored, as it is in a background
        # job of a script (CI's shell): the claim would then wait for ever. Handle it here.
        before = signal.signal(signal.SIGINT, signal.default_int_handler)
        presser = threading.Thread(target=press_ctrl_c)
        presser.start()
        try:
            with pytest.raises(KeyboardInterrupt):
                store.claim(seat, holder="a", request_id="k", ttl=60)
        finally:
            presser.join()
            signal.signal(signal.SIGINT, before)
        assert store.holder_of(seat) == "a"  # committed on the primary; a read, not a loss


def test_a_role_that_may_not_emit_the_message_is_told_so(ghost: Ghost) -> None:
    """A replay with synchronous standbys calls pg_logical_emit_message. Where EXECUTE on it
    was revoked, a retry cannot help: StoreMisconfigured naming the grant, never a
    retryable StoreUnavailable."""
    schema = f"gp_{secrets.token_hex(4)}"
    seat = Unit("seat", "grant")
    revoke = "REVOKE EXECUTE ON FUNCTION pg_logical_emit_message(boolean, text, text) FROM PUBLIC"
    admin_db = ghost.cluster.primary.url(ghost.db)  # the admin role, in the store's database
    with dibs.open(ghost.url(schema, wait=False)) as setup:
        setup.claim(seat, holder="a", request_id="p", ttl=60)
    with psycopg.connect(admin_db, autocommit=True) as conn:
        conn.execute("SET synchronous_commit = local")  # this commit must not wait
        conn.execute(revoke)
    try:
        with (
            dibs.open(ghost.url(schema)) as store,
            pytest.raises(dibs.StoreMisconfigured, match="pg_logical_emit_message"),
        ):
            store.claim(seat, holder="a", request_id="p", ttl=60)
    finally:
        with psycopg.connect(admin_db, autocommit=True) as conn:
            conn.execute("SET synchronous_commit = local")
            conn.execute(revoke.replace("REVOKE", "GRANT").replace("FROM", "TO"))
