"""Idempotency-Key on the wire, as the IETF draft (httpapi-idempotency-key-header) has it.

The key is 1-255 printable ASCII characters, sent as a Structured Field string
(or a bare token); a reuse with the same body replays, with another body is
``422``, and a request whose key is still in flight never changes how the first
one ends.
"""

from __future__ import annotations

import string
import threading
import uuid
from typing import Any

import httpx
import pytest
from hypothesis import example, given
from hypothesis import strategies as st

import dibs
from dibs.service import ServiceConfig
from dibs.service._guard import MAX_KEY, ApiError, parse_idempotency_key
from dibs.service._ids import SECRET_UNIT
from service_support import GatedStore, serve_in_thread

pytestmark = pytest.mark.timeout(60)

PRINTABLE = st.characters(min_codepoint=0x20, max_codepoint=0x7E)


def sf_string(key: str) -> str:
    """``key`` serialized as an RFC 8941 String."""
    return '"' + key.replace("\\", "\\\\").replace('"', '\\"') + '"'


@given(st.text(PRINTABLE, min_size=1, max_size=MAX_KEY))
@example("k" * MAX_KEY)
@example('"' * MAX_KEY)
@example("\\")
def test_every_key_of_1_to_255_printable_characters_is_accepted_quoted(key: str) -> None:
    assert parse_idempotency_key(sf_string(key)) == key


@given(
    st.text(
        st.sampled_from(sorted(set(string.printable[:94]) - {'"'})), min_size=1, max_size=MAX_KEY
    )
)
def test_every_bare_token_of_1_to_255_characters_is_accepted(key: str) -> None:
    assert parse_idempotency_key(key) == key


@given(st.text(PRINTABLE, min_size=MAX_KEY + 1, max_size=2 * MAX_KEY))
def test_a_key_past_255_characters_is_refused(key: str) -> None:
    with pytest.raises(ApiError) as err:
        parse_idempotency_key(sf_string(key))
    assert err.value.status == 400 and err.value.extra == {"field": "Idempotency-Key"}


def test_a_quoted_255_character_key_claims_and_replays() -> None:
    config = ServiceConfig(store_url="memory://", keys_file=None)
    key = "k" * 254 + '"'  # the escape and the quotes are not part of the key
    body = {"targets": [{"resource": "seat-1", "slot": "s"}], "ttl": 30}
    with serve_in_thread(config) as s, s.client("alice") as c:
        first = c.post("/v1/claims", json=body, headers={"Idempotency-Key": sf_string(key)})
        again = c.post("/v1/claims", json=body, headers={"Idempotency-Key": sf_string(key)})
        longer = c.post("/v1/claims", json=body, headers={"Idempotency-Key": sf_string(key + "k")})
    assert first.status_code == 201, first.text
    assert first.json()["idempotency_key"] == key
    assert again.status_code == 201 and again.headers["idempotent-replayed"] == "true"
    assert longer.status_code == 400


class FirstClaimGated(GatedStore):
    """Only the first claim waits at the gate (before the store); later ones go straight in."""

    async def _claim(self, *args: Any) -> dibs.ClaimResult:
        if args[0].targets == (SECRET_UNIT,):
            return await super(GatedStore, self)._claim(*args)
        self.calls += 1
        if self.calls == 1:
            self.entered.set()
            await self._wait()
        return await super(GatedStore, self)._claim(*args)


@pytest.mark.parametrize("path", ["/v1/claims", "/v1/match"])
def test_another_body_while_the_first_runs_never_makes_the_first_a_422(path: str) -> None:
    store = FirstClaimGated()
    config = ServiceConfig(store_url="memory://", keys_file=None, idempotency_wait=0.2)
    field = "targets" if path == "/v1/claims" else "candidates"
    first_body = {field: [{"resource": "car-1", "slot": "s"}], "ttl": 30}
    other_body = {field: [{"resource": "car-2", "slot": "s"}], "ttl": 30}
    key = {"Idempotency-Key": sf_string(str(uuid.uuid4()))}
    with serve_in_thread(config, async_store=store) as s, s.client("alice") as c:
        first: list[httpx.Response] = []
        t = threading.Thread(
            target=lambda: first.append(c.post(path, json=first_body, headers=key))
        )
        t.start()
        assert store.entered.wait(10)
        # The first request is in flight, before the store: this one must not overtake it.
        other = c.post(path, json=other_body, headers=key)
        store.gate.set()
        t.join(30)
        after = c.post(path, json=other_body, headers=key)
    assert first[0].status_code == 201, first[0].text
    assert other.status_code in (409, 422), other.text
    if other.status_code == 409:
        assert other.json()["error"] == "in_progress" and other.headers["retry-after"] == "1"
    assert after.status_code == 422 and after.json()["error"] == "idempotency_key_reused"
    assert store.sync.holder_of(dibs.Unit("car-2", "s")) is None


