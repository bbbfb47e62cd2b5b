"""dibs.renew / dibs.aio.renew: a hold renewed by claim ID and fence, from any process.

Every refusal is the same typed error on every store and both faces, and extends nothing.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest

import dibs
import dibs.aio
from conftest import SHARED_STORE_KINDS
from dibs import (
    ClaimNotFound,
    ClaimState,
    FakeClock,
    HoldLost,
    HoldLostReason,
    InvalidInput,
    NotHolder,
    Store,
    Unit,
)
from dibs.aio import AsyncStore
from eventually import eventually

UNIT = Unit("report", "2026-11-30")


def _held(store: Store, ttl: float = 30.0) -> dibs.Claim:
    claim = store.claim(UNIT, holder="worker", ttl=ttl).claim
    assert claim is not None
    return claim


def test_renew_pushes_the_expiry_and_keeps_id_and_fence(store: Store, clock: FakeClock) -> None:
    first = _held(store, ttl=30.0)
    for _ in range(5):  # 100 s on the store's clock under a 30 s TTL
        clock.advance(20.0)
        renewed = dibs.renew(store, first.id, holder="worker", fence=first.fence, ttl=30.0)
        assert (renewed.id, renewed.fence, renewed.state) == (
            first.id,
            first.fence,
            ClaimState.HELD,
        )
    assert renewed.expires_at is not None and first.expires_at is not None
    assert renewed.expires_at - first.expires_at == timedelta(seconds=100)
    assert store.holder_of(UNIT) == "worker"
    assert not store.claim(UNIT, holder="thief", ttl=30.0)


def test_a_confirmed_claim_comes_back_unchanged(store: Store) -> None:
    claim = _held(store)
    confirmed = store.confirm(claim.id, holder="worker", fence=claim.fence)
    assert dibs.renew(store, claim.id, holder="worker", fence=claim.fence, ttl=5.0) == confirmed


def _stale_fence(store: Store, clock: FakeClock) -> tuple[dibs.Claim, dict[str, Any]]:
    old = _held(store)
    store.release(old.id, holder="worker", fence=old.fence)
    new = _held(store)
    return new, {"claim_id": new.id, "holder": "worker", "fence": old.fence}


def _foreign_fence(store: Store, clock: FakeClock) -> tuple[dibs.Claim, dict[str, Any]]:
    claim = _held(store)
    return claim, {"claim_id": claim.id, "holder": "worker", "fence": claim.fence + 1}


def _other_holder(store: Store, clock: FakeClock) -> tuple[dibs.Claim, dict[str, Any]]:
    claim = _held(store)
    return claim, {"claim_id": claim.id, "holder": "watchdog", "fence": claim.fence}


def _released(store: Store, clock: FakeClock) -> tuple[dibs.Claim, dict[str, Any]]:
    claim = _held(store)
    store.release(claim.id, holder="worker", fence=claim.fence)
    return claim, {"claim_id": claim.id, "holder": "worker", "fence": claim.fence}


def _expired(store: Store, clock: FakeClock) -> tuple[dibs.Claim, dict[str, Any]]:
    claim = _held(store, ttl=5.0)
    clock.advance(6.0)
    return claim, {"claim_id": claim.id, "holder": "worker", "fence": claim.fence}


def _taken_over(store: Store, clock: FakeClock) -> tuple[dibs.Claim, dict[str, Any]]:
    claim = _held(store, ttl=5.0)
    clock.advance(6.0)
    assert store.claim(UNIT, holder="thief", ttl=60.0)
    return claim, {"claim_id": claim.id, "holder": "worker", "fence": claim.fence}


REFUSALS: dict[str, tuple[Callable[..., Any], type[Exception], HoldLostReason | None]] = {
    "stale fence": (_stale_fence, HoldLost, HoldLostReason.FENCE),
    "foreign fence": (_foreign_fence, HoldLost, HoldLostReason.FENCE),
    "other holder": (_other_holder, NotHolder, None),
    "released": (_released, HoldLost, HoldLostReason.RELEASED),
    "expired": (_expired, HoldLost, HoldLostReason.EXPIRED),
    "taken over": (_taken_over, HoldLost, HoldLostReason.TAKEN_OVER),
}


@pytest.mark.parametrize("case", sorted(REFUSALS))
def test_every_refusal_is_one_typed_error_and_extends_nothing(
    store: Store, clock: FakeClock, case: str
) -> None:
    setup, error, reason = REFUSALS[case]
    claim, args = setup(store, clock)
    before = store.get(claim.id)
    with pytest.raises(error) as raised:
        dibs.renew(store, args.pop("claim_id"), ttl=600.0, **args)
    if reason is not None:
        assert isinstance(raised.value, HoldLost) and raised.value.reason is reason
    assert store.get(claim.id) == before  # nothing extended


def test_an_unknown_claim_id_is_claim_not_found(store: Store) -> None:
    with pytest.raises(ClaimNotFound):
        dibs.renew(store, "no-such-claim", holder="worker", fence=1, ttl=30.0)


@pytest.mark.parametrize(
    ("field", "value"),
    [("ttl", 0), ("ttl", float("nan")), ("ttl", True), ("fence", "1"), ("holder", "")],
)
def test_bad_input_is_invalid_input_naming_it(store: Store, field: str, value: Any) -> None:
    claim = _held(store)
    args: dict[str, Any] = {"holder": "worker", "fence": claim.fence, "ttl": 30.0, field: value}
    with pytest.raises(InvalidInput) as raised:
        dibs.renew(store, claim.id, **args)
    assert raised.value.field == field
    assert store.get(claim.id) == claim


# --- the async face -------------------------------------------------------------------------------


def _aopen(make_store: Any, clock: FakeClock) -> AsyncStore:
    url = make_store.url if make_store.kind != "memory" else "memory://"
    return dibs.aio.open(url, clock=clock)


def test_async_renew_extends_and_refuses_as_the_sync_face_does(
    make_store: Any, clock: FakeClock
) -> None:
    async def main() -> None:
        async with _aopen(make_store, clock) as store:
            claim = (await store.claim(UNIT, holder="worker", ttl=30.0)).claim
            assert claim is not None
            clock.advance(20.0)
            renewed = await dibs.aio.renew(
                store, claim.id, holder="worker", fence=claim.fence, ttl=30.0
            )
            assert renewed.fence == claim.fence and renewed.expires_at is not None
            assert claim.expires_at is not None
            assert renewed.expires_at - claim.expires_at == timedelta(seconds=20)
            with pytest.raises(HoldLost) as stale:
                await dibs.aio.renew(
                    store, claim.id, holder="worker", fence=claim.fence + 1, ttl=30.0
                )
            assert stale.value.reason is HoldLostReason.FENCE
            with pytest.raises(NotHolder):
                await dibs.aio.renew(store, claim.id, holder="x", fence=claim.fence, ttl=30.0)
            await store.release(claim.id, holder="worker", fence=claim.fence)
            with pytest.raises(HoldLost) as released:
                await dibs.aio.renew(store, claim.id, holder="worker", fence=claim.fence, ttl=30.0)
            assert released.value.reason is HoldLostReason.RELEASED
            with pytest.raises(InvalidInput) as bad:
                await dibs.aio.renew(store, claim.id, holder="worker", fence=claim.fence, ttl=0)
            assert bad.value.field == "ttl"

    asyncio.run(main())


# --- across processes -----------------------------------------------------------------------------

_WATCHDOG = """
import sys, dibs
store = dibs.open(sys.argv[1])
store.get("warm-up")  # connected and imported before the claim is made
print("ready", flush=True)
claim_id, fence = sys.stdin.readline().split()
try:
    claim = dibs.renew(store, claim_id, holder="worker", fence=int(fence), ttl=60.0)
