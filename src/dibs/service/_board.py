"""The live seat map: snapshots of a showing's seats, refreshed when the store changes.

Each :class:`Board` keeps the latest snapshot of one showing and a version
that grows whenever the snapshot changes. A poll loop refreshes it when this
instance changed something (``poke``), when a hold in the snapshot is due to
expire, and when the store's change feed (:meth:`dibs.Store.change_feed`)
says anyone changed anything: for SQLite ``PRAGMA data_version``, for
PostgreSQL the server's WAL position. For a store without a feed the loop
recomputes the snapshot every poll and compares. The snapshot is built
from ``holder_of`` and ``claims_of`` only, so it works on every store, and it
never names a holder.

Everything here runs on the event loop's thread except :meth:`Board.compute`
and the change feed's reads, which run in worker threads.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from datetime import datetime
from typing import Any

import anyio.to_thread

from dibs._model import ClaimState, Unit
from dibs.service._config import Showing
from dibs.stores.base import Store
from dibs.stores.capabilities import ChangeFeed

__all__ = ["Board"]

log = logging.getLogger("dibs.service")


class Board:
    """The latest snapshot of one showing's seats, and a way to wait for the next."""

    def __init__(
        self,
        store: Store,
        showing: Showing,
        *,
        poll_interval: float,
        change_feed: ChangeFeed | None,
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

    def compute(self) -> dict[str, Any]:
        """Read the showing's seats from the store (blocking; a worker thread calls it)."""
        slot = self.showing.slot
        now = self.store.now()
        seats: dict[str, dict[str, Any]] = {}
        by_holder: dict[str, set[str]] = {}
        for name in self.showing.seats:
            holder = self.store.holder_of(Unit(name, slot))
            seats[name] = {"state": "free", "expires_at": None}
            if holder is not None:
                by_holder.setdefault(holder, set()).add(name)
                # Until its claim is read below (a claim may land in between).
                seats[name] = {"state": "held", "expires_at": None}
        for holder, names in by_holder.items():
            for claim in self.store.claims_of(holder):
                for unit in claim.units:
                    if unit.slot == slot and unit.resource in names:
                        confirmed = claim.state is ClaimState.CONFIRMED
                        seats[unit.resource] = {
                            "state": "confirmed" if confirmed else "held",
                            "expires_at": None
                            if confirmed or claim.expires_at is None
                            else claim.expires_at.isoformat().replace("+00:00", "Z"),
                        }
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
        return await anyio.to_thread.run_sync(self._change_feed.read)

    async def refresh(self) -> None:
        """Recompute the snapshot and publish it if any seat changed.

        The change token is read first, so the snapshot is at least as new as
        the token it is compared against next time.
        """
        self._dirty = False
        self._token = await self._read_token()
        snapshot = await anyio.to_thread.run_sync(self.compute)
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


def _epoch(text: str) -> float:
    return datetime.fromisoformat(text).timestamp()
