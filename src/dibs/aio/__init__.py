"""dibs for asyncio: the store's contract as coroutines.

>>> import asyncio, dibs, dibs.aio
>>> async def main() -> bool:
...     async with dibs.aio.open("memory://") as store:
...         result = await store.claim(dibs.Unit("show-1", "A1"), holder="alice", ttl=60.0)
...         return result.granted
>>> asyncio.run(main())
True

:func:`open` returns an :class:`AsyncStore` with the sync store's methods,
arguments, results and errors. PostgreSQL runs natively on psycopg's async
pool; memory:// runs inline; SQLite and plug-in stores run on the store's own
worker threads, so the event loop never blocks. See docs/async.md.
"""

from __future__ import annotations

import importlib
from typing import Any

from dibs.aio import booking
from dibs.aio.lot import Lot
from dibs.aio.matching import match
from dibs.aio.ratelimit import RateLimit
from dibs.aio.renewal import renew
from dibs.aio.waitlist import Waitlist
from dibs.semaphore import AsyncSemaphore as Semaphore
from dibs.singleflight import AsyncSingleFlight
from dibs.stores.base_async import AsyncStore
from dibs.stores.threaded import ThreadedStore

__all__ = [
    "AsyncSingleFlight",
    "AsyncStore",
    "Lot",
    "RateLimit",
    "Semaphore",
    "ThreadedStore",
    "Waitlist",
    "booking",
    "match",
    "open",
    "renew",
]


def open(url: str | None = None, **options: Any) -> AsyncStore:
    """The async store named by ``url`` (default ``$DIBS_URL``, else ``sqlite:///dibs.db``).

    Returns at once, without I/O: the store opens on the first ``await`` of it,
    of ``async with``, or of any of its methods. Takes the options
    :func:`dibs.open` takes. A store class that names a native async twin in
    :attr:`dibs.Store.async_store` gets it; any other store runs on worker
    threads (:class:`ThreadedStore`, which also takes ``threads=``). Raises
    :class:`~dibs.UnknownScheme` and :class:`~dibs.InvalidInput` for a
    malformed URL at once (and, for a native store such as PostgreSQL's, a
    bad option); what only opening can tell (:class:`~dibs.StoreMisconfigured`,
    :class:`~dibs.StoreUnavailable`, a threaded store's bad option) is raised
    by the first ``await``. The store belongs to the event loop it is first
    used on; close it there (``async with`` does).
    """
    from dibs.stores import default_url, store_class  # noqa: PLC0415

    if url is None:
        url = default_url()
    cls = store_class(url)
    if cls.async_store is not None:
        module_name, _, class_name = cls.async_store.partition(":")
        native: type[AsyncStore] = getattr(importlib.import_module(module_name), class_name)
        return native.from_url(url, **options)
    return ThreadedStore.from_url(url, **options)
