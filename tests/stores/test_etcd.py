"""What only the etcd store has: its URL, real leases, its round trips, etcd's limits.

The contract and the state machine (tests/stores/test_contract.py,
tests/stores/test_etcd_machine.py) run it under a test clock; here holds are real
etcd leases, so the tests wait for etcd to expire them (by polling, bounded by
pytest-timeout: no timed assertions).
"""

from __future__ import annotations

import asyncio
import base64
import http.server
import itertools
import os
import random
import socket
import ssl
import subprocess
import sys
import textwrap
import threading
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

import dibs
import dibs.aio
from conftest import drop_etcd_prefix
from dibs import (
    ClaimState,
    HoldLost,
    HoldLostReason,
    InvalidInput,
    Span,
    StoreMisconfigured,
    StoreUnavailable,
    Unit,
)
from dibs.stores.etcd import AsyncEtcdStore, EtcdStore
from dibs.stores.etcd._keys import parse_url
from etcd_fixtures import fresh_prefix
from eventually import eventually

SEAT = Unit("seat-14A", "show-42")


@pytest.fixture
def url(etcd_url: str) -> Iterator[str]:
    prefix = fresh_prefix()
    yield f"{etcd_url}/{prefix}"
    drop_etcd_prefix(etcd_url, prefix)


@pytest.fixture
def store(url: str) -> Iterator[EtcdStore]:
    with dibs.open(url) as opened:
        assert isinstance(opened, EtcdStore)
        yield opened


def _gateway(store: EtcdStore, path: str, body: dict[str, Any]) -> dict[str, Any]:
    answer: dict[str, Any] = httpx.post(
        f"http://{store.settings.endpoints[0]}{path}", json=body, timeout=10
    ).json()
    return answer


def _live_lease(store: EtcdStore, claim: dibs.Claim) -> int:
    key = store._ops.keys.live(claim.holder, claim.id)
    found = _gateway(store, "/v3/kv/range", {"key": base64.b64encode(key).decode()})
    (kv,) = found["kvs"]
    return int(kv.get("lease", 0))


def _lease_alive(store: EtcdStore, lease: int) -> bool:
    answer = _gateway(store, "/v3/lease/timetolive", {"ID": str(lease)})
    return int(answer.get("TTL", -1)) > 0


def _wait_until_free(store: EtcdStore, target: Unit) -> None:
    eventually(lambda: store.holder_of(target) is None, f"{target} is free")


# --- the URL ----------------------------------------------------------------------------------


def test_url_names_members_prefix_and_limits() -> None:
    settings = parse_url("etcd://a:1,b:2,[::1]:3/app/claims?timeout=2&max_txn_ops=64")
    assert settings.endpoints == ("a:1", "b:2", "[::1]:3")
    assert settings.prefix == "app/claims"
    assert settings.timeout == 2.0 and settings.max_txn_ops == 64
    assert parse_url("etcd://host").endpoints == ("host:2379",)
    assert parse_url("etcd://host:2379/").prefix == "dibs"


@pytest.mark.parametrize(
    "bad",
    [
        "etcd://",
        "etcd://host:port",
        "etcd://host:0",
        "etcd://a:1,,b:2",
        "etcd://h o:1",
        "etcd://h:1/p?timeout=0",
        "etcd://h:1/p?timeout=nan",
        "etcd://h:1/p?max_txn_ops=2",
        "etcd://h:1/p?colour=blue",
        "etcd://h:1/p%00x",
    ],
)
def test_bad_urls_are_invalid_input(bad: str) -> None:
    with pytest.raises(InvalidInput) as raised:
        dibs.open(bad)
    assert raised.value.value is not None


def test_no_member_answering_is_store_unavailable() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed once the block ends: nobody listens
    with pytest.raises(StoreUnavailable):
        dibs.open(f"etcd://127.0.0.1:{port}?connect_timeout=0.2&timeout=0.5")


