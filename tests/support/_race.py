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
