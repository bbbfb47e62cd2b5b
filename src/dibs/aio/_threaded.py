"""An async face for any sync store: its calls run where they cannot block the loop.

memory:// never waits on I/O (its locks are held for microseconds), so its calls
run inline on the loop. Every other sync store (SQLite, plug-ins) runs its
calls on a small pool of worker threads that belongs to this async store
(``threads=``, default :data:`DEFAULT_THREADS`; ``benchmarks/bench_aio_sqlite.py``
measured the choices, see docs/async.md).

Cancellation: a call still queued for a worker when its await is cancelled never
runs; a call a worker already started runs to its end on that thread (a sync
call cannot be interrupted), so no connection is ever left mid-transaction, and
a claim it made is recorded: a retry with the same request ID replays it.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Self, TypeVar

from dibs._model import Claim, ClaimResult, Span, SweepResult, Target, Unit
from dibs.aio._store import AsyncStore
from dibs.exceptions import InvalidInput, StoreClosed
from dibs.stores.base import Store

__all__ = ["DEFAULT_THREADS", "ThreadedStore"]

_T = TypeVar("_T")

DEFAULT_THREADS = 4
"""Worker threads per async store over a blocking sync store."""


class ThreadedStore(AsyncStore):
    """:class:`AsyncStore` over a sync :class:`~dibs.Store`, its calls on worker threads.

    memory:// runs inline on the loop instead (pure CPU, microseconds per call).
    :meth:`close` lets the calls already handed to a worker finish, then closes
    the sync store and joins the workers, without blocking the loop.
    """

    scheme = "threaded"

    def __init__(
        self, url: str, options: dict[str, Any], *, threads: int = DEFAULT_THREADS
    ) -> None:
        from dibs.stores import store_class  # noqa: PLC0415 (dibs.stores imports dibs.aio lazily)

        cls = store_class(url)
        self.scheme = cls.scheme  # type: ignore[misc]  # per instance: the wrapped store's
        super().__init__()
        if isinstance(threads, bool) or not isinstance(threads, int) or threads < 1:
            raise InvalidInput(
                f"threads must be a positive integer, got {threads!r}",
                field="threads",
                value=threads,
            )
        self._url = url
        self._options = options
        self._inline = cls.in_process and cls.local_clock
        self._threads = threads
        self._executor: ThreadPoolExecutor | None = None
        self._opening_sync: asyncio.Future[Store] | None = None
        self.sync: Store | None = None
        """The sync store behind this one, once opened."""

    @classmethod
    def from_url(cls, url: str, **options: Any) -> Self:
        """Wrap the sync store for ``url``; it is opened (on a worker) by :meth:`open`.

        ``threads=`` sets the worker threads (ignored by memory://, which runs
        inline); every other option goes to the sync store's ``from_url``.
        """
        threads = options.pop("threads", DEFAULT_THREADS)
        return cls(url, options, threads=threads)

    async def _run(self, fn: Callable[..., _T], *args: Any) -> _T:
        if self._inline:
            return fn(*args)
        executor = self._executor
        if executor is None:
            raise StoreClosed(f"this {type(self).__name__} is closed")
        try:
            # A cancelled await cancels a call still queued (it never runs); one already
            # running ends on its worker, so no transaction is ever cut off.
            future = executor.submit(fn, *args)
        except RuntimeError as exc:  # shut down by close() between the check and the submit
            raise StoreClosed(f"this {type(self).__name__} is closed") from exc
        return await asyncio.wrap_future(future)

    def _store(self) -> Store:
        assert self.sync is not None
        return self.sync

    async def _open(self) -> None:
        from dibs.stores import open_store  # noqa: PLC0415

        opener = functools.partial(open_store, self._url, **self._options)
        if self._inline:
            self.sync = opener()
            return
        if self._executor is None:
            self._executor = ThreadPoolExecutor(
                self._threads, thread_name_prefix=f"dibs-{self.scheme}"
            )
        if self._opening_sync is None:
            # Shielded: a cancelled open goes on on its worker, and the next await adopts
            # the store it opens instead of opening (and leaking) a second one.
            self._opening_sync = asyncio.wrap_future(self._executor.submit(opener))
            self._opening_sync.add_done_callback(self._adopt)
        await asyncio.shield(self._opening_sync)

    def _adopt(self, future: asyncio.Future[Store]) -> None:
        """Take the sync store as soon as it is open, whoever still awaits it.

        So close() closes it even when the await that opened it was cancelled, and
        it is closed at once when close() came while it was opening.
        """
        if future.cancelled() or future.exception() is not None:
            # The next await opens afresh, on new workers; these are not needed meanwhile.
            self._opening_sync = None
            executor, self._executor = self._executor, None
            self._close_off_loop(executor, None)
            return
        store = future.result()
        if self._closed:
            executor, self._executor = self._executor, None
            self._close_off_loop(executor, store)
            return
        self.sync = store
        self._opened = True

    def _close_off_loop(
        self, executor: ThreadPoolExecutor | None, store: Store | None
    ) -> asyncio.Future[None]:
        """Let the calls already accepted finish, then close the store, on a thread of its own.

        Not on the loop's default pool: it may be busy, or gone at interpreter exit.
        """
        loop = asyncio.get_running_loop()
        done: asyncio.Future[None] = loop.create_future()
        # A close nobody awaits (after a cancelled open) must not log "never retrieved".
        done.add_done_callback(lambda f: f.cancelled() or f.exception())

        def finish() -> None:
            error: BaseException | None = None
            try:
                if executor is not None:
                    executor.shutdown(wait=True)
                if store is not None:
                    store.close()
            except BaseException as exc:  # handed to the awaiting task
                error = exc
            with contextlib.suppress(RuntimeError):  # the loop closed meanwhile
                loop.call_soon_threadsafe(_settle, done, error)

        threading.Thread(target=finish, name=f"dibs-{self.scheme}-close").start()
        return done

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
        store, self.sync = self.sync, None
        executor, self._executor = self._executor, None
        if self._inline:
            if store is not None:
                store.close()
        elif executor is not None or store is not None:
            await asyncio.shield(self._close_off_loop(executor, store))


def _settle(future: asyncio.Future[None], error: BaseException | None) -> None:
    if not future.done():
        if error is None:
            future.set_result(None)
        else:
            future.set_exception(error)
