"""API contract: every status the service promises, over HTTP on loopback.

One server per test module where state does not matter (each test uses its
own holders and resources); servers of their own for clocks, gates and limits.
"""

from __future__ import annotations

import json
import logging
import socket
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from openapi_spec_validator import validate
from starlette.routing import Route

import dibs
from dibs import FakeClock, Unit
from dibs.service import KeyRing, ServiceConfig, Showing, create_app
from dibs.stores.memory import MemoryStore
from eventually import eventually
from service_support import GatedStore, Running, serve_in_thread

pytestmark = pytest.mark.timeout(60)

SHOW = "show-1"


def seat(name: str, slot: str = SHOW) -> dict[str, str]:
    return {"resource": name, "slot": slot}


def idem() -> dict[str, str]:
    return {"Idempotency-Key": f'"{uuid.uuid4()}"'}


@pytest.fixture(scope="module")
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture(scope="module")
def svc(clock: FakeClock) -> Iterator[Running]:
    store = MemoryStore(clock=clock)
    config = ServiceConfig(store_url="memory://", keys_file=None, showings=(Showing(SHOW, 4, 6),))
    with serve_in_thread(config, store=store) as running:
        yield running


def hold(c: httpx.Client, *targets: dict[str, Any], ttl: float | None = 60) -> dict[str, Any]:
    r = c.post("/v1/claims", json={"targets": list(targets), "ttl": ttl}, headers=idem())
    assert r.status_code == 201, r.text
    doc: dict[str, Any] = r.json()
    return doc


# --- POST /v1/claims ---------------------------------------------------------------------------


def test_claim_201_with_claim_location_and_fence(svc: Running) -> None:
    with svc.client("alice") as c:
        r = c.post("/v1/claims", json={"targets": [seat("c1")], "ttl": 30}, headers=idem())
    assert r.status_code == 201
    doc = r.json()
    assert doc["holder"] == "alice" and doc["state"] == "held" and doc["fence"] >= 1
    assert doc["targets"] == [seat("c1")]
    assert r.headers["location"] == f"/v1/claims/{doc['id']}"
    assert r.headers["x-request-id"]


def test_claim_without_ttl_is_confirmed(svc: Running) -> None:
    with svc.client("alice") as c:
        doc = hold(c, seat("c2"), ttl=None)
    assert doc["state"] == "confirmed" and doc["expires_at"] is None


def test_claim_lost_409_lists_taken_but_never_the_holder(svc: Running) -> None:
    with svc.client("alice") as a, svc.client("bob") as b:
        hold(a, seat("c3"))
        r = b.post("/v1/claims", json={"targets": [seat("c3"), seat("c4")], "ttl": 30})
    assert r.status_code == 409
    doc = r.json()
    assert doc["error"] == "taken" and doc["taken"] == [seat("c3")]
    assert "alice" not in r.text
    with svc.client("bob") as b:  # all-or-nothing: c4 was not taken by the losing claim
        hold(b, seat("c4"))


def test_idempotency_key_replays_and_422_on_other_body(svc: Running) -> None:
    key = {"Idempotency-Key": '"checkout-1"'}
    body = {"targets": [seat("c5")], "ttl": 30}
    with svc.client("alice") as c:
        first = c.post("/v1/claims", json=body, headers=key)
        again = c.post("/v1/claims", json=body, headers=key)
        other = c.post("/v1/claims", json={"targets": [seat("c6")], "ttl": 30}, headers=key)
    assert first.status_code == again.status_code == 201
    assert again.json()["id"] == first.json()["id"]
    assert again.headers["idempotent-replayed"] == "true"
    assert "idempotent-replayed" not in first.headers
    assert first.json()["idempotency_key"] == "checkout-1"
    assert other.status_code == 422 and other.json()["error"] == "idempotency_key_reused"


def test_a_lost_claim_replays_as_lost(svc: Running) -> None:
    with svc.client("alice") as a, svc.client("bob") as b:
        hold(a, seat("c7"))
        key = {"Idempotency-Key": '"bob-try"'}
        body = {"targets": [seat("c7")], "ttl": 30}
        assert b.post("/v1/claims", json=body, headers=key).status_code == 409
        claim = next(
            c for c in a.get("/v1/claims").json()["claims"] if c["targets"] == [seat("c7")]
        )
        a.delete(f"/v1/claims/{claim['id']}", params={"fence": claim["fence"]})
        replay = b.post("/v1/claims", json=body, headers=key)
    assert replay.status_code == 409 and replay.headers["idempotent-replayed"] == "true"


