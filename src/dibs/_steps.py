"""One implementation of a pattern behind a sync and an async face: steps and their drivers.

A pattern (:class:`~dibs.Lot`, :func:`~dibs.match`, :func:`~dibs.booking.exclusive`)
is written once as a generator that decides everything (validation, what to
claim next, how to read an answer, when to give up) and *yields* the store
calls it needs instead of making them. Each yielded step is one of:

* a store call, ``lambda store: store.claim(units, holder=...)``: the driver
  calls it on its store at once and sends the result back (or throws the
  store's exception in at the ``yield``, where the pattern may catch it);
* :class:`Pause`: sleep, with the face's own sleep;
* :class:`Ask`: call a function of the caller's (e.g. ``candidates()``).

:func:`run` drives the steps on a sync :class:`~dibs.Store`, :func:`arun`
awaits them on a :class:`dibs.aio.AsyncStore`. The store methods have the same
names, arguments and results on both faces, so one step serves both, and the
rules live in one place, as psycopg keeps one implementation behind two faces.
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Awaitable, Callable, Generator
from dataclasses import dataclass
from typing import Any, TypeVar

__all__ = ["Ask", "Pause", "Steps", "arun", "run"]

R = TypeVar("R")


@dataclass(frozen=True, slots=True)
class Pause:
    """Sleep ``seconds`` before the next step."""

    seconds: float


@dataclass(frozen=True, slots=True)
class Ask:
    """Call ``fn()`` (the async face awaits its result if it is awaitable) and send its value."""

    fn: Callable[[], Any]


Step = Callable[[Any], Any] | Pause | Ask
Steps = Generator[Step, Any, R]
"""A pattern's steps: yields what to do next, is sent what it gave, returns the outcome."""


def run(store: Any, steps: Steps[R], sleep: Callable[[float], object] = time.sleep) -> R:
    """Drive ``steps`` on the sync ``store`` and return their outcome; raises what they raise."""
    send = steps.send
    value: Any = None
    try:
        step = send(None)
        while True:
            try:
                if type(step) is Pause:
                    sleep(step.seconds)
                    value = None
                elif type(step) is Ask:
                    value = step.fn()
                else:
                    value = step(store)  # type: ignore[operator]
            except Exception as exc:
                # Raised at the pattern's yield, as if it had called the store itself.
                step = steps.throw(exc)
                continue
            step = send(value)
    except StopIteration as done:
        return done.value  # type: ignore[no-any-return]


async def arun(
    store: Any,
    steps: Steps[R],
    sleep: Callable[[float], Awaitable[object]] = asyncio.sleep,
) -> R:
    """Drive ``steps`` on the async ``store``, awaiting each call; raises what they raise.

    A cancelled await closes the steps there: the pattern takes no further step.
    """
    send = steps.send
    value: Any = None
    try:
        step = send(None)
        while True:
            try:
                if type(step) is Pause:
                    await sleep(step.seconds)
                    value = None
                elif type(step) is Ask:
                    value = step.fn()
                    if inspect.isawaitable(value):
                        value = await value
                else:
                    value = await step(store)  # type: ignore[operator]
            except Exception as exc:
                step = steps.throw(exc)
                continue
            step = send(value)
    except StopIteration as done:
        return done.value  # type: ignore[no-any-return]
    finally:
        steps.close()
