"""dibs: claim a named, indivisible thing exactly once, across threads, processes and hosts.

>>> import dibs
>>> with dibs.open("memory://") as store:
...     won = store.claim(dibs.Unit("seat-14A", "show-42"), holder="alice", ttl=300)
...     lost = store.claim(dibs.Unit("seat-14A", "show-42"), holder="bob", ttl=300)
...     bool(won), bool(lost), lost.taken
(True, False, (Unit(resource='seat-14A', slot='show-42'),))
"""

from importlib import metadata as _metadata

from dibs import booking
from dibs import lease as lease  # loading it gives the stores their lease()
from dibs._clock import Clock, FakeClock, SystemClock
from dibs._compiled import compiled_modules as _compiled_modules
from dibs._model import Claim, ClaimResult, ClaimState, Span, SweepResult, Target, Unit
from dibs._request import ClaimRequest
from dibs.exceptions import (
    ClaimNotFound,
    DibsError,
    HoldLost,
    HoldLostReason,
    InvalidInput,
    MissingExtra,
    NotHolder,
    RequestConflict,
    ResourceBusy,
    SchemaError,
    SpanKindMismatch,
    StoreClosed,
    StoreMisconfigured,
    StoreUnavailable,
    TransactionConflict,
    UnknownScheme,
)
from dibs.idempotency import IdempotencyInProgress, idempotent
from dibs.lot import AlreadyParked, Lot, NotParked, Occupancy, VehicleBlocked
from dibs.matching import Match, match
from dibs.paths import PathsExhausted, ReservedPath, reserve_path
from dibs.ratelimit import Decision, Rate, RateLimit
from dibs.renewal import renew
from dibs.semaphore import Semaphore
from dibs.singleflight import AsyncSingleFlight, FlightResult, SingleFlight
from dibs.stores import open_store as open
from dibs.stores.base import Store
from dibs.waitlist import Waitlist

__all__ = [
    "AlreadyParked",
    "AsyncSingleFlight",
    "Claim",
    "ClaimNotFound",
    "ClaimRequest",
    "ClaimResult",
    "ClaimState",
    "Clock",
    "Decision",
    "DibsError",
    "FakeClock",
    "FlightResult",
    "HoldLost",
    "HoldLostReason",
    "IdempotencyInProgress",
    "InvalidInput",
    "Lot",
    "Match",
    "MissingExtra",
    "NotHolder",
    "NotParked",
    "Occupancy",
    "PathsExhausted",
    "Rate",
    "RateLimit",
    "RequestConflict",
    "ReservedPath",
    "ResourceBusy",
    "SchemaError",
    "Semaphore",
    "SingleFlight",
    "Span",
    "SpanKindMismatch",
    "Store",
    "StoreClosed",
    "StoreMisconfigured",
    "StoreUnavailable",
    "SweepResult",
    "SystemClock",
    "Target",
    "TransactionConflict",
    "Unit",
    "UnknownScheme",
    "VehicleBlocked",
    "Waitlist",
    "booking",
    "idempotent",
    "match",
    "open",
    "renew",
    "reserve_path",
]


def _version() -> str:
    try:
        return _metadata.version("dibs")
    except _metadata.PackageNotFoundError:  # pragma: no cover - imported from a bare source tree
        return "0+unknown"


__version__ = _version()
"""The installed version, from the package metadata (pyproject.toml holds the one copy)."""

compiled = bool(_compiled_modules())
"""Whether this process runs the compiled (mypyc) claim path: docs/design.md, "Compiled core"."""

# Public names report the package they are imported from, as trio's do, so that
# reprs, docs and pickles never depend on a private module path.
for _name in __all__:
    _obj = globals()[_name]
    if getattr(_obj, "__module__", "").startswith("dibs.") and isinstance(_obj, type):
        _obj.__module__ = "dibs"
del _name, _obj