def test_same_key_different_holders_never_collide(svc: Running) -> None:
    key = {"Idempotency-Key": '"shared-key"'}
    with svc.client("alice") as a, svc.client("bob") as b:
        ra = a.post("/v1/claims", json={"targets": [seat("c8")], "ttl": 30}, headers=key)
        rb = b.post("/v1/claims", json={"targets": [seat("c9")], "ttl": 30}, headers=key)
    assert ra.status_code == rb.status_code == 201
    assert ra.json()["holder"] == "alice" and rb.json()["holder"] == "bob"
    assert ra.json()["idempotency_key"] == rb.json()["idempotency_key"] == "shared-key"


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({}, "targets"),
        ({"targets": []}, "targets"),
        ({"targets": "seat"}, "targets"),
        ({"targets": [{"slot": "x"}]}, "targets[0].resource"),
        ({"targets": [{"resource": ""}]}, "targets[0].resource"),
        ({"targets": [{"resource": "a\u0000"}]}, "targets[0].resource"),
        ({"targets": [{"resource": "a", "slot": 5}]}, "targets[0].slot"),
        ({"targets": [{"resource": "a", "seat": "x"}]}, "targets[0].seat"),
        ({"targets": [{"resource": "r", "start": 5, "end": 1}]}, "targets[0].end"),
        (
            {"targets": [{"resource": "r", "start": "2026-01-01T00:00", "end": 3}]},
            "targets[0].start",
        ),
        ({"targets": [{"resource": "r", "start": 1, "end": 2, "slot": ""}]}, "targets[0].slot"),
        ({"targets": [seat("x")], "ttl": 0}, "ttl"),
        ({"targets": [seat("x")], "ttl": -1}, "ttl"),
        ({"targets": [seat("x")], "ttl": True}, "ttl"),
        ({"targets": [seat("x")], "ttl": "60"}, "ttl"),
        ({"targets": [seat("x")], "ttl": 1e300}, "ttl"),
        ({"targets": [seat("x")], "holder": "mallory"}, "holder"),
        ({"targets": [seat("x")] * 101}, "targets"),
    ],
)
def test_claim_400_names_the_bad_field(svc: Running, body: dict[str, Any], field: str) -> None:
    with svc.client("alice") as c:
        r = c.post("/v1/claims", json=body)
    assert r.status_code == 400, r.text
    assert r.json()["error"] == "invalid" and r.json()["field"] == field


@pytest.mark.parametrize("raw", [b"{", b"[1]", b'"x"', b"\xff"])
def test_claim_400_for_a_body_that_is_not_a_json_object(svc: Running, raw: bytes) -> None:
    with svc.client("alice") as c:
        r = c.post("/v1/claims", content=raw, headers={"Content-Type": "application/json"})
    assert r.status_code == 400 and r.json()["field"] == "body"


@pytest.mark.parametrize("header", ['""', '"unterminated', "two words", '"' + "k" * 300 + '"'])
def test_claim_400_for_a_bad_idempotency_key(svc: Running, header: str) -> None:
    with svc.client("alice") as c:
        r = c.post("/v1/claims", json={"targets": [seat("x")]}, headers={"Idempotency-Key": header})
    assert r.status_code == 400 and r.json()["field"] == "Idempotency-Key"


def test_a_bare_token_idempotency_key_is_accepted(svc: Running) -> None:
    with svc.client("alice") as c:
        r = c.post(
            "/v1/claims",
            json={"targets": [seat("c10")]},
            headers={"Idempotency-Key": "bare-token-1"},
        )
    assert r.status_code == 201 and r.json()["idempotency_key"] == "bare-token-1"


def test_spans_with_numbers_and_times(svc: Running) -> None:
    room = {"resource": "room-7", "start": "2026-12-03T14:00:00Z", "end": "2026-12-03T16:00:00Z"}
    with svc.client("alice") as a, svc.client("bob") as b:
        doc = hold(a, room)
        assert doc["targets"] == [room]
        overlap = {**room, "start": "2026-12-03T15:00:00+01:00", "end": "2026-12-03T18:00:00Z"}
        lost = b.post("/v1/claims", json={"targets": [overlap]})
        in_utc = {**overlap, "start": "2026-12-03T14:00:00Z"}  # spans are instants, kept in UTC
        assert lost.status_code == 409 and lost.json()["taken"] == [in_utc]
        hold(b, {"resource": "room-8", "start": 1, "end": 2.5})


