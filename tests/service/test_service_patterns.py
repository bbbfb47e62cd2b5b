"""Lots and match over HTTP: statuses, and names that belong to the caller."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import httpx
import pytest

from dibs import Lot, Unit
from dibs.service import ServiceConfig
from dibs.service._config import LotSpec
from service_support import Running, serve_in_thread

pytestmark = pytest.mark.timeout(60)


@pytest.fixture(scope="module")
def svc() -> Iterator[Running]:
    config = ServiceConfig(store_url="memory://", keys_file=None, lots=(LotSpec("row", 6),))
    with serve_in_thread(config) as running:
        yield running


def test_park_find_and_unpark(svc: Running) -> None:
    with svc.client("alice") as a:
        assert a.get("/v1/lots").json() == {"lots": [{"name": "row", "size": 6}]}
        parked = a.post("/v1/lots/row/vehicles", json={"vehicle": "van", "length": 2})
        assert parked.status_code == 201
        doc = parked.json()
        assert doc["vehicle"] == "van" and doc["length"] == 2
        again = a.post("/v1/lots/row/vehicles", json={"vehicle": "van", "length": 2})
        assert again.status_code == 201 and again.json()["position"] == doc["position"]
        other = a.post("/v1/lots/row/vehicles", json={"vehicle": "van", "length": 3})
        assert other.status_code == 409 and other.json()["error"] == "already_parked"
        assert other.json()["position"] == doc["position"] and other.json()["length"] == 2
        found = a.get("/v1/lots/row/vehicles/van")
        assert found.status_code == 200 and found.json()["position"] == doc["position"]
        view = a.get("/v1/lots/row").json()
        assert view["snapshot"] is True and view["free"] == 4
        assert [s["state"] for s in view["slots"]].count("yours") == 2
        gone = a.delete("/v1/lots/row/vehicles/van")
        assert gone.status_code == 200 and gone.json()["position"] == doc["position"]
        assert a.delete("/v1/lots/row/vehicles/van").status_code == 404
        assert a.get("/v1/lots/row/vehicles/van").status_code == 404


def test_a_full_lot_answers_409_and_bad_input_400(svc: Running) -> None:
    with svc.client("carol") as c:
        assert (
            c.post("/v1/lots/row/vehicles", json={"vehicle": "bus", "length": 6}).status_code == 201
        )
        full = c.post("/v1/lots/row/vehicles", json={"vehicle": "bike"})
        assert full.status_code == 409 and full.json()["error"] == "full"
        for body, field in [
            ({"vehicle": "x", "length": 0}, "length"),
            ({"vehicle": "x", "length": 7}, "length"),
            ({"vehicle": ""}, "vehicle"),
            ({"length": 1}, "vehicle"),
            ({"vehicle": "x", "color": "red"}, "color"),
        ]:
            r = c.post("/v1/lots/row/vehicles", json=body)
            assert r.status_code == 400 and r.json()["field"] == field, body
        assert c.post("/v1/lots/none/vehicles", json={"vehicle": "x"}).status_code == 404
        assert c.get("/v1/lots/none").status_code == 404
        c.delete("/v1/lots/row/vehicles/bus")


def test_vehicle_names_belong_to_their_holder(svc: Running) -> None:
    with svc.client("alice") as a, svc.client("bob") as b:
        mine = a.post("/v1/lots/row/vehicles", json={"vehicle": "car-1"}).json()
        assert b.get("/v1/lots/row/vehicles/car-1").status_code == 404
        assert b.delete("/v1/lots/row/vehicles/car-1").status_code == 404
        theirs = b.post("/v1/lots/row/vehicles", json={"vehicle": "car-1"})
        assert theirs.status_code == 201 and theirs.json()["position"] != mine["position"]
        seen_by_bob = b.get("/v1/lots/row").json()["slots"]
        assert seen_by_bob[mine["position"]] == {"state": "taken"}
        assert "alice" not in b.get("/v1/lots/row").text
        assert a.get("/v1/lots/row/vehicles/car-1").json()["position"] == mine["position"]
        a.delete("/v1/lots/row/vehicles/car-1")
        b.delete("/v1/lots/row/vehicles/car-1")


def test_concurrent_parks_never_share_a_slot(svc: Running) -> None:
    positions: list[tuple[int, int]] = []
    lock = threading.Lock()

    def park(i: int) -> None:
        with svc.client(f"driver-{i}") as c:
            r = c.post("/v1/lots/row/vehicles", json={"vehicle": "v", "length": 1 + i % 2})
            if r.status_code == 201:
                with lock:
                    positions.append((r.json()["position"], r.json()["length"]))
            else:
                assert r.status_code == 409 and r.json()["error"] == "full"

    threads = [threading.Thread(target=park, args=(i,)) for i in range(12)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    slots = [p + k for p, n in positions for k in range(n)]
    assert len(slots) == len(set(slots)) and all(0 <= s < 6 for s in slots)
    for i in range(12):
        with svc.client(f"driver-{i}") as c:
            c.delete("/v1/lots/row/vehicles/v")


def test_match_claims_the_first_free_candidate_and_replays(svc: Running) -> None:
    drivers = [{"resource": f"driver-{i}", "slot": "shift"} for i in range(3)]
    key = {"Idempotency-Key": '"ride-1"'}
    with svc.client("dispatch-a") as a, svc.client("dispatch-b") as b:
        first = a.post("/v1/match", json={"candidates": drivers, "ttl": 60}, headers=key)
        assert first.status_code == 201
        assert first.json()["candidate"] == drivers[0]
        assert first.json()["claim"]["state"] == "held"
        again = a.post("/v1/match", json={"candidates": drivers, "ttl": 60}, headers=key)
        assert again.status_code == 201 and again.headers["idempotent-replayed"] == "true"
        assert again.json()["claim"]["id"] == first.json()["claim"]["id"]
        # Bob's "ride-1" is another ride: it gets the next driver.
        other = b.post("/v1/match", json={"candidates": drivers}, headers=key)
        assert other.status_code == 201 and other.json()["candidate"] == drivers[1]
        b.post("/v1/match", json={"candidates": drivers}, headers={"Idempotency-Key": '"r2"'})
        none = b.post(
            "/v1/match", json={"candidates": drivers}, headers={"Idempotency-Key": '"r3"'}
        )
        assert none.status_code == 409 and none.json()["error"] == "none_free"
        no_key = b.post("/v1/match", json={"candidates": drivers})
        assert no_key.status_code == 400 and no_key.json()["field"] == "Idempotency-Key"
        spans = b.post(
            "/v1/match",
            json={"candidates": [{"resource": "r", "start": 1, "end": 2}]},
            headers={"Idempotency-Key": '"r4"'},
        )
        assert spans.status_code == 400 and spans.json()["field"] == "candidates"
        # The claim is the caller's own: another holder cannot read it.
        claim_id = first.json()["claim"]["id"]
        assert b.get(f"/v1/claims/{claim_id}").status_code == 404
        assert a.get(f"/v1/claims/{claim_id}").status_code == 200


def test_lot_and_match_need_a_key(svc: Running) -> None:
    with httpx.Client(base_url=svc.url) as anon:
        for method, path in [
            ("GET", "/v1/lots"),
            ("GET", "/v1/lots/row"),
            ("POST", "/v1/lots/row/vehicles"),
            ("GET", "/v1/lots/row/vehicles/v"),
            ("DELETE", "/v1/lots/row/vehicles/v"),
            ("POST", "/v1/match"),
        ]:
            assert anon.request(method, path).status_code == 401, path


def test_a_park_blocked_outside_the_api_answers_409_at_once(svc: Running) -> None:
    # A library caller on the same store holds the vehicle unit (the API cannot
    # reach it): the park ends with 409 rather than spinning until the timeout.
    assert svc.service is not None
    store = svc.service.store
    assert store.claim(Unit("dibs.lot:row", "vehicle:dibs.4:dave:van-1"), holder="mallory")
    with svc.client("dave") as d:
        r = d.post("/v1/lots/row/vehicles", json={"vehicle": "van-1"})
        assert r.status_code == 409 and r.json()["error"] == "vehicle_blocked"
        assert d.post("/v1/lots/row/vehicles", json={"vehicle": "van-2"}).status_code == 201
        assert d.delete("/v1/lots/row/vehicles/van-2").status_code == 200


def test_a_lot_stored_with_another_size_answers_400_not_500() -> None:
    # The store keeps a lot's size: a service configured with another one than a
    # deployment before it (here a library lot on its units) refuses every lot call.
    config = ServiceConfig(store_url="memory://", keys_file=None, lots=(LotSpec("yard", 5),))
    with serve_in_thread(config) as running:
        assert running.service is not None
        store = running.service.store
        assert Lot(store, "yard", 3, resource="dibs.lot:yard").park("x") == 0
        with running.client("erin") as e:
            for method, path, body in [
                ("GET", "/v1/lots/yard", None),
                ("POST", "/v1/lots/yard/vehicles", {"vehicle": "van"}),
                ("GET", "/v1/lots/yard/vehicles/van", None),
                ("DELETE", "/v1/lots/yard/vehicles/van", None),
            ]:
                r = e.request(method, path, json=body)
                assert r.status_code == 400, (path, r.text)
                assert r.json()["error"] == "invalid" and r.json()["field"] == "size", r.text
