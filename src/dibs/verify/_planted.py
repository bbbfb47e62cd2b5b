"""Deliberately broken stores: the checker's negative controls.

Each plant subclasses a real store (memory, SQLite or PostgreSQL) and breaks
one promise (a principle of docs/design.md) the way a plausible bug would.
``dibs verify --plant NAME`` runs the workload on one, and must report
anomalies every time; a checker that passes a plant is broken.

* ``check-then-act`` — the claim reads "is it free?" first and then writes
  blindly, so two callers can both win (principle 1);
* ``confirm-unfenced`` — confirm turns a hold into a confirmed claim without
  checking its fence, its state or its expiry (principle 4);
* ``client-clock`` — expiry judged on each client's clock, skewed by ± the
  skew, instead of on the store's one clock (principle 4).

``renew-ignores-fence`` breaks no store: see :mod:`dibs.verify._planted_lease`.

``rate-over-limit`` breaks no store: the clients' :class:`~dibs.RateLimit`
keeps one slot more than its rate allows (an off-by-one in the limit), so
some window admits ``limit + 1`` units; the rate check
(:func:`dibs.verify._check.rate_anomalies`) must flag it on every store.

The plants of :data:`~dibs.verify._planted_replay.REPLAY_PLANTS` (a grant on
other targets, a stale fence accepted, an extend after expiry, a request
record replayed wrongly) are caught by the log replay alone, so also where the
search runs out of budget.

A plant may also be ``module:Class``: any importable :class:`~dibs.Store`
subclass with ``from_url(url, **options)``, so that users and auditors can
bring their own broken (or suspect) stores.
"""

from __future__ import annotations

import importlib
import threading
import time
from collections.abc import Callable
from typing import Any

import dibs
from dibs._model import Claim, ClaimResult, ClaimState, Unit, claim_from_micros
from dibs._request import ClaimRequest
from dibs.exceptions import InvalidInput
from dibs.ratelimit import Rate, RateLimit
from dibs.stores import store_class
from dibs.stores.base import Store, claim_not_found, not_holder, parse_serial_id
from dibs.stores.memory import MemoryStore
from dibs.stores.sqlite import SQLiteStore
from dibs.verify._planted_lease import RENEW_PLANTS
from dibs.verify._planted_replay import REPLAY_PLANTS, replay_plant
from dibs.verify._planted_shared import SHARED_PLANTS, shared_plants
from dibs.verify._waitlist import WAITLIST_PLANTS
from dibs.verify._workload import RACE_WINDOW

__all__ = [
    "ALL_PLANTS",
    "PLANTS",
    "RATE_PLANTS",
    "REPLAY_PLANTS",
    "SEMAPHORE_PLANTS",
    "SkewedClock",
    "open_planted",
    "plant_class",
    "rate_limit_class",
]

PLANTS = ("check-then-act", "confirm-unfenced", "client-clock")
"""The plants every checker must catch: the negative controls run on every store."""
SEMAPHORE_PLANTS = ("semaphore-n-plus-one",)
"""Plants in the patterns above the store: the store is the real one, the workload's
semaphore admits one holder too many (its ``semaphore`` ops are turned on)."""
RATE_PLANTS = ("rate-over-limit",)
"""Plants in the clients' rate limits, on any store: the rate check must catch them."""
ALL_PLANTS = (
    PLANTS
    + REPLAY_PLANTS
    + SEMAPHORE_PLANTS
    + RATE_PLANTS
    + WAITLIST_PLANTS
    + SHARED_PLANTS
    + RENEW_PLANTS
)
"""Every built-in plant a ``--plant`` name may give."""


class _CheckThenActMemory(MemoryStore):
    def _claim(self, request: ClaimRequest) -> ClaimResult:
        targets = request.targets
        if all(isinstance(t, Unit) for t in targets) and all(
            self._holder_of(t) is None for t in targets
        ):
            time.sleep(RACE_WINDOW)
            for t in targets:  # BUG: act on a stale check, dropping whoever came in between
                if isinstance(t, Unit):
                    self._units.pop(t._key, None)
        return super()._claim(request)


class _CheckThenActSQLite(SQLiteStore):
    def _claim(self, request: ClaimRequest) -> ClaimResult:
        targets = request.targets
        units = [t for t in targets if isinstance(t, Unit)]
        if len(units) == len(targets) and all(self._holder_of(t) is None for t in units):
            time.sleep(RACE_WINDOW)

            def clear() -> None:
                with self._immediate() as conn:
                    for u in units:  # BUG: act on a stale check, as if the unit were free
                        conn.execute(
                            "UPDATE dibs_units_v2 SET state = 'released' "
                            "WHERE resource = ? AND slot = ? AND state IS NOT NULL",
                            (u.resource, u.slot),
                        )
                        conn.execute(
                            "DELETE FROM dibs_units_v2 "
                            "WHERE resource = ? AND slot = ? AND state IS NULL",
                            (u.resource, u.slot),
                        )

            self._retrying(clear)
        return super()._claim(request)


class _UnfencedMemory(MemoryStore):
    def _confirm(self, claim_id: str, holder: str, fence: int) -> Claim:
        record = self._owned(claim_id, holder)
        with self._locked(self._stripes_of(record)):
            now = self._now_us()
            # BUG: no fence, state or expiry condition.
            record["state"] = ClaimState.CONFIRMED
            record["_expires_at_us"] = None
            record["_updated_at_us"] = now
            return claim_from_micros(dict(record))


