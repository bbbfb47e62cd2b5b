"""Every error the service answers is an RFC 9457 problem details document.

``application/problem+json`` with ``type``, ``title``, ``status`` and
``detail``, and the service's own ``error`` code and ``message`` (and facts
such as ``field``) beside them, so that clients written before keep working.
Each error path is provoked over HTTP on loopback.
"""

from __future__ import annotations

import socket
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

import dibs
from dibs import FakeClock
from dibs.service import ServiceConfig
from dibs.service._config import LotSpec
from dibs.service._guard import PROBLEMS
from dibs.service._stores import SharedFace
from dibs.stores.memory import MemoryStore
from service_support import GatedStore, Running, reserved, serve_in_thread

pytestmark = pytest.mark.timeout(60)

TITLES: dict[str, str] = {}


def assert_problem(r: httpx.Response, status: int, error: str, **facts: Any) -> dict[str, Any]:
    """``r`` is a problem of this status and code, with these members besides."""
    assert r.status_code == status, (r.status_code, r.text)
    assert r.headers["content-type"] == "application/problem+json", r.headers
    doc: dict[str, Any] = r.json()
    assert doc["status"] == status and isinstance(doc["status"], int)
    assert isinstance(doc["title"], str) and doc["title"]
    assert isinstance(doc["detail"], str) and doc["detail"]
    assert doc["type"] == f"/docs#problem-{error}"
    assert doc["error"] == error and doc["message"] == doc["detail"]
    # A problem type's title is the same for every occurrence (RFC 9457 section 3.1.3).
    assert TITLES.setdefault(error, doc["title"]) == doc["title"]
    if error in PROBLEMS:
        assert doc["title"] == PROBLEMS[error][0]
    for name, value in facts.items():
        assert doc[name] == value, (name, doc)
    return doc


@pytest.fixture(scope="module")
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture(scope="module")
def svc(clock: FakeClock) -> Iterator[Running]:
    config = ServiceConfig(
        store_url="memory://", keys_file=None, lots=(LotSpec("tiny", 1),), max_body=1024
    )
    with serve_in_thread(config, store=MemoryStore(clock=clock)) as running:
        yield running


def seat(name: str) -> dict[str, str]:
    return {"resource": name, "slot": "s"}


def test_client_errors_are_problems(svc: Running, clock: FakeClock) -> None:
    with svc.client("alice") as a, svc.client("bob") as b, svc.client() as anon:
        assert_problem(a.post("/v1/claims", json={"targets": []}), 400, "invalid", field="targets")
        assert_problem(
            a.post("/v1/claims", json={"targets": [seat("x")]}, headers={"Idempotency-Key": '""'}),
            400,
            "invalid",
            field="Idempotency-Key",
        )
        assert_problem(
            a.post("/v1/claims", content=b"{", headers={"Content-Type": "application/json"}),
            400,
            "invalid",
            field="body",
        )
        unauthorized = anon.get("/v1/claims")
        assert_problem(unauthorized, 401, "unauthorized")
        assert unauthorized.headers["www-authenticate"].startswith("Bearer")
        assert_problem(a.get("/v1/claims", params={"holder": "bob"}), 403, "forbidden")
        assert_problem(a.get("/v1/claims/AAAAAAAAAAAAAAAA"), 404, "not_found")
        assert_problem(a.get("/v1/nothing"), 404, "not_found")
        assert_problem(a.get("/nothing/at/all"), 404, "not_found")
        assert_problem(a.get("/v1/showings/no-such-show"), 404, "not_found")
        assert_problem(a.get("/v1/lots/no-such-lot"), 404, "not_found")
        not_allowed = a.put("/v1/claims")
        assert_problem(not_allowed, 405, "method_not_allowed")
        assert "POST" in not_allowed.headers["allow"]
        assert_problem(
            a.post("/v1/claims", content=b"x" * 2000, headers={"Content-Type": "application/json"}),
            413,
            "too_large",
        )
        assert_problem(
            a.post("/v1/claims", content=b"{}", headers={"Content-Type": "text/plain"}),
            415,
            "unsupported_media_type",
        )

        mine = a.post("/v1/claims", json={"targets": [seat("p1")], "ttl": 10}).json()
        assert_problem(
            b.post("/v1/claims", json={"targets": [seat("p1")]}), 409, "taken", taken=[seat("p1")]
        )
        assert_problem(
            a.post(f"/v1/claims/{mine['id']}/confirm", json={"fence": mine["fence"] + 1}),
            409,
            "hold_lost",
            reason="fence",
        )
        key = {"Idempotency-Key": f'"{uuid.uuid4()}"'}
        assert a.post("/v1/claims", json={"targets": [seat("p2")]}, headers=key).status_code == 201
        assert_problem(
            a.post("/v1/claims", json={"targets": [seat("p3")]}, headers=key),
            422,
            "idempotency_key_reused",
        )
        assert a.post("/v1/lots/tiny/vehicles", json={"vehicle": "v1"}).status_code == 201
        assert_problem(a.post("/v1/lots/tiny/vehicles", json={"vehicle": "v2"}), 409, "full")
        assert_problem(
            a.post("/v1/lots/tiny/vehicles", json={"vehicle": "v9", "length": 2}),
            400,
            "invalid",
            field="length",
        )
        assert_problem(
            b.post(
                "/v1/match",
                json={"candidates": [seat("p1")]},
                headers={"Idempotency-Key": '"m-1"'},
            ),
            409,
            "none_free",
        )


