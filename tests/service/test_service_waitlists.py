"""Waiting lists over HTTP, on every store: the routes, the service's watcher, and a race.

Every answer is checked against /openapi.json (tests/support/conformance.py). The
race joins many clients at once, frees units through the list from several clients
while the service's watcher runs, and has the offered clients accept at once: the
units go to the first in line, one each, exactly once. No reading of wall time.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from dibs.service import ServiceConfig
from eventually import eventually
from service_support import Running, serve_in_thread

pytestmark = pytest.mark.timeout(180)

SEATS = [{"resource": f"seat-{n}", "slot": "show-42"} for n in range(2)]


@pytest.fixture
def svc(aio_url: str) -> Iterator[Running]:
    # The races here check who gets what, not how fast: a store slowed by a loaded
    # machine (aio-etcd at a load average of 20+) must not turn calls into 503s.
    config = ServiceConfig(
        store_url=aio_url, keys_file=None, rate=10_000, burst=10_000, request_timeout=120
    )
    with serve_in_thread(config) as running:
        yield running


def _claim(c: httpx.Client, targets: list[dict[str, str]], ttl: float | None = None) -> Any:
    r = c.post("/v1/claims", json={"targets": targets, "ttl": ttl})
    assert r.status_code == 201, r.text
    return r.json()


def _offers(c: httpx.Client, key: str = "show-42") -> list[Any]:
    r = c.get(f"/v1/waitlists/{key}/offers")
    assert r.status_code == 200, r.text
    offers: list[Any] = r.json()["offers"]
    return offers


def test_join_release_decline_accept_and_the_watcher(svc: Running) -> None:
    with (
        svc.client("buyer") as buyer,
        svc.client("alice") as a,
        svc.client("bob") as b,
        svc.client("carol") as c,
        svc.client("mallory") as m,
    ):
        sold = [_claim(buyer, [seat]) for seat in SEATS]
        put = a.put("/v1/waitlists/show-42", json={"units": SEATS, "offer_ttl": 600})
        assert put.status_code == 200, put.text
        assert put.json() == {
            "snapshot": True,
            "name": "show-42",
            "waiting": 0,
            "position": None,
            "watching": 2,
            "offer_ttl": 600.0,
            "version": 1,
        }
        for n, client in enumerate([a, b, c], 1):
            joined = client.post("/v1/waitlists/show-42/entries")
            assert joined.status_code == 200 and joined.json()["position"] == n, joined.text
        assert a.post("/v1/waitlists/show-42/entries").json()["position"] == 1  # once
        view = b.get("/v1/waitlists/show-42").json()
        assert (view["waiting"], view["position"]) == (3, 2) and "alice" not in str(view)

        # The buyer's refund, through the list: seat 0 is held for alice at once.
        released = buyer.post(
            "/v1/waitlists/show-42/release",
            json={"claim_id": sold[0]["id"], "fence": sold[0]["fence"]},
        )
        # (The service's own watcher may have offered it a moment before this call did.)
        assert released.json()["released"] is True and released.json()["offered"] in (0, 1)
        [offer] = eventually(lambda: _offers(a), "seat 0 offered to alice")
        assert offer["unit"] == SEATS[0] and offer["claim"]["state"] == "held"
        assert _offers(b) == []
        taken = m.post("/v1/claims", json={"targets": [SEATS[0]]})
        assert taken.status_code == 409  # held for alice: nobody else gets it
        path = f"/v1/waitlists/show-42/offers/{offer['claim']['id']}"
        fence = {"fence": offer["claim"]["fence"]}
        assert b.post(f"{path}/accept", json=fence).status_code == 404  # not bob's
        stale = a.post(f"{path}/accept", json={"fence": offer["claim"]["fence"] + 1})
        assert stale.status_code == 409 and stale.json()["reason"] == "fence"

        # Alice says no: bob is next.
        declined = a.post(f"{path}/decline", json=fence)
        assert declined.json()["declined"] is True and declined.json()["unit"] == SEATS[0]
        assert a.post(f"{path}/accept", json=fence).status_code == 404  # gone
        [bobs] = eventually(lambda: _offers(b), "seat 0 offered to bob")
        accepted = b.post(
            f"/v1/waitlists/show-42/offers/{bobs['claim']['id']}/accept",
            json={"fence": bobs["claim"]["fence"]},
        )
        assert accepted.status_code == 200, accepted.text
        assert accepted.json()["claim"]["state"] == "confirmed"

        # A plain DELETE of seat 1: the service's watcher offers it to carol, unasked.
        gone = buyer.delete(f"/v1/claims/{sold[1]['id']}?fence={sold[1]['fence']}")
        assert gone.json()["released"] is True
        [carols] = eventually(lambda: _offers(c), "the watcher offers seat 1 to carol")
        assert carols["unit"] == SEATS[1]
        assert c.get("/v1/waitlists/show-42").json()["waiting"] == 0

        # Leaving, and releasing again (idempotent).
        assert m.post("/v1/waitlists/show-42/entries").json()["position"] == 1
        assert m.delete("/v1/waitlists/show-42/entries").json()["left"] is True
        assert m.delete("/v1/waitlists/show-42/entries").json()["left"] is False
        again = buyer.post(
            "/v1/waitlists/show-42/release",
            json={"claim_id": sold[1]["id"], "fence": sold[1]["fence"]},
        )
        assert again.status_code == 404  # released already: not a claim of yours now


def test_a_lapsed_cart_and_a_lapsed_offer_go_down_the_list(svc: Running) -> None:
    with svc.client("cart") as cart, svc.client("alice") as a, svc.client("bob") as b:
        seat = [SEATS[0]]
        _claim(cart, seat, ttl=0.3)  # a cart that will lapse
        put = a.put("/v1/waitlists/lapse", json={"units": seat, "offer_ttl": 0.3})
        assert put.status_code == 200, put.text
        a.post("/v1/waitlists/lapse/entries")
        b.post("/v1/waitlists/lapse/entries")
        [first] = eventually(lambda: _offers(a, "lapse"), "the lapsed cart's seat offered")
        [second] = eventually(lambda: _offers(b, "lapse"), "alice's lapsed offer passed on")
        assert first["unit"] == second["unit"] == SEATS[0]
        late = a.post(
            f"/v1/waitlists/lapse/offers/{first['claim']['id']}/accept",
            json={"fence": first["claim"]["fence"]},
        )
        assert late.status_code == 409, late.text


def test_bad_input_and_other_holders(svc: Running) -> None:
    with svc.client("alice") as a, svc.client("bob") as b, svc.client() as anonymous:
        assert anonymous.get("/v1/waitlists/x").status_code == 401
        assert anonymous.post("/v1/waitlists/x/entries").status_code == 401
        for body, field in [
            ({"units": [{"resource": "dibs.semaphore:x", "slot": "0"}]}, "units[0].resource"),
            ({"units": "seat"}, "units"),
            ({"units": [], "offer_ttl": 0}, "offer_ttl"),
            ({"units": [], "extra": 1}, "extra"),
        ]:
            r = a.put("/v1/waitlists/x", json=body)
            assert r.status_code == 400 and r.json()["field"] == field, r.text
        claim = _claim(a, [SEATS[0]])
        for body, field in [
            ({"claim_id": claim["id"]}, "fence"),
            ({"claim_id": 5, "fence": 1}, "claim_id"),
        ]:
            r = a.post("/v1/waitlists/x/release", json=body)
            assert r.status_code == 400 and r.json()["field"] == field, r.text
        theirs = b.post("/v1/waitlists/x/release", json={"claim_id": claim["id"], "fence": 1})
        assert theirs.status_code == 404
        stale = a.post(
            "/v1/waitlists/x/release", json={"claim_id": claim["id"], "fence": claim["fence"] + 1}
        )
        assert stale.status_code == 409 and stale.json()["reason"] == "fence"
        # A semaphore's permit is the service's own: no list hands its slot out.
        assert a.put("/v1/semaphores/p", json={"permits": 1}).status_code == 200
        permit = a.post("/v1/semaphores/p/permits", json={"ttl": 60}).json()["claim"]
        refused = a.post(
            "/v1/waitlists/x/release", json={"claim_id": permit["id"], "fence": permit["fence"]}
        )
        assert refused.status_code == 409 and refused.json()["error"] == "not_offerable"
        # A claim that is not an offer of this list is no offer.
        not_offer = a.post(
            f"/v1/waitlists/x/offers/{claim['id']}/accept", json={"fence": claim["fence"]}
        )
        assert not_offer.status_code == 404
        bad_fence = a.post(f"/v1/waitlists/x/offers/{claim['id']}/decline", json={"fence": 0})
        assert bad_fence.status_code == 400 and bad_fence.json()["field"] == "fence"
        assert a.get("/v1/waitlists/x").json()["watching"] is None  # never PUT: not watched


def test_racing_clients_get_one_unit_each_in_line_order(svc: Running) -> None:
    units, people = 6, 14
    seats = [{"resource": f"race-{n}", "slot": "s"} for n in range(units)]
    with svc.client("seller") as seller:
        sold = [_claim(seller, [seat]) for seat in seats]
        put = seller.put("/v1/waitlists/race", json={"units": seats, "offer_ttl": 600})
        assert put.status_code == 200, put.text
    numbers: dict[str, int] = {}
    confirmed: dict[str, list[dict[str, str]]] = {}
    lock = threading.Lock()
    start = threading.Barrier(people)
    freed = threading.Barrier(units)

    def person(i: int) -> None:
        name = f"p{i}"
        with svc.client(name) as c:
            start.wait()
            joined = c.post("/v1/waitlists/race/entries")
            assert joined.status_code == 200, joined.text
            with lock:
                numbers[name] = joined.json()["number"]

    threads = [threading.Thread(target=person, args=(i,)) for i in range(people)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(set(numbers.values())) == people  # one entry each, distinct numbers

    def release(claim: dict[str, Any]) -> None:
        with svc.client("seller") as c:
            freed.wait()
            r = c.post(
                "/v1/waitlists/race/release",
                json={"claim_id": claim["id"], "fence": claim["fence"]},
            )
            assert r.status_code == 200 and r.json()["released"], r.text

    threads = [threading.Thread(target=release, args=(claim,)) for claim in sold]
    for t in threads:
        t.start()
    for t in threads:
        t.join()

    def all_offered() -> list[tuple[str, Any]]:
        found = []
        for name in numbers:
            with svc.client(name) as c:
                found += [(name, offer) for offer in _offers(c, "race")]
        return found if len(found) >= units else []

    offered = eventually(all_offered, "every freed unit offered")
    accept_now = threading.Barrier(len(offered))

    def accept(name: str, offer: dict[str, Any]) -> None:
        with svc.client(name) as c:
            accept_now.wait()
            r = c.post(
                f"/v1/waitlists/race/offers/{offer['claim']['id']}/accept",
                json={"fence": offer["claim"]["fence"]},
            )
            assert r.status_code == 200, r.text
            with lock:
                confirmed.setdefault(name, []).append(r.json()["unit"])

    threads = [threading.Thread(target=accept, args=pair) for pair in offered]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    # One entry, one unit: the first `units` in line got one each, and every unit went once.
    in_line = sorted(numbers, key=numbers.__getitem__)
    assert sorted(confirmed) == sorted(in_line[:units]), confirmed
    assert all(len(got) == 1 for got in confirmed.values()), confirmed
    assert sorted(u["resource"] for got in confirmed.values() for u in got) == sorted(
        s["resource"] for s in seats
    )
    with svc.client("seller") as c:
        assert c.get("/v1/waitlists/race").json()["waiting"] == people - units
