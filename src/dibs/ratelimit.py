"""Rate limits shared by every caller of a store: at most ``limit`` units in any window.

A :class:`RateLimit` of ``"10/s"`` on a key keeps ten *slots*, the units
``Unit(key, "dibs.rate/10/1000000/0")`` ... ``/9``. Admitting ``cost`` units
claims ``cost`` free slots in one claim, a hold as long as the window that no
one ever releases. The store's uniqueness of a live unit is the check
(principle 1), and its clock ends the hold (principle 4): a slot admits again
only once its last admission's hold has ended, so a slot admits at most once
in any half-open window ``[t, t + window)`` of the store's clock, and
``limit`` slots admit at most ``limit`` units in it. This is a sliding-window
log whose entries are claims, exact across threads, processes and hosts, with
no burst beyond the limit itself.

Which slots are free is a hint each instance keeps (what its own admissions,
lost claims and ``claims_of`` snapshots taught it): it picks which slots to
claim, never whether to admit. A refusal is decided on the store's clock
(``store.now()``) from slots known held: a hold is never released early, so a
slot seen held until ``t`` is held until ``t``, and a refusal is exact too.
"""

from __future__ import annotations

import hashlib
import heapq
import math
import random
import re
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from decimal import Decimal, InvalidOperation

from dibs._model import Claim, Target, Unit, check_name, shown
from dibs.exceptions import InvalidInput
from dibs.limits import RATE_LIMIT_MAX, TTL_MAX, TTL_MIN
from dibs.stores.base import Store

__all__ = ["Decision", "Rate", "RateLimit"]

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MICROSECOND = timedelta(microseconds=1)
_WINDOW_MIN_US = round(TTL_MIN * 1_000_000)
_WINDOW_MAX_US = round(TTL_MAX * 1_000_000)

_UNITS_US = {
    "us": 1,
    "ms": 1_000,
    "millisecond": 1_000,
    "milliseconds": 1_000,
    "s": 1_000_000,
    "sec": 1_000_000,
    "second": 1_000_000,
    "seconds": 1_000_000,
    "m": 60_000_000,
    "min": 60_000_000,
    "minute": 60_000_000,
    "minutes": 60_000_000,
    "h": 3_600_000_000,
    "hour": 3_600_000_000,
    "hours": 3_600_000_000,
    "d": 86_400_000_000,
    "day": 86_400_000_000,
    "days": 86_400_000_000,
}
_RATE = re.compile(
    r"\s*([0-9]{1,30})\s*(?:/|\s+per\s+)\s*([0-9]{1,30}(?:\.[0-9]{1,30})?)?\s*([a-z]{1,20})\s*",
    re.ASCII | re.IGNORECASE,
)
_OVERHANG_US = 250_000
"""How long a slot the store still holds past its ``expires_at`` (an etcd lease that
has not been deleted yet) is taken to stay held: a refusal's retry-after hint."""


def _micros(moment: datetime) -> int:
    """Whole microseconds since the epoch, exactly (no float on the way)."""
    return (moment - _EPOCH) // _MICROSECOND


