"""Finish an awaitable even when its caller is cancelled: for steps that must not stop halfway."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any, TypeVar

__all__ = ["to_the_end"]

_T = TypeVar("_T")


async def to_the_end(work: Coroutine[Any, Any, _T]) -> _T:
    """Await ``work`` to its end even if the caller is cancelled meanwhile; then re-raise that.

    For the store calls that must not stop halfway: storing a result whose function
    ran, and ending a run hold. A cancellation that lands as the work finishes is
    re-raised too, and the caller's ``cancelling()`` count is left as the cancellers
    made it (their ``uncancel()`` is theirs to call: ``asyncio.timeout`` still turns
    its own into ``TimeoutError``).
    """
    task = asyncio.ensure_future(work)
    caller = asyncio.current_task()
    asked = caller.cancelling() if caller is not None else 0
    interrupted: asyncio.CancelledError | None = None
    while not task.done():
        try:
            await asyncio.shield(task)
        except asyncio.CancelledError as exc:
            # Ours unless the work itself was cancelled and nobody asked to cancel us:
            # a cancel delivered just as the work ended arrives here with task.done().
            if not task.done() or caller is None or caller.cancelling() > asked:
                interrupted = interrupted or exc
    if interrupted is not None:
        if not task.cancelled():
            task.exception()  # retrieved: the caller's cancellation is the answer now
        raise interrupted
    return task.result()
