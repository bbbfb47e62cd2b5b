"""The service's two faces of its store: async for the claim path, sync for the rest.

The claim path (``/v1/claims``, ``/v1/resources``, ``/readyz`` and the
sweeper) awaits an :class:`~dibs.aio.AsyncStore`, so that on a store with a
native async twin (PostgreSQL) a request makes no thread hop at all. What the
async face does not offer (the change feed and reads behind the live seat
maps, the lot and match patterns) runs on the sync :class:`~dibs.Store` in
worker threads. Which store is behind each face:

- a store class with a native async twin (:attr:`dibs.Store.async_store`):
  two stores opened from the same URL, the twin for the claim path and the
  sync store for the rest (same database, so both see every claim);
- any other store (memory://, SQLite, plug-ins): one store, the sync one,
  behind :class:`SharedFace`. memory:// must be one store (a second open would
  be a second, empty world); for SQLite one store keeps one connection set and
  one group-commit queue. Its calls run inline on the loop when the store is
  in-process (memory://, pure CPU) and on the face's worker threads otherwise.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Self, TypeVar

import dibs.aio
from dibs._model import Claim, ClaimResult, Span, SweepResult, Target, Unit
from dibs.aio import AsyncStore, ThreadedStore
from dibs.exceptions import StoreClosed
from dibs.stores.base import Store

__all__ = ["SharedFace", "async_face"]

_T = TypeVar("_T")


def async_face(store: Store, url: str | None, *, threads: int) -> AsyncStore:
    """The async store for the claim path beside the sync ``store``.

    With a ``url`` (the store the service opened itself) and a store class with
    a native async twin, the twin opened from the same URL; otherwise the sync
    store itself behind a :class:`SharedFace`. Does no I/O: an async store opens
    on the first await, on the serving loop.
    """
    if url is not None:
        native = dibs.aio.open(url)
        if not isinstance(native, ThreadedStore):
            return native
    return SharedFace(store, threads=threads)


class SharedFace(AsyncStore):
    """:class:`~dibs.aio.AsyncStore` over a sync store someone else opened and closes.

    Like :class:`~dibs.aio.ThreadedStore`, but over a given store rather than
    one it opens from a URL: :meth:`close` stops its worker threads and leaves
    the store open for its owner. Calls on a store closed by its owner raise
    :class:`~dibs.StoreClosed`, as the store's own methods do.
    """

    scheme = "shared"

    def __init__(self, store: Store, *, threads: int) -> None:
        self.scheme = store.scheme  # type: ignore[misc]  # per instance: the wrapped store's
        super().__init__()
        self.sync = store
        """The sync store behind this face."""
        # memory:// never waits on I/O: inline on the loop is cheaper than any hop.
        self._inline = store.in_process and store.local_clock
        self._threads = threads
        self._executor: ThreadPoolExecutor | None = None

    @classmethod
    def from_url(cls, url: str, **options: Any) -> Self:
        """Not for URLs: :func:`dibs.aio.open` makes a store from a URL."""
        raise TypeError("a SharedFace wraps an open store: SharedFace(store, threads=n)")

    async def _run(self, fn: Callable[..., _T], *args: Any) -> _T:
        if self.sync.closed:
            raise StoreClosed(f"this {type(self.sync).__name__} is closed")
        if self._inline:
            return fn(*args)
        executor = self._executor
        if executor is None:
            raise StoreClosed(f"this {type(self).__name__} is closed")
        # A cancelled await cancels a call still queued (it never runs); one a worker
        # started runs to its end, so its claim is recorded for a retry to learn.
        return await asyncio.wrap_future(executor.submit(fn, *args))

    async def _open(self) -> None:
        if not self._inline:
            self._executor = ThreadPoolExecutor(
                self._threads, thread_name_prefix=f"dibs-service-{self.scheme}"
            )

    async def _claim(
        self, targets: tuple[Target, ...], holder: str, request_id: str | None, ttl: float | None
    ) -> ClaimResult:
        return await self._run(self.sync._claim, targets, holder, request_id, ttl)

    async def _confirm(self, claim_id: str, holder: str, fence: int) -> Claim:
        return await self._run(self.sync._confirm, claim_id, holder, fence)

    async def _extend(self, claim_id: str, holder: str, fence: int, ttl: float) -> Claim:
        return await self._run(self.sync._extend, claim_id, holder, fence, ttl)

    async def _release(self, claim_id: str, holder: str, fence: int) -> bool:
        return await self._run(self.sync._release, claim_id, holder, fence)

    async def _get(self, claim_id: str) -> Claim | None:
        return await self._run(self.sync._get, claim_id)

    async def _holder_of(self, target: Unit | Span) -> str | None:
        return await self._run(self.sync._holder_of, target)

    async def _claims_of(self, holder: str) -> list[Claim]:
        return await self._run(self.sync._claims_of, holder)

    async def _sweep(self) -> SweepResult:
        return await self._run(self.sync._sweep)

    async def _now(self) -> float:
        return await self._run(self.sync._now)

    async def _close(self) -> None:
        executor, self._executor = self._executor, None
        if executor is not None:
            # Calls already on a worker finish there (a sync call cannot be cut off);
            # wait for them off the loop, so the owner closes the store after them.
            loop = asyncio.get_running_loop()
            await loop.run_in_executor(None, functools.partial(executor.shutdown, wait=True))
