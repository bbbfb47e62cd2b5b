"""The errors dibs raises, one tree rooted at :class:`DibsError`.

Losing a race is never an error: a claim that finds its targets taken returns a
falsy :class:`~dibs.ClaimResult`. Exceptions are for misuse and for broken
promises::

    DibsError
    ├── InvalidInput (ValueError)          bad argument; names the field and value
    │   ├── UnknownScheme                  store URL with an unregistered scheme
    │   └── SpanKindMismatch               numbers and datetimes mixed on one resource
    ├── RequestConflict (ValueError)       request ID reused with different input
    ├── ClaimNotFound (LookupError)        no claim with that ID
    ├── NotHolder (PermissionError)        the claim belongs to another holder
    ├── HoldLost                           the hold expired, was released or taken over
    ├── StoreClosed (RuntimeError)         the store was closed
    ├── SchemaError (RuntimeError)         the stored schema is newer than this code
    ├── StoreMisconfigured (RuntimeError)  cannot be opened as configured; retrying won't help
    ├── StoreUnavailable (ConnectionError) transient; the only error worth retrying
    ├── TransactionConflict (RuntimeError) your own transaction (connection=) was aborted
    ├── ResourceBusy (TimeoutError)        exclusive() or lease() found it taken too long
    ├── MissingExtra (ImportError)         an optional dependency is not installed
    │
    │   raised by the patterns, defined beside them:
    ├── lot.NotParked (LookupError)        removing a vehicle that holds no slots
    ├── lot.AlreadyParked (ValueError)     re-parking a vehicle with another length
    ├── lot.VehicleBlocked (RuntimeError)  a vehicle's unit is held outside a parking of it
    ├── paths.PathsExhausted (FileExistsError) every candidate name was taken
    ├── idempotency.IdempotencyInProgress (RuntimeError) the same call is running now
    └── tasks.TaskCancelled, TaskTimeout, WaitTimeout, ProcessorClosed,
        NotInTask, UnknownTask             see dibs.tasks

Every exception carries its facts as attributes and pickles cleanly, so it can
cross a process boundary unchanged.
"""

from __future__ import annotations

import enum
from typing import Any

__all__ = [
    "ClaimNotFound",
    "DibsError",
    "HoldLost",
    "HoldLostReason",
    "InvalidInput",
    "MissingExtra",
    "NotHolder",
    "RequestConflict",
    "ResourceBusy",
    "SchemaError",
    "SpanKindMismatch",
    "StoreClosed",
    "StoreMisconfigured",
    "StoreUnavailable",
    "TransactionConflict",
    "UnknownScheme",
]


class DibsError(Exception):
    """Base of every error dibs raises."""

    def __init__(self, message: str, **facts: Any) -> None:
        super().__init__(message)
        self.message = message
        self._facts = facts
        for name, value in facts.items():
            setattr(self, name, value)

    def __reduce__(self) -> tuple[Any, ...]:
        # Keyword facts are not in self.args, so rebuild through a helper.
        return (_rebuild, (type(self), self.message, self._facts))

    def __str__(self) -> str:
        return self.message


def _rebuild(cls: type[DibsError], message: str, facts: dict[str, Any]) -> DibsError:
    return cls(message, **facts)


class InvalidInput(DibsError, ValueError):
    """Raised for a bad argument; ``field`` and ``value`` say which and what."""

    field: str
    value: Any

    def __init__(self, message: str, *, field: str, value: Any, **facts: Any) -> None:
        super().__init__(message, field=field, value=value, **facts)


class UnknownScheme(InvalidInput):
    """Raised by :func:`dibs.open` for a URL whose scheme names no store.

    ``schemes`` lists every scheme available, plug-ins included.
    """

    schemes: tuple[str, ...]


class SpanKindMismatch(InvalidInput):
    """Raised when numeric and datetime spans would be mixed on one resource."""


class RequestConflict(DibsError, ValueError):
    """Raised when a request ID is reused with different input (``request_id``)."""

    request_id: str


class ClaimNotFound(DibsError, LookupError):
    """Raised when no claim has the given ``claim_id``."""

    claim_id: str


class NotHolder(DibsError, PermissionError):
    """Raised when ``holder`` is not the holder of claim ``claim_id``."""

    claim_id: str
    holder: str


class HoldLostReason(enum.StrEnum):
    """Why a confirm, extend or release found no live hold."""

    EXPIRED = "expired"
    """The hold's TTL ran out on the store's clock, and nobody has taken its targets since."""
    TAKEN_OVER = "taken_over"
    """The hold expired and another claimant took its targets.

    That is, a later claim was granted on a target the hold would have blocked
    had it been live (see "the reason rule" in docs/stores.md), whether or not
    a sweep had marked the hold expired first.
    """
    RELEASED = "released"
    """The holder released the claim."""
    FENCE = "fence"
    """The fence given is not the claim's fence: a stale or foreign token."""


class HoldLost(DibsError):
    """Raised when the claim is no longer the caller's live hold; see ``reason``."""

    claim_id: str
    reason: HoldLostReason


class StoreClosed(DibsError, RuntimeError):
    """Raised by any operation on a store after :meth:`close`."""


class SchemaError(DibsError, RuntimeError):
    """Raised when the stored schema version (``found``) is newer than ``supported``."""

    found: int
    supported: int


class StoreMisconfigured(DibsError, RuntimeError):
    """Raised when a store cannot be opened as configured; retrying the same call cannot help.

    A wrong password, a database, role or directory that does not exist, an
    option the driver rejects. ``cause`` is the driver's or the file system's
    own words (never a password). Fix the URL or the setup, then open again.
    Deliberately not a :class:`StoreUnavailable` (and not a ``ConnectionError``),
    so retry loops that retry those give up at once.
    """

    cause: str


class StoreUnavailable(DibsError, ConnectionError):
    """Raised when the store could not be reached; retry with the same request ID."""


class TransactionConflict(DibsError, RuntimeError):
    """Raised when the database aborted the caller's own transaction (``connection=``).

    A concurrent transaction took what it needed (a unique job's key, under
    REPEATABLE READ or SERIALIZABLE: a serialization failure; or a deadlock), so the
    transaction is dead: roll it back and run the whole of it again. Retrying the
    one call cannot help, so this is deliberately not a :class:`StoreUnavailable`.
    ``sqlstate`` is the database's code (``"40001"``, ``"40P01"``; SQLite's
    ``"SQLITE_BUSY_SNAPSHOT"``, a read snapshot a commit outdated); the driver's
    error is the ``__cause__``.
    """

    sqlstate: str


class ResourceBusy(DibsError, TimeoutError):
    """Raised by ``booking.exclusive()`` when ``resource`` stayed taken for ``waited`` seconds.

    :meth:`dibs.Store.lease` raises it too, with ``taken`` (the targets that
    blocked it), ``holders`` (who held them, a snapshot) and ``targets``;
    ``resource`` is then the first taken target's.
    """

    resource: str
    waited: float


class MissingExtra(DibsError, ImportError):
    """Raised when a feature needs a package that only one of dibs's extras installs.

    ``extra`` names the extra (``pip install 'dibs[<extra>]'`` installs it) and
    ``name`` the module that could not be imported; the original
    ``ImportError`` is the ``__cause__``.
    """

    extra: str
    name: str
