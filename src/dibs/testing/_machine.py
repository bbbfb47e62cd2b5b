"""A Hypothesis ``RuleBasedStateMachine`` checking a store against :class:`ModelStore`.

Subclass it and set ``make_store`` to a callable returning a fresh store
driven by a :class:`~dibs.FakeClock`; then expose ``Machine.TestCase``.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any, ClassVar

from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from dibs._clock import FakeClock
from dibs._model import Claim, ClaimResult, ClaimState, Span, Target, Unit, normalize_targets
from dibs.exceptions import DibsError, HoldLost, SpanKindMismatch
from dibs.stores.base import Store
from dibs.testing.model import ModelOutcome, ModelStore

__all__ = ["StoreStateMachine"]

UNITS = [Unit("seat", str(i)) for i in range(4)]
_T0 = datetime(2026, 12, 3, tzinfo=UTC)
# One datetime span on the numeric spans' resource: a kind switch once they are dead.
SPANS = [
    *(Span("room", a, b) for a, b in [(0, 4), (2, 6), (4, 8), (6, 10), (0, 10)]),
    Span("room", _T0, _T0 + timedelta(hours=2)),
]
HOLDERS = ["alice", "bob", "carol"]
RETENTION = 100.0

targets_strategy = st.lists(
    st.sampled_from([*UNITS, *SPANS]), min_size=1, max_size=3, unique=True
).filter(
    lambda ts: (
        not any(
            a is not b
            and isinstance(a, Span)
            and isinstance(b, Span)
            and (a.overlaps(b) or a.kind != b.kind)
            for a in ts
            for b in ts
        )
    )
)


class StoreStateMachine(RuleBasedStateMachine):
    """Random claims, confirms, extends, releases, sweeps and clock moves, checked step by step."""

    make_store: ClassVar[Callable[[FakeClock, float], Store]]

    def __init__(self) -> None:
        super().__init__()
        self.clock = FakeClock()
        self.store = type(self).make_store(self.clock, RETENTION)
        self.model = ModelStore(retention=RETENTION)
        self.ids: list[Claim] = []  # model key -> the store's claim as first granted

    def teardown(self) -> None:
        self.store.close()

    # --- rules ---------------------------------------------------------------------------------

    @rule(
        goal=targets_strategy,
        holder=st.sampled_from(HOLDERS),
        request_id=st.one_of(st.none(), st.sampled_from(["q1", "q2", "q3"])),
        ttl=st.sampled_from([None, 5.0, 10.0]),
    )
    def claim(
        self, goal: list[Target], holder: str, request_id: str | None, ttl: float | None
    ) -> None:
        # ("targets" is a reserved argument name of Hypothesis rules.)
        targets = goal
        normalized = normalize_targets(targets)
        expected: ModelOutcome | DibsError
        try:
            expected = self.model.claim(normalized, holder, request_id, ttl, self.clock.now())
        except DibsError as exc:
            expected = exc
        try:
            actual: ClaimResult | DibsError = self.store.claim(
                targets, holder=holder, request_id=request_id, ttl=ttl
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
        holder = claim.holder if right_holder else "mallory"
        fence = claim.fence if right_fence else claim.fence + 10_000
        now = self.clock.now()
        expected: Any
        try:
            if operation == "confirm":
                expected = self.model.confirm(key, holder, fence, now)
            elif operation == "extend":
                expected = self.model.extend(key, holder, fence, 7.0, now)
            else:
                expected = self.model.release(key, holder, fence, now)
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

    @rule(seconds=st.sampled_from([0.5, 2.0, 4.999, 5.0, 7.0, 11.0, RETENTION]))
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
        for unit in UNITS:
            assert self.store.holder_of(unit) == self.model.holder_of(unit, now), unit
        for span in SPANS:
            try:
                actual = self.store.holder_of(span)
            except SpanKindMismatch:  # pragma: no cover - no store raises it on a read today
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
        assert claim.state is expected.observed_state(now), (claim, expected)
        assert claim.taken_over == expected.taken_over, (claim, expected)
        if expected.state is ClaimState.HELD:
            assert claim.expires_at is not None and expected.expires_at is not None
            assert abs(claim.expires_at.timestamp() - expected.expires_at) < 1e-3
        elif expected.state is not ClaimState.EXPIRED:
            assert claim.expires_at is None, claim