@dataclass(frozen=True, slots=True)
class Rate:
    """At most ``limit`` units in any window of ``window`` seconds.

    Made by :meth:`parse` from text such as ``"10/s"``, ``"100/minute"``,
    ``"5/2s"``, ``"1/500ms"`` or ``"3 per hour"``, or directly. Raises
    :class:`~dibs.InvalidInput` (field ``limit`` or ``window``) for a limit
    that is not an integer from 1 to :data:`dibs.limits.RATE_LIMIT_MAX`, or a
    window that is not a whole number of microseconds from
    :data:`dibs.limits.TTL_MIN` to :data:`dibs.limits.TTL_MAX` seconds.
    """

    limit: int
    window: float
    window_us: int = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        limit, window = self.limit, self.window
        if type(limit) is not int or not 1 <= limit <= RATE_LIMIT_MAX:
            raise InvalidInput(
                f"limit must be an integer from 1 to {RATE_LIMIT_MAX}, got {shown(limit)}",
                field="limit",
                value=limit,
            )
        bad = InvalidInput(
            f"window must be a number of seconds from {TTL_MIN} to {TTL_MAX:.0f}, "
            f"in whole microseconds, got {shown(window)}",
            field="window",
            value=window,
        )
        if type(window) not in (int, float):
            raise bad
        try:
            micros = Decimal(window) * 1_000_000
        except (InvalidOperation, ValueError, OverflowError):
            raise bad from None
        if not micros.is_finite() or not _WINDOW_MIN_US <= micros <= _WINDOW_MAX_US:
            raise bad
        whole = round(micros)
        # A float such as 0.1 is 0.1000000000000000055...: within a nanosecond (or the
        # float's own spacing, for long windows) of a whole microsecond counts as that one.
        slack = max(Decimal("0.001"), Decimal(math.ulp(float(window))) * 1_000_000)
        if abs(micros - whole) > slack:
            raise bad
        object.__setattr__(self, "window", whole / 1_000_000)
        object.__setattr__(self, "window_us", whole)

    @classmethod
    def parse(cls, text: object) -> Rate:
        """The rate ``text`` names (a :class:`Rate` is returned as is).

        Raises :class:`~dibs.InvalidInput` (field ``rate``) for text that is not
        ``<limit>/<unit>``, ``<limit>/<number><unit>`` or ``<limit> per
        [<number>] <unit>`` with a unit among us, ms, s, m (minute), h and d (or
        their names), or names a limit or window outside :class:`Rate`'s.
        """
        if isinstance(text, Rate):
            return text
        if not isinstance(text, str):
            raise InvalidInput(
                f"rate must be text such as '10/s' or a dibs.Rate, got {shown(text)}",
                field="rate",
                value=text,
            )
        found = _RATE.fullmatch(text)
        unit = _UNITS_US.get(found.group(3).lower()) if found else None
        if found is None or unit is None:
            raise InvalidInput(
                f"rate must look like '10/s', '100/minute', '5/2s' or '3 per hour', got {text!r}",
                field="rate",
                value=text,
            )
        count, number, _ = found.groups()
        micros = Decimal(number or 1) * unit
        try:
            if not _WINDOW_MIN_US <= micros <= _WINDOW_MAX_US or micros != int(micros):
                raise InvalidInput("window", field="window", value=micros)
            return cls(int(count), int(micros) / 1_000_000)
        except InvalidInput as exc:
            raise InvalidInput(
                f"rate {text!r}: {exc}"
                if exc.field == "limit"
                else f"rate {text!r}: the window must be from {TTL_MIN} s to "
                f"{TTL_MAX:.0f} s, in whole microseconds",
                field="rate",
                value=text,
            ) from None

    def __str__(self) -> str:
        micros = self.window_us
        if micros == 1_000_000:
            return f"{self.limit}/s"
        if micros % 1_000_000 == 0:
            return f"{self.limit}/{micros // 1_000_000}s"
        if micros % 1_000 == 0:
            return f"{self.limit}/{micros // 1_000}ms"
        return f"{self.limit}/{micros}us"


@dataclass(frozen=True, slots=True)
class Decision:
    """The answer to :meth:`RateLimit.acquire`: truthy when the units were admitted.

    ``retry_after`` is 0.0 when admitted, else the seconds (on the store's
    clock) until enough of the slots known held end: the earliest the same
    cost may be admitted, if no one else takes them first. ``claim`` is the
    admission's claim (its ``created_at`` is the store's time of admission),
    None when refused.
    """

    allowed: bool
    retry_after: float = 0.0
    claim: Claim | None = None

    def __bool__(self) -> bool:
        return self.allowed

    @property
    def at(self) -> datetime | None:
        """When the store admitted the units (its clock), or None when refused."""
        return None if self.claim is None else self.claim.created_at


