""":func:`dibs.renew` for asyncio: a watchdog's renewal of a hold it does not own as a lease.

The part between the markers below is the one implementation of ``renew``:
``scripts/unasync.py`` generates :func:`dibs.renew` from it.
"""

from __future__ import annotations

from dibs._model import Claim
from dibs.stores.base_async import AsyncStore

__all__ = ["renew"]


# --- shared with the sync face: scripts/unasync.py makes it from this part ---
async def renew(store: AsyncStore, claim_id: str, *, holder: str, fence: int, ttl: float) -> Claim:
    """Push a live hold's expiry to ``ttl`` seconds from now, by its claim ID and fence.

    For a watchdog in any process: it needs only what the worker can hand it
    (``lease.id``, ``lease.holder``, ``lease.fence``), never the lease object.
    It is the store's fenced :meth:`~dibs.Store.extend`, so it extends the hold
    only while that hold is the same live claim: the updated claim. A confirmed
    claim comes back unchanged (it does not expire). Raises, the same on every
    store, without extending anything: :class:`~dibs.HoldLost` with ``reason``
    ``fence`` (a stale or foreign fence), ``released``, ``expired`` or
    ``taken_over``; :class:`~dibs.NotHolder` for another holder;
    :class:`~dibs.ClaimNotFound` for an ID the store does not know (never
    issued, or expired and swept); :class:`~dibs.InvalidInput` naming a bad
    argument; :class:`~dibs.StoreUnavailable` when the store cannot answer
    (safe to retry: a renewal extends to ``ttl`` from when it lands).
    """
    return await store.extend(claim_id, holder=holder, fence=fence, ttl=ttl)


# --- end of the shared part ---
