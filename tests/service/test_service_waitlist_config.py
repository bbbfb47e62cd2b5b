"""A waiting list's configuration is the store's, not the instance's: every instance agrees.

Several ``dibs serve`` instances on one store (each app opens its own store from
the URL, as separate processes do) on every store that processes share: a PUT
to one instance sets the units and offer TTL that the others' offers use, a fresh
instance reads it, a dead watcher's list is watched by another, racing PUTs
settle on one version, and a stored configuration the service did not write is
a typed 409. Expiries are compared with the claim's own ``created_at`` (both on
the store's clock), never with wall time.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Iterator
from datetime import datetime
from typing import Any

import httpx
import pytest

import dibs.aio
from conftest import SHARED_STORE_KINDS, StoreMaker
from dibs import Unit
from dibs.service import KeyRing, ServiceConfig
from dibs.service._listconfig import CONFIG_PREFIX, DATA_PREFIX, ListConfig, read_config
from dibs.service._waitlists import LEAD_PREFIX
from eventually import eventually
from service_support import Running, serve_in_thread

pytestmark = [
    pytest.mark.timeout(180),
    pytest.mark.parametrize("store_kind", SHARED_STORE_KINDS),
]

TTL = 7200.0  # not OFFER_TTL (900): an offer held for 900 s is the bug
SEAT = {"resource": "seat-1", "slot": "show-9"}


@contextlib.contextmanager
def instance(make_store: StoreMaker, keys: KeyRing) -> Iterator[Running]:
    """One more service instance on the test's store, with its own store connection."""
    config = ServiceConfig(
        store_url=make_store.url, keys_file=None, rate=10_000, burst=10_000, request_timeout=120
    )
    with serve_in_thread(config, keys=keys) as running:
        yield running


def _held_for(claim: dict[str, Any]) -> float:
    """Seconds the hold was made for: its expiry less its creation, both the store's clock."""
    expires = datetime.fromisoformat(claim["expires_at"])
    return (expires - datetime.fromisoformat(claim["created_at"])).total_seconds()


def _offers(c: httpx.Client, name: str) -> list[Any]:
    r = c.get(f"/v1/waitlists/{name}/offers")
    assert r.status_code == 200, r.text
    offers: list[Any] = r.json()["offers"]
    return offers


def _client(run: Running, keys: KeyRing, tokens: dict[str, str], holder: str) -> httpx.Client:
    """A client of ``run`` for ``holder``, with one key per holder across instances."""
    if holder not in tokens:
        tokens[holder] = keys.create(holder)[0]
    return httpx.Client(
        base_url=run.url, headers={"Authorization": f"Bearer {tokens[holder]}"}, timeout=150
    )


def test_a_decline_on_another_instance_offers_for_the_stored_ttl(make_store: StoreMaker) -> None:
    keys, tokens = KeyRing(None), {}
    with instance(make_store, keys) as a:
        with _client(a, keys, tokens, "admin") as admin:
            # No units: no watch round offers a free seat, so the release below is B's offer.
            put = admin.put("/v1/waitlists/w", json={"units": [], "offer_ttl": TTL})
            assert put.status_code == 200 and put.json()["version"] == 1, put.text
        # B starts after the PUT and never sees one: what it uses comes from the store.
        with (
            instance(make_store, keys) as b,
            _client(b, keys, tokens, "buyer") as buyer,
            _client(b, keys, tokens, "alice") as alice,
            _client(b, keys, tokens, "bob") as bob,
        ):
            view = alice.get("/v1/waitlists/w").json()
            assert (view["offer_ttl"], view["watching"], view["version"]) == (TTL, 0, 1)
            sold = buyer.post("/v1/claims", json={"targets": [SEAT]}).json()
            assert alice.post("/v1/waitlists/w/entries").json()["position"] == 1
            assert bob.post("/v1/waitlists/w/entries").json()["position"] == 2
            released = buyer.post(
                "/v1/waitlists/w/release", json={"claim_id": sold["id"], "fence": sold["fence"]}
            )
            assert released.json() == {"name": "w", "released": True, "offered": 1}
            [first] = _offers(alice, "w")
            assert TTL - 60 < _held_for(first["claim"]) <= TTL + 1  # the release on B
            declined = alice.post(
                f"/v1/waitlists/w/offers/{first['claim']['id']}/decline",
                json={"fence": first["claim"]["fence"]},
            )
            assert declined.json()["declined"] is True, declined.text
            # The decline on B passes it on, or a watch round that saw the offer's record
            # close first (its instance's TTL is the store's too).
            [second] = eventually(lambda: _offers(bob, "w"), "the seat passed on to bob")
            assert TTL - 60 < _held_for(second["claim"]) <= TTL + 1