def test_another_body_waits_for_the_first_then_is_422() -> None:
    store = FirstClaimGated()
    config = ServiceConfig(store_url="memory://", keys_file=None, idempotency_wait=30)
    key = {"Idempotency-Key": '"one-key"'}
    body = {"targets": [{"resource": "w-1", "slot": "s"}], "ttl": 30}
    other = {"targets": [{"resource": "w-2", "slot": "s"}], "ttl": 30}
    with serve_in_thread(config, async_store=store) as s, s.client("alice") as c:
        results: dict[str, httpx.Response] = {}
        t1 = threading.Thread(
            target=lambda: results.update(a=c.post("/v1/claims", json=body, headers=key))
        )
        t1.start()
        assert store.entered.wait(10)
        t2 = threading.Thread(
            target=lambda: results.update(b=c.post("/v1/claims", json=other, headers=key))
        )
        t2.start()
        api = s.service.api if s.service is not None else None
        assert api is not None
        # The newcomer is parked on the first request's end (its event has a waiter).
        # (The event is made for the first waiter: a request running alone has none.)
        while not any(
            r.done is not None and r.done._waiters  # type: ignore[attr-defined]
            for r in list(api._running.values())
        ):
            t2.join(0.01)
        store.gate.set()
        t1.join(30)
        t2.join(30)
    assert results["a"].status_code == 201
    assert (
        results["b"].status_code == 422 and results["b"].json()["error"] == "idempotency_key_reused"
    )


def test_match_reusing_a_key_with_other_candidates_is_422() -> None:
    config = ServiceConfig(store_url="memory://", keys_file=None)
    drivers = [{"resource": f"driver-{i}", "slot": "shift"} for i in range(3)]
    key = {"Idempotency-Key": '"ride-9"'}
    with serve_in_thread(config) as s, s.client("dispatch") as c:
        first = c.post("/v1/match", json={"candidates": drivers[:2], "ttl": 60}, headers=key)
        again = c.post("/v1/match", json={"candidates": drivers[:2], "ttl": 60}, headers=key)
        others = c.post("/v1/match", json={"candidates": drivers[1:], "ttl": 60}, headers=key)
        reordered = c.post("/v1/match", json={"candidates": drivers[1::-1], "ttl": 60}, headers=key)
        ttl = c.post("/v1/match", json={"candidates": drivers[:2], "ttl": 30}, headers=key)
        mine = c.get("/v1/claims").json()["claims"]
    assert first.status_code == 201
    assert again.status_code == 201 and again.headers["idempotent-replayed"] == "true"
    for r in (others, reordered, ttl):
        assert r.status_code == 422, r.text
        assert r.json()["error"] == "idempotency_key_reused"
    assert [c["id"] for c in mine] == [first.json()["claim"]["id"]]


@pytest.mark.parametrize("path", ["/v1/claims", "/v1/match"])
def test_an_idempotency_key_sent_twice_is_400(path: str) -> None:
    """Two field lines combine into a list (RFC 9110 section 5.3), which is no key."""
    config = ServiceConfig(store_url="memory://", keys_file=None)
    field = "targets" if path == "/v1/claims" else "candidates"
    body = {field: [{"resource": "twice", "slot": "s"}]}
    with serve_in_thread(config) as s, s.client("alice") as c:
        for keys in ([("Idempotency-Key", '"a"'), ("Idempotency-Key", '"b"')],
                     [("Idempotency-Key", '"a"'), ("Idempotency-Key", '"a"')]):  # fmt: skip
            r = c.post(path, json=body, headers=keys)
            assert r.status_code == 400, r.text
            assert r.json()["field"] == "Idempotency-Key"
        assert store_is_untouched(s)


def store_is_untouched(s: Any) -> bool:
    assert s.service is not None
    return s.service.store.holder_of(dibs.Unit("twice", "s")) is None
