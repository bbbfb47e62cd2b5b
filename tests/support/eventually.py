"""Wait on a condition, never on a duration.

A test that sleeps a fixed time and then asserts guesses how long the machine
needs; on a loaded 2-core box the guess is wrong and the test flakes. These
helpers poll the condition itself instead: they return as soon as it holds, and
fail with a message naming what never happened once the guard runs out. The
guard is a hang detector, far above any real wait, never a timing claim.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

T = TypeVar("T")

GUARD = 60.0
# The poll starts fine and backs off: a condition that holds at once costs
# about a millisecond, one that takes seconds costs a few dozen wake-ups.
FIRST, LAST = 0.001, 0.05


def eventually(condition: Callable[[], T], what: str = "", *, timeout: float = GUARD) -> T:
    """Return ``condition()``'s first truthy value; AssertionError naming ``what`` if none comes."""
    deadline = time.monotonic() + timeout
    pause = FIRST
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"never happened in {timeout:g} s: {what or condition!r}")
        time.sleep(pause)
        pause = min(pause * 2, LAST)


async def aeventually(
    condition: Callable[[], T | Awaitable[T]], what: str = "", *, timeout: float = GUARD
) -> T:
    """The coroutine twin of `eventually`: ``condition`` may be sync or async."""
    deadline = time.monotonic() + timeout
    pause = FIRST
    while True:
        value = condition()
        if isinstance(value, Awaitable):
            value = await value
        if value:
            return value  # type: ignore[return-value]
        if time.monotonic() > deadline:
            raise AssertionError(f"never happened in {timeout:g} s: {what or condition!r}")
        await asyncio.sleep(pause)
        pause = min(pause * 2, LAST)