def test_the_problem_types_are_documented_on_the_docs_page(svc: Running) -> None:
    with svc.client() as c:
        page = c.get("/docs").text
    for code in PROBLEMS:
        assert f"id=problem-{code}>" in page


def test_429_is_a_problem() -> None:
    config = ServiceConfig(store_url="memory://", keys_file=None, rate=0.001, burst=1)
    with serve_in_thread(config) as s, s.client("alice") as a:
        a.get("/v1/claims")
        limited = a.get("/v1/claims")
    assert_problem(limited, 429, "rate_limited")
    assert int(limited.headers["retry-after"]) >= 1


def test_408_is_a_problem() -> None:
    config = ServiceConfig(store_url="memory://", keys_file=None, body_timeout=0.3)
    with serve_in_thread(config) as s:
        host, port = s.url.removeprefix("http://").split(":")
        with socket.create_connection((host, int(port))) as sock:
            sock.sendall(
                b"POST /v1/claims HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                b"Authorization: Bearer " + s.token("alice").encode() + b"\r\n"
                b"Content-Length: 100\r\n\r\n{"
            )
            answer = b""
            while b"\r\n\r\n" not in answer or not answer.rstrip().endswith(b"}"):
                chunk = sock.recv(4096)
                if not chunk:
                    break
                answer += chunk
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 408")
    assert b"content-type: application/problem+json" in head.lower()
    assert b'"status":408' in body.replace(b" ", b"")


def test_503_timeout_unavailable_and_readiness_are_problems() -> None:
    gated = GatedStore()
    config = ServiceConfig(store_url="memory://", keys_file=None, request_timeout=0.2)
    with serve_in_thread(config, async_store=gated) as s, s.client("alice") as c:
        r = c.post("/v1/claims", json={"targets": [seat("g1")]})
        gated.gate.set()
    assert_problem(r, 503, "timeout")
    assert r.headers["retry-after"] == "1"
    store = MemoryStore()
    config = ServiceConfig(store_url="memory://", keys_file=None)
    with serve_in_thread(config, store=store) as s, s.client("alice") as c:
        store.close()
        down = c.post("/v1/claims", json={"targets": [seat("g2")]})
        ready = c.get("/readyz")
    assert_problem(down, 503, "unavailable")
    assert_problem(ready, 503, "unavailable")
    assert ready.headers["retry-after"] == "1"


class BrokenStore(SharedFace):
    """A store whose claims fail with an error no one expected."""

    def __init__(self) -> None:
        super().__init__(MemoryStore(), threads=1)

    async def _claim(self, *args: Any) -> dibs.ClaimResult:
        if reserved(args[0]):
            return await super()._claim(*args)
        raise RuntimeError("a bug")


def test_500_is_a_problem_with_the_request_id() -> None:
    config = ServiceConfig(store_url="memory://", keys_file=None)
    with serve_in_thread(config, async_store=BrokenStore()) as s, s.client("alice") as c:
        r = c.post(
            "/v1/claims", json={"targets": [seat("b1")]}, headers={"X-Request-ID": "trace-500"}
        )
    assert_problem(r, 500, "internal", request_id="trace-500")
