"""``POST /v1/claims`` with ``"mode": "shared"``: readers together, a writer alone, over HTTP."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from dibs import FakeClock
from dibs.service import ServiceConfig
from dibs.stores.memory import MemoryStore
from service_support import Running, serve_in_thread

pytestmark = pytest.mark.timeout(60)

DOC = {"resource": "doc-7", "slot": "page-1"}


@pytest.fixture(scope="module")
def svc() -> Iterator[Running]:
    store = MemoryStore(clock=FakeClock())
    with serve_in_thread(ServiceConfig(store_url="memory://", keys_file=None), store=store) as run:
        yield run


def test_readers_share_and_a_writer_waits(svc: Running) -> None:
    body = {"targets": [DOC], "ttl": 30, "mode": "shared"}
    with svc.client("ann") as a, svc.client("bob") as b, svc.client("wes") as w:
        first = a.post("/v1/claims", json=body)
        second = b.post("/v1/claims", json=body)
        assert first.status_code == second.status_code == 201
        assert first.json()["mode"] == second.json()["mode"] == "shared"
        lost = w.post("/v1/claims", json={"targets": [DOC], "ttl": 30})
        assert lost.status_code == 409 and lost.json()["taken"] == [DOC]
        for c, doc in ((a, first.json()), (b, second.json())):
            assert c.delete(f"/v1/claims/{doc['id']}", params={"fence": doc["fence"]}).is_success
        won = w.post("/v1/claims", json={"targets": [DOC], "ttl": 30})
        assert won.status_code == 201 and won.json()["mode"] == "exclusive"
        refused = a.post("/v1/claims", json=body)
        assert refused.status_code == 409


def test_the_idempotency_key_covers_the_mode(svc: Running) -> None:
    key = {"Idempotency-Key": '"read-1"'}
    target = {"resource": "doc-8", "slot": "p"}
    with svc.client("ann") as a:
        first = a.post("/v1/claims", json={"targets": [target], "mode": "shared"}, headers=key)
        again = a.post("/v1/claims", json={"targets": [target], "mode": "shared"}, headers=key)
        other = a.post("/v1/claims", json={"targets": [target]}, headers=key)
    assert first.status_code == again.status_code == 201
    assert again.json()["id"] == first.json()["id"]
    assert other.status_code == 422


@pytest.mark.parametrize("mode", ["read", "", 1, None, ["shared"], "Shared"])
def test_a_bad_mode_is_400_naming_the_field(svc: Running, mode: object) -> None:
    with svc.client("ann") as a:
        r = a.post("/v1/claims", json={"targets": [DOC], "mode": mode})
    assert r.status_code == 400 and r.json()["field"] == "mode"
