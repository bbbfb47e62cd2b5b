"""Units, spans, claims and claim results: the pure vocabulary of dibs, no I/O."""

from __future__ import annotations

import enum
import hashlib
import json
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, fields
from datetime import UTC, datetime, timedelta
from operator import attrgetter
from typing import Any, TypeAlias

from dibs.exceptions import InvalidInput
from dibs.limits import (
    NAME_MAX_BYTES,
    NUMBER_MAX,
    NUMBER_MIN,
    RETENTION_MAX,
    RETENTION_MIN,
    TTL_MAX,
    TTL_MIN,
)

__all__ = [
    "EXCLUSIVE",
    "SHARED",
    "Claim",
    "ClaimResult",
    "ClaimState",
    "Span",
    "SweepResult",
    "Target",
    "Unit",
]

SpanBound: TypeAlias = int | float | datetime

EXCLUSIVE = "exclusive"
"""A claim's default mode: it excludes every other live claim on its targets."""
SHARED = "shared"
"""A reader's mode: it coexists with other shared claims and excludes exclusive ones."""
MODES = (EXCLUSIVE, SHARED)


def conflicts(mode: str, other: str) -> bool:
    """Whether a claim in ``mode`` and a live one in ``other`` on one target exclude each other."""
    return mode != SHARED or other != SHARED


@dataclass(frozen=True, slots=True, order=True)
class Unit:
    """One indivisible key ``(resource, slot)``, e.g. a seat for a showing.

    Raises :class:`~dibs.InvalidInput` for an empty or non-string resource or slot.
    """

    resource: str
    slot: str = ""
    # Units are dict keys on every claim; the generated __hash__ builds a tuple
    # per call, so hash once. (No defaults on these two: __init__ would set each
    # before __post_init__ does, and setting a frozen field is a slow call.)
    _hash: int = field(init=False, repr=False, compare=False)
    # The same key as one string, for a store's own indexes: a dict looks a str
    # up without calling back into Python (Unit.__hash__ is a Python call), and
    # the string keeps its hash, which is the unit's. Names hold no NUL, so no
    # two units share one. Hashing it costs no more than hashing (resource, slot).
    _key: str = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        _check_id("resource", self.resource)
        if type(self.slot) is not str or not is_plain_name(self.slot):
            _check_name("slot", self.slot)
        key = f"{self.resource}\x00{self.slot}"
        _set_hash(self, hash(key))
        _set_key(self, key)

    def __hash__(self) -> int:
        return self._hash

    def __getstate__(self) -> tuple[str, str]:
        return (self.resource, self.slot)

    def __setstate__(self, state: tuple[str, str]) -> None:
        # String hashes differ between processes: recompute after unpickling.
        object.__setattr__(self, "resource", state[0])
        object.__setattr__(self, "slot", state[1])
        key = f"{state[0]}\x00{state[1]}"
        object.__setattr__(self, "_hash", hash(key))
        object.__setattr__(self, "_key", key)


@dataclass(frozen=True, slots=True)
class Span:
    """A half-open interval ``[start, end)`` on a resource.

    Bounds are numbers or timezone-aware datetimes, both of one kind. A span is
    a stretch of instants, so datetime bounds are converted to UTC: a repeated
    wall-clock hour (``fold``) is two different hours. Raises
    :class:`~dibs.InvalidInput` for an empty or inverted span, NaN, a number
    outside the signed 64-bit range, naive datetimes or mixed kinds.
    """

    resource: str
    start: SpanBound
    end: SpanBound

    def __post_init__(self) -> None:
        _check_id("resource", self.resource)
        kinds = {_bound_kind(name, v) for name, v in (("start", self.start), ("end", self.end))}
        for name in ("start", "end"):
            value = getattr(self, name)
            if isinstance(value, datetime):
                object.__setattr__(self, name, _to_utc(name, value))
            elif value == 0:
                object.__setattr__(self, name, type(value)(0))  # -0.0 is 0.0
        if len(kinds) != 1:
            raise InvalidInput(
                f"span bounds must both be numbers or both datetimes, got "
                f"{self.start!r} and {self.end!r}",
                field="span",
                value=(self.start, self.end),
            )
        if not self.start < self.end:  # type: ignore[operator]
            raise InvalidInput(
                f"span on {self.resource!r} is empty or inverted: "
                f"start {self.start!r} is not before end {self.end!r}",
                field="span",
                value=(self.start, self.end),
            )

    @property
    def kind(self) -> str:
        """``"time"`` for datetime bounds, ``"number"`` otherwise."""
        return "time" if isinstance(self.start, datetime) else "number"

    def overlaps(self, other: Span) -> bool:
        """Whether both spans are on one resource and share some point."""
        return (
            self.resource == other.resource
            and self.kind == other.kind
            and self.start < other.end  # type: ignore[operator]
            and other.start < self.end  # type: ignore[operator]
        )


