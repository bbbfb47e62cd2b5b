"""Semaphores and rate limits over HTTP, on every store: statuses, replays, and races.

The semaphore race counts holders from each grant's answer until before its
release is sent, which lies inside the hold's life in the store, so a count
past ``permits`` is a breach (as tests/patterns/test_semaphore.py counts). The
rate race checks the decisions on the store's clock: an admission's ``at`` is
its claim's ``created_at``, so no window ``[t, t + w)`` starting at one holds
more than the limit (as tests/patterns/test_ratelimit.py does). No reading of
wall time, no threshold drawn from timing.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path

import httpx
import pytest

from dibs.service import KeyRing, ServiceConfig
from service_support import Running, serve_in_thread

pytestmark = pytest.mark.timeout(180)

PERMIT = {"ttl": 60}


@pytest.fixture
def svc(aio_url: str) -> Iterator[Running]:
    # The races here check who gets what, not how fast: a store slowed by a loaded
    # machine (aio-etcd at a load average of 20+) must not turn calls into 503s.
    config = ServiceConfig(
        store_url=aio_url, keys_file=None, rate=10_000, burst=10_000, request_timeout=120
    )
    with serve_in_thread(config) as running:
        yield running


def _micros(text: str) -> int:
    moment = datetime.fromisoformat(text)
    return int(moment.timestamp()) * 1_000_000 + moment.microsecond


def test_a_semaphore_admits_its_permits_then_answers_409(svc: Running) -> None:
    with svc.client("alice") as a, svc.client("bob") as b:
        missing = a.post("/v1/semaphores/pay/permits", json=PERMIT)
        assert missing.status_code == 404 and missing.json()["error"] == "not_found"
        assert a.get("/v1/semaphores/pay").status_code == 404
        put = a.put("/v1/semaphores/pay", json={"permits": 2})
        assert put.json() == {"snapshot": True, "name": "pay", "permits": 2, "held": 0, "yours": 0}
        first = a.post("/v1/semaphores/pay/permits", json=PERMIT)
        second = b.post("/v1/semaphores/pay/permits", json=PERMIT)
        assert first.status_code == second.status_code == 201, (first.text, second.text)
        assert {first.json()["slot"], second.json()["slot"]} == {0, 1}
        assert first.json()["permits"] == 2 and first.json()["claim"]["state"] == "held"
        assert first.headers["location"] == f"/v1/claims/{first.json()['claim']['id']}"
        full = b.post("/v1/semaphores/pay/permits", json={"ttl": 60, "wait": 0.05})
        assert full.status_code == 409, full.text
        assert full.json()["error"] == "no_permit" and full.json()["permits"] == 2
        view = b.get("/v1/semaphores/pay").json()
        assert (view["held"], view["yours"]) == (2, 1) and "alice" not in str(view)
        # The permit is a hold: extend it and release it through its claim, fenced.
        claim = first.json()["claim"]
        extended = a.post(
            f"/v1/claims/{claim['id']}/extend", json={"fence": claim["fence"], "ttl": 120}
        )
        assert extended.status_code == 200 and extended.json()["fence"] == claim["fence"]
        stale = a.post(f"/v1/claims/{claim['id']}/extend", json={"fence": 1, "ttl": 1})
        assert stale.status_code == 409 and stale.json()["reason"] == "fence"
        assert b.delete(f"/v1/claims/{claim['id']}?fence={claim['fence']}").status_code == 404
        gone = a.delete(f"/v1/claims/{claim['id']}?fence={claim['fence']}")
        assert gone.status_code == 200 and gone.json()["released"] is True
        again = b.post("/v1/semaphores/pay/permits", json=PERMIT)
        assert again.status_code == 201 and again.json()["slot"] == first.json()["slot"]
        assert b.get("/v1/semaphores/pay").json()["yours"] == 2
        # No client reaches the semaphore's units through the claims route.
        direct = a.post(
            "/v1/claims", json={"targets": [{"resource": "dibs.semaphore:pay", "slot": "0"}]}
        )
        assert direct.status_code == 400 and direct.json()["field"] == "targets[0].resource"


def test_a_lowered_limit_admits_no_one_until_the_count_is_below_it(svc: Running) -> None:
    with svc.client("carol") as c:
        c.put("/v1/semaphores/low", json={"permits": 3})
        held = [c.post("/v1/semaphores/low/permits", json=PERMIT).json()["claim"] for _ in range(3)]
        lowered = c.put("/v1/semaphores/low", json={"permits": 1})
        assert (lowered.json()["permits"], lowered.json()["held"]) == (1, 3)
        for claim in held:
            refused = c.post("/v1/semaphores/low/permits", json=PERMIT)
            assert refused.status_code == 409 and refused.json()["permits"] == 1
            c.delete(f"/v1/claims/{claim['id']}?fence={claim['fence']}")
        admitted = c.post("/v1/semaphores/low/permits", json=PERMIT)
        assert admitted.status_code == 201 and admitted.json()["slot"] == 0
        assert c.put("/v1/semaphores/low", json={"permits": 0}).json()["held"] == 1


def test_a_keyed_permit_replays_while_it_lives(svc: Running) -> None:
    key = {"Idempotency-Key": '"job-7"'}
    with svc.client("dave") as d, svc.client("erin") as e:
        d.put("/v1/semaphores/jobs", json={"permits": 2})
        first = d.post("/v1/semaphores/jobs/permits", json=PERMIT, headers=key)
        assert first.status_code == 201 and "idempotent-replayed" not in first.headers
        for _ in range(3):
            again = d.post("/v1/semaphores/jobs/permits", json=PERMIT, headers=key)
            assert again.status_code == 201 and again.headers["idempotent-replayed"] == "true"
            assert again.json()["claim"]["id"] == first.json()["claim"]["id"]
        assert d.get("/v1/semaphores/jobs").json()["held"] == 1
        other = d.post("/v1/semaphores/jobs/permits", json={"ttl": 61}, headers=key)
        assert other.status_code == 422 and other.json()["error"] == "idempotency_key_reused"
        # Erin's "job-7" is another request.
        theirs = e.post("/v1/semaphores/jobs/permits", json=PERMIT, headers=key)
        assert theirs.status_code == 201 and "idempotent-replayed" not in theirs.headers
        assert theirs.json()["slot"] != first.json()["slot"]


def test_bad_input_names_the_field(svc: Running) -> None:
    with svc.client("frank") as f:
        f.put("/v1/semaphores/s", json={"permits": 1})
        for body, field in [
            ({}, "ttl"),
            ({"ttl": 0}, "ttl"),
            ({"ttl": "5"}, "ttl"),
            ({"ttl": 5, "wait": -1}, "wait"),
            ({"ttl": 5, "wait": 61}, "wait"),
            ({"ttl": 5, "permits": 3}, "permits"),
            ({"ttl": 5, "holder": "mallory"}, "holder"),
        ]:
            r = f.post("/v1/semaphores/s/permits", json=body)
            assert r.status_code == 400 and r.json()["field"] == field, (body, r.text)
        for body, field in [
            ({}, "permits"),
            ({"permits": -1}, "permits"),
            ({"permits": 257}, "permits"),
            ({"permits": 2.0}, "permits"),
            ({"permits": True}, "permits"),
        ]:
            r = f.put("/v1/semaphores/s", json=body)
            assert r.status_code == 400 and r.json()["field"] == field, (body, r.text)
        for body, field in [
            ({}, "rate"),
            ({"rate": "10"}, "rate"),
            ({"rate": "10/fortnight"}, "rate"),
            ({"rate": "0/s"}, "rate"),
            ({"rate": "10001/s"}, "rate"),
            ({"rate": "1/0s"}, "rate"),
            ({"rate": 10}, "rate"),
            ({"rate": "3/s", "cost": 4}, "cost"),
            ({"rate": "3/s", "cost": 0}, "cost"),
            ({"rate": "3/s", "cost": 1.0}, "cost"),
            ({"rate": "3/s", "key": "x"}, "key"),
        ]:
            r = f.post("/v1/rate-limits/api/acquire", json=body)
            assert r.status_code == 400 and r.json()["field"] == field, (body, r.text)
        keyed = f.post(
            "/v1/rate-limits/api/acquire", json={"rate": "3/s"}, headers={"Idempotency-Key": "k"}
        )
        assert keyed.status_code == 400 and keyed.json()["field"] == "Idempotency-Key"
        long = "k" * 201
        assert f.get(f"/v1/semaphores/{long}").json()["field"] == "key"
    with httpx.Client(base_url=svc.url) as anon:
        for method, path in [
            ("GET", "/v1/semaphores/s"),
            ("PUT", "/v1/semaphores/s"),
            ("POST", "/v1/semaphores/s/permits"),
            ("POST", "/v1/rate-limits/api/acquire"),
        ]:
            assert anon.request(method, path).status_code == 401, path


def test_a_rate_limit_admits_its_limit_then_answers_429(svc: Running) -> None:
    with svc.client("gina") as g, svc.client("hank") as h:
        body = {"rate": "3/60s"}
        admitted = [g.post("/v1/rate-limits/geo/acquire", json=body) for _ in range(2)]
        admitted.append(h.post("/v1/rate-limits/geo/acquire", json=body))
        for r in admitted:
            assert r.status_code == 200, r.text
            assert r.json()["allowed"] is True and r.json()["rate"] == "3/60s"
        assert [r.json()["cost"] for r in admitted] == [1, 1, 1]
        refused = h.post("/v1/rate-limits/geo/acquire", json=body)
        assert refused.status_code == 429 and refused.json()["error"] == "over_limit"
        retry_after = refused.json()["retry_after"]
        assert 0 < retry_after <= 60
        # RFC 9110: whole seconds, rounded up from the exact figure.
        assert int(refused.headers["retry-after"]) == -int(-retry_after // 1)
        # The limit is the key and the rate: another rate on the key is another limit.
        other = g.post("/v1/rate-limits/geo/acquire", json={"rate": "2/60s", "cost": 2})
        assert other.status_code == 200 and other.json()["rate"] == "2/60s"
        assert g.post("/v1/rate-limits/geo2/acquire", json=body).status_code == 200


def test_racing_clients_never_hold_more_than_the_permits(svc: Running) -> None:
    permits, clients, rounds = 3, 12, 6
    active, peak, granted, refused = 0, 0, 0, 0
    breaches: list[int] = []
    lock = threading.Lock()
    with svc.client("setup") as s:
        assert s.put("/v1/semaphores/race", json={"permits": permits}).status_code == 200
    start = threading.Barrier(clients)

    def client(i: int) -> None:
        nonlocal active, peak, granted, refused
        with svc.client(f"worker-{i % 4}") as c:
            start.wait()
            for _ in range(rounds):
                r = c.post("/v1/semaphores/race/permits", json={"ttl": 120, "wait": 2})
                if r.status_code == 409:
                    with lock:
                        refused += 1
                    continue
                assert r.status_code == 201, r.text
                # Counted from the grant's answer to before the release is sent: inside
                # the hold's life in the store, so more than `permits` here is a breach.
                with lock:
                    active += 1
                    granted += 1
                    peak = max(peak, active)
                    if active > permits:
                        breaches.append(active)
                claim = r.json()["claim"]
                held = c.post(  # hold it a little longer, fenced, as a client would
                    f"/v1/claims/{claim['id']}/extend", json={"fence": claim["fence"], "ttl": 120}
                )
                assert held.status_code == 200, held.text
                with lock:
                    active -= 1
                gone = c.delete(f"/v1/claims/{claim['id']}?fence={claim['fence']}")
                assert gone.status_code == 200 and gone.json()["released"], gone.text

    threads = [threading.Thread(target=client, args=(i,)) for i in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert granted + refused == clients * rounds and granted > permits
    assert not breaches, f"{max(breaches)} permits held at once, limit {permits}"
    with svc.client("setup") as s:
        assert s.get("/v1/semaphores/race").json()["held"] == 0


def test_racing_clients_never_exceed_the_rate_in_any_window(svc: Running) -> None:
    limit, window_us, clients, calls = 3, 2_000_000, 12, 12
    admitted: list[tuple[int, int]] = []
    refused = 0
    lock = threading.Lock()
    start = threading.Barrier(clients)

    def client(i: int) -> None:
        nonlocal refused
        with svc.client(f"caller-{i % 4}") as c:
            start.wait()
            for n in range(calls):
                cost = 1 + (i + n) % 2
                r = c.post("/v1/rate-limits/race/acquire", json={"rate": "3/2s", "cost": cost})
                with lock:
                    if r.status_code == 429:
                        assert r.json()["retry_after"] > 0
                        refused += 1
                    else:
                        assert r.status_code == 200, r.text
                        admitted.append((_micros(r.json()["at"]), cost))

    threads = [threading.Thread(target=client, args=(i,)) for i in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert refused > 0 and admitted  # the limit was full at least once
    rows = sorted(admitted)
    for i, (begin, _) in enumerate(rows):
        # Every window that could hold the most starts at an admission.
        inside = sum(cost for at, cost in rows[i:] if at < begin + window_us)
        assert inside <= limit, f"{inside} units admitted in [{begin}, {begin + window_us}) µs"


def test_two_instances_share_a_semaphore_and_its_permits_ids(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'dibs.db'}"
    keys = KeyRing(None)
    config = ServiceConfig(store_url=url, keys_file=None)
    with (
        serve_in_thread(config, keys=keys) as one,
        serve_in_thread(config, keys=keys) as two,
        one.client("ivy") as a,
        two.client("ivy") as b,
    ):
        assert a.put("/v1/semaphores/shared", json={"permits": 1}).status_code == 200
        permit = a.post("/v1/semaphores/shared/permits", json=PERMIT).json()["claim"]
        assert b.post("/v1/semaphores/shared/permits", json=PERMIT).status_code == 409
        # The other instance reads the same opaque claim ID: extend and release there.
        body = {"fence": permit["fence"], "ttl": 90}
        assert b.post(f"/v1/claims/{permit['id']}/extend", json=body).status_code == 200
        assert b.get("/v1/semaphores/shared").json()["held"] == 1
        gone = b.delete(f"/v1/claims/{permit['id']}?fence={permit['fence']}")
        assert gone.json()["released"] is True
        assert a.post("/v1/semaphores/shared/permits", json=PERMIT).status_code == 201
