"""A process-wide bell that every release rings: waiters in this process wake on it at once.

Fair waiters (``dibs._queue``) wait for a release: of the targets, for the head
of a queue, or of a ticket, for the one behind it. A release made in this
process (another thread, another task, a store of any kind) rings the bell,
and a waiter that read the store before the ring wakes instead of sleeping
out its pause. A waiter passes :func:`rung`'s count from *before* its last
read as ``since``, so a ring between that read and its wait is not missed.

Releases in other processes go unheard here: the waiter's pause (and, where
the lease watches one, the store's change feed) covers them. A ring is only
news that something may be free; the waiter's next read or claim decides.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import threading
import time
from collections import deque
from collections.abc import Collection

__all__ = ["alisten", "listen", "ring", "rung"]

_lock = threading.Lock()
_changed = threading.Condition(_lock)
_count = 0
_sleepers = 0  # threads in listen(), under _lock: a ring with none and no task skips waking
_KEPT = 256
_released: deque[str] = deque(maxlen=_KEPT)  # the claim IDs of the last rings, oldest first
# Each waiting task's future -> its loop, and what it waits for (``since``, ``ids``).
_futures: dict[asyncio.Future[None], tuple[asyncio.AbstractEventLoop, int, Collection[str] | None]]
_futures = {}


def _forked() -> None:
    # The parent's lock may have been held by another thread at the fork: start afresh.
    global _lock, _changed, _futures, _sleepers
    _lock = threading.Lock()
    _changed = threading.Condition(_lock)
    _futures = {}  # the parent's loops and threads are not this process's
    _sleepers = 0


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forked)


def rung() -> int:
    """How many times the bell has rung in this process (pass it to a later wait)."""
    return _count


def ring(claim_id: str) -> None:
    """Wake the waiters of this process for the release of ``claim_id`` (any thread)."""
    global _count
    # The common case, on every release, takes no lock: no one waits in this process.
    # The append is atomic; an increment racing another may count one ring for two,
    # which still moves the count (a waiter for given IDs may then sleep its pause out:
    # later, never wrong). A waiter registers under the lock and then checks the count,
    # so if the reads below saw no waiter, that waiter's check sees this ring.
    _released.append(claim_id)
    _count += 1
    if not _sleepers and not _futures:
        return
    with _lock:
        _changed.notify_all()
        woken = [(f, loop) for f, (loop, since, ids) in _futures.items() if _news(since, ids)]
        for future, _ in woken:
            del _futures[future]
    for future, loop in woken:
        with contextlib.suppress(RuntimeError):  # its loop is closed: no one waits there
            loop.call_soon_threadsafe(_wake, future)


def _news(since: int, ids: Collection[str] | None) -> bool:
    """Whether the rings past ``since`` released every one of ``ids`` (None: any claim at
    all); under ``_lock``."""
    rang = _count - since
    if rang <= 0:
        return False
    if ids is None or rang > len(_released):
        return True  # some of the rings are forgotten: maybe
    released = {_released[-1 - back] for back in range(rang)}
    return all(claim_id in released for claim_id in ids)


def _wake(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


def listen(since: int | None, seconds: float, ids: Collection[str] | None = None) -> bool:
    """Sleep ``seconds``, or less once the bell has rung past ``since`` for every one of
    ``ids`` (None: for any release); whether it did. ``since`` None: just sleep."""
    global _sleepers
    if since is None:
        time.sleep(max(0.0, seconds))
        return False
    with _lock:
        _sleepers += 1
        try:
            return _changed.wait_for(lambda: _news(since, ids), max(0.0, seconds))
        finally:
            _sleepers -= 1


async def alisten(since: int | None, seconds: float, ids: Collection[str] | None = None) -> bool:
    """:func:`listen` for asyncio: the loop runs on while it waits."""
    if since is None:
        await asyncio.sleep(max(0.0, seconds))
        return False
    loop = asyncio.get_running_loop()
    future: asyncio.Future[None] = loop.create_future()
    with _lock:
        # Registered before the check: a ring that then saw no waiter (it takes no lock
        # when none waits) came before the check, which sees it.
        _futures[future] = (loop, since, ids)
        if _news(since, ids):
            del _futures[future]
            return True
    try:
        await asyncio.wait((future,), timeout=max(0.0, seconds))
    finally:
        with _lock:
            _futures.pop(future, None)
    return future.done()