Target: TypeAlias = Unit | Span


def _bound_kind(name: str, value: object) -> str:
    if isinstance(value, datetime):
        if value.tzinfo is None or value.utcoffset() is None:
            raise InvalidInput(
                f"span {name} must be timezone-aware, got naive {shown(value)}",
                field=name,
                value=value,
            )
        return "time"
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise InvalidInput(
            f"span {name} must be a number or an aware datetime, got {shown(value)}",
            field=name,
            value=value,
        )
    if isinstance(value, float) and not math.isfinite(value):
        raise InvalidInput(
            f"span {name} must be finite, got {shown(value)}", field=name, value=value
        )
    if not NUMBER_MIN <= value <= NUMBER_MAX:
        raise InvalidInput(
            f"span {name} must lie in the signed 64-bit range [-2**63, 2**63 - 1], "
            f"got {shown(value)}",
            field=name,
            value=value,
        )
    return "number"


def _to_utc(name: str, value: datetime) -> datetime:
    try:
        return value.astimezone(UTC)
    except OverflowError:
        raise InvalidInput(
            f"span {name} {value.isoformat()} is outside the datetime range in UTC",
            field=name,
            value=value,
        ) from None


def is_plain_name(value: str) -> bool:
    """Whether a string is certainly a valid name: the fast path for ASCII."""
    return len(value) <= NAME_MAX_BYTES and value.isascii() and "\x00" not in value


def _check_name(name: str, value: object) -> None:
    """Raise :class:`InvalidInput` unless ``value`` is a string in the name domain."""
    if not isinstance(value, str):
        raise InvalidInput(f"{name} must be a string, got {shown(value)}", field=name, value=value)
    if "\x00" in value:
        raise InvalidInput(f"{name} must not contain NUL characters", field=name, value=value)
    try:
        size = len(value.encode("utf-8"))
    except UnicodeEncodeError as exc:
        raise InvalidInput(
            f"{name} must be valid Unicode text; it has a lone surrogate "
            f"{value[exc.start : exc.end]!r} at index {exc.start}",
            field=name,
            value=value,
        ) from None
    if size > NAME_MAX_BYTES:
        raise InvalidInput(
            f"{name} must be at most {NAME_MAX_BYTES} bytes in UTF-8, got {size}",
            field=name,
            value=value,
        )


def _check_id(name: str, value: object) -> None:
    """Raise :class:`InvalidInput` unless ``value`` is a non-empty name."""
    if type(value) is str and value and is_plain_name(value):
        return
    if isinstance(value, str) and not value:
        raise InvalidInput(f"{name} must be a non-empty string, got ''", field=name, value=value)
    _check_name(name, value)


class ClaimState(enum.StrEnum):
    """Where a claim is in its life: held → confirmed → released, or expired."""

    HELD = "held"
    CONFIRMED = "confirmed"
    RELEASED = "released"
    EXPIRED = "expired"


