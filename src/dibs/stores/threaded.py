"""An async face for any sync store: its calls run where they cannot block the loop.

memory:// never waits on I/O (its locks are held for microseconds), so its calls
run inline on the loop. Every other sync store (SQLite, plug-ins) runs its calls
on worker threads that belong to this async store, fed by the loop through a
queue; finished calls go back to the loop a batch per wake-up. Four workers
(``threads=`` sets it): ``benchmarks/bench_aio_sqlite.py`` measured the choices
(docs/async.md).

Cancellation: a call still queued for a worker when its await is cancelled never
runs; a call a worker already started runs to its end on that thread (a sync
call cannot be interrupted), so no connection is ever left mid-transaction, and
a claim it made is recorded: a retry with the same request ID replays it.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import functools
import logging
import threading
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any, Self, TypeVar

from dibs._model import Claim, ClaimResult, Span, SweepResult, Target, Unit, check_retention
from dibs._request import ClaimRequest
from dibs.exceptions import InvalidInput, StoreClosed
from dibs.stores.base import DEFAULT_REQUEST_RETENTION, Store, _logger_name
from dibs.stores.base_async import AsyncStore

if TYPE_CHECKING:
    from dibs.stores.capabilities import ChangeFeed

__all__ = ["DEFAULT_THREADS", "ThreadedStore"]

_T = TypeVar("_T")
_Call = tuple["asyncio.Future[Any]", Callable[..., Any], tuple[Any, ...]]

DEFAULT_THREADS = 4
"""Worker threads per async store over a blocking sync store (``threads=`` overrides):
on SQLite, 4 workers beat 1 and 2, a ``ThreadPoolExecutor`` and ``asyncio.to_thread``
(benchmarks/bench_aio_sqlite.py, docs/benchmarks.md)."""


class _Workers:
    """Worker threads fed by the loop: calls wait in a queue, results go back in batches.

    Each finished call is handed back to the loop, but the loop is woken once per
    batch of them (``call_soon_threadsafe`` only when the batch was empty), not once
    per call: with many tasks claiming, a claim costs less CPU than through
    ``run_in_executor`` (benchmarks/bench_aio_sqlite.py).
    """

    def __init__(self, loop: asyncio.AbstractEventLoop, threads: int, name: str) -> None:
        self._loop = loop
        self._lock = threading.Lock()  # guards _calls, _done and _closing
        self._ready = threading.Condition(self._lock)
        self._calls: collections.deque[_Call] = collections.deque()
        self._done: list[tuple[asyncio.Future[Any], Any, BaseException | None]] = []
        self._closing = False
        # Daemons: a store nobody closed must not keep the interpreter from exiting (an
        # unfinished SQLite transaction is rolled back by SQLite when the process ends).
        self._threads = [
            threading.Thread(target=self._work, name=f"{name}-{i}", daemon=True)
            for i in range(threads)
        ]
        for thread in self._threads:
            thread.start()

    def submit(self, fn: Callable[..., _T], args: tuple[Any, ...]) -> asyncio.Future[_T]:
        """Queue ``fn(*args)``; its future, on the loop. Raises StoreClosed once closing."""
        future: asyncio.Future[_T] = self._loop.create_future()
        with self._lock:
            if self._closing:
                raise StoreClosed("this async store is closed")
            self._calls.append((future, fn, args))
            self._ready.notify()
        return future

    def _work(self) -> None:
        while True:
            with self._lock:
                while not self._calls:
                    if self._closing:
                        return
                    self._ready.wait()
                future, fn, args = self._calls.popleft()
            # Cancelled while queued: it never runs. A cancel that comes after this check
            # lets the call run to its end; its outcome is recorded, and a retry with the
            # same request ID learns it.
            if future.cancelled():
                continue
            value: Any = None
            error: BaseException | None = None
            try:
                value = fn(*args)
            except BaseException as exc:  # handed to the awaiting task
                error = exc
            with self._lock:
                self._done.append((future, value, error))
                wake = len(self._done) == 1
            if wake:
                with contextlib.suppress(RuntimeError):  # the loop is closed: nobody awaits
                    self._loop.call_soon_threadsafe(self._hand_back)

    def _hand_back(self) -> None:
        with self._lock:
            done, self._done = self._done, []
        for future, value, error in done:
            if future.cancelled():
                continue
            if error is None:
                future.set_result(value)
            else:
                future.set_exception(error)

    def close(self) -> None:
        """Let every queued call run, then stop the threads; blocks, so call it off the loop."""
        with self._lock:
            self._closing = True
            self._ready.notify_all()
        for thread in self._threads:
            thread.join()


class ThreadedStore(AsyncStore):
    """:class:`AsyncStore` over a sync :class:`~dibs.Store`, its calls on worker threads.

    memory:// runs inline on the loop instead (pure CPU, microseconds per call).
    :meth:`close` lets the calls already handed to a worker finish, then closes
    the sync store and joins the workers, without blocking the loop.
    """

    scheme = "threaded"

    def __init__(
        self,
        url: str | None,
        options: dict[str, Any],
        *,
        threads: int | None = None,
        store: Store | None = None,
    ) -> None:
        from dibs.stores import store_class  # noqa: PLC0415 (dibs.stores imports dibs.aio lazily)

        if store is None:
            assert url is not None
            cls = store_class(url)
        else:
            cls = type(store)
        self.scheme = cls.scheme  # type: ignore[misc]  # per instance: the wrapped store's
        self.shared_holds = cls.shared_holds  # type: ignore[misc]
        super().__init__()
        self._logger = logging.getLogger(_logger_name(cls))  # the sync face's logger
        if threads is None:
            threads = DEFAULT_THREADS
        if isinstance(threads, bool) or not isinstance(threads, int) or threads < 1:
            raise InvalidInput(
                f"threads must be a positive integer, got {threads!r}",
                field="threads",
                value=threads,
            )
        self._url = url
        self._options = options
        self._class = cls
        self._inline = cls.in_process and cls.local_clock
        # A subclass that overrides a backend step (a test's gated store) keeps its
        # override on every call: the direct calls below are for this class's steps.
        mine = type(self)
        self._direct = self._inline and all(
            getattr(mine, step) is getattr(ThreadedStore, step)
            for step in ("_claim", "_confirm", "_extend", "_release", "_holder_of", "_claims_of")
        )
        self._threads = threads
        self._workers: _Workers | None = None
        self._opening_sync: asyncio.Future[Store] | None = None
        self._given = store is not None
        self.sync: Store | None = store
        """The sync store behind this one, once opened (or as given: see :meth:`over`)."""

    @property
    def request_retention(self) -> float:
        """Seconds a request ID is remembered: the sync store's ``request_retention``.

        Before the store is open (and after it is closed), the option it was
        given, as the sync store will read it. ``@dibs.idempotent`` keeps its
        results this long.
        """
        if self.sync is not None:
            return self.sync.request_retention
        return check_retention(self._options.get("request_retention", DEFAULT_REQUEST_RETENTION))

    @classmethod
    def over(cls, store: Store, *, threads: int | None = None) -> Self:
        """The async face of a sync store that is already open, which its owner closes.

        :meth:`close` stops the face's workers (after the calls they accepted)
        and leaves ``store`` open; once the owner closes ``store``, calls raise
        :class:`~dibs.StoreClosed`, as the store's own do.
        """
        return cls(None, {}, threads=threads, store=store)

    @classmethod
    def from_url(cls, url: str, **options: Any) -> Self:
        """Wrap the sync store for ``url``; it is opened (on a worker) by :meth:`open`.

        ``threads=`` sets the worker threads (default :data:`DEFAULT_THREADS`;
        memory:// runs inline); every other option goes to the sync store's
        ``from_url``.
        """
        threads = options.pop("threads", None)
        return cls(url, options, threads=threads)

    async def _run(self, fn: Callable[..., _T], *args: Any) -> _T:
        if self._inline:
            return fn(*args)
        workers = self._workers
        if workers is None:
            raise StoreClosed(f"this {type(self).__name__} is closed")
        return await workers.submit(fn, args)

    def _move_to(self, loop: asyncio.AbstractEventLoop) -> bool:
        """New workers for ``loop``; the old loop's (idle: it is closed) stop off the loop."""
        old, self._workers = self._workers, None
        if old is not None:
            self._workers = _Workers(loop, self._threads, f"dibs-{self.scheme}")
            threading.Thread(target=old.close, name=f"dibs-{self.scheme}-close").start()
        return True

    def _shut(self) -> bool:
        sync = self.sync
        return self._closed or (sync is not None and sync.closed)

    def _store(self) -> Store:
        store = self.sync
        if store is None or store.closed:  # closed by us meanwhile, or by its owner
            raise StoreClosed(f"this {type(self).__name__} is closed")
        return store

    async def _open(self) -> None:
        from dibs.stores import open_store  # noqa: PLC0415

        if self._workers is None and not self._inline:
            loop = asyncio.get_running_loop()
            self._workers = _Workers(loop, self._threads, f"dibs-{self.scheme}")
        if self._given:
            return
        opener = functools.partial(open_store, self._url, **self._options)
        if self._inline:
            self.sync = opener()
            return
        assert self._workers is not None
        if self._opening_sync is None:
            # Shielded: a cancelled open goes on on its worker, and the next await adopts
            # the store it opens instead of opening (and leaking) a second one.
            self._opening_sync = self._workers.submit(opener, ())
            self._opening_sync.add_done_callback(self._adopt)
        store = await asyncio.shield(self._opening_sync)
        if self.sync is None and not self._closed:
            # A retry that finds the open already done resumes before _adopt's callback
            # has run (callbacks are scheduled, not immediate): take the store here.
            self.sync = store

    def _adopt(self, future: asyncio.Future[Store]) -> None:
        """Take the sync store as soon as it is open, whoever still awaits it.

        So close() closes it even when the await that opened it was cancelled, and
        it is closed at once when close() came while it was opening.
        """
        if future.cancelled() or future.exception() is not None:
            # The next await opens afresh, on new workers; these are not needed meanwhile.
            self._opening_sync = None
            workers, self._workers = self._workers, None
            self._close_off_loop(workers, None)
            return
        store = future.result()
        if self._closed:
            workers, self._workers = self._workers, None
            self._close_off_loop(workers, store)
            return
        self.sync = store
        self._opened = True

    def _close_off_loop(
        self, workers: _Workers | None, store: Store | None
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
                if workers is not None:
                    workers.close()
                if store is not None:
                    store.close()
            except BaseException as exc:  # handed to the awaiting task
                error = exc
            with contextlib.suppress(RuntimeError):  # the loop closed meanwhile
                loop.call_soon_threadsafe(_settle, done, error)

        threading.Thread(target=finish, name=f"dibs-{self.scheme}-close").start()
        return done

    # memory:// (inline): once open, the public calls go straight to the sync store's
    # public ones, which check their input and raise exactly as the general path
    # does (the same functions), and take memory's inline paths for the common
    # well-formed call. Through AsyncStore's checks and the general ``_``-steps a
    # dibs.aio.Lot park+remove on memory:// cost about three times the sync one
    # (benchmarks/bench_aio_lot.py, docs/benchmarks.md).

    def _inline_store(self) -> Store | None:
        """The sync store, when calls may go to its public methods directly; else None."""
        if self._direct and self._opened and not self._closed:
            return self.sync
        return None

    async def claim(
        self,
        targets: Target | Iterable[Target],
        *,
        holder: str,
        request_id: str | None = None,
        ttl: float | None = None,
        mode: str = "exclusive",
    ) -> ClaimResult:
        """Claim every target or none, atomically, and answer who won: :meth:`dibs.Store.claim`."""
        store = self._inline_store()
        if store is not None:
            return store.claim(targets, holder=holder, request_id=request_id, ttl=ttl, mode=mode)
        return await super().claim(
            targets, holder=holder, request_id=request_id, ttl=ttl, mode=mode
        )

    async def confirm(self, claim_id: str, *, holder: str, fence: int) -> Claim:
        """Turn a live hold into a confirmed claim: :meth:`dibs.Store.confirm`."""
        store = self._inline_store()
        if store is not None:
            return store.confirm(claim_id, holder=holder, fence=fence)
        return await super().confirm(claim_id, holder=holder, fence=fence)

    async def extend(self, claim_id: str, *, holder: str, fence: int, ttl: float) -> Claim:
        """Push a live hold's expiry to ``ttl`` seconds from now: :meth:`dibs.Store.extend`."""
        store = self._inline_store()
        if store is not None:
            return store.extend(claim_id, holder=holder, fence=fence, ttl=ttl)
        return await super().extend(claim_id, holder=holder, fence=fence, ttl=ttl)

    async def release(self, claim_id: str, *, holder: str, fence: int) -> bool:
        """Give up a live hold or confirmed claim: :meth:`dibs.Store.release`."""
        store = self._inline_store()
        if store is not None:
            return store.release(claim_id, holder=holder, fence=fence)
        return await super().release(claim_id, holder=holder, fence=fence)

    async def holder_of(self, target: Unit | Span) -> str | None:
        """Who holds this unit or an overlapping span now: :meth:`dibs.Store.holder_of`."""
        store = self._inline_store()
        if store is not None:
            return store.holder_of(target)
        return await super().holder_of(target)

    async def claims_of(self, holder: str) -> list[Claim]:
        """The holder's live claims, a snapshot: :meth:`dibs.Store.claims_of`."""
        store = self._inline_store()
        if store is not None:
            return store.claims_of(holder)
        return await super().claims_of(holder)

    async def _claim_checked(self, units: tuple[Unit, ...], holder: str) -> ClaimResult:
        """Claim units a pattern built from checked names: :meth:`dibs.Store._claim_checked`."""
        store = self._inline_store()
        if store is not None:
            return store._claim_checked(units, holder)
        return await super()._claim_checked(units, holder)

    async def _claim(self, request: ClaimRequest) -> ClaimResult:
        return await self._run(self._store()._claim, request)

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

    def change_feed(self) -> _ThreadedFeed | None:
        """The sync store's :meth:`~dibs.Store.change_feed`, read where its calls run.

        Inline for memory:// (its feed never moves), on this store's workers
        otherwise (SQLite's ``PRAGMA data_version`` on a connection of its own).
        None when the store class offers no feed.
        """
        if self._class.change_feed is Store.change_feed:
            return None
        return _ThreadedFeed(self)

    async def _close(self) -> None:
        if self._given:  # its owner closes it
            store = None
        else:
            store, self.sync = self.sync, None
        workers, self._workers = self._workers, None
        if self._inline:
            if store is not None:
                store.close()
        elif workers is not None or store is not None:
            await asyncio.shield(self._close_off_loop(workers, store))


class _ThreadedFeed:
    """:class:`~dibs.stores.capabilities.AsyncChangeFeed` over a sync store's feed.

    The sync feed is made on the first read (opening the store if needed) and
    read where the store's calls run. A store whose ``change_feed()`` answers
    None after all reads as "maybe changed" every time.
    """

    def __init__(self, store: ThreadedStore) -> None:
        self._store = store
        self._making: asyncio.Future[ChangeFeed | None] | None = None
        self._closed = False

    async def read(self) -> object:
        """The sync feed's token, or a fresh ``object()``; raises StoreClosed once the store
        or this feed is closed (a read after close must not open a new sync feed)."""
        if self._closed:
            raise StoreClosed("this change feed is closed")
        store = self._store
        store._check_open()
        try:
            await store._ready()
            if self._making is None:
                # One feed for all reads, however many start together (it holds a connection).
                self._making = asyncio.ensure_future(store._run(store._store().change_feed))
            feed = await asyncio.shield(self._making)
            return object() if feed is None else await store._run(feed.read)
        except StoreClosed:
            raise
        except Exception:  # a transient failure: "maybe changed", as the protocol says
            if self._made() is None and self._making is not None and self._making.done():
                self._making = None  # making it failed: try again on the next read
            if store._shut():
                raise StoreClosed(f"this {type(store).__name__} is closed") from None
            return object()

    def _made(self) -> ChangeFeed | None:
        making = self._making
        if making is None or not making.done() or making.cancelled() or making.exception():
            return None
        return making.result()

    async def close(self) -> None:
        """Close the sync feed (its connection), on the workers while they run.

        A feed still being made (a first read in flight) is waited for and closed
        too: left to finish on its own, its connection would never be closed.
        """
        self._closed = True
        making, self._making = self._making, None
        if making is not None and not making.done():
            with contextlib.suppress(Exception):
                await asyncio.shield(making)
        feed = None
        if making is not None and making.done() and not making.cancelled():
            feed = None if making.exception() else making.result()
        if feed is None:
            return
        try:
            await self._store._run(feed.close)
        except StoreClosed:  # the workers are gone: closing a connection does not wait
            feed.close()


def _settle(future: asyncio.Future[None], error: BaseException | None) -> None:
    if not future.done():
        if error is None:
            future.set_result(None)
        else:
            future.set_exception(error)
