"""The service on the async store: which face serves what, and calls cut short.

A store call cut short (the request timeout, a client gone) must leave what
the async store promises: no claim, or one that a retry with the same
Idempotency-Key learns about; never a second claim.
"""

from __future__ import annotations

import asyncio
import socket
import threading
import uuid
from pathlib import Path
from typing import Any

import httpx
import pytest

import dibs
from dibs import Unit
from dibs.aio import ThreadedStore
from dibs.service import KeyRing, ServiceConfig
from dibs.service._stores import SharedFace
from dibs.stores.memory import MemoryStore
from service_support import GatedStore, reserved, serve_in_thread

SHOW = "show-1"


def seat(name: str) -> dict[str, str]:
    return {"resource": name, "slot": SHOW}


def _claims(store: GatedStore, holder: str) -> list[dibs.Claim]:
    return store.sync.claims_of(holder)


def test_a_claim_cut_short_after_it_landed_is_learned_by_the_retry() -> None:
    store = GatedStore(before=False)
    config = ServiceConfig(store_url="memory://", keys_file=None, request_timeout=0.2)
    body, key = {"targets": [seat("late-1")], "ttl": 60}, {"Idempotency-Key": '"late-1"'}
    with serve_in_thread(config, async_store=store) as s, s.client("alice") as c:
        first = c.post("/v1/claims", json=body, headers=key)
        assert first.status_code == 503 and first.json()["error"] == "timeout"
        store.gate.set()
        retry = c.post("/v1/claims", json=body, headers=key)
    assert retry.status_code == 201, retry.text
    assert retry.headers["idempotent-replayed"] == "true"
    (claim,) = _claims(store, "alice")
    assert claim.units == (Unit("late-1", SHOW),)


def test_a_claim_cut_short_before_it_landed_leaves_nothing() -> None:
    store = GatedStore(before=True)
    config = ServiceConfig(store_url="memory://", keys_file=None, request_timeout=0.2)
    body, key = {"targets": [seat("early-1")], "ttl": 60}, {"Idempotency-Key": '"early-1"'}
    with serve_in_thread(config, async_store=store) as s, s.client("alice") as c:
        first = c.post("/v1/claims", json=body, headers=key)
        assert first.status_code == 503
        # The wait was cancelled, not left running to claim later.
        assert store.cancelled == 1 and _claims(store, "alice") == []
        store.gate.set()
        retry = c.post("/v1/claims", json=body, headers=key)
    assert retry.status_code == 201 and "idempotent-replayed" not in retry.headers
    assert len(_claims(store, "alice")) == 1


@pytest.mark.parametrize("before", [True, False])
def test_a_client_gone_mid_claim_leaves_one_claim_its_retry_learns(before: bool) -> None:
    store = GatedStore(before=before)
    config = ServiceConfig(store_url="memory://", keys_file=None)
    name = f"gone-{before}"
    body = f'{{"targets":[{{"resource":"{name}","slot":"{SHOW}"}}],"ttl":60}}'.encode()
    with serve_in_thread(config, async_store=store) as s:
        token = s.token("alice")
        host, port = s.url.removeprefix("http://").split(":")
        with socket.create_connection((host, int(port)), timeout=10) as sock:
            sock.sendall(
                b"POST /v1/claims HTTP/1.1\r\nHost: x\r\n"
                + f"Authorization: Bearer {token}\r\n".encode()
                + f'Idempotency-Key: "{name}"\r\n'.encode()
                + b"Content-Type: application/json\r\n"
                + f"Content-Length: {len(body)}\r\n\r\n".encode()
                + body
            )
            assert store.entered.wait(10)
        # The client is gone while its claim is in the store's hands.
        store.gate.set()
        with s.client("alice") as c:
            retry = c.post(
                "/v1/claims",
                content=body,
                headers={"Idempotency-Key": f'"{name}"', "Content-Type": "application/json"},
            )
            listed = c.get("/v1/claims").json()["claims"]
    assert retry.status_code == 201, retry.text
    assert [x["id"] for x in listed] == [retry.json()["id"]]
    assert len(_claims(store, "alice")) == 1


class LoopCheckedStore(MemoryStore):
    """A memory store that notes, per claim, whether it ran on the event loop's thread."""

    def __init__(self) -> None:
        super().__init__()
        self.on_loop: list[bool] = []

    def _claim(self, *args: Any) -> dibs.ClaimResult:
        if reserved(args[0]):
            return super()._claim(*args)  # the service's own (the claim-ID secret)
        try:
            asyncio.get_running_loop()
            self.on_loop.append(True)
        except RuntimeError:
            self.on_loop.append(False)
        return super()._claim(*args)


def test_memory_claims_run_inline_on_the_loop_without_a_thread_hop() -> None:
    store = LoopCheckedStore()
    config = ServiceConfig(store_url="memory://", keys_file=None)
    with serve_in_thread(config, store=store) as s, s.client("alice") as c:
        for i in range(3):
            r = c.post("/v1/claims", json={"targets": [seat(f"inline-{i}")]})
            assert r.status_code == 201
        assert s.service is not None and s.service.aio.sync is store  # type: ignore[attr-defined]
    assert store.on_loop == [True, True, True]