@dataclass(frozen=True)
class Claim:
    """A snapshot of one claim as the store recorded it.

    ``expires_at`` is set for holds and judged on the store's clock; a held
    claim whose ``expires_at`` has passed is dead even before a sweep marks it
    expired. ``fence`` is strictly greater than the fence of every earlier
    claim on any of the same targets. ``mode`` is ``"exclusive"`` (the
    default) or ``"shared"`` (a reader: it coexists with other shared claims
    on its targets and excludes exclusive ones); it applies to every target.
    """

    id: str
    holder: str
    targets: tuple[Target, ...]
    state: ClaimState
    fence: int
    expires_at: datetime | None
    request_id: str | None
    created_at: datetime
    updated_at: datetime
    taken_over: bool = False
    # A store's record of an exclusive claim carries no mode: it reads this default.
    mode: str = EXCLUSIVE

    def __getstate__(self) -> dict[str, Any]:
        # The public fields only, times as datetimes: a pickle never carries the
        # microsecond form, so any version of Claim can load it.
        return {name: getattr(self, name) for name in _CLAIM_FIELDS}

    @property
    def units(self) -> tuple[Unit, ...]:
        """The unit targets of this claim."""
        return tuple(t for t in self.targets if isinstance(t, Unit))

    @property
    def spans(self) -> tuple[Span, ...]:
        """The span targets of this claim."""
        return tuple(t for t in self.targets if isinstance(t, Span))


@dataclass(frozen=True)
class ClaimResult:
    """The answer to a claim: truthy when granted, else ``taken`` says what blocked it.

    ``taken`` lists the requested targets that were held by someone else (or,
    for spans, the requested spans that overlapped a live claim); it never
    names the other holder. ``replayed`` is true when an earlier identical
    request (same request ID, or the same holder re-claiming what it holds)
    answered instead of a new claim.
    """

    granted: bool
    claim: Claim | None = None
    taken: tuple[Target, ...] = ()
    replayed: bool = False

    def __bool__(self) -> bool:
        return self.granted


@dataclass(frozen=True, slots=True)
class SweepResult:
    """What one :meth:`sweep` did: holds marked expired, records purged."""

    expired: int = 0
    purged_requests: int = 0
    purged_claims: int = 0


class _MicrosTime:
    """A time field of :class:`Claim`: a datetime, made from whole microseconds on first read.

    A claim built by :func:`claim_from_micros` holds ``_<name>_us`` instead of
    the datetime; the first read converts it and keeps the result (a frozen
    instance's ``__dict__`` is ours to fill; racing readers store equal
    values). A claim built by ``Claim(...)`` holds the datetime itself. Only
    the three time fields pay for this: every other field stays a plain
    instance attribute.
    """

    __slots__ = ("key", "name")

    def __init__(self, name: str) -> None:
        self.name = name
        self.key = f"_{name}_us"

    def __get__(self, claim: Claim | None, owner: type | None = None) -> Any:
        if claim is None:
            return self
        values = claim.__dict__
        try:
            return values[self.name]
        except KeyError:
            if self.key not in values:
                raise AttributeError(self.name) from None
        micros = values[self.key]
        value = None if micros is None else _fromtimestamp(micros / 1e6, UTC)
        values[self.name] = value
        return value

    def __set__(self, claim: Claim, value: Any) -> None:
        # Reached only from the dataclass __init__ (object.__setattr__): the frozen
        # __setattr__ refuses every other assignment first.
        claim.__dict__[self.name] = value


_fromtimestamp = datetime.fromtimestamp
for _name in ("expires_at", "created_at", "updated_at"):
    setattr(Claim, _name, _MicrosTime(_name))
_CLAIM_FIELDS = tuple(f.name for f in fields(Claim))

# Claim and ClaimResult are made on every claim. A frozen dataclass's __init__
# sets each field through object.__setattr__, which costs more than the rest of
# an in-memory claim, so the stores build them through these (same objects,
# same equality; no __slots__ so that __dict__ can be filled in one call).
_new = object.__new__


