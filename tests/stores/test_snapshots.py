"""A Claim a store hands back is a snapshot: no later transition changes it.

Every store builds a fresh ``Claim`` per call today; these tests pin that down so that a
store which shares its own record with the caller (copy on write, docs/benchmarks.md
"Issue 27: a record that is the snapshot") must build a new record on every transition
rather than write into the one it handed back. The snapshots are checked both before
any field of theirs was read (a lazily made time must come from the moment of the call)
and after every field was read.
"""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from conftest import ALL_STORE_KINDS
from dibs import Claim, ClaimState, FakeClock, HoldLost, Store, Unit

QUICK = True  # in `pytest -m quick` (conftest.is_quick: not slow, no server)


@pytest.fixture(params=ALL_STORE_KINDS)
def store_kind(request: pytest.FixtureRequest) -> str:
    """Every store, and every store again through :func:`dibs.aio.open` (support/aio_face.py)."""
    return str(request.param)


def fields(claim: Claim) -> dict[str, Any]:
    return {f.name: getattr(claim, f.name) for f in dataclasses.fields(claim)}


def at(clock: FakeClock) -> datetime:
    return datetime.fromtimestamp(clock.now(), UTC)


def test_a_hold_stays_as_handed_back_through_extend_confirm_and_release(
    store: Store, clock: FakeClock
) -> None:
    unit = Unit("seat", "1")
    start = at(clock)
    held = store.claim(unit, holder="alice", ttl=60).claim
    assert held is not None
    claim_id, fence = held.id, held.fence  # nothing else read before the transitions
    clock.advance(5)
    extended = store.extend(claim_id, holder="alice", fence=fence, ttl=120)
    seen_extended = fields(extended)
    clock.advance(5)
    confirmed = store.confirm(claim_id, holder="alice", fence=fence)
    seen_confirmed = fields(confirmed)
    clock.advance(5)
    assert store.release(claim_id, holder="alice", fence=fence)
    assert held.state is ClaimState.HELD
    assert held.expires_at == start + timedelta(seconds=60)
    assert held.updated_at == start and held.created_at == start
    assert fields(extended) == seen_extended
    assert extended.state is ClaimState.HELD
    assert extended.expires_at == start + timedelta(seconds=125)
    assert fields(confirmed) == seen_confirmed
    assert confirmed.state is ClaimState.CONFIRMED and confirmed.expires_at is None


def test_read_snapshots_stay_through_later_transitions(store: Store, clock: FakeClock) -> None:
    group = [Unit("row", "1"), Unit("row", "2")]
    held = store.claim(group, holder="alice", ttl=60).claim
    assert held is not None
    seen_held = fields(held)  # every field read, lazily made times included
    got = store.get(held.id)
    assert got is not None
    seen_got = fields(got)
    clock.advance(1)
    confirmed = store.confirm(held.id, holder="alice", fence=held.fence)
    seen_confirmed = fields(confirmed)
    clock.advance(1)
    store.release(held.id, holder="alice", fence=held.fence)
    assert fields(held) == seen_held
    assert fields(got) == seen_got
    assert fields(confirmed) == seen_confirmed
    assert held.state is ClaimState.HELD and confirmed.state is ClaimState.CONFIRMED


def test_a_dead_hold_stays_as_handed_back_through_sweep_and_takeover(
    store: Store, clock: FakeClock
) -> None:
    group = [Unit("row", "1"), Unit("row", "2")]
    held = store.claim(group, holder="alice", ttl=5).claim
    lone = store.claim(Unit("seat", "9"), holder="alice", ttl=5).claim
    assert held is not None and lone is not None
    seen_held, seen_lone = fields(held), fields(lone)
    clock.advance(10)
    store.sweep()  # marks both expired
    assert store.claim(group[0], holder="bob")  # takes one target of the swept group over
    assert store.claim(Unit("seat", "9"), holder="bob")
    with pytest.raises(HoldLost):
        store.confirm(held.id, holder="alice", fence=held.fence)
    assert fields(held) == seen_held
    assert fields(lone) == seen_lone
    assert held.state is ClaimState.HELD and lone.state is ClaimState.HELD
