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
  behind :class:`SharedFace` (:meth:`dibs.aio.ThreadedStore.over`). memory://
  must be one store (a second open would be a second, empty world); for SQLite
  one store keeps one connection set and one group-commit queue. Its calls run
  inline on the loop when the store is in-process (memory://, pure CPU) and on
  the face's worker threads otherwise.
"""

from __future__ import annotations

from typing import Any, Self

import dibs.aio
from dibs.aio import AsyncStore, ThreadedStore
from dibs.stores.base import Store

__all__ = ["SharedFace", "async_face"]


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