def checked_unit(resource: str, slot: str) -> Unit:
    """``Unit(resource, slot)`` for names the caller has checked: ``resource`` taken
    from a Unit already made, ``slot`` non-empty and :func:`is_plain_name`.

    The same object, equal and hashing alike, without checking the names again
    (``dibs.Lot`` makes a vehicle's unit on every park).
    """
    unit: Unit = _new(Unit)
    key = f"{resource}\x00{slot}"
    _set_resource(unit, resource)
    _set_slot(unit, slot)
    _set_hash(unit, hash(key))
    _set_key(unit, key)
    return unit


_set_field = object.__setattr__
# A slot's own setter: what the frozen class's object.__setattr__ ends in, called directly.
_set_resource, _set_slot, _set_hash, _set_key = (
    vars(Unit)[name].__set__ for name in ("resource", "slot", "_hash", "_key")
)


def make_claim(
    id: str,
    holder: str,
    targets: tuple[Target, ...],
    state: ClaimState,
    fence: int,
    expires_at: datetime | None,
    request_id: str | None,
    created_at: datetime,
    updated_at: datetime,
    taken_over: bool = False,
    mode: str = EXCLUSIVE,
) -> Claim:
    """Build a :class:`Claim` without the frozen-dataclass ``__init__`` overhead."""
    claim: Claim = _new(Claim)
    if mode != EXCLUSIVE:
        claim.__dict__["mode"] = mode
    claim.__dict__.update(
        id=id,
        holder=holder,
        targets=targets,
        state=state,
        fence=fence,
        expires_at=expires_at,
        request_id=request_id,
        created_at=created_at,
        updated_at=updated_at,
        taken_over=taken_over,
    )
    return claim


def claim_from_micros(values: dict[str, Any]) -> Claim:
    """A :class:`Claim` from a dict of its fields with times in whole microseconds.

    ``values`` holds ``id``, ``holder``, ``targets``, ``state``, ``fence``,
    ``request_id`` (and ``taken_over`` unless false, ``mode`` unless exclusive: absent,
    they read the class defaults) and, in place of the three datetimes,
    ``_expires_at_us`` (or None), ``_created_at_us`` and ``_updated_at_us``
    (microseconds since the epoch). The datetimes are made when first read, so
    a store that keeps integer times (memory://) builds a claim with one dict
    copy. The dict is copied; later changes to it do not reach the claim.
    """
    claim: Claim = _new(Claim)
    claim.__dict__.update(values)
    return claim


def make_result(
    granted: bool,
    claim: Claim | None = None,
    taken: tuple[Target, ...] = (),
    replayed: bool = False,
) -> ClaimResult:
    """Build a :class:`ClaimResult` without the frozen-dataclass ``__init__`` overhead."""
    result: ClaimResult = _new(ClaimResult)
    result.__dict__.update(granted=granted, claim=claim, taken=taken, replayed=replayed)
    return result


# --- input normalization shared by every store -------------------------------------------------


def normalize_targets(targets: Target | Iterable[Target]) -> tuple[Target, ...]:
    """Return the targets as a sorted, duplicate-free tuple.

    Raises :class:`InvalidInput` for an empty list, a non-target or overlapping
    spans within one request.
    """
    if type(targets) is Unit or isinstance(targets, Unit | Span):
        return (targets,)
    if isinstance(targets, str | bytes) or not isinstance(targets, Iterable):
        raise InvalidInput(
            f"targets must be a Unit, a Span or a list of them, got {shown(targets)}",
            field="targets",
            value=targets,
        )
    items = list(targets)
    if not items:
        raise InvalidInput("targets must not be empty", field="targets", value=items)
    if type(items[0]) is Unit and len(set(map(type, items))) == 1:
        # The common group claim (seats, a parking row): sort on a C-level key
        # instead of the dataclass's Python __lt__; the same order.
        return tuple(sorted(set(items), key=_unit_key))
    units: set[Unit] = set()
    spans: list[Span] = []
    for item in items:
        if isinstance(item, Unit):
            units.add(item)
        elif isinstance(item, Span):
            if item not in spans:
                spans.append(item)
        else:
            raise InvalidInput(
                f"each target must be a Unit or a Span, got {shown(item)}",
                field="targets",
                value=item,
            )
    for i, a in enumerate(spans):
        for b in spans[i + 1 :]:
            if a.resource == b.resource and a.kind != b.kind:
                raise InvalidInput(
                    f"spans on {a.resource!r} mix numbers and datetimes",
                    field="targets",
                    value=(a, b),
                )
            if a.overlaps(b):
                raise InvalidInput(
                    f"spans in one claim overlap: {a!r} and {b!r}", field="targets", value=(a, b)
                )
    spans.sort(key=_span_sort_key)
    return (*sorted(units), *spans)


