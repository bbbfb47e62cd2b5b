"""The accepted input domain: its edges keep every promise, the same on every store.

Each case here broke a promise on some store before the domain was checked in
one place (``Store`` and the model types): DST folds, integers past 2**53,
extreme TTLs, names a driver cannot store, claim IDs past 64 bits.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone
from typing import Any
from zoneinfo import ZoneInfo

import pytest

import dibs
from aio_face import open_face
from conftest import ALL_STORE_KINDS, StoreMaker
from dibs import FakeClock, HoldLostReason, InvalidInput, RequestConflict, Span, Store, Unit
from dibs.limits import NAME_MAX_BYTES, RETENTION_MAX, TTL_MAX, TTL_MIN

QUICK = True  # in `pytest -m quick` (conftest.is_quick: not slow, no server)

NEW_YORK = ZoneInfo("America/New_York")


@pytest.fixture(params=ALL_STORE_KINDS)
def store_kind(request: pytest.FixtureRequest) -> str:
    """Every store, and every store again through :func:`dibs.aio.open` (support/aio_face.py)."""
    return str(request.param)


def _ny(hour: int, minute: int, *, fold: int = 0) -> datetime:
    """A wall-clock time on 2026-11-01, the night New York repeats 01:00-02:00."""
    return datetime(2026, 11, 1, hour, minute, tzinfo=NEW_YORK, fold=fold)


# --- DST folds: spans are instants -------------------------------------------------------------


def test_a_span_across_the_repeated_hour_is_valid_and_an_hour_long() -> None:
    span = Span("room", _ny(1, 0), _ny(1, 0, fold=1))
    assert span.end - span.start == timedelta(hours=1)  # type: ignore[operator]
    assert span.start.tzinfo is UTC  # type: ignore[union-attr]


def test_spans_that_overlap_in_utc_conflict_whatever_the_wall_clock_says(store: Store) -> None:
    # 00:30 EDT to 01:20 EST is 04:30-06:20 UTC; 01:30-01:40 EDT (05:30-05:40 UTC) lies inside,
    # though its wall-clock start comes after the first span's wall-clock end.
    first = store.claim(Span("room", _ny(0, 30), _ny(1, 20, fold=1)), holder="a", ttl=60)
    assert first
    second = store.claim(Span("room", _ny(1, 30), _ny(1, 40)), holder="b", ttl=60)
    assert not second and len(second.taken) == 1


def test_the_two_one_oclock_hours_are_two_targets(store: Store) -> None:
    early = Span("room", _ny(1, 0), _ny(1, 30))
    late = Span("room", _ny(1, 0, fold=1), _ny(1, 30, fold=1))
    assert early != late
    result = store.claim([early, late], holder="a", ttl=60)
    assert result and len(result.claim.spans) == 2  # type: ignore[union-attr]
    assert not store.claim(late, holder="stranger", ttl=60)
    assert not store.claim(early, holder="stranger", ttl=60)


def test_a_span_given_in_another_zone_is_the_same_span(store: Store) -> None:
    start = datetime(2026, 3, 8, 6, 30, tzinfo=UTC)  # the night New York skips 02:00-03:00
    in_utc = Span("room", start, start + timedelta(hours=1))
    in_ny = Span(
        "room", start.astimezone(NEW_YORK), (start + timedelta(hours=1)).astimezone(NEW_YORK)
    )
    assert in_ny == in_utc
    first = store.claim(in_ny, holder="a", request_id="r1", ttl=60)
    assert store.claim(in_utc, holder="a", request_id="r1", ttl=60).replayed
    assert store.claim(in_utc, holder="a", ttl=60).claim == first.claim


def test_a_datetime_outside_the_utc_range_is_invalid_input() -> None:
    first_hour = datetime(1, 1, 1, tzinfo=timezone(timedelta(hours=14)))  # 10:00, 31 Dec 1 BC
    with pytest.raises(InvalidInput) as raised:
        Span("room", first_hour, first_hour + timedelta(minutes=30))
    assert raised.value.field == "start"


# --- integers past 2**53 and 2**63 -------------------------------------------------------------

BIG = 2**53


def test_a_request_id_reused_for_a_neighbouring_big_integer_conflicts(store: Store) -> None:
    store.claim(Span("ns", BIG, BIG + 2), holder="a", request_id="r", ttl=60)
    with pytest.raises(RequestConflict):
        store.claim(Span("ns", BIG + 1, BIG + 2), holder="a", request_id="r", ttl=60)


def test_equal_numbers_of_either_type_are_the_same_input(store: Store) -> None:
    store.claim(Span("ns", 1, 2), holder="a", request_id="r", ttl=60)
    assert store.claim(Span("ns", 1.0, 2.0), holder="a", request_id="r", ttl=60).replayed
    assert store.claim(Span("nz", -0.0, 1), holder="a", request_id="z", ttl=60)
    assert store.claim(Span("nz", 0, 1), holder="a", request_id="z", ttl=60).replayed


@pytest.mark.parametrize("request_id", [None, "r"])
def test_reordered_big_spans_replay_the_claim(store: Store, request_id: str | None) -> None:
    spans = [Span("ns", BIG + 1, BIG + 2), Span("ns", BIG, BIG + 1)]
    first = store.claim(spans, holder="a", request_id=request_id, ttl=60)
    again = store.claim(spans[::-1], holder="a", request_id=request_id, ttl=60)
    assert first and again.replayed and again.claim == first.claim


@pytest.mark.parametrize("bound", [2**63, -(2**63) - 1, 10**400, 2.0**63, -1e300])
def test_numbers_outside_64_bits_are_invalid_input(bound: Any) -> None:
    with pytest.raises(InvalidInput) as raised:
        Span("ns", min(bound, 0), max(bound, 1))
    assert raised.value.field in ("start", "end")


def test_the_64_bit_edges_are_claimable(store: Store) -> None:
    low, high = -(2**63), 2**63 - 1
    assert store.claim(Span("edge", low, low + 1), holder="a", ttl=60)
    assert store.claim(Span("edge", high - 1, high), holder="a", ttl=60)
    assert not store.claim(Span("edge", high - 2, high), holder="b", ttl=60)
    assert store.claim(Span("edge", low + 1, high - 1), holder="b", ttl=60)


# --- TTLs and retention at both ends -----------------------------------------------------------


@pytest.mark.parametrize("ttl", [1e12, 10**400, TTL_MAX * 1.000001, 5e-7, 0.0009, 0, -1])
def test_a_ttl_outside_the_domain_is_invalid_input_and_claims_nothing(
    store: Store, ttl: Any
) -> None:
    with pytest.raises(InvalidInput) as raised:
        store.claim(Unit("seat"), holder="a", ttl=ttl)
    assert raised.value.field == "ttl"
    assert store.holder_of(Unit("seat")) is None
    granted = store.claim(Unit("seat"), holder="b", ttl=60)
    with pytest.raises(InvalidInput):
        store.extend(granted.claim.id, holder="b", fence=granted.claim.fence, ttl=ttl)  # type: ignore[union-attr]


def test_the_ttl_edges_hold_as_long_as_they_say(store: Store, clock: FakeClock) -> None:
    longest = store.claim(Unit("long"), holder="a", ttl=TTL_MAX)
    shortest = store.claim(Unit("short"), holder="a", ttl=TTL_MIN)
    assert longest and shortest
    clock.advance(TTL_MIN)
    assert store.holder_of(Unit("short")) is None
    assert store.claim(Unit("short"), holder="b", ttl=60)
    clock.advance(TTL_MAX - 1)
    assert store.holder_of(Unit("long")) == "a"
    assert store.confirm(longest.claim.id, holder="a", fence=longest.claim.fence)  # type: ignore[union-attr]


@pytest.mark.parametrize("retention", [RETENTION_MAX * 2, 1e13, 10**400, 0.5])
def test_a_retention_outside_the_domain_is_invalid_input(
    make_store: StoreMaker, retention: Any
) -> None:
    url = "memory://" if make_store.kind == "memory" else make_store.url
    opener = open_face if make_store.aio else dibs.open  # the async face raises when it opens
    with pytest.raises(InvalidInput) as raised:
        opener(url, request_retention=retention)
    assert raised.value.field == "request_retention"


def test_the_longest_retention_claims_and_sweeps(make_store: StoreMaker) -> None:
    store = make_store(request_retention=RETENTION_MAX)
    store.claim(Unit("seat"), holder="a", request_id="r", ttl=60)
    store.sweep()
    assert store.claim(Unit("seat"), holder="a", request_id="r", ttl=60).replayed


# --- names -------------------------------------------------------------------------------------

BAD_NAMES = {
    "NUL": "seat\x00A",
    "lone surrogate": "caf\udce9",  # what os.fsdecode makes of a Latin-1 file name
    "too long": "x" * (NAME_MAX_BYTES + 1),
    "too long in UTF-8": "\U0001f600" * (NAME_MAX_BYTES // 4 + 1),
    "a megabyte": "y" * 1_000_000,
}


@pytest.mark.parametrize("name", BAD_NAMES.values(), ids=BAD_NAMES.keys())
@pytest.mark.parametrize("field", ["resource", "slot", "holder", "request_id"])
def test_names_outside_the_domain_are_invalid_input(store: Store, field: str, name: str) -> None:
    args: dict[str, Any] = {"resource": "seat", "slot": "s", "holder": "a", "request_id": "r"}
    args[field] = name
    with pytest.raises(InvalidInput) as raised:
        store.claim(
            Unit(args["resource"], args["slot"]),
            holder=args["holder"],
            request_id=args["request_id"],
            ttl=60,
        )
    assert raised.value.field == field
    assert len(str(raised.value)) < 300


@pytest.mark.parametrize("name", BAD_NAMES.values(), ids=BAD_NAMES.keys())
def test_bad_names_are_invalid_input_in_every_call(store: Store, name: str) -> None:
    calls = [
        lambda: store.confirm(name, holder="a", fence=1),
        lambda: store.extend("1", holder=name, fence=1, ttl=5),
        lambda: store.release(name, holder="a", fence=1),
        lambda: store.get(name),
        lambda: store.claims_of(name),
        lambda: store.holder_of(Span(name, 1, 2)),
    ]
    for call in calls:
        with pytest.raises(InvalidInput):
            call()


@pytest.mark.parametrize(
    "name",
    [
        "é" * (NAME_MAX_BYTES // 2),
        "\U0001f600" * (NAME_MAX_BYTES // 4),
        "\U0010ffff\ufffe\u200b\u0301",
        "x" * NAME_MAX_BYTES,
    ],
)
def test_names_at_the_edges_of_the_domain_work(store: Store, name: str) -> None:
    unit = Unit(name, name)
    result = store.claim(unit, holder=name, request_id=name, ttl=60)
    assert result and result.claim.targets == (unit,)  # type: ignore[union-attr]
    assert store.claim(unit, holder=name, request_id=name, ttl=60).replayed
    assert store.holder_of(unit) == name
    assert [c.id for c in store.claims_of(name)] == [result.claim.id]  # type: ignore[union-attr]
    span = Span(name, 1, 2)
    assert store.claim(span, holder=name, ttl=60)
    assert store.holder_of(span) == name


# --- claim IDs and fences ----------------------------------------------------------------------


@pytest.mark.parametrize(
    "claim_id", ["9" * 20, str(2**63), str(2**64 + 1), "0", "-1", "1e3", "\u0661", "x-1"]
)
def test_a_claim_id_no_store_issued_is_not_found(store: Store, claim_id: str) -> None:
    store.claim(Unit("seat"), holder="a", ttl=60)
    assert store.get(claim_id) is None
    with pytest.raises(dibs.ClaimNotFound):
        store.confirm(claim_id, holder="a", fence=1)
    with pytest.raises(dibs.ClaimNotFound):
        store.release(claim_id, holder="a", fence=1)


def test_a_padded_claim_id_is_not_the_claim(store: Store) -> None:
    claim = store.claim(Unit("seat"), holder="a", ttl=60).claim
    assert claim is not None
    assert store.get("0" + claim.id) is None


@pytest.mark.parametrize("fence", [0, -1, 2**63, 10**30, 1.0, True, "1"])
def test_a_fence_outside_64_bits_is_invalid_input(store: Store, fence: Any) -> None:
    claim = store.claim(Unit("seat"), holder="a", ttl=60).claim
    assert claim is not None
    with pytest.raises(InvalidInput) as raised:
        store.confirm(claim.id, holder="a", fence=fence)
    assert raised.value.field == "fence"
    assert store.confirm(claim.id, holder="a", fence=claim.fence)


def test_a_wrong_fence_inside_the_domain_is_hold_lost(store: Store) -> None:
    claim = store.claim(Unit("seat"), holder="a", ttl=60).claim
    assert claim is not None
    with pytest.raises(dibs.HoldLost) as raised:
        store.confirm(claim.id, holder="a", fence=2**63 - 1)
    assert raised.value.reason is HoldLostReason.FENCE
