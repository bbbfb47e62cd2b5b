"""The wire format, held strictly: one test per finding of issue 12, over HTTP on loopback.

Each of these answered a 5xx, hung, let one holder block another, or took
input the schema does not allow, before the fix.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

import dibs
from dibs.service import ServiceConfig
from dibs.service._ids import ClaimIds
from dibs.service._openapi import openapi_document
from dibs.service._wire import MAX_BOUND, MAX_FENCE, MAX_NAME, MAX_TTL, MIN_TTL
from service_support import Running, serve_in_thread

pytestmark = pytest.mark.timeout(60)

SECRET = b"a test secret of enough bytes"


@pytest.fixture(scope="module")
def svc(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Running]:
    # SQLite: its INTEGER claim IDs are where a 2**63 claim ID used to give 500.
    path = tmp_path_factory.mktemp("wire") / "dibs.db"
    config = ServiceConfig(
        store_url=f"sqlite:///{path}", keys_file=None, id_secret=SECRET, request_timeout=5
    )
    with dibs.open(config.store_url) as store, serve_in_thread(config, store=store) as running:
        yield running


def unit(resource: str, slot: str = "s") -> dict[str, str]:
    return {"resource": resource, "slot": slot}


def claim(c: httpx.Client, *targets: dict[str, Any], ttl: float | None = 60) -> dict[str, Any]:
    r = c.post("/v1/claims", json={"targets": list(targets), "ttl": ttl})
    assert r.status_code == 201, r.text
    doc: dict[str, Any] = r.json()
    return doc


def assert_json_error(r: httpx.Response, status: int, field: str | None = None) -> None:
    assert r.status_code == status, (r.status_code, r.text)
    assert r.headers["content-type"] == "application/problem+json"
    doc = r.json()
    assert set(doc) >= {"error", "message"}
    if field is not None:
        assert doc["field"] == field, doc


# --- defects ---------------------------------------------------------------------------------


@pytest.mark.parametrize("claim_id", ["9223372036854775808", "99999999999999999999999", "1"])
def test_claim_ids_past_63_bits_are_404_not_500(svc: Running, claim_id: str) -> None:
    with svc.client("alice") as c:
        for method, path, body in [
            ("GET", f"/v1/claims/{claim_id}", None),
            ("POST", f"/v1/claims/{claim_id}/confirm", {"fence": 1}),
            ("POST", f"/v1/claims/{claim_id}/extend", {"fence": 1, "ttl": 5}),
            ("DELETE", f"/v1/claims/{claim_id}", {"fence": 1}),
        ]:
            assert_json_error(c.request(method, path, json=body), 404)


HUGE = "1" + "0" * 400


def big(text: str) -> str:
    """``text`` with each ``N`` spelled as a 401-digit JSON integer."""
    return text.replace("N", HUGE)


@pytest.mark.parametrize(
    ("path", "raw", "field"),
    [
        ("/v1/claims", big('{"targets": [{"resource": "r", "slot": ""}], "ttl": N}'), "body"),
        ("/v1/claims", big('{"targets": [{"resource": "r", "start": 0, "end": N}]}'), "body"),
        ("/v1/claims", big('{"targets": [{"resource": "r", "start": -N, "end": 1}]}'), "body"),
        ("/v1/claims", '{"targets": [{"resource": "r", "slot": ""}], "ttl": 1e400}', "body"),
        ("/v1/claims", '{"targets": [{"resource": "r", "slot": ""}], "ttl": NaN}', "body"),
        ("/v1/claims", '{"targets": [{"resource": "r", "start": 0, "end": 1e300}]}', None),
        (
            "/v1/claims",
            '{"targets": [{"resource": "r", "slot": ""}], "ttl": 1208925819614629174706176}',
            "ttl",
        ),
        ("/v1/match", big('{"candidates": [{"resource": "d"}], "ttl": N}'), "body"),
        # Past Python's int-to-str digit limit (4300): json.loads itself raises ValueError.
        ("/v1/claims", '{"targets": [], "ttl": 1' + "0" * 5000 + "}", "body"),
        ("/v1/match", '{"candidates": [{"resource": "d"}], "ttl": -1' + "0" * 5000 + "}", "body"),
    ],
    ids=lambda value: value if len(str(value)) < 40 else f"{len(str(value))}-chars",
)
def test_numbers_too_large_for_a_float_are_400(
    svc: Running, path: str, raw: str, field: str | None
) -> None:
    with svc.client("alice") as c:
        r = c.post(
            path,
            content=raw,
            headers={"Content-Type": "application/json", "Idempotency-Key": '"big"'},
        )
    assert_json_error(r, 400, field)


def test_extend_with_a_huge_ttl_is_400(svc: Running) -> None:
    with svc.client("alice") as c:
        doc = claim(c, unit(f"ext-{uuid.uuid4()}"))
        r = c.post(
            f"/v1/claims/{doc['id']}/extend",
            content=big(f'{{"fence": {doc["fence"]}, "ttl": N}}'),
            headers={"Content-Type": "application/json"},
        )
    assert_json_error(r, 400, "body")


def test_no_holder_can_claim_the_match_keys_of_another(svc: Running) -> None:
    alice_key = f"5:alice:ride-{uuid.uuid4()}"
    with svc.client("bob") as b, svc.client("alice") as a:
        for resource in ("dibs.match", "dibs.lot:lot-1", "dibs.anything"):
            r = b.post("/v1/claims", json={"targets": [unit(resource, alice_key)]})
            assert_json_error(r, 400, "targets[0].resource")
        span = {"resource": "dibs.match", "start": 1, "end": 2}
        assert_json_error(b.post("/v1/claims", json={"targets": [span]}), 400)
        assert_json_error(
            b.get("/v1/resources/dibs.match", params={"slot": alice_key}), 400, "resource"
        )
        ride = {"candidates": [unit(f"driver-{uuid.uuid4()}")]}
        r = a.post("/v1/match", json=ride, headers={"Idempotency-Key": alice_key.split(":")[2]})
        assert r.status_code == 201, r.text


def test_no_holder_can_block_the_vehicle_of_another(svc: Running) -> None:
    with svc.client("bob") as b, svc.client("alice") as a:
        # The lot's old and new vehicle units, both as bob would spell alice's van.
        for target in (
            unit("lot:lot-1", "vehicle:5:alice:van-9"),
            unit("dibs.lot:lot-1", "vehicle:dibs.5:alice:van-9"),
        ):
            b.post("/v1/claims", json={"targets": [target]})
        r = a.post("/v1/lots/lot-1/vehicles", json={"vehicle": "van-9", "length": 2})
        assert r.status_code == 201, r.text
        assert a.delete("/v1/lots/lot-1/vehicles/van-9").status_code == 200


def test_no_key_can_be_made_for_the_services_own_holders(tmp_path: Path) -> None:
    ring = dibs.service.KeyRing(tmp_path / "keys.json")
    for holder in ("dibs.5:alice:van-9", "x" * 201, "é" * 101):
        with pytest.raises(dibs.InvalidInput):
            ring.create(holder)


# --- opaque claim IDs ------------------------------------------------------------------------


def test_claim_ids_are_opaque_fixed_length_and_url_safe(svc: Running) -> None:
    with svc.client("alice") as c:
        docs = [claim(c, unit(f"op-{uuid.uuid4()}")) for _ in range(5)]
    ids = [d["id"] for d in docs]
    assert all(re.fullmatch(r"[A-Za-z0-9_-]{16}", i) for i in ids), ids
    fences = [d["fence"] for d in docs]
    assert fences == sorted(fences)  # the fence still increases: it is the fencing token
    assert not any(str(f) in i for f, i in zip(fences, ids, strict=True))


def test_a_tampered_claim_id_is_404(svc: Running) -> None:
    with svc.client("alice") as c:
        doc = claim(c, unit(f"tamper-{uuid.uuid4()}"))
        wire = doc["id"]
        for i in range(len(wire)):
            forged = wire[:i] + ("A" if wire[i] != "A" else "B") + wire[i + 1 :]
            assert_json_error(c.get(f"/v1/claims/{forged}"), 404)
        assert c.get(f"/v1/claims/{wire}").status_code == 200


def test_claim_ids_round_trip_only_under_their_secret() -> None:
    ours, theirs = ClaimIds(SECRET), ClaimIds(b"another secret of enough bytes")
    for store_id in ("1", "17", str(2**63 - 1), str(2**63), "0a1b2c3d-42", "017", "é"):
        wire = ours.to_wire(store_id)
        assert ours.from_wire(wire) == store_id
        assert theirs.from_wire(wire) is None
    assert ours.from_wire("not an id") is None and ours.from_wire("") is None


# --- a strict wire format --------------------------------------------------------------------


@pytest.mark.parametrize(
    "headers",
    [
        {"Content-Type": "text/plain"},
        {"Content-Type": "application/x-www-form-urlencoded"},
        {"Content-Type": "application/json; charset=latin-1"},
        {},
    ],
)
def test_a_body_that_is_not_application_json_is_415(svc: Running, headers: dict[str, str]) -> None:
    body = b'{"targets": [{"resource": "ct", "slot": ""}]}'
    with svc.client("alice") as c:
        r = c.post("/v1/claims", content=body, headers=headers)
    assert_json_error(r, 415)


@pytest.mark.parametrize(
    ("raw", "field"),
    [
        (b'\xef\xbb\xbf{"targets": [{"resource": "bom", "slot": ""}]}', "body"),
        (b'{"targets": [{"resource": "a", "slot": ""}], "targets": []}', "body"),
        (b'{"targets": [{"resource": "a", "resource": "b", "slot": ""}]}', "body"),
        (b'{"targets": [{"resource": "a\\ud800", "slot": ""}]}', "targets[0].resource"),
        (b'{"targets": [{"resource": "\xff", "slot": ""}]}', "body"),
    ],
)
def test_bom_duplicate_keys_and_bad_text_are_400(svc: Running, raw: bytes, field: str) -> None:
    with svc.client("alice") as c:
        r = c.post("/v1/claims", content=raw, headers={"Content-Type": "application/json"})
    assert_json_error(r, 400, field)


def test_fences_are_json_integers_only(svc: Running) -> None:
    with svc.client("alice") as c:
        doc = claim(c, unit(f"fence-{uuid.uuid4()}"))
        cid, fence = doc["id"], doc["fence"]
        arabic = str(fence).translate(str.maketrans("0123456789", "٠١٢٣٤٥٦٧٨٩"))
        for bad in (str(fence), arabic, float(fence), MAX_FENCE + 1, True):
            r = c.post(f"/v1/claims/{cid}/confirm", json={"fence": bad})
            assert_json_error(r, 400, "fence")
        for bad in (arabic, f"+{fence}", f"0{fence}", f" {fence}", f"{fence}.0", "²"):
            assert_json_error(c.delete(f"/v1/claims/{cid}", params={"fence": bad}), 400, "fence")
        r = c.delete(f"/v1/claims/{cid}?fence={fence}&fence={fence}")
        assert_json_error(r, 400, "fence")
        assert c.delete(f"/v1/claims/{cid}", params={"fence": fence}).json()["released"] is True


@pytest.mark.parametrize(
    "path", ["/v1/claims/%2f", "/v1/claims/%2F/confirm", "/v1/claims/", "/v1/", "/v1/nothing"]
)
def test_every_path_under_v1_answers_json(svc: Running, path: str) -> None:
    with svc.client("alice", follow_redirects=False) as c:
        for method in ("GET", "POST", "DELETE"):
            r = c.request(method, path)
            assert 400 <= r.status_code < 500, (method, path, r.status_code)
            assert r.headers["content-type"] == "application/problem+json", (method, path)


def test_releasing_an_ended_claim_is_200_released_false(svc: Running) -> None:
    with svc.client("alice") as c:
        doc = claim(c, unit(f"rel-{uuid.uuid4()}"))
        first = c.delete(f"/v1/claims/{doc['id']}", params={"fence": doc["fence"]})
        again = c.delete(f"/v1/claims/{doc['id']}", params={"fence": doc["fence"]})
        assert first.json()["released"] is True
        assert again.status_code == 200 and again.json()["released"] is False
        assert again.json()["claim"]["state"] == "released"
        assert_json_error(c.get(f"/v1/claims/{doc['id']}"), 404)  # gone, as DELETE promised


def test_idempotent_replayed_means_only_this_key_answered_before(svc: Running) -> None:
    target = unit(f"natural-{uuid.uuid4()}")
    body = {"targets": [target], "ttl": 60}
    with svc.client("alice") as c:
        first = c.post("/v1/claims", json=body, headers={"Idempotency-Key": '"k1"'})
        assert first.status_code == 201 and "idempotent-replayed" not in first.headers
        # Exactly what alice holds, under another key, no key, another ttl: the
        # natural key answers her claim, 200, and no key of these was seen before.
        for headers, ttl in [({"Idempotency-Key": '"k2"'}, 60), ({}, 60), ({}, 300)]:
            r = c.post("/v1/claims", json={**body, "ttl": ttl}, headers=headers)
            assert r.status_code == 200 and "idempotent-replayed" not in r.headers
            assert r.json()["id"] == first.json()["id"]
        replay = c.post("/v1/claims", json=body, headers={"Idempotency-Key": '"k1"'})
        assert replay.status_code == 201 and replay.headers["idempotent-replayed"] == "true"
        assert replay.json() == first.json()


def test_messages_use_iso_times_and_never_say_how_a_resource_is_used(svc: Running) -> None:
    room = f"room-{uuid.uuid4()}"
    with svc.client("alice") as a, svc.client("bob") as b:
        backwards = {"resource": room, "start": "2026-12-04T10:00:00+01:00",
                     "end": "2026-12-03T14:00:00Z"}  # fmt: skip
        r = a.post("/v1/claims", json={"targets": [backwards]})
        assert_json_error(r, 400, "targets[0].end")
        assert "2026-12-04T09:00:00Z" in r.json()["message"]
        assert "datetime" not in r.text
        claim(a, {"resource": room, "start": "2026-12-03T14:00:00Z", "end": "2026-12-04T10:00:00Z"})
        # Spans of the other kind (numbers) while alice holds times: a loss like
        # any other, that says nothing of how the room is used.
        numbers = {"resource": room, "start": 1, "end": 2}
        r = b.post("/v1/claims", json={"targets": [unit("seat-x"), numbers]})
        assert_json_error(r, 409)
        assert r.json()["error"] == "taken" and r.json()["taken"] == [numbers]
        message = r.json()["message"]
        for word in ("datetime", "holds", "time spans", "kind", room):
            assert word not in message


def test_hold_lost_and_not_found_never_show_store_ids(svc: Running) -> None:
    with svc.client("alice") as c:
        doc = claim(c, unit(f"lost-{uuid.uuid4()}"))
        r = c.post(f"/v1/claims/{doc['id']}/confirm", json={"fence": doc["fence"] + 1})
        assert_json_error(r, 409)
        assert str(doc["fence"]) not in r.json()["message"]


def test_the_openapi_document_takes_its_limits_from_the_wire_module() -> None:
    doc = openapi_document(7)
    schemas = doc["components"]["schemas"]
    assert schemas["ClaimRequest"]["properties"]["targets"]["maxItems"] == 7
    assert schemas["ClaimRequest"]["properties"]["ttl"]["maximum"] == MAX_TTL
    assert schemas["ExtendRequest"]["properties"]["ttl"]["minimum"] == MIN_TTL
    assert schemas["FenceRequest"]["properties"]["fence"]["maximum"] == MAX_FENCE
    assert schemas["Unit"]["properties"]["resource"]["maxLength"] == MAX_NAME
    bound = schemas["Span"]["properties"]["start"]["oneOf"][0]
    assert bound["maximum"] == MAX_BOUND


def test_the_claim_id_secret_comes_from_a_file_or_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from dibs.service._cli import _id_secret

    secret = tmp_path / "id-secret"
    secret.write_bytes(SECRET + b"\n")
    monkeypatch.setenv("DIBS_ID_SECRET", "from the environment, long enough")
    assert _id_secret(str(secret)) == SECRET
    assert _id_secret(None) == b"from the environment, long enough"
    monkeypatch.delenv("DIBS_ID_SECRET")
    assert _id_secret(None) is None
    with pytest.raises(dibs.InvalidInput):
        ServiceConfig(id_secret=b"short")
