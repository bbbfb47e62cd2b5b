"""Claim IDs across instances: several services on one store agree with no set-up.

Without ``--id-secret-file``, the secret that keys the opaque claim IDs is kept
in the store, made once by whichever instance gets there first. Run on every
store (the ``store_kind`` fixture): instances started together, each with its
own store opened from the URL (memory://: the one in-process store).
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Iterator

import httpx
import pytest
import uvicorn
from starlette.applications import Starlette

import dibs
import dibs.aio
from conftest import StoreMaker
from dibs.aio import AsyncStore, ThreadedStore
from dibs.service import KeyRing, ServiceConfig, create_app
from dibs.service._ids import SECRET_UNIT, ClaimIds, stored_secret
from eventually import eventually
from service_support import free_port, serve_in_thread

pytestmark = pytest.mark.timeout(120)

INSTANCES = 4


@contextlib.contextmanager
def serve_together(apps: list[Starlette]) -> Iterator[list[str]]:
    """Start every app's server at once, so their lifespans (which read the secret) race."""
    servers = [
        uvicorn.Server(
            uvicorn.Config(
                app,
                host="127.0.0.1",
                port=free_port(),
                log_config=None,
                access_log=False,
                lifespan="on",
            )
        )
        for app in apps
    ]
    start = threading.Barrier(len(servers))

    def run(server: uvicorn.Server) -> None:
        start.wait()
        asyncio.run(server.serve())

    threads = [threading.Thread(target=run, args=(s,), daemon=True) for s in servers]
    for t in threads:
        t.start()
    try:
        for server, thread in zip(servers, threads, strict=True):
            eventually(lambda s=server, t=thread: s.started or not t.is_alive(), "it started")
            assert thread.is_alive(), "a service thread died while starting"
        yield [f"http://127.0.0.1:{s.config.port}" for s in servers]
    finally:
        for server in servers:
            server.should_exit = True
        for thread in threads:
            thread.join(30)


def test_instances_started_together_resolve_each_others_claim_ids(
    make_store: StoreMaker,
) -> None:
    keys = KeyRing(None)
    token = keys.create("alice")[0]
    if make_store.kind == "memory":
        store = make_store()
        config = ServiceConfig(store_url="memory://", keys_file=None)
        apps = [create_app(config, store=store, keys=keys) for _ in range(INSTANCES)]
    else:
        config = ServiceConfig(store_url=make_store.url, keys_file=None)
        apps = [create_app(config, keys=keys) for _ in range(INSTANCES)]
    auth = {"Authorization": f"Bearer {token}"}
    with serve_together(apps) as urls:
        clients = [httpx.Client(base_url=u, headers=auth, timeout=30) for u in urls]
        try:
            for i, made_by in enumerate(clients):
                seat = {"resource": f"seat-{i}", "slot": "show"}
                r = made_by.post("/v1/claims", json={"targets": [seat], "ttl": 60})
                assert r.status_code == 201, r.text
                claim = r.json()
                for j, reader in enumerate(clients):
                    got = reader.get(f"/v1/claims/{claim['id']}")
                    assert got.status_code == 200, (i, j, got.text)
                    assert got.json()["id"] == claim["id"]
                # A fenced write through another instance, too.
                other = clients[(i + 1) % len(clients)]
                done = other.post(
                    f"/v1/claims/{claim['id']}/confirm", json={"fence": claim["fence"]}
                )
                assert done.status_code == 200, done.text
        finally:
            for c in clients:
                c.close()
    # One secret in the store, whoever made it.
    assert make_store().holder_of(SECRET_UNIT) is not None


def test_a_given_secret_keeps_the_store_out_of_it() -> None:
    store = dibs.open("memory://")
    secret = b"a secret of at least sixteen bytes"
    config = ServiceConfig(store_url="memory://", keys_file=None, id_secret=secret)
    with serve_in_thread(config, store=store) as s, s.client("alice") as c:
        r = c.post("/v1/claims", json={"targets": [{"resource": "r", "slot": ""}]})
        assert r.status_code == 201
    assert store.holder_of(SECRET_UNIT) is None
    assert ClaimIds(secret).from_wire(r.json()["id"]) is not None


