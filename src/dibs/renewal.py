"""Renewing a hold by its claim ID and fence, from any process: ``dibs.renew``.

A lease renews its own hold while its block runs (:mod:`dibs.lease`). A
*watchdog* (another thread, process or host that watches a worker) renews a
hold it does not own as a lease object, with only what the worker can hand it:
the claim ID, the holder and the fence. See docs/leases.md, "A watchdog".
The async face is :func:`dibs.aio.renew` (``dibs/aio/renewal.py``), from which
the function below is generated.
"""

from __future__ import annotations

from dibs._model import Claim
from dibs.stores.base import Store

__all__ = ["renew"]


# --- generated from dibs/aio/renewal.py (scripts/unasync.py): edit that, then run it ---
def renew(store: Store, claim_id: str, *, holder: str, fence: int, ttl: float) -> Claim:
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
    return store.extend(claim_id, holder=holder, fence=fence, ttl=ttl)


# --- end of the generated part ---
