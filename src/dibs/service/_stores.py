"""The service's one store: an :class:`~dibs.aio.AsyncStore`, for every call it makes.

Claims, lots, match, the seat maps (their reads and the change feed), the
claim-ID secret, ``/readyz`` and the sweeper all await one async store, so
that no request hops to a thread the service runs. Which store that is:

- a store the service opens from its URL: :func:`dibs.aio.open` of it; on
  PostgreSQL the native async store on psycopg's async pool (the one pool the
  service opens), on etcd the native store on its async HTTP client, on
  memory:// and SQLite a :class:`~dibs.aio.ThreadedStore` owning the sync store
  (memory:// inline on the loop, SQLite on the face's worker threads);
- a sync store the caller passes (``create_app(store=...)``): that store behind
  a :class:`SharedFace` (:meth:`dibs.aio.ThreadedStore.over`), wrapped once;
  the caller closes the store, the service only its face;
- an async store the caller passes: that store, as it is.
"""

from __future__ import annotations

from typing import Any, Self

import dibs.aio
from dibs.aio import AsyncStore, ThreadedStore
from dibs.stores import store_class
from dibs.stores.base import Store

__all__ = ["SharedFace", "open_async"]


def open_async(url: str, *, threads: int) -> AsyncStore:
    """The async store the service opens for ``url``; does no I/O (it opens on the first await).

    ``threads`` sizes the worker threads of a store without a native async
    twin (SQLite, plug-ins). Raises :class:`~dibs.UnknownScheme` and
    :class:`~dibs.InvalidInput` for a malformed URL.
    """
    if store_class(url).async_store is not None:
        return dibs.aio.open(url)
    return dibs.aio.open(url, threads=threads)


class SharedFace(ThreadedStore):
    """:class:`~dibs.aio.ThreadedStore` over a sync store someone else opened and closes.

    :meth:`close` stops its worker threads and leaves the store open for its
    owner. Calls on a store closed by its owner raise
    :class:`~dibs.StoreClosed`, as the store's own methods do.
    """

    def __init__(self, store: Store, *, threads: int) -> None:
        super().__init__(None, {}, threads=threads, store=store)

    @classmethod
    def from_url(cls, url: str, **options: Any) -> Self:
        """Not for URLs: :func:`dibs.aio.open` makes a store from a URL."""
        raise TypeError("a SharedFace wraps an open store: SharedFace(store, threads=n)")