_unit_key = attrgetter("resource", "slot")


def _span_sort_key(span: Span) -> tuple[str, str, int | float]:
    # Exact: numbers compare exactly in Python (a float key would tie past 2**53),
    # and datetime bounds are UTC, encoded as whole microseconds.
    return (span.resource, span.kind, span_bound_to_number(span.start))


def check_name(value: object, field: str) -> str:
    """Return ``value``, or raise :class:`InvalidInput` unless it is a non-empty name."""
    _check_id(field, value)
    return value  # type: ignore[return-value]


def check_holder(holder: object) -> str:
    """Return ``holder`` or raise :class:`InvalidInput` if it is not a non-empty string."""
    _check_id("holder", holder)
    return holder  # type: ignore[return-value]


def check_claim_id(claim_id: object) -> str:
    """Return ``claim_id`` or raise :class:`InvalidInput`."""
    _check_id("claim_id", claim_id)
    return claim_id  # type: ignore[return-value]


def check_request_id(request_id: object) -> str | None:
    """Return ``request_id`` (``None`` allowed) or raise :class:`InvalidInput`."""
    if request_id is not None:
        _check_id("request_id", request_id)
    return request_id  # type: ignore[return-value]


def check_mode(mode: object) -> str:
    """Return ``mode`` (``"exclusive"`` or ``"shared"``), or raise :class:`InvalidInput`."""
    if mode == EXCLUSIVE and type(mode) is str:
        return EXCLUSIVE
    if mode == SHARED and type(mode) is str:
        return SHARED
    raise InvalidInput(
        f"mode must be 'exclusive' or 'shared', got {shown(mode)}", field="mode", value=mode
    )


def check_ttl(ttl: object, *, allow_none: bool = True) -> float | None:
    """Return the TTL in seconds or raise :class:`InvalidInput` for a bad one.

    A TTL is a number of seconds from :data:`TTL_MIN` to :data:`TTL_MAX`, or
    ``None`` (confirmed at once) where allowed.
    """
    if ttl is None and allow_none:
        return None
    return check_seconds(ttl, "ttl", TTL_MIN, TTL_MAX, or_none=allow_none)


def check_retention(retention: object) -> float:
    """Return a request retention in seconds or raise :class:`InvalidInput`."""
    return check_seconds(retention, "request_retention", RETENTION_MIN, RETENTION_MAX)


def check_seconds(
    value: object, field: str, low: float, high: float, *, or_none: bool = False
) -> float:
    """Return ``value`` as float seconds if it is a number in ``[low, high]``, else raise."""
    # Compare before converting: a huge int has no float, and NaN fails both bounds.
    if isinstance(value, bool) or not isinstance(value, int | float) or not low <= value <= high:
        raise InvalidInput(
            f"{field} must be a number of seconds from {low:g} to {high:g}"
            f"{' or None' if or_none else ''}, got {_short(value)}",
            field=field,
            value=value,
        )
    return float(value)


