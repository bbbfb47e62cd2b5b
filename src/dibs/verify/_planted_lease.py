"""Plants in the lease's patterns, and what makes the workload meet them every run.

* ``renew-ignores-fence`` — the workload's renewal by claim ID
  (:func:`dibs.renew`, its ``extend`` op) looks the claim up and passes the
  claim's own fence in place of the one it was given, as a "helpful" watchdog
  might: a renewal with a stale fence is acknowledged (principle 4). The store
  is the real one; the checker must flag the acknowledged extend.

Under this plant the clients' transitions are mostly renewals and three in ten
carry a wrong fence (against 3 % otherwise), so that every run offers the bug
dozens of live holds to renew with a stale fence.

:func:`crowd` makes the ``semaphore-n-plus-one`` plant's breach certain rather
than likely: a holder of the planted semaphore's permit waits, inside its hold,
until ``permits + 1`` holders are inside theirs (a barrier made of claims, so
it spans processes), so their holds surely overlap.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from dibs._model import Claim, Unit
from dibs.renewal import renew
from dibs.stores.base import Store

__all__ = ["RENEW_PLANTS", "crowd", "renew_for", "transition_weights", "wrong_fence_rate"]

RENEW_PLANTS = ("renew-ignores-fence",)
"""Plants in :func:`dibs.renew` as the workload calls it: the store is the real one."""

_CROWD_WAIT = 30.0
"""Seconds a planted holder waits for the others at most (a hang guard, never reached)."""
_CROWD_TTL = 300.0
_GENERATIONS = 1
"""How many crowds a run gathers: one, early, while every client still runs, is a breach."""


def _renew_ignoring_fence(
    store: Store, claim_id: str, *, holder: str, fence: int, ttl: float
) -> Claim:
    claim = store.get(claim_id)
    if claim is not None and claim.holder == holder:
        fence = claim.fence  # BUG: the claim's fence replaces the caller's, so a stale one passes
    return renew(store, claim_id, holder=holder, fence=fence, ttl=ttl)


def renew_for(plant: str | None) -> Callable[..., Claim]:
    """The renewal by claim ID the clients call: :func:`dibs.renew`, or the plant's."""
    return _renew_ignoring_fence if plant == "renew-ignores-fence" else renew


def transition_weights(plant: str | None) -> tuple[int, int, int]:
    """Weights of confirm, extend (a renewal by ID) and release among a client's transitions."""
    return (1, 8, 1) if plant in RENEW_PLANTS else (5, 2, 3)


def wrong_fence_rate(plant: str | None) -> float:
    """How often a transition carries a wrong fence (a misuse the store must refuse)."""
    return 0.3 if plant in RENEW_PLANTS else 0.03


def crowd(store: Store, key: str, holder: str, count: int, known: list[int]) -> bool:
    """Wait until ``count`` holders have arrived here, as one generation; True if they did.

    Only the first ``_GENERATIONS`` generations gather (later arrivals return
    False at once): at the end of a run fewer clients are left than a crowd needs.

    A barrier of claims: an arrival takes the first free unit ``(key, "crowd/gen/i")``
    of the first generation not yet full from ``known[0]`` (the one after the
    last this client joined), then waits until all ``count`` units of its
    generation are held. The units are never released (they outlive the run),
    so no arrival misses another's, in any process.
    """
    gen = known[0]
    while True:
        if gen >= _GENERATIONS:
            known[0] = gen
            return False  # met already: the rest of the run goes at its own pace
        for index in range(count):
            if store.claim(Unit(key, f"crowd/{gen}/{index}"), holder=holder, ttl=_CROWD_TTL):
                break
        else:
            gen += 1  # full: the next generation
            continue
        break
    # Next time, the next generation: this client has been counted in this one (its claim
    # of a unit it holds would be a replay, not an arrival).
    known[0] = gen + 1
    units = [Unit(key, f"crowd/{gen}/{index}") for index in range(count)]
    deadline = time.monotonic() + _CROWD_WAIT
    while time.monotonic() < deadline:
        if all(store.holder_of(unit) is not None for unit in units):
            return True
        time.sleep(0.005)
    return False