# --- one claim's life -------------------------------------------------------------------------


def test_confirm_extend_get_release(svc: Running) -> None:
    with svc.client("alice") as c:
        doc = hold(c, seat("l1"), ttl=30)
        cid, fence = doc["id"], doc["fence"]
        r = c.post(f"/v1/claims/{cid}/extend", json={"fence": fence, "ttl": 90})
        assert r.status_code == 200 and r.json()["expires_at"] > doc["expires_at"]
        r = c.post(f"/v1/claims/{cid}/confirm", json={"fence": fence})
        assert r.status_code == 200 and r.json()["state"] == "confirmed"
        assert c.post(f"/v1/claims/{cid}/confirm", json={"fence": fence}).status_code == 200
        got = c.get(f"/v1/claims/{cid}")
        assert got.status_code == 200 and got.json()["state"] == "confirmed"
        listed = c.get("/v1/claims", params={"holder": "me"}).json()
        assert listed["snapshot"] is True and cid in {x["id"] for x in listed["claims"]}
        r = c.request("DELETE", f"/v1/claims/{cid}", json={"fence": fence})
        assert r.status_code == 200 and r.json()["released"] is True
        assert r.json()["claim"]["state"] == "released"
        again = c.delete(f"/v1/claims/{cid}", params={"fence": fence})
        assert again.status_code == 200 and again.json()["released"] is False


def test_hold_lost_409_with_reason(svc: Running, clock: FakeClock) -> None:
    with svc.client("alice") as a, svc.client("bob") as b:
        doc = hold(a, seat("l2"), ttl=5)
        cid, fence = doc["id"], doc["fence"]
        stale = a.post(f"/v1/claims/{cid}/confirm", json={"fence": fence + 1000})
        assert stale.status_code == 409
        problem = {"type", "title", "status", "detail"}
        assert {k: v for k, v in stale.json().items() if k not in problem} | {"message": ""} == {
            "error": "hold_lost", "reason": "fence", "message": "",
        }  # fmt: skip
        clock.advance(6)
        expired = a.post(f"/v1/claims/{cid}/extend", json={"fence": fence, "ttl": 30})
        assert expired.status_code == 409 and expired.json()["reason"] == "expired"
        hold(b, seat("l2"))  # takes the dead hold over
        late = a.post(f"/v1/claims/{cid}/confirm", json={"fence": fence})
        assert late.status_code == 409 and late.json()["reason"] == "taken_over"


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("confirm", {}),
        ("confirm", {"fence": 0}),
        ("confirm", {"fence": "x"}),
        ("confirm", {"fence": 2**70}),
        ("confirm", {"fence": 1, "extra": 1}),
        ("extend", {"fence": 1}),
        ("extend", {"fence": 1, "ttl": 0}),
    ],
)
def test_fence_and_ttl_400(svc: Running, path: str, body: dict[str, Any]) -> None:
    with svc.client("alice") as c:
        cid = hold(c, seat(f"f-{path}-{len(body)}-{uuid.uuid4().hex[:6]}"))["id"]
        r = c.post(f"/v1/claims/{cid}/{path}", json=body)
    assert r.status_code == 400 and r.json()["error"] == "invalid"


def test_404_for_unknown_claims(svc: Running) -> None:
    with svc.client("alice") as c:
        for method, path, body in [
            ("GET", "/v1/claims/nope", None),
            ("POST", "/v1/claims/nope/confirm", {"fence": 1}),
            ("POST", "/v1/claims/nope/extend", {"fence": 1, "ttl": 5}),
            ("DELETE", "/v1/claims/nope", {"fence": 1}),
            ("GET", "/v1/claims/" + "x" * 100, None),
        ]:
            r = c.request(method, path, json=body)
            assert r.status_code == 404 and r.json()["error"] == "not_found", (method, path)


def test_list_claims_of_someone_else_403(svc: Running) -> None:
    with svc.client("bob") as c:
        assert c.get("/v1/claims", params={"holder": "alice"}).status_code == 403
        assert c.get("/v1/claims", params={"holder": "bob"}).status_code == 200
        assert c.get("/v1/claims", params={"who": "x"}).status_code == 400


# --- availability -----------------------------------------------------------------------------


