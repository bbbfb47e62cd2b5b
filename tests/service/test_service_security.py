"""Who may do what: the holder comes from the key, and nobody touches another's claims."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

import dibs
from dibs import FakeClock
from dibs._queue import queue_name
from dibs.service import KeyRing, ServiceConfig
from dibs.service._wire import RESERVED
from dibs.stores.memory import MemoryStore
from service_support import Running, serve_in_thread

pytestmark = pytest.mark.timeout(60)

SHOW = "show-1"


@pytest.fixture(scope="module")
def world(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[Running, MemoryStore, FakeClock]]:
    clock = FakeClock()
    store = MemoryStore(clock=clock)
    keys = KeyRing(tmp_path_factory.mktemp("keys") / "keys.json")
    config = ServiceConfig(store_url="memory://", keys_file=None)
    with serve_in_thread(config, store=store, keys=keys) as running:
        yield running, store, clock


def _alice_claims(s: Running, clock: FakeClock) -> dict[str, dict[str, Any]]:
    """Alice's claims in every state, each made with an Idempotency-Key."""
    claims = {}
    with s.client("alice") as a:
        for state, ttl in [("held", 600), ("confirmed", None), ("released", 600), ("expiring", 1)]:
            r = a.post(
                "/v1/claims",
                json={"targets": [{"resource": f"x-{state}", "slot": SHOW}], "ttl": ttl},
                headers={"Idempotency-Key": f'"alice-{state}"'},
            )
            assert r.status_code == 201
            claims[state] = r.json()
        released = claims["released"]
        a.delete(f"/v1/claims/{released['id']}", params={"fence": released["fence"]})
    clock.advance(2)  # the "expiring" hold is now dead
    return claims


def test_cross_holder_matrix_has_no_successes(
    world: tuple[Running, MemoryStore, FakeClock],
) -> None:
    s, store, clock = world
    claims = _alice_claims(s, clock)
    assert s.service is not None
    ids = s.service.api.ids

    def stored(wire_id: str) -> dibs.Claim | None:
        store_id = ids.from_wire(wire_id)
        assert store_id is not None
        return store.get(store_id)

    before = {c["id"]: stored(c["id"]) for c in claims.values()}
    attempts: list[tuple[str, httpx.Response]] = []
    with s.client("bob") as b:
        for state, c in claims.items():
            cid, fence = c["id"], c["fence"]
            target = c["targets"][0]
            for name, method, path, kwargs in [
                ("get", "GET", f"/v1/claims/{cid}", {}),
                ("confirm", "POST", f"/v1/claims/{cid}/confirm", {"json": {"fence": fence}}),
                ("extend", "POST", f"/v1/claims/{cid}/extend",
                 {"json": {"fence": fence, "ttl": 60}}),
                ("release-body", "DELETE", f"/v1/claims/{cid}", {"json": {"fence": fence}}),
                ("release-query", "DELETE", f"/v1/claims/{cid}", {"params": {"fence": fence}}),
                ("list", "GET", "/v1/claims", {"params": {"holder": "alice"}}),
                # Alice's Idempotency-Key with Alice's body must not replay Alice's claim.
                ("replay-key", "POST", "/v1/claims",
                 {"json": {"targets": [target], "ttl": 600 if state != "confirmed" else None},
                  "headers": {"Idempotency-Key": f'"alice-{state}"'}}),
            ]:  # fmt: skip
                attempts.append((f"{state}/{name}", b.request(method, path, **kwargs)))
        # Bob cannot read Alice's claims through the list either.
        mine = b.get("/v1/claims").json()["claims"]
        # Nor find or move Alice's parked vehicle, nor replay her dispatch.
        with s.client("alice") as a:
            assert a.post("/v1/lots/lot-1/vehicles", json={"vehicle": "car-9"}).status_code == 201
            ride = {"candidates": [{"resource": "driver-9", "slot": "s"}]}
            key = {"Idempotency-Key": '"ride-9"'}
            assert a.post("/v1/match", json=ride, headers=key).status_code == 201
        attempts.append(("lot/get", b.get("/v1/lots/lot-1/vehicles/car-9")))
        attempts.append(("lot/unpark", b.delete("/v1/lots/lot-1/vehicles/car-9")))
        attempts.append(("match/replay", b.post("/v1/match", json=ride, headers=key)))
    alice_token = s.token("alice")
    key_id = alice_token.split("_")[1]
    with httpx.Client(base_url=s.url) as anon:
        forged = f"dibs_{key_id}_{s.token('bob').split('_', 2)[2]}"
        for name, token in [("forged-secret", forged), ("truncated", alice_token[:-1])]:
            attempts.append(
                (name, anon.get("/v1/claims", headers={"Authorization": f"Bearer {token}"}))
            )

    alice_ids = {c["id"] for c in claims.values()}
    successes = []
    for name, r in attempts:
        if name.endswith("replay-key") and r.status_code == 201:
            # Bob may win a seat Alice let go, under his own holder: a claim of his own.
            doc = r.json()
            if (
                doc["holder"] == "bob"
                and doc["id"] not in alice_ids
                and ("idempotent-replayed" not in r.headers)
            ):
                continue
        if r.is_success or r.headers.get("idempotent-replayed") == "true":
            successes.append((name, r.status_code, r.text))
    assert successes == []
    # Existence never leaks: another holder's claim answers exactly like a missing one.
    statuses = {name: r.status_code for name, r in attempts}
    for state in claims:
        for op in ("get", "confirm", "extend", "release-body", "release-query"):
            assert statuses[f"{state}/{op}"] == 404, (state, op)
        assert statuses[f"{state}/list"] == 403
    assert statuses["forged-secret"] == statuses["truncated"] == 401
    assert statuses["lot/get"] == statuses["lot/unpark"] == 404
    assert statuses["match/replay"] == 409  # the driver is Alice's; Bob's ride-9 is his own
    with s.client("alice") as a:
        assert a.get("/v1/lots/lot-1/vehicles/car-9").status_code == 200
    assert all(c["holder"] == "bob" for c in mine)
    # And nothing of Alice's changed, but for Bob's fair takeover of her dead hold.
    after = {c["id"]: stored(c["id"]) for c in claims.values()}
    dead = claims["expiring"]["id"]
    assert after.pop(dead).taken_over and not before.pop(dead).taken_over  # type: ignore[union-attr]
    assert after == before