class _Slots:
    """The rules both faces share: the slot units, the hint of when each frees, the answers.

    The hint is plain list and int updates (atomic under the GIL); threads
    sharing one instance may race on it, which costs a lost claim, never a
    wrong admission: the store decides every one.
    """

    def __init__(self, key: str, rate: str | Rate) -> None:
        self.key = check_name(key, "key")
        self.rate = Rate.parse(rate)
        limit, window_us = self.rate.limit, self.rate.window_us
        prefix = f"dibs.rate/{limit}/{window_us}/"
        self._units = tuple(Unit(self.key, f"{prefix}{i}") for i in range(limit))
        self._index: dict[Target, int] = {unit: i for i, unit in enumerate(self._units)}
        digest = hashlib.sha256(f"{limit}/{window_us}/{self.key}".encode()).hexdigest()
        # One holder per key and rate, so that claims_of reads this limit's slots
        # in one call; an admission that comes back as the holder's existing claim
        # (replayed) is refused as a loss, so sharing the holder never admits twice.
        self.holder = f"dibs.rate/{digest[:40]}"
        self._ttl = window_us / 1_000_000
        self._free_at = [0] * limit
        self._cursor = random.randrange(limit)
        self._offset_us: int | None = None

    def _check_cost(self, cost: object) -> int:
        if type(cost) is not int or not 1 <= cost <= self.rate.limit:
            raise InvalidInput(
                f"cost must be an integer from 1 to the limit {self.rate.limit}, got {shown(cost)}",
                field="cost",
                value=cost,
            )
        return cost

    def _estimate(self) -> int:
        """The store's time now, guessed from the last reading and this host's clock."""
        if self._offset_us is None:
            return 0
        return time.monotonic_ns() // 1000 + self._offset_us

    def _observe(self, store_us: int) -> None:
        self._offset_us = store_us - time.monotonic_ns() // 1000

    def _pick(self, cost: int, now_us: int) -> list[int] | None:
        """``cost`` slots the hint says are free at ``now_us``, from a moving cursor."""
        free_at = self._free_at
        limit = len(free_at)
        picked: list[int] = []
        i = self._cursor
        for _ in range(limit):
            if free_at[i] <= now_us:
                picked.append(i)
                if len(picked) == cost:
                    self._cursor = (i + 1) % limit
                    return picked
            i = (i + 1) % limit
        return None

    def _admitted(self, picked: list[int], claim: Claim) -> Decision:
        ends = _micros(claim.expires_at) if claim.expires_at is not None else 0
        for i in picked:
            self._free_at[i] = ends
        self._observe(_micros(claim.created_at))
        return Decision(True, 0.0, claim)

    def _refused(self, cost: int, now_us: int) -> Decision:
        # Fewer than ``cost`` slots are free at now_us; the retry is when enough
        # of the held ones end (each is held until its free_at, never less).
        # One look at the hint: another thread may replace it (a lost claim's snapshot)
        # or fill its slots meanwhile, so it is read once.
        free_at = self._free_at
        held = [t for t in free_at if t > now_us]
        needed = cost - (len(free_at) - len(held))
        if needed <= 0:
            # Slots came free in the hint after this call looked (another thread learned
            # of them): refused all the same, and worth trying again at once.
            return Decision(False, 0.0, None)
        ends = heapq.nsmallest(needed, held)[-1]
        return Decision(False, (ends - now_us) / 1_000_000, None)

    def _relearn(self, claims: Iterable[Claim], taken: Iterable[Target], now_us: int) -> None:
        """Replace the hint with a ``claims_of`` snapshot read after a lost claim."""
        free_at = [0] * len(self._free_at)
        for claim in claims:
            ends = _micros(claim.expires_at) if claim.expires_at is not None else 0
            for target in claim.targets:
                i = self._index.get(target)
                if i is not None:
                    free_at[i] = max(free_at[i], ends)
        for target in taken:
            i = self._index.get(target)
            # Taken when the claim was decided, yet not live in the snapshot with a
            # later end: an etcd lease past its expires_at not deleted yet, or a
            # claim of the unit by another holder. Count it held a little longer.
            if i is not None and free_at[i] <= now_us:
                free_at[i] = now_us + min(_OVERHANG_US, self.rate.window_us)
        self._free_at = free_at
        self._observe(now_us)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(key={self.key!r}, rate={str(self.rate)!r})"


class RateLimit(_Slots):
    """A limit of ``rate`` on ``key``, shared by every caller of the store, in any process.

    ``acquire(cost)`` admits ``cost`` units or refuses with a retry-after hint;
    in any half-open window of ``rate.window`` seconds on the store's clock the
    admitted costs sum to at most ``rate.limit``. Instances with the same key
    and rate share one limit; another rate on the same key is another limit.
    :class:`dibs.aio.RateLimit` is the same limit for asyncio code. Raises
    :class:`~dibs.InvalidInput` for a bad key or rate.
    """

    # --- generated from dibs/aio/ratelimit.py (scripts/unasync.py): edit that, then run it ---

    def __init__(self, store: Store, key: str, rate: str | Rate = "10/s") -> None:
        super().__init__(key, rate)
        self.store = store

    def acquire(self, cost: int = 1) -> Decision:
        """Admit ``cost`` units now, or refuse with ``retry_after`` seconds.

        Raises :class:`~dibs.InvalidInput` for a cost that is not an integer
        from 1 to the rate's limit, and what the store raises
        (:class:`~dibs.StoreUnavailable`...); an admission the store granted
        before such an error counts against the limit.
        """
        cost = self._check_cost(cost)
        store, now, exact = self.store, self._estimate(), False
        while True:
            picked = self._pick(cost, now)
            if picked is None and not exact:
                # The hint's guess of the time refuses: refuse only on the store's clock.
                now, exact = _micros(store.now()), True
                self._observe(now)
                picked = self._pick(cost, now)
            if picked is None:
                return self._refused(cost, now)
            units = [self._units[i] for i in picked]
            # The linearization point: the store grants these slots' units to one
            # claim at most while their last admission's hold lives.
            result = store.claim(units, holder=self.holder, ttl=self._ttl)
            if result.granted and not result.replayed and result.claim is not None:
                return self._admitted(picked, result.claim)
            # Lost (or handed back this holder's live claim of them): someone else
            # admitted since the hint was made; learn the slots and decide again
            # on the store's clock.
            claims = store.claims_of(self.holder)
            now = _micros(store.now())
            self._relearn(claims, result.taken, now)
            exact = True

    # --- end of the generated part ---
