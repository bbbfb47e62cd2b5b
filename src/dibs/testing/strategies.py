"""Hypothesis strategies that draw from the whole accepted input domain.

A narrow generator is how edge bugs slip through: these draw names with NUL-free
Unicode up to the byte limit, span bounds at the 2**53 and 2**63 edges, aware
datetimes in zones with DST folds and gaps (``fold=0`` and ``fold=1``), TTLs at
both ends, and target lists shuffled and with duplicates. Use them to test a
store of your own, or code built on dibs; the table they follow is in
docs/stores.md.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

from dibs._extras import needs

with needs("testing", "dibs.testing.strategies"):
    from hypothesis import strategies as st

from dibs._model import Span, Target, Unit, span_bound_to_number
from dibs.limits import NAME_MAX_BYTES, NUMBER_MAX, NUMBER_MIN, TTL_MAX, TTL_MIN

__all__ = [
    "ZONES",
    "aware_datetimes",
    "names",
    "span_numbers",
    "spans",
    "target_lists",
    "targets",
    "ttls",
    "units",
]

ZONES = (
    UTC,
    ZoneInfo("America/New_York"),  # repeats 01:00-02:00 in November
    ZoneInfo("Europe/London"),
    ZoneInfo("Australia/Lord_Howe"),  # a half-hour DST shift
    ZoneInfo("Pacific/Chatham"),  # +12:45 / +13:45
    ZoneInfo("America/St_Johns"),  # -03:30 / -02:30
)
"""Zones whose transitions are unusual: folds, gaps, odd offsets."""

# Wall-clock instants just before a transition in the zones above (2026), where
# fold=0 and fold=1 of the same wall time are different instants.
_TRANSITIONS = (
    datetime(2026, 11, 1, 1, 0),  # New York, fall back
    datetime(2026, 3, 8, 2, 0),  # New York, spring forward (a gap)
    datetime(2026, 10, 25, 1, 0),  # London, fall back
    datetime(2026, 4, 5, 1, 30),  # Lord Howe, fall back by 30 minutes
)

_characters = st.characters(
    exclude_categories=["Cs"],  # lone surrogates are outside the domain
    exclude_characters="\x00",
)


def _at_byte_limit(char: str) -> str:
    return char * (NAME_MAX_BYTES // len(char.encode("utf-8")))


def names(*, allow_empty: bool = False) -> st.SearchStrategy[str]:
    """Names in the domain: short ones that collide, Unicode text, names at the byte limit."""
    return st.one_of(
        st.sampled_from(["a", "b", "seat-1", "Seat-1", "é", "\U0001f600", " ", "a b"]),
        st.text(_characters, min_size=0 if allow_empty else 1, max_size=12),
        st.builds(_at_byte_limit, _characters),
    )


def span_numbers() -> st.SearchStrategy[int | float]:
    """Numeric span bounds across the whole signed 64-bit range, edges first."""
    edges = [0, -0.0, 1, -1, 2**53 - 1, 2**53, 2**53 + 1, NUMBER_MAX, NUMBER_MIN, 0.5, 1e-300]
    return st.one_of(
        st.sampled_from(edges),
        st.integers(NUMBER_MIN, NUMBER_MAX),
        st.integers(2**53 - 3, 2**53 + 3),
        st.floats(min_value=float(NUMBER_MIN), max_value=9.223372036854775e18, allow_nan=False),
    )


def aware_datetimes() -> st.SearchStrategy[datetime]:
    """Aware datetimes, often within minutes of a DST transition, with either fold."""
    near_transition = st.builds(
        lambda base, minutes, zone, fold: (base + timedelta(minutes=minutes)).replace(
            tzinfo=zone, fold=fold
        ),
        st.sampled_from(_TRANSITIONS),
        st.integers(-90, 90),
        st.sampled_from(ZONES),
        st.integers(0, 1),
    )
    anywhere = st.datetimes(
        min_value=datetime(1, 1, 3),
        max_value=datetime(9999, 12, 29),
        timezones=st.sampled_from(ZONES),
    )
    return st.one_of(near_transition, anywhere)


@st.composite
def spans(
    draw: st.DrawFn, resources: st.SearchStrategy[str] | None = None, kind: str | None = None
) -> Span:
    """A valid span: two distinct bounds of one kind, in order."""
    resource = draw(resources if resources is not None else names())
    kind = kind or draw(st.sampled_from(["number", "time"]))
    bounds: st.SearchStrategy[int | float | datetime] = (
        span_numbers() if kind == "number" else aware_datetimes()
    )
    low, high = draw(st.lists(bounds, min_size=2, max_size=2).filter(lambda pair: _distinct(*pair)))
    if _key(high) < _key(low):
        low, high = high, low
    return Span(resource, low, high)


def _key(bound: int | float | datetime) -> int | float:
    """A bound as a number that orders exactly like it (datetimes in UTC microseconds)."""
    return span_bound_to_number(bound.astimezone(UTC)) if isinstance(bound, datetime) else bound


def _distinct(a: int | float | datetime, b: int | float | datetime) -> bool:
    return _key(a) != _key(b)


def units(
    resources: st.SearchStrategy[str] | None = None, slots: st.SearchStrategy[str] | None = None
) -> st.SearchStrategy[Unit]:
    """Units with names from :func:`names` (slots may be empty)."""
    return st.builds(
        Unit,
        resources if resources is not None else names(),
        slots if slots is not None else names(allow_empty=True),
    )


def targets(resources: st.SearchStrategy[str] | None = None) -> st.SearchStrategy[Target]:
    """One unit or one span; pass a few ``resources`` to make claims collide."""
    return st.one_of(units(resources, resources), spans(resources))


def target_lists(
    universe: st.SearchStrategy[Target] | None = None,
) -> st.SearchStrategy[list[Target]]:
    """Target lists in any order, with duplicates, whose spans do not overlap each other."""
    element = universe if universe is not None else targets()
    return (
        st.lists(element, min_size=1, max_size=5)
        .filter(_claimable)
        .flatmap(_shuffled_with_duplicates)
    )


def _claimable(items: list[Target]) -> bool:
    found = [t for t in items if isinstance(t, Span)]
    for i, a in enumerate(found):
        for b in found[i + 1 :]:
            if a.resource == b.resource and (a.kind != b.kind or (a != b and a.overlaps(b))):
                return False
    return True


def _shuffled_with_duplicates(items: list[Target]) -> st.SearchStrategy[list[Target]]:
    return st.lists(st.sampled_from(items), max_size=2).flatmap(
        lambda extra: st.permutations([*items, *extra])
    )


def ttls(*, allow_none: bool = True) -> st.SearchStrategy[float | int | None]:
    """TTLs across the domain: both ends, ints and floats, and ``None`` where allowed."""
    finite: st.SearchStrategy[float | int | None] = st.one_of(
        st.sampled_from([TTL_MIN, TTL_MAX, 1, 0.0015]),
        st.floats(min_value=TTL_MIN, max_value=TTL_MAX),
        st.integers(1, int(TTL_MAX)),
    )
    return st.one_of(st.none(), finite) if allow_none else finite
