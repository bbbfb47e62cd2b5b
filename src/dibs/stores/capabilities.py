"""What a store may offer beyond the claim contract, each a small protocol.

A store offers a capability by returning an object from the matching
:class:`~dibs.Store` method; ``None`` is the answer "not supported", and the
caller degrades or refuses as its docs say:

==========================  ================================  ==================================
capability                  asked by                          without it
==========================  ================================  ==================================
:class:`JobTable`           :meth:`Store.job_table`           durable tasks refuse the store
:class:`ChangeFeed`         :meth:`Store.change_feed`         live views recompute on every poll
:class:`AsyncChangeFeed`    :meth:`AsyncStore.change_feed`    the same, on the async face
:class:`ClaimLog`           :meth:`Store.claim_log`           ``dibs verify`` skips the log replay
==========================  ================================  ==================================

Code outside :mod:`dibs.stores` asks for these and never tests a store's
scheme or reads its private attributes, so a store from another package gets
durable tasks, the live seat map and ``dibs verify`` by offering them.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from dibs._model import Claim
from dibs.exceptions import StoreClosed
from dibs.stores.jobs import Job, JobTable

__all__ = [
    "AsyncChangeFeed",
    "ChangeFeed",
    "ClaimLog",
    "ClaimReader",
    "Job",
    "JobTable",
    "UnchangingFeed",
]


class ChangeFeed(Protocol):
    """A cheap, blocking read whose value moves whenever anyone may have changed the store.

    Equal tokens promise "nothing changed in between"; a token that moved may
    be a needless refresh, never a missed one. Safe to call from any thread.
    """

    def read(self) -> object:
        """The current token; on a transient failure, a fresh ``object()`` ("maybe changed").

        Raises :class:`~dibs.StoreClosed` once the feed is closed (a read racing
        :meth:`close` gets a token or that, never a driver's error).
        """
        ...

    def close(self) -> None:
        """Release the feed's connection, if any; later reads raise StoreClosed."""
        ...


class AsyncChangeFeed(Protocol):
    """:class:`ChangeFeed` for asyncio code: the same token, awaited on the store's own loop.

    Equal tokens promise "nothing changed in between"; a token that moved may
    be a needless refresh, never a missed one. It belongs to its async store's
    event loop, as the store does.
    """

    async def read(self) -> object:
        """The current token; on a transient failure, a fresh ``object()`` ("maybe changed").

        Opens the store first if needed. Raises :class:`~dibs.StoreClosed`
        once the store or the feed is closed.
        """
        ...

    async def close(self) -> None:
        """Release what the feed holds beyond its store's connections, if anything; later
        reads raise StoreClosed."""
        ...


class UnchangingFeed:
    """The feed of a store that only this process can change (memory://).

    Its token never moves: every change comes through this process, where
    whoever made it can say so directly (the service pokes its boards).
    """

    _TOKEN = object()

    def __init__(self) -> None:
        self._closed = False

    def read(self) -> object:
        if self._closed:
            raise StoreClosed("this change feed is closed")
        return self._TOKEN

    def close(self) -> None:
        self._closed = True


class ClaimLog(Protocol):
    """Every claim row a store keeps, for an audit that replays them (``dibs verify``)."""

    def claims(self) -> list[Claim]:
        """Every claim the store still keeps, in any state, in fence order.

        States are as stored, not derived: a hold that died and was not swept
        yet reads ``held``, its ``expires_at`` in the past. Times are the
        store's, to the microsecond. Raises :class:`~dibs.StoreUnavailable`.
        """
        ...


class ClaimReader:
    """A :class:`ClaimLog` made of a function that reads every claim, as ``claims()`` does."""

    def __init__(self, read: Callable[[], list[Claim]]) -> None:
        self._read = read

    def claims(self) -> list[Claim]:
        return self._read()