except dibs.HoldLost as lost:
    print("HoldLost", lost.reason.value)
else:
    print("renewed", claim.expires_at.timestamp())
"""


def _start_watchdog(url: str) -> subprocess.Popen[str]:
    """A watchdog process, ready to renew: its start-up is not raced against the TTL."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    process = subprocess.Popen(
        [sys.executable, "-c", _WATCHDOG, url],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )
    assert process.stdout is not None and process.stdout.readline().split() == ["ready"]
    return process


def _renew_in(process: subprocess.Popen[str], claim_id: str, fence: int) -> list[str]:
    out, _ = process.communicate(f"{claim_id} {fence}\n", timeout=60)
    assert process.returncode == 0
    return out.split()


@pytest.mark.parametrize("store_kind", SHARED_STORE_KINDS)
def test_a_watchdog_process_keeps_a_workers_hold_past_its_ttl(make_store: Any) -> None:
    store = make_store()  # the real clock: the watchdog's process shares no fake one
    # The worker holds without renewing (a plain claim): only the watchdog extends it.
    watchdog = _start_watchdog(make_store.url)
    work = store.claim(UNIT, holder="worker", ttl=2.0).claim
    assert work is not None and work.expires_at is not None
    said = _renew_in(watchdog, work.id, work.fence)
    assert said[0] == "renewed" and float(said[1]) > work.expires_at.timestamp()
    # Past the hold's original expiry (on the clock every store here uses), it still holds.
    original = work.expires_at.timestamp()
    eventually(lambda: time.time() > original + 0.5, "the original TTL passed")
    now = store.get(work.id)
    assert now is not None and now.state is ClaimState.HELD
    assert not store.claim(UNIT, holder="thief", ttl=30.0)
    assert store.release(work.id, holder="worker", fence=work.fence)
    assert _renew_in(_start_watchdog(make_store.url), work.id, work.fence) == [
        "HoldLost",
        "released",
    ]
    ended = store.get(work.id)
    assert ended is not None and ended.state is ClaimState.RELEASED