def test_the_service_opens_one_async_store_for_its_url(aio_url: str) -> None:
    url = aio_url
    config = ServiceConfig(store_url=url, keys_file=None)
    native = not isinstance(dibs.aio.open(url), ThreadedStore)
    with serve_in_thread(config) as s, s.client("alice") as c:
        assert s.service is not None
        assert not isinstance(s.service.aio, SharedFace)  # opened from the URL, not wrapped
        assert isinstance(s.service.aio, ThreadedStore) is not native
        # A native async store has no sync store behind it; a threaded one's is its own.
        assert (s.service.store is None) is native
        r = c.post("/v1/claims", json={"targets": [seat("faces-1")], "ttl": 60})
        assert r.status_code == 201
        if url == "memory://":
            assert s.service.store is not None
            assert s.service.store.holder_of(Unit("faces-1", SHOW)) == "alice"
        else:  # what the service wrote, any other store on the URL reads
            with dibs.open(url) as other:
                assert other.holder_of(Unit("faces-1", SHOW)) == "alice"
        seats = c.get(f"/v1/showings/{SHOW}").json()["seats"]
    assert seats  # the seat map answers on every store


def test_concurrent_requests_on_sqlite_share_the_faces_threads(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'dibs.db'}"
    config = ServiceConfig(store_url=url, keys_file=None, threads=4)
    with serve_in_thread(config) as s:
        token = s.token("alice")
        statuses: list[int] = []

        def client(n: int) -> None:
            with httpx.Client(base_url=s.url, headers={"Authorization": f"Bearer {token}"}) as c:
                for i in range(10):
                    r = c.post(
                        "/v1/claims",
                        json={"targets": [seat(f"t{n}-{i}")], "ttl": 60},
                        headers={"Idempotency-Key": f'"{uuid.uuid4()}"'},
                    )
                    statuses.append(r.status_code)

        threads = [threading.Thread(target=client, args=(n,)) for n in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
    assert statuses == [201] * 80
    with dibs.open(url) as store:
        assert len(store.claims_of("alice")) == 80


def test_an_async_store_alone_serves_and_stays_open() -> None:
    # create_app(async_store=...) once needed store= beside it, for the seat maps
    # and patterns; they await the async store now, so it serves alone.
    async_store = dibs.aio.open("memory://")
    config = ServiceConfig(store_url="sqlite:///nowhere/never-opened.db", keys_file=None)
    with serve_in_thread(config, async_store=async_store) as s, s.client("alice") as c:
        assert c.post("/v1/claims", json={"targets": [seat("alone-1")]}).status_code == 201
        assert c.get(f"/v1/showings/{SHOW}").status_code == 200
    assert not async_store.closed  # a store passed in is its owner's to close
    asyncio.run(async_store.close())


def test_the_app_closes_the_face_it_made_and_leaves_a_given_store_open(tmp_path: Path) -> None:
    store = dibs.open(f"sqlite:///{tmp_path / 'dibs.db'}")
    config = ServiceConfig(store_url="memory://", keys_file=None)
    with serve_in_thread(config, store=store) as s, s.client("alice") as c:
        assert c.post("/v1/claims", json={"targets": [seat("given-1")]}).status_code == 201
        assert s.service is not None
        face = s.service.aio
    assert face.closed and not store.closed
    assert store.holder_of(Unit("given-1", SHOW)) == "alice"
    store.close()


@pytest.mark.parametrize("kind", ["sqlite", "postgresql"])
def test_claims_cut_short_at_any_point_never_make_two_claims_for_one_key(
    kind: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """A request timeout far below a claim's time cuts claims short all along their way.

    Every key is then retried through a second instance with time to answer:
    each retry answers 201 and, per key, the store holds exactly one claim,
    the one the retry names.
    """
    if kind == "sqlite":
        url = f"sqlite:///{tmp_path / 'dibs.db'}"
    else:
        url = request.getfixturevalue("pg_schema_url")
    secret = b"one secret for both instances"
    hurried = ServiceConfig(
        store_url=url,
        keys_file=None,
        request_timeout=0.0005,
        id_secret=secret,
        threads=4,
        rate=1e6,
        burst=10**6,
    )
    patient = ServiceConfig(store_url=url, keys_file=None, id_secret=secret, rate=1e6, burst=10**6)
    keys = KeyRing(tmp_path / "keys.json")
    clients, per_client = 8, 25
    statuses: list[int] = []
    with serve_in_thread(hurried, keys=keys) as fast:
        token = fast.token("alice")

        def client(n: int) -> None:
            with httpx.Client(base_url=fast.url, headers={"Authorization": f"Bearer {token}"}) as c:
                for i in range(per_client):
                    r = c.post(
                        "/v1/claims",
                        json={"targets": [seat(f"cut-{n}-{i}")], "ttl": 600},
                        headers={"Idempotency-Key": f'"cut-{n}-{i}"'},
                    )
                    statuses.append(r.status_code)

        threads = [threading.Thread(target=client, args=(n,)) for n in range(clients)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
    assert set(statuses) <= {201, 503}
    with serve_in_thread(patient, keys=keys) as slow, slow.client("alice") as c:
        retried = {}
        for n in range(clients):
            for i in range(per_client):
                r = c.post(
                    "/v1/claims",
                    json={"targets": [seat(f"cut-{n}-{i}")], "ttl": 600},
                    headers={"Idempotency-Key": f'"cut-{n}-{i}"'},
                )
                assert r.status_code == 201, r.text
                retried[f"cut-{n}-{i}"] = r.json()["id"]
        listed = c.get("/v1/claims").json()["claims"]
    assert sorted(x["id"] for x in listed) == sorted(retried.values())
    assert len(listed) == clients * per_client