def test_a_put_on_one_instance_changes_what_the_others_use(make_store: StoreMaker) -> None:
    keys, tokens = KeyRing(None), {}
    with (
        instance(make_store, keys) as a,
        instance(make_store, keys) as b,
        _client(a, keys, tokens, "admin") as on_a,
        _client(b, keys, tokens, "admin") as on_b,
    ):
        assert on_b.get("/v1/waitlists/w").json()["version"] == 0  # B reads it first: cached
        assert on_a.put("/v1/waitlists/w", json={"units": [SEAT]}).json()["version"] == 1
        assert on_b.get("/v1/waitlists/w").json()["offer_ttl"] == 900.0  # the default
        put = on_a.put("/v1/waitlists/w", json={"units": [SEAT], "offer_ttl": 60})
        assert put.json()["version"] == 2
        view = on_b.get("/v1/waitlists/w").json()
        assert (view["offer_ttl"], view["watching"], view["version"]) == (60.0, 1, 2)
        same = on_b.put("/v1/waitlists/w", json={"units": [SEAT], "offer_ttl": 60})
        assert same.json()["version"] == 2  # nothing changed: nothing written
        stale = on_b.put("/v1/waitlists/w", json={"units": [], "if_version": 1})
        assert stale.status_code == 409, stale.text
        assert (stale.json()["error"], stale.json()["version"]) == ("version_moved", 2)
        fresh = on_b.put("/v1/waitlists/w", json={"units": [], "if_version": 2})
        assert fresh.status_code == 200 and fresh.json()["version"] == 3, fresh.text
        assert on_a.get("/v1/waitlists/w").json()["watching"] == 0
        # A long configuration: 100 units of 200-character names, stored in several claims.
        big = [
            {"resource": f"{i:03d}" + "r" * 197, "slot": "ß\U0001f600" + "s" * 198}
            for i in range(100)
        ]
        put = on_a.put("/v1/waitlists/big", json={"units": big, "offer_ttl": 0.5})
        assert put.status_code == 200, put.text
        view = on_b.get("/v1/waitlists/big").json()
        assert (view["watching"], view["offer_ttl"]) == (100, 0.5)

        async def stored() -> ListConfig:
            async with dibs.aio.open(make_store.url) as store:
                return await read_config(store, "big")

        config = asyncio.run(stored())
        assert config.units == tuple(Unit(u["resource"], u["slot"]) for u in big)


def test_the_watch_goes_on_when_its_instance_stops(make_store: StoreMaker) -> None:
    """A stops: B, which only read the index, offers a seat freed by a plain DELETE."""
    keys, tokens = KeyRing(None), {}
    with instance(make_store, keys) as b:
        with instance(make_store, keys) as a, _client(a, keys, tokens, "admin") as admin:
            with _client(a, keys, tokens, "buyer") as buyer:
                sold = buyer.post("/v1/claims", json={"targets": [SEAT], "ttl": 600})
                assert sold.status_code == 201, sold.text
            put = admin.put("/v1/waitlists/w", json={"units": [SEAT], "offer_ttl": TTL})
            assert put.status_code == 200, put.text
            with _client(a, keys, tokens, "alice") as alice:
                assert alice.post("/v1/waitlists/w/entries").status_code == 200
        # A is gone. No list route reaches B: it watches from the store's index.
        with _client(b, keys, tokens, "buyer") as buyer:
            claim = sold.json()
            gone = buyer.delete(f"/v1/claims/{claim['id']}", params={"fence": claim["fence"]})
            assert gone.json()["released"] is True

        def alices_offer() -> list[Any]:
            with _client(b, keys, tokens, "alice") as alice:
                claims: list[Any] = alice.get("/v1/claims", params={"holder": "me"}).json()
                return [c for c in claims["claims"] if c["state"] == "held"]

        [offer] = eventually(alices_offer, "B offers the freed seat to alice")
        assert TTL - 60 < _held_for(offer) <= TTL + 1


def test_a_dead_instances_lease_lapses_and_another_watches(make_store: StoreMaker) -> None:
    """A lease left by an instance that died (never released) stops no one past its TTL."""
    keys, tokens = KeyRing(None), {}
    with (
        instance(make_store, keys) as b,
        _client(b, keys, tokens, "buyer") as buyer,
        _client(b, keys, tokens, "alice") as alice,
    ):
        sold = buyer.post("/v1/claims", json={"targets": [SEAT], "ttl": 600}).json()
        ghost = make_store().claim(Unit(LEAD_PREFIX + "w", ""), holder=f"{LEAD_PREFIX}x", ttl=2)
        assert ghost, "the lease is free before the first PUT"
        put = buyer.put("/v1/waitlists/w", json={"units": [SEAT], "offer_ttl": TTL})
        assert put.status_code == 200, put.text
        assert alice.post("/v1/waitlists/w/entries").status_code == 200
        gone = buyer.delete(f"/v1/claims/{sold['id']}", params={"fence": sold["fence"]})
        assert gone.json()["released"] is True
        # Only a watch round offers it (a plain DELETE), and only once the ghost's lease lapsed.
        [offer] = eventually(lambda: _offers(alice, "w"), "B takes the lapsed lease over")
        assert TTL - 60 < _held_for(offer["claim"]) <= TTL + 1


