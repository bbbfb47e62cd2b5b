"""The one retry loop of the SQL stores: full-jitter exponential backoff on transient errors.

Each store says which of its driver's errors are transient (SQLite: "database
is locked"/"busy"; PostgreSQL: serialization failures and deadlocks, SQLSTATE
40001/40P01) and how long to keep trying; everything else propagates at once,
for the store to translate. :class:`Backoff` is the policy; :func:`retrying`
runs it for blocking code (SQLite). PostgreSQL's operations are plans that ask
:class:`Backoff` themselves, so both of its faces retry alike (``_drive.py``).
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable
from typing import TypeVar

__all__ = ["Backoff", "retrying"]

_T = TypeVar("_T")

_logger = logging.getLogger("dibs.stores")


class Backoff:
    """One call's retry state: whether an error is worth another try, and how long to wait.

    After a transient error, :meth:`pause` answers a random time up to the
    current delay (doubling from ``delay`` to ``max_delay``), at most
    ``attempts`` tries in all and for at most ``seconds``. When either runs out
    it raises ``gave_up(error, tries)`` from the last error. Each retry is a
    DEBUG line on ``logger``; giving up is the caller's to report.
    """

    __slots__ = (
        "_attempts",
        "_deadline",
        "_delay",
        "_gave_up",
        "_logger",
        "_max",
        "_transient",
        "tries",
    )

    def __init__(
        self,
        *,
        transient: Callable[[Exception], bool],
        gave_up: Callable[[Exception, int], Exception],
        attempts: int | None = None,
        seconds: float | None = None,
        delay: float = 0.001,
        max_delay: float = 0.1,
        logger: logging.Logger = _logger,
    ) -> None:
        self._transient = transient
        self._gave_up = gave_up
        self._attempts = attempts
        self._deadline = None if seconds is None else time.monotonic() + seconds
        self._delay = delay
        self._max = max_delay
        self._logger = logger
        self.tries = 0
        """Attempts that failed so far."""

    def pause(self, exc: Exception) -> float | None:
        """Seconds to wait before the next try after ``exc``; None when ``exc`` is not transient.

        Raises ``gave_up(exc, tries)`` from ``exc`` when the tries or the time are used up.
        """
        self.tries += 1
        if not self._transient(exc):
            return None
        if (self._attempts is not None and self.tries >= self._attempts) or (
            self._deadline is not None and time.monotonic() >= self._deadline
        ):
            raise self._gave_up(exc, self.tries) from exc
        self._logger.debug(
            "transient error, retry %d after up to %.3f s: %s", self.tries, self._delay, exc
        )
        pause = random.uniform(0, self._delay)  # full jitter: contenders spread out
        self._delay = min(self._delay * 2, self._max)
        return pause


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
    """Run ``work`` until it returns or raises an error that is not ``transient`` (see Backoff)."""
    backoff = Backoff(
        transient=transient,
        gave_up=gave_up,
        attempts=attempts,
        seconds=seconds,
        delay=delay,
        max_delay=max_delay,
        logger=logger,
    )
    while True:
        try:
            return work()
        except Exception as exc:
            pause = backoff.pause(exc)
            if pause is None:
                raise
        time.sleep(pause)
