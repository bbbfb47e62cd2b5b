"""A Hypothesis ``RuleBasedStateMachine`` checking a store against :class:`ModelStore`.

Subclass it and set ``make_store`` to a callable returning a fresh store
driven by a :class:`~dibs.FakeClock`; then expose ``Machine.TestCase``.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any, ClassVar

from dibs._extras import needs

with needs("testing", "dibs.testing.StoreStateMachine"):
    from hypothesis import strategies as st
    from hypothesis.stateful import (
        RuleBasedStateMachine,
        initialize,
        invariant,
        precondition,
        rule,
    )

from dibs._clock import FakeClock
from dibs._model import Claim, ClaimResult, ClaimState, Span, Target, Unit, normalize_targets
from dibs.exceptions import DibsError, HoldLost, SpanKindMismatch
from dibs.limits import NUMBER_MAX, TTL_MAX, TTL_MIN
from dibs.stores.base import Store
from dibs.testing.model import ModelOutcome, ModelStore
from dibs.testing.strategies import aware_datetimes, names, span_numbers, target_lists

__all__ = ["StoreStateMachine"]

RETENTION = 100.0
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
TTLS = [None, TTL_MIN, 5.0, 10.0, TTL_MAX]
STEPS = [TTL_MIN, 0.5, 2.0, 4.999, 5.0, 7.0, 11.0, RETENTION, TTL_MAX]


@st.composite
def _points(draw: st.DrawFn, kind: str) -> list[int | float | datetime]:
    """Five increasing bounds of one kind, close together."""
    if kind == "number":
        low = draw(_LOW_NUMBERS)
        # Past 2**53 a float step of 1 is no step: space float bounds by their ulp.
        step = 1 if isinstance(low, int) else max(0.25, 2 * math.ulp(low))
        return [low + step * i for i in range(5)]
    start = draw(_STARTS)
    minutes = draw(_MINUTES)
    utc = start.astimezone(UTC)
    return [(utc + timedelta(minutes=minutes * i)).astimezone(start.tzinfo) for i in range(5)]


# Every strategy is built once, here or once per universe (StoreStateMachine.draw_universe):
# Hypothesis validates a new strategy object, and works out its filters' bounds, on its first
# draw, which cost more than the draws themselves when a rule built its strategies at each step.
_LOW_NUMBERS = span_numbers().filter(lambda x: x <= NUMBER_MAX - 2**13)
_STARTS = aware_datetimes().filter(lambda d: d.year < 9999)
_MINUTES = st.sampled_from([1, 20, 30, 60])
_POINTS = {kind: _points(kind) for kind in ("number", "time")}
_RESOURCES = st.lists(names(), min_size=2, max_size=2, unique=True)
_SLOTS = st.lists(names(allow_empty=True), min_size=4, max_size=4, unique=True)
_KINDS = st.sampled_from(["number", "time", "both"])
_CALLERS = st.lists(names(), min_size=3, max_size=3, unique=True)
"""Three holders, or three request ids."""
_MODES = {
    # Readers beside writers on stores that take shared claims.
    True: st.sampled_from(["exclusive", "shared"]),
    False: st.sampled_from(["exclusive"]),
}


@st.composite
def _universe(draw: st.DrawFn) -> tuple[list[Unit], list[Span], list[str], list[str]]:
    """A few units and spans that collide often, with names and bounds from the whole domain.

    Units share two resources; spans sit close together on two resources, in
    numbers clustered at an edge (2**53, 2**63) or in datetimes around a DST
    fold, so claims overlap, replay and switch kinds as often as they win.
    """
    resources = draw(_RESOURCES)
    slots = draw(_SLOTS)
    units = [Unit(resources[i % 2], slot) for i, slot in enumerate(slots)]
    spans: list[Span] = []
    for resource in resources:
        kind = draw(_KINDS)
        for each in ("number", "time") if kind == "both" else (kind,):
            points = draw(_POINTS[each])
            for a, b in [(0, 2), (1, 3), (2, 4), (0, 4)]:
                spans.append(Span(resource, points[a], points[b]))
    holders = draw(_CALLERS)
    request_ids = draw(_CALLERS)
    return units, spans, holders, request_ids


class StoreStateMachine(RuleBasedStateMachine):
    """Random claims, confirms, extends, releases, sweeps and clock moves, checked step by step."""

    make_store: ClassVar[Callable[[FakeClock, float], Store]]

    def __init__(self) -> None:
        super().__init__()
        self.clock = FakeClock()
        self.store = type(self).make_store(self.clock, RETENTION)
        self.model = ModelStore(retention=RETENTION)
        self.ids: list[Claim] = []  # model key -> the store's claim as first granted
        self.units: list[Unit] = []
        self.spans: list[Span] = []
        self.holders: list[str] = []
        self.request_ids: list[str] = []
        # The claim rule's strategies, built once per universe (draw_universe).
        self._draw_targets: st.SearchStrategy[list[Target]] = st.nothing()
        self._draw_holder: st.SearchStrategy[str] = st.nothing()
        self._draw_request_id: st.SearchStrategy[str | None] = st.nothing()

    def teardown(self) -> None:
        self.store.close()

    # --- rules ---------------------------------------------------------------------------------

    @initialize(universe=_universe())
    def draw_universe(self, universe: tuple[list[Unit], list[Span], list[str], list[str]]) -> None:
        self.units, self.spans, self.holders, self.request_ids = universe
        self._draw_targets = target_lists(st.sampled_from([*self.units, *self.spans]))
        self._draw_holder = st.sampled_from(self.holders)
        self._draw_request_id = st.one_of(st.none(), st.sampled_from(self.request_ids))

    @rule(data=st.data(), ttl=st.sampled_from(TTLS))
    def claim(self, data: Any, ttl: float | None) -> None:
        targets = data.draw(self._draw_targets, "targets")
        holder = data.draw(self._draw_holder, "holder")
        request_id = data.draw(self._draw_request_id, "id")
        mode = data.draw(_MODES[bool(self.store.shared_holds)], "mode")
        normalized = normalize_targets(targets)
        expected: ModelOutcome | DibsError
        try:
            expected = self.model.claim(normalized, holder, request_id, ttl, self.clock.now(), mode)
        except DibsError as exc:
            expected = exc
        try:
            actual: ClaimResult | DibsError = self.store.claim(
                targets, holder=holder, request_id=request_id, ttl=ttl, mode=mode
            )
        except DibsError as exc:
            actual = exc
        if isinstance(expected, DibsError):
            assert type(actual) is type(expected), (expected, actual)
            return
        assert isinstance(actual, ClaimResult), actual
        assert actual.granted == expected.granted, (expected, actual)
        assert actual.replayed == expected.replayed, (expected, actual)
        assert actual.taken == expected.taken, (expected, actual)
        if expected.key is not None:
            assert actual.claim is not None
            if expected.key == len(self.ids):
                # A new grant: its fence beats every earlier one.
                assert all(actual.claim.fence > c.fence for c in self.ids), actual.claim
                self.ids.append(actual.claim)
            assert actual.claim.id == self.ids[expected.key].id
            self._same(expected.key, actual.claim)

    @precondition(lambda self: self.ids)
    @rule(
        data=st.data(),
        operation=st.sampled_from(["confirm", "extend", "release"]),
        right_holder=st.booleans(),
        right_fence=st.booleans(),
    )
    def transition(self, data: Any, operation: str, right_holder: bool, right_fence: bool) -> None:
        key = data.draw(st.integers(0, len(self.ids) - 1))
        claim = self.ids[key]
        holder = claim.holder if right_holder else "mallory\u00e9"
        fence = claim.fence if right_fence else claim.fence + 10_000
        # The model numbers its fences 1, 2, 3...; a store's need only increase (etcd's
        # are cluster revisions), so the model hears of a fence in its own numbering.
        model_fence = self.model.claims[key].fence + (0 if right_fence else 10_000)
        now = self.clock.now()
        expected: Any
        try:
            if operation == "confirm":
                expected = self.model.confirm(key, holder, model_fence, now)
            elif operation == "extend":
                expected = self.model.extend(key, holder, model_fence, 7.0, now)
            else:
                expected = self.model.release(key, holder, model_fence, now)
        except DibsError as exc:
            expected = exc
        try:
            if operation == "confirm":
                actual: Any = self.store.confirm(claim.id, holder=holder, fence=fence)
            elif operation == "extend":
                actual = self.store.extend(claim.id, holder=holder, fence=fence, ttl=7.0)
            else:
                actual = self.store.release(claim.id, holder=holder, fence=fence)
        except DibsError as exc:
            actual = exc
        if isinstance(expected, DibsError):
            assert type(actual) is type(expected), (expected, actual)
            if isinstance(expected, HoldLost):
                assert isinstance(actual, HoldLost) and actual.reason is expected.reason, (
                    expected.reason,
                    actual,
                )
        elif isinstance(expected, bool):
            assert actual is expected
        else:
            assert isinstance(actual, Claim), actual
            self._same(key, actual)

    @rule(seconds=st.sampled_from(STEPS))
    def advance(self, seconds: float) -> None:
        self.clock.advance(seconds)

    @rule()
    def sweep(self) -> None:
        expected = self.model.sweep(self.clock.now())
        assert self.store.sweep().expired == expected

    # --- invariants ----------------------------------------------------------------------------

    @invariant()
    def holders_agree(self) -> None:
        now = self.clock.now()
        for unit in self.units:
            assert self.store.holder_of(unit) == self.model.holder_of(unit, now), unit
        for span in self.spans:
            try:
                actual = self.store.holder_of(span)
            except SpanKindMismatch:
                actual = None
            assert (actual is None) == (self.model.holder_of(span, now) is None), span

    @invariant()
    def claims_agree(self) -> None:
        for key in range(len(self.ids)):
            stored = self.store.get(self.ids[key].id)
            if self.model.claims[key].purged:
                assert stored is None, stored
            else:
                assert stored is not None
                self._same(key, stored)

    def _same(self, key: int, claim: Claim) -> None:
        expected = self.model.claims[key]
        now = self.clock.now()
        assert claim.holder == expected.holder
        assert claim.targets == expected.targets
        assert claim.state is self.model.state_of(key, now), (claim, expected)
        assert claim.taken_over == expected.taken_over, (claim, expected)
        assert claim.mode == expected.mode, (claim, expected)
        if expected.state is ClaimState.HELD:
            assert claim.expires_at is not None and expected.expires_at is not None
            assert claim.expires_at == _EPOCH + timedelta(microseconds=expected.expires_at)
        elif expected.state is not ClaimState.EXPIRED:
            assert claim.expires_at is None, claim
