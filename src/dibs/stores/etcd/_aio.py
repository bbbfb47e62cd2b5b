"""``etcd://`` for asyncio: the etcd store's plans, awaited on an ``httpx.AsyncClient``.

:class:`AsyncEtcdStore` runs the very plans of the sync
:class:`~dibs.stores.etcd.EtcdStore` (:mod:`dibs.stores.etcd._ops`); the two
differ only in how a request is sent.
"""

from __future__ import annotations

from typing import Any, Self

from dibs._clock import Clock, SystemClock
from dibs._model import Claim, ClaimResult, Span, SweepResult, Unit, check_retention
from dibs._request import ClaimRequest
from dibs.stores.base import DEFAULT_REQUEST_RETENTION
from dibs.stores.base_async import AsyncStore, TokenFeed
from dibs.stores.etcd._keys import Settings
from dibs.stores.etcd._ops import Operations
from dibs.stores.etcd._store import open_settings
from dibs.stores.etcd._wire import AsyncDriver

__all__ = ["AsyncEtcdStore"]


class AsyncEtcdStore(AsyncStore):
    """The etcd store for asyncio code; see :class:`~dibs.stores.etcd.EtcdStore`."""

    scheme = "etcd"
    shared_holds = True

    def __init__(
        self,
        settings: Settings,
        *,
        clock: Clock | None = None,
        request_retention: float = DEFAULT_REQUEST_RETENTION,
    ) -> None:
        super().__init__()
        self.settings = settings
        self.request_retention = check_retention(request_retention)
        self.clock: Clock = clock if clock is not None else SystemClock()
        self._ops = Operations(settings, clock, lambda: self.request_retention)
        self._driver = AsyncDriver(settings, type(self).__name__)

    @classmethod
    def from_url(cls, url: str, **options: Any) -> Self:
        """Make the store without I/O; raises :class:`~dibs.InvalidInput` for a bad URL."""
        settings, rest = open_settings(url, dict(options))
        return cls(settings, **rest)

    async def _open(self) -> None:
        await self._driver.run(self._ops.token())

    async def _claim(self, request: ClaimRequest) -> ClaimResult:
        return await self._driver.run(self._ops.claim(request))

    async def _confirm(self, claim_id: str, holder: str, fence: int) -> Claim:
        return await self._driver.run(self._ops.confirm(claim_id, holder, fence))

    async def _extend(self, claim_id: str, holder: str, fence: int, ttl: float) -> Claim:
        return await self._driver.run(self._ops.extend(claim_id, holder, fence, ttl))

    async def _release(self, claim_id: str, holder: str, fence: int) -> bool:
        return await self._driver.run(self._ops.release(claim_id, holder, fence))

    async def _get(self, claim_id: str) -> Claim | None:
        return await self._driver.run(self._ops.get(claim_id))

    async def _holder_of(self, target: Unit | Span) -> str | None:
        return await self._driver.run(self._ops.holder_of(target))

    async def _claims_of(self, holder: str) -> list[Claim]:
        return await self._driver.run(self._ops.claims_of(holder))

    async def _sweep(self) -> SweepResult:
        return await self._driver.run(self._ops.sweep())

    async def _now(self) -> float:
        return self.clock.now()

    def change_feed(self) -> TokenFeed:
        """The cluster's revision, read on this store's HTTP client: it moves on every write."""
        return TokenFeed(self, lambda: self._driver.run(self._ops.token()))

    async def _close(self) -> None:
        await self._driver.close()
