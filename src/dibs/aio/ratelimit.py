""":class:`dibs.RateLimit` for asyncio: the same slots and rules, awaited on an async store.

The part of :class:`RateLimit` between the markers below is the one
implementation of ``acquire``: ``scripts/unasync.py`` generates
:class:`dibs.RateLimit`'s from it by dropping ``async``/``await``. The rules it
calls (the slots, the hint, the answers) live in :class:`dibs.ratelimit._Slots`.
"""

from __future__ import annotations

from dibs.ratelimit import Decision, Rate, _micros, _Slots
from dibs.stores.base_async import AsyncStore

__all__ = ["RateLimit"]


class RateLimit(_Slots):
    """:class:`dibs.RateLimit` on an :class:`~dibs.aio.AsyncStore`: ``acquire`` is a coroutine.

    It returns and raises what :class:`dibs.RateLimit`'s does; sync and async
    limits of one key and rate, in any process, share one limit. Raises
    :class:`~dibs.InvalidInput` for a bad key or rate.
    """

    # --- shared with the sync face: scripts/unasync.py makes it from this part ---

    def __init__(self, store: AsyncStore, key: str, rate: str | Rate = "10/s") -> None:
        super().__init__(key, rate)
        self.store = store

    async def acquire(self, cost: int = 1) -> Decision:
        """Admit ``cost`` units now, or refuse with ``retry_after`` seconds.

        Raises :class:`~dibs.InvalidInput` for a cost that is not an integer
        from 1 to the rate's limit, and what the store raises
        (:class:`~dibs.StoreUnavailable`...); an admission the store granted
        before such an error counts against the limit.
        """
        cost = self._check_cost(cost)
        store, now, exact = self.store, self._estimate(), False
        while True:
            picked = self._pick(cost, now)
            if picked is None and not exact:
                # The hint's guess of the time refuses: refuse only on the store's clock.
                now, exact = _micros(await store.now()), True
                self._observe(now)
                picked = self._pick(cost, now)
            if picked is None:
                return self._refused(cost, now)
            units = [self._units[i] for i in picked]
            # The linearization point: the store grants these slots' units to one
            # claim at most while their last admission's hold lives.
            result = await store.claim(units, holder=self.holder, ttl=self._ttl)
            if result.granted and not result.replayed and result.claim is not None:
                return self._admitted(picked, result.claim)
            # Lost (or handed back this holder's live claim of them): someone else
            # admitted since the hint was made; learn the slots and decide again
            # on the store's clock.
            claims = await store.claims_of(self.holder)
            now = _micros(await store.now())
            self._relearn(claims, result.taken, now)
            exact = True

    # --- end of the shared part ---