def test_the_body_cannot_choose_the_holder(world: tuple[Running, MemoryStore, FakeClock]) -> None:
    s, _, _ = world
    with s.client("bob") as b:
        r = b.post(
            "/v1/claims",
            json={"targets": [{"resource": "h1", "slot": SHOW}], "holder": "alice"},
        )
        ok = b.post("/v1/claims", json={"targets": [{"resource": "h1", "slot": SHOW}]})
    assert r.status_code == 400 and r.json()["field"] == "holder"
    assert ok.json()["holder"] == "bob"


@pytest.mark.parametrize("kind", ["waitlist", "lease", "semaphore", "booking"])
def test_a_patterns_queue_units_are_reserved_so_no_client_can_block_a_queue(
    world: tuple[Running, MemoryStore, FakeClock], kind: str
) -> None:
    """Before: fair waiters' and waiting lists' queues were named ``dibs-queue-...``,
    outside the reserved ``dibs.`` names, so a client could claim a queue's counter
    or a ticket through ``POST /v1/claims`` and stall every waiter behind it."""
    s, _, _ = world
    name = queue_name(kind, "dibs.waitlist:show-1")
    assert name.startswith(RESERVED)
    with s.client("mallory") as m:
        for slot in ("next", "1"):
            r = m.post("/v1/claims", json={"targets": [{"resource": name, "slot": slot}]})
            assert r.status_code == 400 and r.json()["field"] == "targets[0].resource", r.text


def test_keys_file_keeps_only_digests(tmp_path: Path) -> None:
    ring = KeyRing(tmp_path / "keys.json")
    token, record = ring.create("alice", name="web")
    text = (tmp_path / "keys.json").read_text()
    assert token not in text and token.split("_", 2)[2] not in text
    assert record.sha256 in text
    assert (tmp_path / "keys.json").stat().st_mode & 0o077 == 0
    assert KeyRing(tmp_path / "keys.json").authenticate(token) == record
    assert ring.authenticate(token[:-1] + ("A" if token[-1] != "A" else "B")) is None


def test_keys_command_creates_lists_and_revokes(tmp_path: Path) -> None:
    keys = tmp_path / "keys.json"

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "dibs.service", "keys", "--keys", str(keys), *args],
            capture_output=True,
            text=True,
            check=False,
        )

    made = run("create", "--holder", "alice", "--json")
    assert made.returncode == 0, made.stderr
    doc = json.loads(made.stdout)
    assert KeyRing(keys).authenticate(doc["key"]) is not None
    listed = run("list")
    assert doc["id"] in listed.stdout and "alice" in listed.stdout
    assert doc["key"] not in listed.stdout
    assert run("revoke", doc["id"]).returncode == 0
    assert KeyRing(keys).authenticate(doc["key"]) is None
    assert run("revoke", doc["id"]).returncode == 2
    assert run("create", "--holder", " bad ").returncode == 2


def test_the_dibs_command_has_serve_and_keys(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from dibs.cli import main

    keys = tmp_path / "keys.json"
    assert main(["keys", "--keys", str(keys), "create", "--holder", "dora", "--json"]) == 0
    token = json.loads(capsys.readouterr().out)["key"]
    assert KeyRing(keys).authenticate(token) is not None
    with pytest.raises(SystemExit):
        main(["serve", "--help"])
    assert "--showing" in capsys.readouterr().out
