"""Input checks shared by submit(), every(), cron() and durable task registration."""

from __future__ import annotations

from typing import Any

from dibs._model import check_name, shown
from dibs.exceptions import InvalidInput
from dibs.limits import NUMBER_MAX, RETENTION_MAX
from dibs.semaphore import PERMITS_MAX, check_key
from dibs.tasks._handle import Backoff
from dibs.tasks._locks import CONCURRENCY_PREFIX, Concurrency

__all__ = [
    "RETRIES_MAX",
    "check_fn",
    "check_id",
    "check_limit",
    "concurrency_option",
    "task_options",
]


RETRIES_MAX = 1_000_000
"""Most retries a task may have."""


def check_fn(fn: object) -> None:
    """Raise :class:`~dibs.InvalidInput` unless ``fn`` is callable."""
    if not callable(fn):
        raise InvalidInput(f"fn must be callable, got {shown(fn)}", field="fn", value=fn)


def check_id(value: object, field: str) -> str:
    """Return ``value`` or raise :class:`~dibs.InvalidInput` unless it is a name in the domain.

    Job IDs, keys, queues, lock keys and schedule IDs obey the domain of store
    names (a lock key is claimed as ``Unit("dibs.tasks.lock", lock_key)``), the
    same on every store: non-empty, at most ``NAME_MAX_BYTES`` in UTF-8, no
    NUL, no lone surrogates.
    """
    return check_name(value, field)


def check_limit(limit: object) -> int | None:
    """Return ``limit`` (None: no limit) or raise :class:`~dibs.InvalidInput` unless it is an
    int from 1 to 2**63 - 1.

    0 is refused rather than read as "none" or "no limit": either reading is a
    surprise to someone, and None already says "all".
    """
    if limit is not None and (
        isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= NUMBER_MAX
    ):
        raise InvalidInput(
            f"limit must be an int from 1 to 2**63 - 1 (None: no limit), got {shown(limit)}",
            field="limit", value=limit,
        )  # fmt: skip
    return limit


def task_options(
    retries: object, backoff: object, timeout: object
) -> tuple[int, Backoff, float | None]:
    """Validate and normalize the per-task execution options.

    ``backoff`` may be a :class:`Backoff` or a number (the base delay in
    seconds). Raises :class:`~dibs.InvalidInput` for a negative or non-int
    ``retries``, a bad backoff, or a ``timeout`` that is not None or > 0.
    """
    # Bounded: a durable job stores its attempts in a 64-bit column, and a million
    # retries at the default 300 s backoff cap already span nine years.
    if isinstance(retries, bool) or not isinstance(retries, int) or not 0 <= retries <= RETRIES_MAX:
        raise InvalidInput(
            f"retries must be an int from 0 to {RETRIES_MAX}, got {shown(retries)}",
            field="retries",
            value=retries,
        )
    if not isinstance(backoff, Backoff):
        if isinstance(backoff, bool) or not isinstance(backoff, int | float):
            raise InvalidInput(
                f"backoff must be a Backoff or a base delay in seconds, got {shown(backoff)}",
                field="backoff",
                value=backoff,
            )
        backoff = Backoff(base=backoff)
    # Compare before converting: a huge int has no float, and NaN fails both bounds.
    if timeout is not None and (
        isinstance(timeout, bool)
        or not isinstance(timeout, int | float)
        or not 0 < timeout <= RETENTION_MAX
    ):
        raise InvalidInput(
            f"timeout must be None or seconds > 0 and <= {RETENTION_MAX:g}, got {shown(timeout)}",
            field="timeout",
            value=timeout,
        )
    return retries, backoff, None if timeout is None else float(timeout)


def describe(fn: Any) -> str:
    """A readable name for a task function in logs."""
    return str(getattr(fn, "__qualname__", None) or getattr(fn, "__name__", None) or repr(fn))


def concurrency_option(concurrency: object, key: object) -> Concurrency | None:
    """A task's concurrency limit, or None; raises :class:`~dibs.InvalidInput` for a bad one.

    ``concurrency`` is None (no limit) or an int from 1 to
    :data:`dibs.semaphore.PERMITS_MAX`; ``key`` a name, a callable, or None.
    """
    if concurrency is None:
        if key is not None:
            raise InvalidInput(
                "concurrency_key needs concurrency=N", field="concurrency_key", value=key
            )
        return None
    if (
        isinstance(concurrency, bool)
        or not isinstance(concurrency, int)
        or not 1 <= concurrency <= PERMITS_MAX
    ):
        raise InvalidInput(
            f"concurrency must be None or an int from 1 to {PERMITS_MAX}, got {shown(concurrency)}",
            field="concurrency",
            value=concurrency,
        )
    if isinstance(key, str):
        check_id(key, "concurrency_key")
        try:
            check_key(CONCURRENCY_PREFIX + key)
        except InvalidInput:
            raise InvalidInput(
                f"concurrency_key is too long, got {shown(key)}", field="concurrency_key", value=key
            ) from None
    elif key is not None and not callable(key):
        raise InvalidInput(
            f"concurrency_key must be a name, a function of the job's arguments or None,"
            f" got {shown(key)}",
            field="concurrency_key",
            value=key,
        )
    return Concurrency(concurrency, key)