def test_racing_puts_settle_on_one_version(make_store: StoreMaker) -> None:
    writers = 8
    keys, tokens = KeyRing(None), {}
    with instance(make_store, keys) as a, instance(make_store, keys) as b:
        runs = [a, b]
        for holder in (f"w{i}" for i in range(writers)):
            tokens[holder] = keys.create(holder)[0]
        answers: dict[int, httpx.Response] = {}
        start = threading.Barrier(writers)

        def put(i: int, body: dict[str, Any]) -> None:
            with _client(runs[i % 2], keys, tokens, f"w{i}") as c:
                start.wait()
                answers[i] = c.put("/v1/waitlists/race", json=body)

        # Compare-and-set from version 0: exactly one writer makes version 1.
        threads = [
            threading.Thread(
                target=put, args=(i, {"units": [], "offer_ttl": 100 + i, "if_version": 0})
            )
            for i in range(writers)
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        won = [i for i, r in answers.items() if r.status_code == 200]
        assert len(won) == 1, {i: r.text for i, r in answers.items()}
        assert all(r.json()["error"] == "version_moved" for i, r in answers.items() if i not in won)
        # Without if_version the last version wins: every writer writes one, in some order.
        start.reset()
        answers.clear()
        threads = [
            threading.Thread(target=put, args=(i, {"units": [], "offer_ttl": 200 + i}))
            for i in range(writers)
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert all(r.status_code == 200 for r in answers.values())
        versions = {r.json()["version"]: r.json()["offer_ttl"] for r in answers.values()}
        assert sorted(versions) == list(range(2, 2 + writers))  # one version each
        with _client(a, keys, tokens, "w0") as on_a, _client(b, keys, tokens, "w1") as on_b:
            seen = [c.get("/v1/waitlists/race").json() for c in (on_a, on_b)]
        assert seen[0] == seen[1]
        assert seen[0]["version"] == 1 + writers
        assert seen[0]["offer_ttl"] == versions[1 + writers]


def test_a_bad_stored_configuration_is_a_typed_409(make_store: StoreMaker) -> None:
    store = make_store()
    keys, tokens = KeyRing(None), {}
    # Claims no service writes: a marker held by a stranger, and a payload out of range.
    store.claim(Unit(CONFIG_PREFIX + "odd", "1"), holder="someone", ttl=None)
    nonce = "ab" * 16
    payload = '{"units":[],"offer_ttl":-1}'
    holder = f"{CONFIG_PREFIX}{nonce}.{len(payload)}"
    store.claim(Unit(DATA_PREFIX + nonce, f"0.{payload}"), holder=holder, ttl=None)
    store.claim(Unit(CONFIG_PREFIX + "neg", "1"), holder=holder, ttl=None)
    with instance(make_store, keys) as a, _client(a, keys, tokens, "alice") as alice:
        for name in ("odd", "neg"):
            seat = alice.post("/v1/claims", json={"targets": [SEAT]}).json()
            back = {"claim_id": seat["id"], "fence": seat["fence"]}
            for r in (
                alice.get(f"/v1/waitlists/{name}"),
                alice.post(f"/v1/waitlists/{name}/release", json=back),  # before releasing
            ):
                assert r.status_code == 409, r.text
                assert (r.json()["error"], r.json()["version"]) == ("bad_config", 1)
            assert alice.delete(f"/v1/claims/{seat['id']}", params={"fence": seat["fence"]}).json()[
                "released"
            ]
            fixed = alice.put(f"/v1/waitlists/{name}", json={"units": [], "offer_ttl": 30})
            assert fixed.status_code == 200 and fixed.json()["version"] == 2, fixed.text
            assert alice.get(f"/v1/waitlists/{name}").json()["offer_ttl"] == 30.0
        for body, field in [
            ({"units": [], "if_version": -1}, "if_version"),
            ({"units": [], "if_version": "1"}, "if_version"),
            ({"units": [], "if_version": 2**63}, "if_version"),
            ({"units": [], "offer_ttl": 10**9}, "offer_ttl"),
        ]:
            r = alice.put("/v1/waitlists/w", json=body)
            assert r.status_code == 400 and r.json()["field"] == field, r.text
