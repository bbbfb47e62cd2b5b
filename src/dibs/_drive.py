"""The one driver for rules written as steps (sans-io): :func:`drive` and :func:`adrive`.

A rule that must run on both faces is a generator: it yields a *step* (a
statement, an HTTP request, a store call, a pause), the driver performs the
step and sends its answer back in, or throws the step's error in when the
rule decides on that kind of error. The PostgreSQL and etcd stores'
operations, the lease's policy and ``@dibs.idempotent`` are written this way:
each rule is written once, and a blocking driver and an asyncio one run it
alike, as psycopg keeps one implementation behind its two faces.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Generator
from typing import Any, TypeVar, cast

__all__ = ["adrive", "drive"]

_S = TypeVar("_S")
_T = TypeVar("_T")

Errors = type[BaseException] | tuple[type[BaseException], ...]

_UNSTARTED: Any = object()


def drive(
    steps: Generator[_S, Any, _T],
    perform: Callable[[_S], Any],
    decides: Errors = (),
    *,
    first: _S = _UNSTARTED,
) -> _T:
    """Run ``steps`` to its result, performing each step it yields with ``perform``.

    An error of a type in ``decides`` raised by ``perform`` is thrown into the
    rule, which may handle it; any other error closes the rule and propagates.
    ``first`` is the step a rule already started elsewhere has yielded.
    Returns the rule's result; raises what the rule raises.
    """
    try:
        if first is _UNSTARTED:
            try:
                first = next(steps)
            except StopIteration as done:
                return cast(_T, done.value)
        step = first
        while True:
            error: BaseException | None = None
            try:
                answer = perform(step)
            except decides as exc:
                answer, error = None, exc
            try:
                step = steps.send(answer) if error is None else steps.throw(error)
            except StopIteration as done:
                return cast(_T, done.value)
    finally:
        steps.close()


async def adrive(
    steps: Generator[_S, Any, _T],
    perform: Callable[[_S], Awaitable[Any]],
    decides: Errors = (),
    *,
    first: _S = _UNSTARTED,
) -> _T:
    """:func:`drive`, awaiting each step; a cancellation closes the rule and propagates."""
    try:
        if first is _UNSTARTED:
            try:
                first = next(steps)
            except StopIteration as done:
                return cast(_T, done.value)
        step = first
        while True:
            error: BaseException | None = None
            try:
                answer = await perform(step)
            except decides as exc:
                answer, error = None, exc
            try:
                step = steps.send(answer) if error is None else steps.throw(error)
            except StopIteration as done:
                return cast(_T, done.value)
    finally:
        steps.close()