def check_fence(fence: object) -> int:
    """Return ``fence`` or raise :class:`InvalidInput` if it is not a positive 64-bit int."""
    if isinstance(fence, bool) or not isinstance(fence, int) or not 0 < fence <= NUMBER_MAX:
        raise InvalidInput(
            f"fence must be an integer from 1 to 2**63 - 1, got {_short(fence)}",
            field="fence",
            value=fence,
        )
    return fence


def shown(value: object) -> str:
    """The repr of a bad value for an error message, cut short (it must not carry a
    megabyte), and never raising: an int past Python's int-to-str digit limit has none."""
    try:
        text = repr(value)
    except ValueError:
        if isinstance(value, int):
            return f"an int of {value.bit_length()} bits"
        return f"a {type(value).__name__} with no repr"
    return text if len(text) <= 80 else f"{text[:60]}... ({len(text)} characters)"


_short = shown


# --- encoding shared by the stores that persist -----------------------------------------------


def span_bound_to_number(value: SpanBound) -> int | float:
    """Encode a span bound as a number that orders like the bound (datetimes in µs)."""
    if isinstance(value, datetime):
        delta = value - _EPOCH
        return (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds
    return value


_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def target_to_json(target: Target) -> list[Any]:
    """Encode a target as a JSON-able list (stable, for fingerprints and storage)."""
    if isinstance(target, Unit):
        return ["u", target.resource, target.slot]
    if target.kind == "time":
        return [
            "t",
            target.resource,
            span_bound_to_number(target.start),
            span_bound_to_number(target.end),
        ]
    return ["n", target.resource, target.start, target.end]


def target_from_json(item: Sequence[Any]) -> Target:
    """Decode what :func:`target_to_json` made."""
    tag = item[0]
    if tag == "u":
        return Unit(item[1], item[2])
    if tag == "t":
        return Span(item[1], _from_micros(item[2]), _from_micros(item[3]))
    return Span(item[1], item[2], item[3])


def _from_micros(micros: int) -> datetime:
    return _EPOCH + timedelta(microseconds=micros)


def targets_to_text(targets: Sequence[Target]) -> str:
    """Encode targets as compact canonical JSON."""
    if all(type(t) is Unit for t in targets):
        # The common case on the claim path, several times faster than json.dumps.
        return (
            "["
            + ",".join(f'["u",{_quote(t.resource)},{_quote(t.slot)}]' for t in targets)  # type: ignore[union-attr]
            + "]"
        )
    return _compact([target_to_json(t) for t in targets])


_quote = json.encoder.encode_basestring_ascii
_compact = json.JSONEncoder(separators=(",", ":")).encode
"""``json.dumps(value, separators=(",", ":"))``, byte for byte, without building an encoder
per call (json.dumps builds one whenever an option differs from its defaults)."""


def targets_from_text(text: str) -> tuple[Target, ...]:
    """Decode what :func:`targets_to_text` made."""
    return tuple(target_from_json(item) for item in json.loads(text))


def fingerprint(
    holder: str, targets: Sequence[Target], ttl: float | None, mode: str = EXCLUSIVE
) -> str:
    """A stable digest of a claim's input, to tell a replay from a conflicting reuse.

    An exclusive claim's digest is the one dibs always wrote (stored request
    records still replay); a shared claim's adds its mode.
    """
    encoded = [
        [
            _canonical(x) if i >= 2 and isinstance(x, int | float) else x
            for i, x in enumerate(target_to_json(t))
        ]
        for t in targets
    ]
    parts: list[Any] = [holder, encoded, ttl]
    if mode != EXCLUSIVE:
        parts.append(mode)
    text = _compact(parts)
    return hashlib.sha256(text.encode()).hexdigest()


def _canonical(number: int | float) -> int | float:
    """One encoding per value, equal exactly when Python's ``==`` says so (``1 == 1.0``).

    An int that a float holds exactly is written as that float (as fingerprints
    always were); a larger one stays an int, so ``2**53 + 1`` is not ``2**53``.
    """
    if type(number) is int and float(number) != number:
        return number
    return float(number)