class _UnfencedSQLite(SQLiteStore):
    def _confirm(self, claim_id: str, holder: str, fence: int) -> Claim:
        def attempt() -> Claim:
            with self._immediate() as conn:
                now = round(self._now() * 1_000_000)
                key = parse_serial_id(claim_id)
                row = conn.execute(
                    "SELECT holder FROM dibs_units_v2 WHERE fence = ? AND state IS NOT NULL "
                    "UNION ALL SELECT holder FROM dibs_claims_v2 WHERE fence = ?",
                    (key, key),
                ).fetchone()
                if key is None or row is None:
                    raise claim_not_found(claim_id)
                if row[0] != holder:
                    raise not_holder(claim_id, holder)
                # BUG: no fence, state or expiry condition.
                for table in ("dibs_units_v2", "dibs_claims_v2"):
                    conn.execute(
                        f"UPDATE {table} SET state = 'confirmed', expires_at = NULL, "
                        "updated_at = ? WHERE fence = ? AND state IS NOT NULL",
                        (now, key),
                    )
                claim = self._read(conn, key, now)
                assert claim is not None
                return claim

        return self._retrying(attempt)


class _OverLimit(RateLimit):
    """A rate limit with one slot too many: it admits ``limit + 1`` units per window."""

    def __init__(self, store: Store, key: str, rate: str | Rate = "10/s") -> None:
        super().__init__(store, key, rate)
        prefix = self._units[0].slot.rpartition("/")[0]
        extra = Unit(self.key, f"{prefix}/{self.rate.limit}")
        # BUG: an off-by-one in the limit (range(limit + 1)).
        self._index[extra] = len(self._units)
        self._units = (*self._units, extra)
        self._free_at = [*self._free_at, 0]


def rate_limit_class(plant: str | None) -> type[RateLimit]:
    """The :class:`~dibs.RateLimit` the clients use: the real one, or the plant's."""
    return _OverLimit if plant == "rate-over-limit" else RateLimit


class SkewedClock:
    """The machine clock plus a per-thread offset: a client's clock, for ``client-clock``."""

    def __init__(self, skew: float = 0.0) -> None:
        self.skew = skew
        self._local = threading.local()

    def set_thread_skew(self, skew: float) -> None:
        """Give the calling thread its own offset (memory:// clients are threads)."""
        self._local.skew = skew

    def now(self) -> float:
        """``time.time()`` plus this thread's (or the clock's) offset."""
        return time.time() + getattr(self._local, "skew", self.skew)


_CLASSES: dict[tuple[str, str], type[Store]] = {
    ("check-then-act", "memory"): _CheckThenActMemory,
    ("check-then-act", "sqlite"): _CheckThenActSQLite,
    ("confirm-unfenced", "memory"): _UnfencedMemory,
    ("confirm-unfenced", "sqlite"): _UnfencedSQLite,
    ("client-clock", "memory"): MemoryStore,
    ("client-clock", "sqlite"): SQLiteStore,
    **shared_plants(),
}


def _postgres_plant(plant: str) -> type[Store]:
    from dibs.stores.postgres import PostgresStore  # noqa: PLC0415 (an optional extra)
    from dibs.verify._planted_postgres import (  # noqa: PLC0415
        CheckThenActPostgres,
        ReaderBesideWriterPostgres,
        UnfencedPostgres,
    )

    return {
        "check-then-act": CheckThenActPostgres,
        "confirm-unfenced": UnfencedPostgres,
        "client-clock": PostgresStore,
        "reader-beside-writer": ReaderBesideWriterPostgres,
    }[plant]


def plant_class(spec: str) -> type[Store]:
    """Import ``module:Class``, a :class:`~dibs.Store` subclass with ``from_url``.

    Raises :class:`~dibs.InvalidInput` if it cannot be imported or is no such class.
    """
    module_name, _, name = spec.partition(":")
    try:
        obj: Any = importlib.import_module(module_name)
        for part in name.split("."):
            obj = getattr(obj, part)
    except (ImportError, AttributeError, ValueError) as exc:
        raise InvalidInput(
            f"cannot import plant {spec!r}: {exc}", field="plant", value=spec
        ) from exc
    if not (isinstance(obj, type) and issubclass(obj, Store) and hasattr(obj, "from_url")):
        raise InvalidInput(
            f"plant {spec!r} is not a Store subclass with from_url(url, **options)",
            field="plant",
            value=spec,
        )
    return obj


def open_planted(url: str, plant: str | None, *, skew: float = 0.0, **options: Any) -> Store:
    """Open ``url`` as the real store, or with the planted bug ``plant``.

    ``plant`` is a built-in plant's name or ``module:Class``. ``skew`` is the
    client clock offset the ``client-clock`` plant judges expiry by. Raises
    :class:`~dibs.InvalidInput` for an unknown plant or a store it has no
    broken twin for.
    """
    if plant is None or plant in SEMAPHORE_PLANTS + RATE_PLANTS + WAITLIST_PLANTS + RENEW_PLANTS:
        return dibs.open(url, **options)
    if ":" in plant:
        custom: Callable[..., Store] = plant_class(plant).from_url
        return custom(url, **options)
    # The built-in plants are broken twins of the built-in stores, keyed by the store's
    # registered scheme (postgres:// and postgresql:// are one store).
    base = store_class(url)
    scheme = base.scheme
    cls = _CLASSES.get((plant, scheme))
    if cls is None and plant in REPLAY_PLANTS:
        cls = replay_plant(plant, base)
    if cls is None and plant in (*PLANTS, *SHARED_PLANTS) and scheme == "postgresql":
        cls = _postgres_plant(plant)
    if cls is None:
        raise InvalidInput(
            f"no planted bug {plant!r} for {scheme}:// (plants: {', '.join(ALL_PLANTS)}; "
            "stores: memory, sqlite, postgresql; extend-revives: memory, sqlite)",
            field="plant",
            value=plant,
        )
    if plant == "client-clock":
        options["clock"] = SkewedClock(skew)
    opener: Callable[..., Store] = cls.from_url
    return opener(url, **options)