def test_a_server_that_is_not_etcd_is_misconfigured() -> None:
    class NotEtcd(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            self.send_response(200)
            self.end_headers()
            self.wfile.write(b"hello")

        def log_message(self, *args: object) -> None:
            pass

    with http.server.ThreadingHTTPServer(("127.0.0.1", 0), NotEtcd) as server:
        threading.Thread(target=server.serve_forever, daemon=True).start()
        try:
            with pytest.raises(StoreMisconfigured):
                dibs.open(f"etcd://127.0.0.1:{server.server_address[1]}")
        finally:
            server.shutdown()


def test_async_face_is_the_native_twin(url: str) -> None:
    async def main() -> tuple[type, bool]:
        async with dibs.aio.open(url) as store:
            won = await store.claim(SEAT, holder="alice", ttl=30)
            return type(store), won.granted

    kind, granted = asyncio.run(main())
    assert kind is AsyncEtcdStore and granted


# --- round trips ------------------------------------------------------------------------------


class _Counting:
    def __init__(self, store: EtcdStore) -> None:
        self.calls: list[str] = []
        send = store._driver.send

        def counted(call: Any) -> Any:
            self.calls.append(call.path)
            return send(call)

        store._driver.send = counted  # type: ignore[method-assign]


def test_an_uncontended_hold_is_one_lease_grant_and_one_txn(store: EtcdStore) -> None:
    counting = _Counting(store)
    assert store.claim(SEAT, holder="alice", ttl=30, request_id="r-1")
    assert counting.calls == ["/v3/lease/grant", "/v3/kv/txn"]
    counting.calls.clear()
    assert store.claim([Unit("a"), Unit("b")], holder="bob")  # no TTL: no lease
    assert counting.calls == ["/v3/kv/txn"]


class _Wire:
    """Wraps a driver's transport: every request that reaches the wire, and its answer."""

    def __init__(self, real: Any) -> None:
        self.real = real
        self.requests: list[httpx.Request] = []
        self.responses: list[httpx.Response] = []

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        self.responses.append(self.real.handle_request(request))
        return self.responses[-1]

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        self.responses.append(await self.real.handle_async_request(request))
        return self.responses[-1]


def _one_request_per_call(wire: _Wire, calls: list[str], timeout: float) -> None:
    """Each plan call was one request on the wire, as a client would send it, read whole."""
    assert [r.url.path for r in wire.requests] == calls
    for request, response in zip(wire.requests, wire.responses, strict=True):
        assert request.method == "POST" and request.headers["content-type"] == "application/json"
        assert request.extensions["timeout"]["read"] == timeout
        assert response.is_closed and response.request is request  # its connection is free


@pytest.mark.parametrize("face", ["sync", "async"])
def test_every_call_is_one_request_on_the_transport(url: str, face: str) -> None:
    """The drivers hand requests straight to the client's transport: no extra request."""

    async def ops(store: Any, wire: _Wire, calls: list[str], awaited: bool) -> None:
        async def do(result: Any) -> Any:
            return await result if awaited else result

        won = await do(store.claim(SEAT, holder="alice", ttl=30))
        assert calls[:2] == ["/v3/lease/grant", "/v3/kv/txn"] and len(calls) == 2
        claim = won.claim
        assert (await do(store.get(claim.id))) == claim
        assert [c.id for c in await do(store.claims_of("alice"))] == [claim.id]
        await do(store.confirm(claim.id, holder="alice", fence=claim.fence))
        assert not await do(store.claim(SEAT, holder="bob"))
        assert await do(store.release(claim.id, holder="alice", fence=claim.fence))
        _one_request_per_call(wire, calls, store.settings.timeout)

    def counted(driver: Any) -> list[str]:
        calls: list[str] = []
        send = driver.send

        def counting(call: Any) -> Any:
            calls.append(call.path)
            return send(call)

        async def acounting(call: Any) -> Any:
            calls.append(call.path)
            return await send(call)

        driver.send = acounting if face == "async" else counting
        return calls

    if face == "sync":
        with dibs.open(url) as store:
            own = store._driver._own()
            own.transport = wire = _Wire(own.transport)
            asyncio.run(ops(store, wire, counted(store._driver), awaited=False))
        return

    async def main() -> None:
        async with dibs.aio.open(url) as store:
            driver = store._driver
            driver._transport = wire = _Wire(driver._pool())
            await ops(store, wire, counted(driver), awaited=True)

    asyncio.run(main())


def test_stores_and_threads_share_one_tls_context(
    url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Loading certificates costs tens of ms of CPU: no async store, no thread pays it again."""
    from dibs.stores.etcd import _wire

    made = _wire._ssl_context()
    built: list[object] = []
    real = ssl.create_default_context

    def counting(*args: Any, **kwargs: Any) -> ssl.SSLContext:
        built.append(args)
        return real(*args, **kwargs)

    monkeypatch.setattr(ssl, "create_default_context", counting)

    async def twice() -> None:
        for n in range(2):
            async with dibs.aio.open(url) as store:
                assert await store.claim(Unit("seat", f"a{n}"), holder="h")

    asyncio.run(twice())
    with dibs.open(url) as store:
        worker = threading.Thread(
            target=store.claim, args=(Unit("seat", "t"),), kwargs={"holder": "h"}
        )
        worker.start()
        worker.join()
        assert store.holder_of(Unit("seat", "t")) == "h"
    assert built == [] and _wire._ssl_context() is made


def test_limits_are_refused_before_sending(store: EtcdStore) -> None:
    counting = _Counting(store)
    # 128 writes: 125 units, the record, the live key, the request ID.
    most = [Unit("row", str(i)) for i in range(125)]
    assert store.claim(most, holder="alice", request_id="r")
    counting.calls.clear()
    with pytest.raises(InvalidInput) as raised:
        store.claim([*most, Unit("row", "x")], holder="bob", request_id="r2")
    assert raised.value.field == "targets" and raised.value.limit == 128  # type: ignore[attr-defined]
    assert "128" in str(raised.value)
    # Each resource with spans costs one write more (its guard).
    spans = [Span(f"room-{i}", 0, 1) for i in range(63)]
    with pytest.raises(InvalidInput):
        store.claim(spans, holder="bob", request_id="r3")
    # 1.5 MiB: long names that JSON escapes six-fold (control characters) fill a
    # transaction long before 125 targets do.
    long = [Unit("\x01" * 1024, f"{i}".rjust(1024, "\x02")) for i in range(120)]
    with pytest.raises(InvalidInput) as raised:
        store.claim(long, holder="bob")
    assert raised.value.limit == 1536 * 1024  # type: ignore[attr-defined]
    assert counting.calls == []


def test_limits_follow_the_url(url: str) -> None:
    with dibs.open(url + "?max_txn_ops=8") as small:
        assert small.claim([Unit("r", str(i)) for i in range(6)], holder="a")
        with pytest.raises(InvalidInput):
            small.claim([Unit("r", str(i)) for i in range(7)], holder="a")


# --- real leases ------------------------------------------------------------------------------


def test_a_hold_is_a_lease_of_whole_seconds_at_least_two(store: EtcdStore) -> None:
    # The lease runs a second past expires_at: room for the grant's round trips.
    claim = store.claim(SEAT, holder="alice", ttl=0.25).claim
    assert claim is not None and claim.expires_at is not None
    assert (claim.expires_at - claim.created_at).total_seconds() == 2
    ttl = _gateway(store, "/v3/lease/timetolive", {"ID": str(_live_lease(store, claim))})
    assert int(ttl["grantedTTL"]) == 3
    longer = store.claim(seat_b := Unit("seat-14B", "show-42"), holder="bob", ttl=2.5).claim
    assert longer is not None and longer.expires_at is not None
    assert (longer.expires_at - longer.created_at).total_seconds() == 3
    assert store.holder_of(seat_b) == "bob"


def test_an_expired_lease_frees_the_unit_and_the_hold_is_taken_over(store: EtcdStore) -> None:
    hold = store.claim([SEAT, Span("room", 0, 10)], holder="alice", ttl=2).claim
    assert hold is not None
    assert not store.claim(SEAT, holder="bob")
    _wait_until_free(store, SEAT)
    with pytest.raises(HoldLost) as raised:
        store.confirm(hold.id, holder="alice", fence=hold.fence)
    assert raised.value.reason is HoldLostReason.EXPIRED
    taker = store.claim(Span("room", 5, 6), holder="bob").claim
    assert taker is not None and taker.fence > hold.fence
    with pytest.raises(HoldLost) as raised:
        store.extend(hold.id, holder="alice", fence=hold.fence, ttl=5)
    assert raised.value.reason is HoldLostReason.TAKEN_OVER
    dead = store.get(hold.id)
    assert dead is not None and dead.state is ClaimState.EXPIRED and dead.taken_over
    assert store.claim(SEAT, holder="carol")


def test_extend_moves_the_hold_to_a_new_lease_and_confirm_drops_it(store: EtcdStore) -> None:
    claim = store.claim(SEAT, holder="alice", ttl=30).claim
    assert claim is not None
    first = _live_lease(store, claim)
    extended = store.extend(claim.id, holder="alice", fence=claim.fence, ttl=60)
    second = _live_lease(store, claim)
    assert second not in (0, first) and extended.fence == claim.fence
    assert not _lease_alive(store, first) and _lease_alive(store, second)
    confirmed = store.confirm(claim.id, holder="alice", fence=claim.fence)
    assert confirmed.state is ClaimState.CONFIRMED
    assert _live_lease(store, claim) == 0 and not _lease_alive(store, second)
    assert store.release(claim.id, holder="alice", fence=claim.fence)
    assert store.holder_of(SEAT) is None


def test_sweep_marks_a_lapsed_lease_expired(store: EtcdStore) -> None:
    hold = store.claim(SEAT, holder="alice", ttl=2).claim
    assert hold is not None
    _wait_until_free(store, SEAT)
    assert store.sweep().expired == 1
    assert store.sweep().expired == 0
    log = store.claim_log()
    assert log is not None
    (stored,) = log.claims()
    assert stored.state is ClaimState.EXPIRED and not stored.taken_over


def test_change_feed_moves_on_a_claim(store: EtcdStore) -> None:
    feed = store.change_feed()
    before = feed.read()
    assert feed.read() == before
    store.claim(SEAT, holder="alice")
    assert feed.read() != before


def test_racing_span_claims_never_overlap(store: EtcdStore) -> None:
    """12 threads book random stretches of one resource; granted spans never overlap.

    The guard key is what serializes span grants on a resource (docs/stores.md).
    """
    granted: list[Span] = []
    lock = threading.Lock()  # guards granted
    barrier = threading.Barrier(12)

    def run(n: int) -> None:
        rng = random.Random(n)
        barrier.wait()
        for _ in range(25):
            start = rng.randrange(0, 200)
            span = Span("hall", start, start + rng.randrange(1, 6))
            result = store.claim(span, holder=f"t{n}")
            if result and not result.replayed:  # a thread may re-book its own stretch
                with lock:
                    granted.append(span)

    threads = [threading.Thread(target=run, args=(n,)) for n in range(12)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert granted
    ordered = sorted(granted, key=lambda s: s.start)
    for a, b in itertools.pairwise(ordered):
        assert not a.overlaps(b), (a, b)


def test_a_big_claim_taking_over_many_dead_holds_marks_every_one(url: str) -> None:
    """More takeovers than fit beside 120 units in one transaction are marked right after."""
    clock = dibs.FakeClock()
    with dibs.open(url, clock=clock) as store:
        units = [Unit("row", str(i)) for i in range(120)]
        holds = [store.claim(u, holder=f"h{i}", ttl=10).claim for i, u in enumerate(units[:60])]
        clock.advance(11)
        big = store.claim(units, holder="bus", request_id="bus-1")
        assert big and big.claim is not None
        for hold in holds:
            assert hold is not None
            with pytest.raises(HoldLost) as raised:
                store.confirm(hold.id, holder=hold.holder, fence=hold.fence)
            assert raised.value.reason is HoldLostReason.TAKEN_OVER
        assert store.sweep().expired == 0


def test_many_threads_on_one_store_never_see_a_pooled_connection_closed_under_them(
    store: EtcdStore, fine_switching: None
) -> None:
    # With one client shared by every thread, httpcore's pool pass in one thread saw
    # another's connection as idle, then its socket readable (the answer arriving) and
    # closed it under that thread: "Bad file descriptor", a write with an unknown outcome
    # on a healthy cluster. Each thread has its own client now; every claim must decide.
    threads_n, rounds = 50, 40
    failures: list[BaseException] = []

    def worker(w: int) -> None:
        try:
            for r in range(rounds):
                assert store.claim(Unit(f"t{w}", f"r{r}"), holder=f"h{w}", request_id=f"{w}-{r}")
        except BaseException as exc:
            failures.append(exc)

    threads = [threading.Thread(target=worker, args=(w,)) for w in range(threads_n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not failures, failures[:3]


_FD_SCRIPT = textwrap.dedent(
    """
    import resource, sys, threading
    import dibs
    from dibs import Unit

    resource.setrlimit(resource.RLIMIT_NOFILE, (256, 256))
    store = dibs.open(sys.argv[1])
    errors = []

    def work(n):
        try:
            assert store.claim(Unit("seat", str(n)), holder="h")
        except BaseException as exc:
            errors.append(exc)

    for wave in range(20):  # 1,000 short-lived threads, 50 at a time
        threads = [threading.Thread(target=work, args=(wave * 50 + k,)) for k in range(50)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert not errors, errors[0]
    store.close()
    print("ok")
    """
)


def test_a_thousand_short_lived_threads_fit_under_256_descriptors(url: str) -> None:
    # Each thread has its own client (and connection): one that ends must close it, or
    # 1,000 threads need 1,000 descriptors.
    out = subprocess.run(
        [sys.executable, "-c", _FD_SCRIPT, url],
        capture_output=True, text=True, timeout=200, check=False,
    )  # fmt: skip
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-2000:]


def test_closing_the_store_closes_every_threads_client(store: EtcdStore) -> None:
    clients: list[httpx.Client] = []
    ready = threading.Barrier(4)
    closed = threading.Event()

    def work(n: int) -> None:
        assert store.claim(Unit("seat", str(n)), holder="h")
        clients.append(store._driver._http())
        ready.wait()
        closed.wait()  # alive while the store closes: its client must close anyway

    threads = [threading.Thread(target=work, args=(n,)) for n in range(3)]
    for t in threads:
        t.start()
    ready.wait()
    assert len({id(c) for c in clients}) == 3  # one client per thread
    assert not any(c.is_closed for c in clients)
    store.close()
    try:
        assert all(c.is_closed for c in clients)
    finally:
        closed.set()
        for t in threads:
            t.join()


def test_a_forked_child_uses_its_own_client_and_leaves_the_parents_alone(store: EtcdStore) -> None:
    assert store.claim(Unit("seat", "parent-1"), holder="parent")
    parents = store._driver._http()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        code = 1
        try:
            mine = store._driver._http()
            ok = mine is not parents and bool(store.claim(Unit("seat", "child"), holder="c"))
            store.close()  # closes the child's client, not the parent's sockets
            code = 0 if ok else 1
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert store._driver._http() is parents and not parents.is_closed
    assert store.claim(Unit("seat", "parent-2"), holder="parent")
    assert store.holder_of(Unit("seat", "child")) == "c"


def _writes_between_round_trips(
    monkeypatch: pytest.MonkeyPatch, store: EtcdStore | AsyncEtcdStore, writes: Any
) -> None:
    """After a read's first round trip, run ``writes`` (sync, or awaited on the async
    store) before its next: what another client may do while the read is on the wire."""
    real = store._driver.send
    armed = [True]

    def fire() -> bool:
        was, armed[0] = armed[0], False
        return was

    if isinstance(store, EtcdStore):

        def send(call: Any) -> Any:
            answer = real(call)
            if fire():
                writes()
            return answer

    else:

        async def send(call: Any) -> Any:  # type: ignore[misc]
            answer = await real(call)  # type: ignore[misc]
            if fire():
                await writes()
            return answer

    monkeypatch.setattr(store._driver, "send", send)


def test_holder_of_a_span_reads_its_claims_at_one_revision(
    store: EtcdStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    # bob's [2, 4) is granted before alice's [0, 2) is released: [0, 4) is held
    # throughout. Read at a later revision, alice's claim (the one candidate the
    # span list showed) was gone, and the answer None fit no moment.
    a = store.claim(Span("s", 0, 2), holder="alice").claim
    assert a is not None

    def writes() -> None:
        assert store.claim(Span("s", 2, 4), holder="bob").granted
        assert store.release(a.id, holder="alice", fence=a.fence)

    _writes_between_round_trips(monkeypatch, store, writes)
    assert store.holder_of(Span("s", 0, 4)) in ("alice", "bob")


def test_claims_of_reads_its_claims_at_one_revision(
    store: EtcdStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    a = store.claim(Unit("r", "1"), holder="c0").claim
    assert a is not None

    def writes() -> None:
        assert store.claim(Unit("r", "2"), holder="c0").granted
        assert store.release(a.id, holder="c0", fence=a.fence)

    _writes_between_round_trips(monkeypatch, store, writes)
    assert store.claims_of("c0") != []  # c0 held r/1, r/2 or both at every moment


def test_async_reads_answer_for_one_revision(url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    async def main() -> None:
        async with dibs.aio.open(url) as store:
            assert isinstance(store, AsyncEtcdStore)
            a = (await store.claim(Span("s", 0, 2), holder="alice")).claim
            c = (await store.claim(Unit("r", "1"), holder="c0")).claim
            assert a is not None and c is not None

            async def span_writes() -> None:
                assert (await store.claim(Span("s", 2, 4), holder="bob")).granted
                assert await store.release(a.id, holder="alice", fence=a.fence)

            _writes_between_round_trips(monkeypatch, store, span_writes)
            assert await store.holder_of(Span("s", 0, 4)) in ("alice", "bob")

            async def unit_writes() -> None:
                assert (await store.claim(Unit("r", "2"), holder="c0")).granted
                assert await store.release(c.id, holder="c0", fence=c.fence)

            _writes_between_round_trips(monkeypatch, store, unit_writes)
            assert await store.claims_of("c0") != []

    asyncio.run(main())
