"""The live seat map: snapshots of a showing's seats, refreshed when the store changes.

Each :class:`Board` keeps the latest snapshot of one showing and a version
that grows whenever the snapshot changes. A poll loop refreshes it when this
instance changed something (``poke``), when a hold in the snapshot is due to
expire, and when the async store's change feed
(:meth:`dibs.aio.AsyncStore.change_feed`) says anyone changed anything: for
SQLite ``PRAGMA data_version``, for PostgreSQL the server's WAL position (on a
connection of the store's one pool), for etcd the cluster's revision. For a
store without a feed the loop recomputes the snapshot every poll and compares.
The snapshot is built from ``holder_of`` and ``claims_of`` only, so it works on
every store, and it never names a holder.

Everything here awaits the service's one async store on the event loop; no
call hops to a thread of the service's (a store on threads runs its calls on
its own workers).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from datetime import datetime
from typing import Any, TypeVar

from dibs._model import ClaimState, Unit
from dibs.aio import AsyncStore
from dibs.service._config import Showing
from dibs.stores.capabilities import AsyncChangeFeed

__all__ = ["Board"]

log = logging.getLogger("dibs.service")

_I = TypeVar("_I")
_R = TypeVar("_R")
_READS = 4
"""Seat reads in flight at once per seat map: a store on threads has 4 workers by default."""


class Board:
    """The latest snapshot of one showing's seats, and a way to wait for the next."""

    def __init__(
        self,
        store: AsyncStore,
        showing: Showing,
        *,
        poll_interval: float,
        change_feed: AsyncChangeFeed | None,
    ) -> None:
        self.store = store
        self.showing = showing
        self.poll_interval = poll_interval
        self.subscribers = 0
        self.version = 0
        self.snapshot: dict[str, Any] | None = None
        self._change_feed = change_feed
        self._token: object = None
        self._dirty = True
        self._wake = asyncio.Event()
        self._changed = asyncio.Event()
        self._next_expiry: float | None = None

    async def compute(self) -> dict[str, Any]:
        """Read the showing's seats from the store, a snapshot; raises what the store raises."""
        slot = self.showing.slot
        seats: dict[str, dict[str, Any]] = {}
        by_holder: dict[str, set[str]] = {}
        every = self.showing.seats
        holders = await _each([Unit(name, slot) for name in every], self.store.holder_of)
        for name, holder in zip(every, holders, strict=True):
            seats[name] = {"state": "free", "expires_at": None}
            if holder is not None:
                by_holder.setdefault(holder, set()).add(name)
                # Until its claim is read below (a claim may land in between).
                seats[name] = {"state": "held", "expires_at": None}
        for holder, names in by_holder.items():
            for claim in await self.store.claims_of(holder):
                for unit in claim.units:
                    if unit.slot == slot and unit.resource in names:
                        confirmed = claim.state is ClaimState.CONFIRMED
                        seats[unit.resource] = {
                            "state": "confirmed" if confirmed else "held",
                            "expires_at": None
                            if confirmed or claim.expires_at is None
                            else claim.expires_at.isoformat().replace("+00:00", "Z"),
                        }
        # The store's time is read last: every claim seen was made before it, so
        # no hold on the map has more than its TTL left (the page counts down from it).
        now = await self.store.now()
        return {
            "slot": slot,
            "rows": self.showing.rows,
            "cols": self.showing.cols,
            "snapshot": True,
            "now": now.isoformat().replace("+00:00", "Z"),
            "seats": seats,
        }

    def poke(self) -> None:
        """Say this instance changed a seat of this showing: refresh at once."""
        self._dirty = True
        self._wake.set()

    async def _read_token(self) -> object:
        if self._change_feed is None:
            return object()  # no feed: "maybe changed", so every poll recomputes
        return await self._change_feed.read()

    async def refresh(self) -> None:
        """Recompute the snapshot and publish it if any seat changed.

        The change token is read first, so the snapshot is at least as new as
        the token it is compared against next time.
        """
        self._dirty = False
        self._token = await self._read_token()
        snapshot = await self.compute()
        expiries = [
            s["expires_at"] for s in snapshot["seats"].values() if s["expires_at"] is not None
        ]
        self._next_expiry = min(_epoch(e) for e in expiries) + 0.05 if expiries else None
        if self.snapshot is None or snapshot["seats"] != self.snapshot["seats"]:
            self.version += 1
            snapshot["version"] = self.version
            self.snapshot = snapshot
            changed, self._changed = self._changed, asyncio.Event()
            changed.set()
        else:
            self.snapshot["now"] = snapshot["now"]

    async def changed(self, version: int, timeout: float) -> bool:
        """Wait until the snapshot's version differs from ``version``; False on timeout."""
        if self.version != version:
            return True
        event = self._changed
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(event.wait(), timeout)
        return self.version != version

    async def run(self) -> None:
        """Refresh whenever something may have changed, while anyone is watching."""
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), self.poll_interval)
            self._wake.clear()
            if self.subscribers == 0:
                continue
            try:
                due = self._next_expiry is not None and time.time() >= self._next_expiry
                if (
                    self._dirty
                    or due
                    or self.snapshot is None
                    or await self._read_token() != self._token
                ):
                    await self.refresh()
            except Exception:
                log.exception("seat map refresh failed", extra={"slot": self.showing.slot})
                await asyncio.sleep(self.poll_interval)


async def _each(items: list[_I], read: Callable[[_I], Awaitable[_R]]) -> list[_R]:
    """``[await read(item) for item in items]``, up to :data:`_READS` reads at a time.

    A few at once: on a store on threads its workers share the reads, and on a
    pool a claim never waits behind a whole seat map's reads.
    """
    results: list[_R | None] = [None] * len(items)
    pending = iter(enumerate(items))

    async def reader() -> None:
        for i, item in pending:
            results[i] = await read(item)

    readers = [asyncio.ensure_future(reader()) for _ in range(min(_READS, len(items)))]
    try:
        await asyncio.gather(*readers)
    except BaseException:  # one failed, or the caller was cancelled: the others stop too
        for task in readers:
            task.cancel()
        raise
    return results  # type: ignore[return-value]  # every slot was filled


def _epoch(text: str) -> float:
    return datetime.fromisoformat(text).timestamp()
