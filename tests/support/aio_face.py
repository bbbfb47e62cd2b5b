"""A sync face over a :class:`dibs.aio.AsyncStore`, so the sync contract suite runs on it.

The contract suite (:class:`dibs.testing.StoreContract`) and the state machine
are written once, against the sync :class:`~dibs.Store` API. :class:`SyncFace`
gives an async store that API: every call becomes one coroutine run on a
private event loop in a background thread (``asyncio.run_coroutine_threadsafe``)
and waited for, so the rules are checked on the async face without being
written twice. The contract's race tests call from many threads at once; their
coroutines then interleave on the one loop, as an asyncio application's tasks do.

All faces share one loop thread: an async store belongs to the loop it first
awaited on, and a closed store must still answer ``StoreClosed`` (so the loop
outlives ``close``).
"""

from __future__ import annotations

import asyncio
import atexit
import threading
from collections.abc import Coroutine
from datetime import datetime
from typing import Any, TypeVar

import dibs.aio
from dibs import Claim, ClaimResult, Clock, SweepResult
from dibs.aio import AsyncStore
from dibs.stores.base import DEFAULT_REQUEST_RETENTION

__all__ = ["SyncFace", "open_face"]

_T = TypeVar("_T")

_loop: asyncio.AbstractEventLoop | None = None
_loop_lock = threading.Lock()  # guards _loop


def _shared_loop() -> asyncio.AbstractEventLoop:
    global _loop
    with _loop_lock:
        if _loop is None:
            loop = asyncio.new_event_loop()
            thread = threading.Thread(target=loop.run_forever, name="aio-face", daemon=True)
            thread.start()

            def stop() -> None:
                loop.call_soon_threadsafe(loop.stop)
                thread.join(timeout=10)
                loop.close()

            atexit.register(stop)
            _loop = loop
        return _loop


class SyncFace:
    """The sync Store API over an async store; each call is one coroutine on the shared loop."""

    def __init__(self, store: AsyncStore, *, clock: Clock | None, request_retention: float) -> None:
        self.aio = store
        self.clock = clock
        """The clock the async store was opened with (the contract moves it)."""
        self.request_retention = request_retention
        """The retention the async store was opened with."""
        self.shared_holds = store.shared_holds
        """Whether the async store takes ``mode="shared"`` claims."""

    def _run(self, coroutine: Coroutine[Any, Any, _T]) -> _T:
        return asyncio.run_coroutine_threadsafe(coroutine, _shared_loop()).result()

    def claim(self, *args: Any, **kwargs: Any) -> ClaimResult:
        return self._run(self.aio.claim(*args, **kwargs))

    def confirm(self, *args: Any, **kwargs: Any) -> Claim:
        return self._run(self.aio.confirm(*args, **kwargs))

    def extend(self, *args: Any, **kwargs: Any) -> Claim:
        return self._run(self.aio.extend(*args, **kwargs))

    def release(self, *args: Any, **kwargs: Any) -> bool:
        return self._run(self.aio.release(*args, **kwargs))

    def get(self, *args: Any, **kwargs: Any) -> Claim | None:
        return self._run(self.aio.get(*args, **kwargs))

    def holder_of(self, *args: Any, **kwargs: Any) -> str | None:
        return self._run(self.aio.holder_of(*args, **kwargs))

    def claims_of(self, *args: Any, **kwargs: Any) -> list[Claim]:
        return self._run(self.aio.claims_of(*args, **kwargs))

    def sweep(self) -> SweepResult:
        return self._run(self.aio.sweep())

    def now(self) -> datetime:
        return self._run(self.aio.now())

    def open(self) -> SyncFace:
        self._run(self.aio.open())
        return self

    def close(self) -> None:
        self._run(self.aio.close())

    @property
    def closed(self) -> bool:
        return self.aio.closed

    def __enter__(self) -> SyncFace:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"SyncFace({self.aio!r})"


def open_face(url: str, *, clock: Clock | None = None, **options: Any) -> SyncFace:
    """``dibs.aio.open(url, ...)`` behind the sync API, opened now (like :func:`dibs.open`)."""
    retention = options.get("request_retention", DEFAULT_REQUEST_RETENTION)
    face = SyncFace(
        dibs.aio.open(url, clock=clock, **options), clock=clock, request_retention=retention
    )
    return face.open()
