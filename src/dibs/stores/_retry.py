"""The one retry loop of the SQL stores: full-jitter exponential backoff on transient errors.

Each store says which of its driver's errors are transient (SQLite: "database
is locked"/"busy"; PostgreSQL: serialization failures and deadlocks, SQLSTATE
40001/40P01) and how long to keep trying; everything else propagates at once,
for the store to translate.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable
from typing import TypeVar

__all__ = ["retrying"]

_T = TypeVar("_T")

_logger = logging.getLogger("dibs.stores")


def retrying(
    work: Callable[[], _T],
    *,
    transient: Callable[[Exception], bool],
    gave_up: Callable[[Exception, int], Exception],
    attempts: int | None = None,
    seconds: float | None = None,
    delay: float = 0.001,
    max_delay: float = 0.1,
    logger: logging.Logger = _logger,
) -> _T:
    """Run ``work`` until it returns or raises an error that is not ``transient``.

    After a transient error, sleeps a random time up to the current delay
    (doubling from ``delay`` to ``max_delay``) and tries again, at most
    ``attempts`` times in all and for at most ``seconds``. When either runs out
    it raises ``gave_up(error, tries)`` from the last error. Each retry is a
    DEBUG line on ``logger``; giving up is the caller's to report.
    """
    deadline = None if seconds is None else time.monotonic() + seconds
    tries = 0
    while True:
        tries += 1
        try:
            return work()
        except Exception as exc:
            if not transient(exc):
                raise
            if (attempts is not None and tries >= attempts) or (
                deadline is not None and time.monotonic() >= deadline
            ):
                raise gave_up(exc, tries) from exc
            logger.debug("transient error, retry %d after up to %.3f s: %s", tries, delay, exc)
        time.sleep(random.uniform(0, delay))  # full jitter: contenders spread out
        delay = min(delay * 2, max_delay)
