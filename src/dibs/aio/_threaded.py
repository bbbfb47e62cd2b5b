"""An async face for any sync store: its calls run where they cannot block the loop.

memory:// never waits on I/O (its locks are held for microseconds), so its calls
run inline on the loop. Every other sync store (SQLite, plug-ins) runs its
calls on worker threads that belong to this async store; cancelling an await
leaves a call that already started to finish on its thread, so its outcome is
recorded and a retry with the same request ID learns it.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Self, TypeVar

from dibs._model import Claim, ClaimResult, Span, SweepResult, Target, Unit
from dibs.aio._store import AsyncStore
from dibs.stores.base import Store

__all__ = ["ThreadedStore"]

_T = TypeVar("_T")

DEFAULT_THREADS = 4
"""Worker threads per async store over a blocking sync store."""


class ThreadedStore(AsyncStore):
    """:class:`AsyncStore` over a sync :class:`~dibs.Store`, opened on a worker thread."""

    scheme = "threaded"

    def __init__(
        self, url: str, options: dict[str, Any], *, threads: int = DEFAULT_THREADS
    ) -> None:
        from dibs.stores import store_class  # noqa: PLC0415 (dibs.stores imports dibs.aio lazily)

        cls = store_class(url)
        self.scheme = cls.scheme  # type: ignore[misc]  # per instance: the wrapped store's
        super().__init__()
        self._url = url
        self._options = options
        self._inline = cls.in_process and cls.local_clock
        self._threads = threads
        self._executor: ThreadPoolExecutor | None = None
        self.sync: Store | None = None
        """The sync store behind this one, once opened."""

    @classmethod
    def from_url(cls, url: str, **options: Any) -> Self:
        """Wrap the sync store for ``url``; it is opened (on a thread) by :meth:`open`."""
        threads = options.pop("threads", DEFAULT_THREADS)
        return cls(url, options, threads=threads)

    async def _run(self, fn: Callable[..., _T], *args: Any) -> _T:
        if self._inline:
            return fn(*args)
        assert self._executor is not None
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, functools.partial(fn, *args))

    def _store(self) -> Store:
        assert self.sync is not None
        return self.sync

    async def _open(self) -> None:
        from dibs.stores import open_store  # noqa: PLC0415

        if not self._inline:
            self._executor = ThreadPoolExecutor(
                self._threads, thread_name_prefix=f"dibs-{self.scheme}"
            )
        self.sync = await self._run(functools.partial(open_store, self._url, **self._options))

    async def _claim(
        self, targets: tuple[Target, ...], holder: str, request_id: str | None, ttl: float | None
    ) -> ClaimResult:
        return await self._run(self._store()._claim, targets, holder, request_id, ttl)

    async def _confirm(self, claim_id: str, holder: str, fence: int) -> Claim:
        return await self._run(self._store()._confirm, claim_id, holder, fence)

    async def _extend(self, claim_id: str, holder: str, fence: int, ttl: float) -> Claim:
        return await self._run(self._store()._extend, claim_id, holder, fence, ttl)

    async def _release(self, claim_id: str, holder: str, fence: int) -> bool:
        return await self._run(self._store()._release, claim_id, holder, fence)

    async def _get(self, claim_id: str) -> Claim | None:
        return await self._run(self._store()._get, claim_id)

    async def _holder_of(self, target: Unit | Span) -> str | None:
        return await self._run(self._store()._holder_of, target)

    async def _claims_of(self, holder: str) -> list[Claim]:
        return await self._run(self._store()._claims_of, holder)

    async def _sweep(self) -> SweepResult:
        return await self._run(self._store()._sweep)

    async def _now(self) -> float:
        return await self._run(self._store()._now)

    async def _close(self) -> None:
        store = self.sync
        if store is not None:
            await self._run(store.close)
        if self._executor is not None:
            self._executor.shutdown(wait=False)
