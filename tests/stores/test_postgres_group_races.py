"""Group claims with request IDs racing round a ring, on PostgreSQL (schema version 6).

A group claim's first try takes its targets without a subtransaction; one that
loses after taking some rolls its whole statement back (DB010) and a second
try, with the subtransaction, decides and records the loss (claim_v4.sql).
Here eight claimers each want two neighbouring units of a ring, with request
IDs, so most losers lose at their second unit after taking their first, and
some of those units hold a dead hold to take over first. After each round:
the winners are disjoint; every unit outside them is free and its dead hold
was not taken over (nothing of a loser stayed); and a replay of every request
answers what was decided (the same claim, or the same refusal, replayed).

Planted bugs fail it every run (checked by hand when it was written): a first
try that records a late loss instead of raising DB010 leaves the loser's first
unit taken (and its dead hold taken over); one that records it as granted
grants a unit twice; a plan that answers DB010 with a refusal instead of the
second try leaves the loss unrecorded, so its replay is no replay.
"""

from __future__ import annotations

import asyncio
from functools import partial
from typing import Any

import pytest

import dibs
import dibs.aio
from _race import race_outcomes
from dibs import ClaimResult, FakeClock, Unit
from pg_fixtures import drop_schema, schema_url

pytestmark = pytest.mark.timeout(300)

RING = 8
ROUNDS = 60


def _wants(rnd: int) -> list[list[Unit]]:
    units = [Unit(f"ring-{rnd}", f"{i}") for i in range(RING)]
    return [[units[i], units[(i + 1) % RING]] for i in range(RING)]


def _ask(rnd: int, i: int) -> dict[str, Any]:
    """Claimer ``i``'s request in round ``rnd``: two neighbouring units, with a request ID."""
    return {
        "targets": _wants(rnd)[i],
        "holder": f"h{i}",
        "ttl": None if i % 2 else 60,
        "request_id": f"{rnd}-{i}",
    }


def _dead_holds(store: dibs.Store, rnd: int) -> dict[Unit, str]:
    """Every third unit of the round's ring held by a hold that dies once the clock moves."""
    dead = {}
    for i in range(0, RING, 3):
        unit = Unit(f"ring-{rnd}", f"{i}")
        held = store.claim(unit, holder=f"gone-{rnd}-{i}", ttl=1)
        assert held.claim is not None
        dead[unit] = held.claim.id
    return dead


def _check_round(
    store: dibs.Store,
    rnd: int,
    answers: list[ClaimResult],
    replays: list[ClaimResult],
    dead: dict[Unit, str],
) -> int:
    """The round's verdicts; how many claimers lost at their second unit only."""
    wants = _wants(rnd)
    held: dict[Unit, str] = {}
    late = 0
    for i, (answer, replay) in enumerate(zip(answers, replays, strict=True)):
        assert not isinstance(answer, BaseException), answer
        if answer:
            assert answer.claim is not None and answer.claim.holder == f"h{i}"
            for unit in wants[i]:
                assert unit not in held, f"{unit} granted to {held[unit]} and h{i}"
                held[unit] = f"h{i}"
            assert replay.replayed and replay.claim is not None
            assert replay.claim.id == answer.claim.id
        else:
            assert answer.taken and not answer.replayed
            assert not replay and replay.replayed, (i, answer, replay)
            assert set(replay.taken) == set(answer.taken)
            first = min(wants[i], key=lambda u: (u.resource, u.slot))
            late += first not in answer.taken
    for unit in sorted({u for w in wants for u in w}, key=lambda u: u.slot):
        claim = store.get(dead[unit]) if unit in dead else None
        if unit in held:
            assert store.holder_of(unit) == held[unit]
            assert claim is None or claim.taken_over
        else:
            # Nothing of a loser stayed: the unit is free, its dead hold untouched.
            assert claim is None or not claim.taken_over, (unit, claim)
            after = store.claim(unit, holder="after", ttl=60)
            assert after, (unit, after.taken)
    return late


def test_group_claims_round_a_ring_are_all_or_nothing_and_replay(pg_url: str) -> None:
    clock = FakeClock()
    url = schema_url(pg_url)
    store = dibs.open(url, clock=clock, pool_min=RING, pool_max=RING)
    late = 0
    try:
        for rnd in range(ROUNDS):
            dead = _dead_holds(store, rnd)
            clock.advance(2)
            answers = race_outcomes([partial(store.claim, **_ask(rnd, i)) for i in range(RING)])
            replays = [store.claim(**_ask(rnd, i)) for i in range(RING)]
            late += _check_round(store, rnd, answers, replays, dead)
        assert late > 0  # the race reached the second try
    finally:
        store.close()
        drop_schema(pg_url, url.rsplit("schema=", 1)[1])


def test_async_group_claims_round_a_ring_are_all_or_nothing_and_replay(pg_url: str) -> None:
    clock = FakeClock()
    url = schema_url(pg_url)
    sync = dibs.open(url, clock=clock)
    late = 0

    async def main() -> None:
        nonlocal late
        async with dibs.aio.open(url, clock=clock, pool_min=RING, pool_max=RING) as store:
            for rnd in range(ROUNDS):
                dead = _dead_holds(sync, rnd)
                clock.advance(2)
                answers = await asyncio.gather(*(store.claim(**_ask(rnd, i)) for i in range(RING)))
                replays = [await store.claim(**_ask(rnd, i)) for i in range(RING)]
                late += _check_round(sync, rnd, list(answers), replays, dead)

    try:
        asyncio.run(main())
        assert late > 0
    finally:
        sync.close()
        drop_schema(pg_url, url.rsplit("schema=", 1)[1])
