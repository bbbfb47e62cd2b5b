"""The system picks the resource: claim the first free candidate, retrying with full jitter.

Dispatching a driver to a ride is a claim where losing is routine: several
dispatchers pick the same nearest driver, one wins, and the others move on to
the next candidate rather than failing the ride. :func:`match` tries the
candidates in preference order, one claim per candidate; when a whole round
finds every candidate taken it sleeps a random time in ``[0, cap)`` (full
jitter, so dispatchers spread out instead of chasing the same driver in
lockstep) and tries again, for a bounded number of rounds.

Each claim is a group: the candidate plus the dispatch's own unit
``Unit("dibs.match", request_id)``. The store grants both or neither, so two
concurrent tries of one dispatch (a client retry racing the original) can
never hold two drivers, and a retry finds the driver the first try got.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from dibs._model import Claim, Unit, check_request_id
from dibs.exceptions import InvalidInput, RequestConflict
from dibs.stores.base import Store

__all__ = ["Match", "match"]

REQUEST_RESOURCE = "dibs.match"
"""The resource of the unit that stands for one dispatch, ``Unit(REQUEST_RESOURCE, request_id)``."""

Candidates = Iterable[Unit | str] | Callable[[], Iterable[Unit | str]]


@dataclass(frozen=True, slots=True)
class Match:
    """The outcome of :func:`match`: truthy when a candidate was claimed.

    ``candidate`` and ``claim`` are what was claimed (both None when none
    could be had); ``replayed`` is true when an earlier try of the same
    request had already claimed it; ``attempts`` and ``rounds`` count the
    claims and rounds this call made.
    """

    candidate: Unit | None
    claim: Claim | None
    replayed: bool = False
    attempts: int = 0
    rounds: int = 0

    def __bool__(self) -> bool:
        return self.claim is not None


def match(
    store: Store,
    candidates: Candidates,
    *,
    holder: str,
    request_id: str,
    ttl: float | None = None,
    attempts: int = 4,
    backoff: float = 0.05,
    max_backoff: float = 2.0,
    jitter: bool = True,
    rng: random.Random | None = None,
    sleep: Callable[[float], None] = time.sleep,
) -> Match:
    """Claim the first free candidate for ``holder``, trying each one in preference order.

    ``candidates`` are units (a string ``s`` means ``Unit(s)``), or a callable
    returning them, called afresh each round (e.g. the nearest drivers now).
    ``attempts`` bounds the rounds; before round ``k`` (from 2) it sleeps a
    uniform random time below ``min(max_backoff, backoff * 2**(k-2))``, or
    exactly that cap with ``jitter=False``. ``ttl`` makes each claim a hold to
    confirm, as in :meth:`Store.claim`.

    Idempotent by ``request_id`` while the assignment is live: a retried
    dispatch returns the same candidate and claim, ``replayed=True``. Once the
    claim is released or expired, the ID is free to dispatch again.

    Raises :class:`~dibs.RequestConflict` when another holder holds an
    assignment under ``request_id``, :class:`~dibs.InvalidInput` for bad
    arguments (an empty candidate list among them; a callable may return no
    candidates in a round, which then counts as a round with all taken), and
    what the store raises.
    """
    # --- generated from dibs/aio/matching.py (scripts/unasync.py): edit that, then run it ---
    _check(request_id, attempts, backoff, max_backoff)
    pick = rng if rng is not None else random
    dispatch = Unit(REQUEST_RESOURCE, request_id)
    fixed = _fixed(candidates)

    earlier = _assignment(store.claims_of(holder), dispatch)
    if earlier is not None:
        return Match(_candidate(earlier, dispatch), earlier, replayed=True)

    tried = 0
    for round_ in range(1, attempts + 1):
        if round_ > 1:
            cap = min(max_backoff, backoff * 2 ** (round_ - 2))
            sleep(pick.uniform(0, cap) if jitter else cap)
        units = fixed if fixed is not None else _units(_call(candidates))  # type: ignore[arg-type]
        for unit in units:
            while True:
                tried += 1
                result = store.claim([unit, dispatch], holder=holder, ttl=ttl)
                # Linearization point: the store's group claim on the candidate and
                # the dispatch unit. Granted means both are this dispatch's.
                if result:
                    assert result.claim is not None
                    return Match(unit, result.claim, result.replayed, tried, round_)
                if dispatch not in result.taken:
                    break  # the candidate is taken: try the next one
                # Another try of this dispatch holds a candidate: answer with it.
                earlier = _assignment(store.claims_of(holder), dispatch)
                if earlier is not None:
                    return Match(_candidate(earlier, dispatch), earlier, True, tried, round_)
                other = store.holder_of(dispatch)
                if other is not None and other != holder:
                    raise _conflict(request_id)
                # The claim that blocked us ended before our first read, and a try
                # of ours may have won since: neither read decides, the claim does,
                # so claim this candidate again. Not endless: each extra loop needs
                # another claim on the dispatch unit to have ended meanwhile.
    return Match(None, None, attempts=tried, rounds=attempts)
    # --- end of the generated part ---


def _check(request_id: str, attempts: int, backoff: float, max_backoff: float) -> None:
    if check_request_id(request_id) is None:
        raise InvalidInput("match() needs a request_id", field="request_id", value=request_id)
    if isinstance(attempts, bool) or not isinstance(attempts, int) or attempts < 1:
        raise InvalidInput(
            f"attempts must be a positive integer, got {attempts!r}",
            field="attempts",
            value=attempts,
        )
    for name, value in (("backoff", backoff), ("max_backoff", max_backoff)):
        if (
            isinstance(value, bool)
            or not isinstance(value, int | float)
            or not 0 <= value < float("inf")
        ):
            raise InvalidInput(
                f"{name} must be a finite number of seconds >= 0, got {value!r}",
                field=name,
                value=value,
            )


def _fixed(candidates: object) -> list[Unit] | None:
    """The candidates as units, or None for a callable (its answer is read each round)."""
    if callable(candidates):
        return None
    fixed = _units(candidates)  # type: ignore[arg-type]
    if not fixed:
        # No round could ever succeed: a mistake to report now, not an outcome to retry.
        raise InvalidInput(
            "match() needs at least one candidate, got none", field="candidates", value=candidates
        )
    return fixed


def _conflict(request_id: str) -> RequestConflict:
    return RequestConflict(
        f"request ID {request_id!r} is dispatched by another holder", request_id=request_id
    )


def _call(candidates: Callable[[], Iterable[Unit | str]]) -> Iterable[Unit | str]:
    return candidates()


def _units(items: Iterable[Unit | str]) -> list[Unit]:
    if isinstance(items, str | Unit):
        raise InvalidInput(
            f"candidates must be a list of units or names, got {items!r}",
            field="candidates",
            value=items,
        )
    units: dict[Unit, None] = {}
    for item in items:
        unit = Unit(item) if isinstance(item, str) else item
        if not isinstance(unit, Unit):
            raise InvalidInput(
                f"each candidate must be a Unit or a name, got {item!r}",
                field="candidates",
                value=item,
            )
        if unit.resource == REQUEST_RESOURCE:
            raise InvalidInput(
                f"{REQUEST_RESOURCE!r} is reserved for dispatch units",
                field="candidates",
                value=item,
            )
        units[unit] = None  # de-duplicate, keeping preference order
    return list(units)


def _assignment(claims: Iterable[Claim], dispatch: Unit) -> Claim | None:
    """The holder's live claim under this dispatch among its claims, if any."""
    for claim in claims:
        if dispatch in claim.units:
            return claim
    return None


def _candidate(claim: Claim, dispatch: Unit) -> Unit:
    return next(u for u in claim.units if u != dispatch)