def test_resource_availability_is_a_snapshot_that_names_nobody(svc: Running) -> None:
    with svc.client("alice") as a, svc.client("bob") as b:
        hold(a, seat("r1"))
        mine = a.get("/v1/resources/r1", params={"slot": SHOW}).json()
        theirs = b.get("/v1/resources/r1", params={"slot": SHOW})
        free = b.get("/v1/resources/r2", params={"slot": SHOW}).json()
        span = b.get("/v1/resources/room-99", params={"start": 1, "end": 2}).json()
        bad = b.get("/v1/resources/r1", params={"start": 2, "end": 1})
    assert mine["state"] == "yours" and mine["snapshot"] is True
    assert theirs.json()["state"] == "taken" and "alice" not in theirs.text
    assert free["state"] == "free" and span["state"] == "free"
    assert bad.status_code == 400 and bad.json()["field"] == "end"


def test_showing_snapshot_lists_every_seat(svc: Running) -> None:
    with svc.client("alice") as a:
        hold(a, seat("seat-B2"), ttl=60)
        confirmed = hold(a, seat("seat-B3"), ttl=None)
    with svc.client() as anon:
        doc = anon.get(f"/v1/showings/{SHOW}").json()
        assert anon.get("/v1/showings/none").status_code == 404
        assert anon.get("/v1/showings").json()["showings"] == [{"slot": SHOW, "rows": 4, "cols": 6}]
    assert doc["snapshot"] is True and len(doc["seats"]) == 24
    assert doc["seats"]["seat-B2"]["state"] == "held" and doc["seats"]["seat-B2"]["expires_at"]
    assert doc["seats"]["seat-B3"] == {"state": "confirmed", "expires_at": None}
    assert doc["seats"]["seat-A1"] == {"state": "free", "expires_at": None}
    assert "alice" not in json.dumps(doc) and confirmed["holder"] == "alice"


# --- authentication ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "authorization", [None, "Bearer", "Bearer nope", "Basic YWxpY2U6eA==", "Bearer dibs_x_y"]
)
def test_401_without_a_valid_key(svc: Running, authorization: str | None) -> None:
    headers = {} if authorization is None else {"Authorization": authorization}
    with svc.client() as c:
        for method, path in [("POST", "/v1/claims"), ("GET", "/v1/claims"),
                             ("GET", "/v1/claims/1"), ("DELETE", "/v1/claims/1"),
                             ("POST", "/v1/claims/1/confirm"), ("POST", "/v1/claims/1/extend"),
                             ("GET", "/v1/resources/r1")]:  # fmt: skip
            r = c.request(method, path, headers=headers, json={"targets": [seat("z")]})
            assert r.status_code == 401, (method, path)
            assert r.headers["www-authenticate"].startswith("Bearer")


def test_a_revoked_key_is_refused_at_once(svc: Running) -> None:
    token, record = svc.keys.create("carol")
    with httpx.Client(base_url=svc.url, headers={"Authorization": f"Bearer {token}"}) as c:
        assert c.get("/v1/claims").status_code == 200
        svc.keys.revoke(record.id)
        assert c.get("/v1/claims").status_code == 401


# --- limits -----------------------------------------------------------------------------------


def test_413_for_a_large_body(svc: Running) -> None:
    big = {"targets": [seat("x" * 150)] * 100, "pad": "p" * 70_000}
    with svc.client("alice") as c:
        r = c.post("/v1/claims", json=big)
        chunked = c.post("/v1/claims", content=iter([b"{" + b" " * 70_000 + b"}"]))
    assert r.status_code == 413 and r.json()["error"] == "too_large"
    assert chunked.status_code == 413


def test_405_and_404_are_json(svc: Running) -> None:
    with svc.client("alice") as c:
        r = c.put("/v1/claims")
        missing = c.get("/v1/nothing")
    assert r.status_code == 405 and r.json()["error"] == "method_not_allowed"
    assert missing.status_code == 404 and missing.json()["error"] == "not_found"


def test_429_with_retry_after_per_key() -> None:
    clock_free = ServiceConfig(store_url="memory://", keys_file=None, rate=0.001, burst=3)
    with serve_in_thread(clock_free) as s, s.client("alice") as a, s.client("bob") as b:
        statuses = [a.get("/v1/claims").status_code for _ in range(4)]
        limited = a.get("/v1/claims")
        other = b.get("/v1/claims")
        metrics = a.get("/metrics").text
    assert statuses == [200, 200, 200, 429]
    assert limited.status_code == 429 and int(limited.headers["retry-after"]) >= 1
    assert other.status_code == 200  # limits are per key
    assert "dibs_rate_limited_total 2.0" in metrics


