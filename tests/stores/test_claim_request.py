"""ClaimRequest: a claim's input checked once, and the one value every store's _claim takes."""

from __future__ import annotations

import pickle
import warnings
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

import dibs
from dibs._model import fingerprint
from dibs.stores.memory import MemoryStore

units = st.builds(
    dibs.Unit,
    st.text(min_size=1, max_size=8).filter(lambda s: "\x00" not in s),
    st.text(max_size=8).filter(lambda s: "\x00" not in s),
)


def test_checks_and_normalizes_once() -> None:
    a, b = dibs.Unit("show", "A1"), dibs.Unit("show", "A2")
    request = dibs.ClaimRequest([b, a, b], holder="alice", request_id="r-1", ttl=30)
    assert request.targets == (a, b)
    assert request.ttl == 30.0 and type(request.ttl) is float
    assert request == dibs.ClaimRequest([a, b], holder="alice", request_id="r-1", ttl=30.0)
    assert hash(request) == hash(
        dibs.ClaimRequest((a, b), holder="alice", request_id="r-1", ttl=30.0)
    )
    assert request != request.replace(ttl=31)
    assert request.replace(request_id=None).request_id is None


@pytest.mark.parametrize(
    ("field", "kwargs"),
    [
        ("holder", {"holder": ""}),
        ("request_id", {"holder": "a", "request_id": "bad\x00id"}),
        ("ttl", {"holder": "a", "ttl": -1}),
        ("ttl", {"holder": "a", "ttl": float("nan")}),
    ],
)
def test_bad_input_is_invalid_input_naming_the_field(field: str, kwargs: dict[str, Any]) -> None:
    with pytest.raises(dibs.InvalidInput) as raised:
        dibs.ClaimRequest(dibs.Unit("r", "s"), **kwargs)
    assert raised.value.field == field


def test_is_immutable_and_pickles() -> None:
    request = dibs.ClaimRequest(dibs.Unit("r", "s"), holder="a", request_id="x")
    with pytest.raises(AttributeError):
        request.holder = "b"  # type: ignore[misc]
    assert pickle.loads(pickle.dumps(request)) == request


@given(
    st.lists(units, min_size=1, max_size=5),
    st.none() | st.floats(0.001, 31_622_400.0) | st.integers(1, 31_622_400),
)
def test_fingerprint_is_computed_once_and_matches_the_stores(
    targets: list[dibs.Unit], ttl: float | int | None
) -> None:
    request = dibs.ClaimRequest(targets, holder="h", request_id="r", ttl=ttl)
    assert request.fingerprint == fingerprint("h", request.targets, request.ttl)
    assert request.fingerprint is request.fingerprint


def test_every_store_claim_takes_one_request() -> None:
    seen: list[dibs.ClaimRequest] = []

    class Recording(MemoryStore):
        def _claim(self, request: dibs.ClaimRequest) -> dibs.ClaimResult:
            seen.append(request)
            return super()._claim(request)

    with Recording() as store:
        store.claim([dibs.Unit("r", "1"), dibs.Span("room", 1, 2)], holder="h", ttl=5)
    assert seen == [
        dibs.ClaimRequest([dibs.Unit("r", "1"), dibs.Span("room", 1, 2)], holder="h", ttl=5)
    ]


def test_a_store_with_the_old_four_argument_claim_still_works_and_is_told() -> None:
    with pytest.warns(DeprecationWarning, match="OldStyle._claim"):

        class OldStyle(MemoryStore):
            def _claim(  # type: ignore[override]
                self,
                targets: tuple[dibs.Target, ...],
                holder: str,
                request_id: str | None,
                ttl: float | None,
            ) -> dibs.ClaimResult:
                return super()._claim(dibs.ClaimRequest.of(targets, holder, request_id, ttl))

    with OldStyle() as store:
        span = dibs.Span("room", 1, 2)
        assert store.claim([span], holder="h", request_id="q", ttl=5)
        assert store.claim([span], holder="h", request_id="q", ttl=5).replayed


def test_new_style_stores_get_no_warning() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")

        class NewStyle(MemoryStore):
            def _claim(self, request: dibs.ClaimRequest) -> dibs.ClaimResult:
                return super()._claim(request)