def test_the_secret_unit_is_reserved_on_the_wire() -> None:
    config = ServiceConfig(store_url="memory://", keys_file=None)
    with serve_in_thread(config) as s, s.client("mallory") as c:
        probe = c.get(f"/v1/resources/{SECRET_UNIT.resource}")
        grab = c.post(
            "/v1/claims", json={"targets": [{"resource": SECRET_UNIT.resource, "slot": ""}]}
        )
    assert probe.status_code == 400 and grab.status_code == 400


def test_many_stores_racing_for_the_secret_all_read_one(make_store: StoreMaker) -> None:
    """The secret's claim is the linearization point: of 16 racers exactly one makes it.

    Each racer is an async store of its own on a loop of its own (memory://: an
    async face of the one in-process store), as each service instance is.
    """
    racers = 16
    start = threading.Barrier(racers)
    secrets: list[bytes] = []

    def face() -> AsyncStore:
        if make_store.kind == "memory":
            return ThreadedStore.over(make_store())
        return dibs.aio.open(make_store.url)

    def race(face: AsyncStore) -> None:
        async def read() -> bytes:
            async with face as store:
                start.wait()  # every racer open, then all claim at once
                return await stored_secret(store)

        secrets.append(asyncio.run(read()))

    # Made here, not in the racers: make_store() is not for many threads at once.
    threads = [threading.Thread(target=race, args=(face(),)) for _ in range(racers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert len(secrets) == racers and len(set(secrets)) == 1
    assert len(secrets[0]) >= 16


def test_an_app_read_before_it_serves_agrees_with_one_that_served(
    make_store: StoreMaker,
) -> None:
    keys = KeyRing(None)
    if make_store.kind == "memory":
        store = make_store()
        config = ServiceConfig(store_url="memory://", keys_file=None)
        served, unserved = (create_app(config, store=store, keys=keys) for _ in range(2))
    else:
        config = ServiceConfig(store_url=make_store.url, keys_file=None)
        served, unserved = (create_app(config, keys=keys) for _ in range(2))
    token = keys.create("alice")[0]
    with serve_together([served]) as (url,):
        r = httpx.post(
            f"{url}/v1/claims",
            json={"targets": [{"resource": "r", "slot": ""}]},
            headers={"Authorization": f"Bearer {token}"},
        )
    assert r.status_code == 201, r.text
    api = unserved.state.service.api

    async def read() -> ClaimIds:
        try:  # as the lifespan does, through the app's async store
            return await api.load_ids()
        finally:
            await api.aio.close()

    assert asyncio.run(read()).from_wire(r.json()["id"]) is not None


# Wire IDs made by the hmac.HMAC-based permutation before the round function
# was written as HMAC's definition on SHA-256 states: the bytes must not move,
# or every claim ID a client holds stops resolving after an upgrade.
KNOWN_WIRE_IDS = [
    ("1", "z4hjDkpl1NelBZhu"),
    ("42", "ATIfd6AeaE6513D8"),
    ("9223372036854775807", "YP0R_KgtpwXcBNvA"),
    ("9223372036854775808", "Gb2c0T7w0DWaQQDDelLIGYKz_NDrkssS"),
    ("c-0001", "sYVEm07mXhhOZG1q"),
    (
        "0a1b2c3d-uuid-like-é" * 3,
        "_D5fm7Xu6Q2euAVoty8BVCNqpUdmZ72kSLiTSryyxNxu0_Cqb-ayak9PtDn_zUD46G7EQGmChW6NSqa09b1vKcDaABd2Hg_g",
    ),
]


@pytest.mark.parametrize(("store_id", "wire_id"), KNOWN_WIRE_IDS)
def test_wire_ids_are_the_same_bytes_as_before(store_id: str, wire_id: str) -> None:
    ids = ClaimIds(b"a known-answer secret, 32 bytes!")
    assert ids.to_wire(store_id) == wire_id
    assert ids.from_wire(wire_id) == store_id