def test_408_for_a_body_that_never_arrives() -> None:
    config = ServiceConfig(store_url="memory://", keys_file=None, body_timeout=0.3)
    with serve_in_thread(config) as s:
        host, port = s.url.removeprefix("http://").split(":")
        with socket.create_connection((host, int(port))) as sock:
            sock.sendall(
                b"POST /v1/claims HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                b"Authorization: Bearer " + s.token("alice").encode() + b"\r\n"
                b"Content-Length: 100\r\n\r\n{"
            )
            answer = sock.recv(4096).decode()
    assert answer.startswith("HTTP/1.1 408")


def test_503_when_the_store_does_not_answer_in_time() -> None:
    store = GatedStore()
    config = ServiceConfig(store_url="memory://", keys_file=None, request_timeout=0.2)
    with serve_in_thread(config, async_store=store) as s, s.client("alice") as c:
        r = c.post("/v1/claims", json={"targets": [seat("g1")]})
        store.gate.set()
    assert r.status_code == 503 and r.json()["error"] == "timeout"
    assert r.headers["retry-after"] == "1"


def test_503_when_the_store_is_closed() -> None:
    store = MemoryStore()
    config = ServiceConfig(store_url="memory://", keys_file=None)
    with serve_in_thread(config, store=store) as s, s.client("alice") as c:
        store.close()
        r = c.post("/v1/claims", json={"targets": [seat("g2")]})
        ready = c.get("/readyz")
    assert r.status_code == 503 and r.json()["error"] == "unavailable"
    assert ready.status_code == 503


def test_duplicate_in_flight_key_waits_for_the_first_answer() -> None:
    store = GatedStore()
    config = ServiceConfig(store_url="memory://", keys_file=None, idempotency_wait=30)
    body, key = {"targets": [seat("g3")], "ttl": 30}, {"Idempotency-Key": '"dup"'}
    with serve_in_thread(config, async_store=store) as s:
        token = s.token("alice")
        results: list[httpx.Response] = []

        def post() -> None:
            with httpx.Client(base_url=s.url, headers={"Authorization": f"Bearer {token}"}) as c:
                results.append(c.post("/v1/claims", json=body, headers=key, timeout=30))

        first = threading.Thread(target=post)
        first.start()
        assert store.entered.wait(10)
        second = threading.Thread(target=post)
        second.start()
        # The duplicate is parked on the first's flight, not in the store.
        while s.service is not None and not any(
            s.service.api.flights.in_flight(k) > 1 for k in list(s.service.api.flights._flights)
        ):
            second.join(0.01)
        store.gate.set()
        first.join(30)
        second.join(30)
        with s.client() as c:
            metrics = c.get("/metrics").text
    assert 'dibs_claims_total{outcome="granted"} 1.0' in metrics
    assert 'dibs_claims_total{outcome="replayed"} 1.0' in metrics
    assert 'dibs_idempotency_waits_total{outcome="answered"} 1.0' in metrics
    assert [r.status_code for r in results] == [201, 201]
    assert results[0].json()["id"] == results[1].json()["id"]
    assert store.calls == 1
    assert sorted(r.headers.get("idempotent-replayed", "-") for r in results) == ["-", "true"]


def test_duplicate_in_flight_key_gives_up_with_409_and_retry_after() -> None:
    store = GatedStore()
    config = ServiceConfig(store_url="memory://", keys_file=None, idempotency_wait=0.2)
    body, key = {"targets": [seat("g4")], "ttl": 30}, {"Idempotency-Key": '"dup"'}
    with serve_in_thread(config, async_store=store) as s, s.client("alice") as c:
        first: list[httpx.Response] = []
        t = threading.Thread(
            target=lambda: first.append(c.post("/v1/claims", json=body, headers=key))
        )
        t.start()
        assert store.entered.wait(10)
        second = c.post("/v1/claims", json=body, headers=key)
        store.gate.set()
        t.join(30)
    assert second.status_code == 409 and second.json()["error"] == "in_progress"
    assert second.headers["retry-after"] == "1"
    assert first[0].status_code == 201


