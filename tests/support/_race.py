"""Thread-race helpers shared by the pattern tests."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def race(n: int, fn: Callable[[int], T]) -> list[T]:
    """Run ``fn(0..n-1)`` on n threads released together; re-raise the first failure."""
    barrier = threading.Barrier(n)
    out: dict[int, T] = {}
    errors: list[BaseException] = []

    def run(i: int) -> None:
        barrier.wait()
        try:
            out[i] = fn(i)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return [out[i] for i in range(n)]


def race_outcomes(calls: list[Callable[[], object]]) -> list[object]:
    """Run ``calls`` on threads released together; each one's result, or the exception it raised.

    For races whose losers raise as part of the answer (a refusal, a conflict): the
    caller checks every outcome.
    """
    barrier = threading.Barrier(len(calls))
    out: list[object] = [None] * len(calls)

    def run(i: int) -> None:
        barrier.wait()
        try:
            out[i] = calls[i]()
        except Exception as exc:  # the race's answer, checked by the caller
            out[i] = exc

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(calls))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return out
