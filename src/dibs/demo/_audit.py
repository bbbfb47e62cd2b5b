"""The audit: read the rush back from the store and check what every customer was told.

Nothing here trusts the workers' own bookkeeping about who owns what: each
check compares what customers were told (their :class:`Outcome`) with what
the store says now, through the public API only (``get``, ``holder_of``), so
it works on every store and catches a store that broke its promises.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable
from dataclasses import dataclass

from dibs._model import Claim, ClaimState, SweepResult, Unit
from dibs.demo._customers import Outcome
from dibs.demo._plan import Behaviour, Venue
from dibs.stores.base import Store

__all__ = ["Check", "audit_rush"]

_EXAMPLES = 5


@dataclass(frozen=True, slots=True)
class Check:
    """One audit check: the promise in words, whether it held, and what was seen."""

    name: str
    promise: str
    passed: bool
    detail: str
    examples: tuple[str, ...] = ()


def _check(name: str, promise: str, problems: list[str], ok: str, bad: str) -> Check:
    return Check(name, promise, not problems, bad if problems else ok, tuple(problems[:_EXAMPLES]))


def audit_rush(
    store: Store,
    venue: Venue,
    outcomes: list[Outcome],
    final_sweep: SweepResult,
    failures: Iterable[str] = (),
) -> tuple[list[Check], dict[str, int]]:
    """Check the rush against the store; return the checks and the counts.

    Call it after the rush ended, every hold made in it has expired, and a
    :meth:`~dibs.Store.sweep` ran. Raises what the store raises.
    """
    granted = [o for o in outcomes if o.claim_id is not None]
    claims: dict[str, Claim | None] = {}
    for o in granted:
        assert o.claim_id is not None
        claims[o.claim_id] = store.get(o.claim_id)

    sold_to: dict[str, list[str]] = defaultdict(list)
    for claim in claims.values():
        if claim is not None and claim.state is ClaimState.CONFIRMED:
            for unit in claim.units:
                if unit.slot == venue.show:
                    sold_to[unit.resource].append(claim.holder)
    doubles = [
        f"{seat} is confirmed for {', '.join(holders)}"
        for seat, holders in sorted(sold_to.items())
        if len(holders) > 1
    ]
    checks = [
        _check(
            "one_confirmed_holder_per_seat",
            "At most one confirmed holder per seat",
            doubles,
            f"{len(sold_to)} seats sold, each to exactly one customer",
            f"{len(doubles)} seats confirmed to two or more customers (double booking)",
        ),
        _winners_hold_their_seats(store, venue, granted, claims),
        _late_payers_refused(granted),
        _every_seat_sold_or_free(store, venue, sold_to, claims),
        _replays_answered_alike(outcomes),
        _losers_told_which_seats(outcomes),
        _no_errors(outcomes, failures),
    ]
    return checks, _counts(venue, outcomes, claims, sold_to, final_sweep)


def _winners_hold_their_seats(
    store: Store, venue: Venue, granted: list[Outcome], claims: dict[str, Claim | None]
) -> Check:
    problems: list[str] = []
    paid = [o for o in granted if o.paid]
    for o in paid:
        assert o.claim_id is not None
        claim = claims[o.claim_id]
        if claim is None:
            problems.append(f"{o.customer} paid for claim {o.claim_id}, which the store lost")
            continue
        if claim.state is not ClaimState.CONFIRMED or claim.holder != o.customer:
            problems.append(
                f"{o.customer} was told 'you got it' but claim {o.claim_id} is "
                f"{claim.state} for {claim.holder}"
            )
        if sorted(u.resource for u in claim.units) != sorted(o.seats):
            problems.append(f"{o.customer} paid for {o.seats}, the store has {claim.units}")
        for seat in o.seats:
            holder = store.holder_of(Unit(seat, venue.show))
            if holder != o.customer:
                problems.append(
                    f"{o.customer} was told 'you got it' but {seat} is held by {holder or 'nobody'}"
                )
    return _check(
        "winners_hold_their_seats",
        'Every customer told "you got it" holds those seats',
        problems,
        f"{len(paid)} paying customers are the confirmed holders of their "
        f"{sum(len(o.seats) for o in paid)} seats",
        f"{len(problems)} seats or claims disagree with what a customer was told",
    )


def _late_payers_refused(granted: list[Outcome]) -> Check:
    late = [o for o in granted if o.behaviour is Behaviour.LATE]
    problems = [
        f"{o.customer} paid {o.paid_after:.2f}s after its hold was granted and was accepted"
        for o in late
        if o.paid
    ]
    problems += [
        f"{o.customer} paid late and got neither a refusal nor a confirmation"
        for o in late
        if not o.paid and o.refused is None
    ]
    reasons = Counter(o.refused for o in late if o.refused is not None)
    told = ", ".join(f"{reason}: {n}" for reason, n in sorted(reasons.items())) or "none"
    return _check(
        "late_payers_refused",
        "Every late payer was refused",
        problems,
        f"{len(late)} late payments refused with HoldLost ({told})",
        f"{len(problems)} of {len(late)} late payments were accepted after the hold expired",
    )


def _every_seat_sold_or_free(
    store: Store, venue: Venue, sold_to: dict[str, list[str]], claims: dict[str, Claim | None]
) -> Check:
    problems: list[str] = []
    for claim in claims.values():
        if claim is not None and claim.state is ClaimState.HELD:
            problems.append(
                f"claim {claim.id} of {claim.holder} is still held after its expiry and a sweep"
            )
    held = 0
    for unit in venue.units():
        holder = store.holder_of(unit)
        buyers = sold_to.get(unit.resource, [])
        if holder is not None:
            held += 1
        if holder is not None and holder not in buyers:
            problems.append(f"{unit.resource} shows holder {holder}, who never paid for it")
        elif holder is None and buyers:
            problems.append(f"{unit.resource} was sold to {buyers[0]} but shows free")
    return _check(
        "every_seat_sold_or_free",
        "After the sweep no seat is held past expiry",
        problems,
        f"{held} seats sold, {venue.seats - held} free, none held by an expired hold",
        f"{len(problems)} seats or claims still show a dead hold or the wrong holder",
    )


def _replays_answered_alike(outcomes: list[Outcome]) -> Check:
    problems = [m for o in outcomes for m in o.replay_mismatches]
    sent = sum(o.claims for o in outcomes if o.behaviour is Behaviour.RETRY) // 2
    return _check(
        "replays_returned_same_claim",
        "A retried request ID replays the same answer",
        problems,
        f"{sent} claims sent twice with one request ID; each retry replayed the first answer",
        f"{len(problems)} of {sent} retries did not replay the first answer",
    )


def _losers_told_which_seats(outcomes: list[Outcome]) -> Check:
    problems = [m for o in outcomes for m in o.bad_losses]
    lost = sum(o.taken for o in outcomes)
    return _check(
        "losers_told_which_seats",
        'Every "taken" answer names seats that were asked for',
        problems,
        f"{lost} losing claims, each told which of its seats were taken",
        f"{len(problems)} losing claims were told the wrong seats",
    )


def _no_errors(outcomes: list[Outcome], failures: Iterable[str]) -> Check:
    problems = [*failures, *(e for o in outcomes for e in o.errors)]
    return _check(
        "no_errors",
        "No store errors",
        problems,
        "no customer or worker saw an error",
        f"{len(problems)} errors",
    )


def _counts(
    venue: Venue,
    outcomes: list[Outcome],
    claims: dict[str, Claim | None],
    sold_to: dict[str, list[str]],
    final_sweep: SweepResult,
) -> dict[str, int]:
    unpaid = [c for c in claims.values() if c is not None and c.state is ClaimState.EXPIRED]
    by = Counter(o.behaviour for o in outcomes)
    return {
        "customers": len(outcomes),
        "seats": venue.seats,
        "seats_sold": len(sold_to),
        "claim_calls": sum(o.claims for o in outcomes),
        "granted": sum(o.granted for o in outcomes),
        "group_holds": sum(o.granted and o.party > 1 for o in outcomes),
        "taken": sum(o.taken for o in outcomes),
        "replayed": sum(o.replayed for o in outcomes),
        "paid": sum(o.paid for o in outcomes),
        "turned_away": sum(not o.granted for o in outcomes),
        "abandoned": sum(o.granted and o.behaviour is Behaviour.ABANDON for o in outcomes),
        "holds_taken_over": sum(c.taken_over for c in unpaid),
        "holds_expired": sum(not c.taken_over for c in unpaid),
        "late_refused": sum(
            o.refused is not None and o.behaviour is Behaviour.LATE for o in outcomes
        ),
        "slow_payers_refused": sum(
            o.refused is not None and o.behaviour is not Behaviour.LATE for o in outcomes
        ),
        "payers": by[Behaviour.PAY] + by[Behaviour.RETRY],
        "abandoners": by[Behaviour.ABANDON],
        "late_payers": by[Behaviour.LATE],
        "swept_at_end": final_sweep.expired,
    }