# --- the rest of the surface ------------------------------------------------------------------


def test_health_readiness_metrics_docs_and_page(svc: Running) -> None:
    with svc.client("alice") as c:
        hold(c, seat("m1"))
        assert c.get("/healthz").json() == {"status": "ok"}
        assert c.get("/readyz").json()["status"] == "ready"
        metrics = c.get("/metrics")
        docs = c.get("/docs")
        page = c.get("/")
    assert 'dibs_claims_total{outcome="granted"}' in metrics.text
    assert (
        'dibs_store_operation_seconds_bucket{le="0.0005",operation="claim",store="memory"}'
        in metrics.text
    )
    assert 'dibs_http_requests_total{route="/v1/claims",status="201"}' in metrics.text
    assert docs.status_code == 200 and "/v1/claims/{claim_id}/confirm" in docs.text
    assert page.status_code == 200 and 'id="map"' in page.text and '"show-1"' in page.text


def test_openapi_validates_and_matches_the_routes(svc: Running) -> None:
    with svc.client() as c:
        doc = c.get("/openapi.json").json()
    validate(doc)
    app = create_app(ServiceConfig(store_url="memory://", keys_file=None))
    routes = {
        (r.path, m.lower())
        for r in app.routes
        if isinstance(r, Route) and r.methods
        for m in r.methods
        if m != "HEAD"
    }
    documented = {(p, m) for p, item in doc["paths"].items() for m in item}
    assert documented == routes - {("/", "get"), ("/docs", "get"), ("/openapi.json", "get")}


def test_json_logs_carry_request_ids(svc: Running, caplog: pytest.LogCaptureFixture) -> None:
    from dibs.service._guard import JsonFormatter

    with caplog.at_level(logging.INFO, logger="dibs.service.access"), svc.client("alice") as c:
        r = c.get("/v1/claims", headers={"X-Request-ID": "trace-42"})
        assert r.headers["x-request-id"] == "trace-42"

        def logged() -> list[logging.LogRecord]:
            return [x for x in caplog.records if getattr(x, "request_id", None) == "trace-42"]

        # The line is written once the answer is out: the client may read it first.
        eventually(lambda: bool(logged()), "the access-log line is written")
    (record,) = logged()
    line = json.loads(JsonFormatter().format(record))
    assert line["request_id"] == "trace-42" and line["status"] == 200
    assert line["route"] == "/v1/claims" and line["holder"] == "alice"


def test_sweeper_runs_on_its_schedule(clock: FakeClock) -> None:
    store = MemoryStore(clock=clock)
    config = ServiceConfig(store_url="memory://", keys_file=None, sweep_interval=0.05)
    with serve_in_thread(config, store=store) as s, s.client("alice") as c:
        hold(c, seat("s1"), ttl=1)
        clock.advance(2)
        eventually(lambda: "dibs_holds_expired_total 1.0" in c.get("/metrics").text, "a sweep ran")


@pytest.mark.parametrize("kind", ["sqlite", "postgresql"])
def test_two_instances_on_one_store_see_each_others_changes(
    kind: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    if kind == "sqlite":
        url = f"sqlite:///{tmp_path / 'dibs.db'}"
    else:
        url = request.getfixturevalue("pg_schema_url")
    config = ServiceConfig(store_url=url, keys_file=None, poll_interval=0.05)
    keys = KeyRing(tmp_path / "keys.json")
    with (
        serve_in_thread(config, keys=keys) as one,
        serve_in_thread(config, keys=keys) as two,
        two.client() as watcher,
        watcher.stream("GET", f"/v1/showings/{SHOW}/events") as events,
    ):
        lines = events.iter_lines()
        first = _next_snapshot(lines)
        assert first["seats"]["seat-A1"]["state"] == "free"
        with one.client("alice") as a:
            hold(a, seat("seat-A1"), ttl=None)
        # Instance one never tells instance two: two sees it through the store.
        while (snap := _next_snapshot(lines))["seats"]["seat-A1"]["state"] != "confirmed":
            assert snap["version"] > first["version"]
    with dibs.open(url) as store:
        assert store.holder_of(Unit("seat-A1", SHOW)) == "alice"


def _next_snapshot(lines: Iterator[str]) -> dict[str, Any]:
    for line in lines:
        if line.startswith("data: "):
            doc: dict[str, Any] = json.loads(line[6:])
            return doc
    raise AssertionError("the event stream ended")
