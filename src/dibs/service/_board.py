"""The live seat map: snapshots of a showing's seats, refreshed when the store changes.

Each :class:`Board` keeps the latest snapshot of one showing and a version
that grows whenever the snapshot changes. A poll loop refreshes it when this
instance changed something (``poke``), when a hold in the snapshot is due to
expire, and when the store says anyone changed anything: for SQLite that is
``PRAGMA data_version`` on a connection of our own, which moves on every
commit by any other connection (other instances, other processes); for stores
without such a counter the loop recomputes the snapshot every poll and
compares. The snapshot is built from ``holder_of`` and ``claims_of`` only, so it
works on every store, and it never names a holder.

Everything here runs on the event loop's thread except :meth:`Board.compute`,
which runs in a worker thread and touches only the store.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sqlite3
import time
from collections.abc import Callable
from datetime import datetime
from typing import Any

import anyio.to_thread

from dibs._model import ClaimState, Unit
from dibs.service._config import Showing
from dibs.stores.base import Store

__all__ = ["Board", "change_token_for"]

log = logging.getLogger("dibs.service")


def change_token_for(store: Store) -> Callable[[], object] | None:
    """A cheap function whose value changes when the store may have changed.

    None when this instance's own pokes are the only changes (memory://, one
    process); a function returning a fresh object (always "changed") when the
    store offers no counter.
    """
    if store.scheme == "memory":
        return None
    path = getattr(store, "path", None)
    if store.scheme == "sqlite" and isinstance(path, str):
        # A connection that never writes: every commit it sees is someone else's.
        conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)

        def data_version() -> object:
            return conn.execute("PRAGMA data_version").fetchone()[0]

        return data_version
    return object


class Board:
    """The latest snapshot of one showing's seats, and a way to wait for the next."""

    def __init__(
        self,
        store: Store,
        showing: Showing,
        *,
        poll_interval: float,
        change_token: Callable[[], object] | None,
    ) -> None:
        self.store = store
        self.showing = showing
        self.poll_interval = poll_interval
        self.subscribers = 0
        self.version = 0
        self.snapshot: dict[str, Any] | None = None
        self._change_token = change_token
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

    async def refresh(self) -> None:
        """Recompute the snapshot and publish it if any seat changed."""
        self._dirty = False
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
                token = self._change_token() if self._change_token is not None else None
                due = self._next_expiry is not None and time.time() >= self._next_expiry
                if self._dirty or due or token != self._token or self.snapshot is None:
                    self._token = token
                    await self.refresh()
            except Exception:
                log.exception("seat map refresh failed", extra={"slot": self.showing.slot})
                await asyncio.sleep(self.poll_interval)


def _epoch(text: str) -> float:
    return datetime.fromisoformat(text).timestamp()
