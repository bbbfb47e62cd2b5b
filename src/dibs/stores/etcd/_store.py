"""``etcd://host:port[,host:port...][/prefix]``: claims on an etcd v3 cluster (Raft).

Holds are etcd leases, fences are revisions, and every decision is one etcd
transaction; the rules are in :mod:`dibs.stores.etcd._ops` (shared with the
async twin) and docs/stores.md, "etcd://".
"""

from __future__ import annotations

import logging
from typing import Any, Self

from dibs._clock import Clock
from dibs._model import Claim, ClaimResult, Span, SweepResult, Unit, check_retention
from dibs._request import ClaimRequest
from dibs.exceptions import StoreClosed
from dibs.stores.base import DEFAULT_REQUEST_RETENTION, Store
from dibs.stores.capabilities import ChangeFeed, ClaimLog, ClaimReader
from dibs.stores.durability import Finding
from dibs.stores.etcd._durability import findings as durability_findings
from dibs.stores.etcd._keys import LEASE_TTL_MIN, Settings, parse_url
from dibs.stores.etcd._ops import Operations
from dibs.stores.etcd._wire import SyncDriver

__all__ = ["EtcdStore"]

logger = logging.getLogger("dibs.stores.etcd")


def open_settings(url: str, options: dict[str, Any]) -> tuple[Settings, dict[str, Any]]:
    """The URL's settings, and the keyword options left for the store (clock, retention)."""
    settings = parse_url(url)
    retention = options.pop("request_retention", settings.request_retention)
    if retention is None:
        retention = DEFAULT_REQUEST_RETENTION
    return settings, {"request_retention": retention, **options}


class EtcdStore(Store):
    """Claims on an etcd v3 cluster over its JSON gateway; safe across threads, processes, hosts.

    ``clock`` is for tests only: with one, expiry is judged on that clock from
    the stored expiry times and holds take no etcd lease, so a
    :class:`~dibs.FakeClock` can move time. Never pass one in production:
    there, a hold lives exactly as long as its lease on the etcd leader.
    """

    scheme = "etcd"
    shared_holds = True
    async_store = "dibs.stores.etcd._aio:AsyncEtcdStore"
    holds_outlive_ttl = True  # a lease restarts its TTL on a leader change (dibs verify's rule)
    client_stamps = True  # etcd keeps no time: the client stamps before its Txn
    least_hold = float(LEASE_TTL_MIN)  # a lease is whole seconds, at least 2

    def __init__(
        self,
        settings: Settings,
        *,
        clock: Clock | None = None,
        request_retention: float = DEFAULT_REQUEST_RETENTION,
    ) -> None:
        super().__init__(clock=clock, request_retention=request_retention)
        self.settings = settings
        self._ops = Operations(settings, clock, lambda: self.request_retention)
        self._driver = SyncDriver(settings, type(self).__name__)

    @classmethod
    def durability(cls, url: str, *, timeout: float = 5.0) -> list[Finding]:
        """Member count and quorum health: :meth:`dibs.Store.durability`."""
        return durability_findings(url, timeout)

    @classmethod
    def check_url(cls, url: str, **options: Any) -> None:
        """Refuse what :meth:`from_url` would refuse before it reaches a member; no I/O."""
        _, rest = open_settings(url, dict(options))
        check_retention(rest["request_retention"])

    @classmethod
    def from_url(cls, url: str, **options: Any) -> Self:
        """Open ``etcd://host:port[,host:port...][/prefix][?option=...]`` (docs/stores.md).

        Raises :class:`~dibs.InvalidInput` for a malformed URL or option, and
        :class:`~dibs.StoreUnavailable` when no member answers.
        """
        settings, rest = open_settings(url, dict(options))
        store = cls(settings, **rest)
        try:
            store._driver.run(store._ops.token())
        except BaseException:
            store.close()
            raise
        logger.debug(
            "opened the etcd store at %s, prefix %r", ",".join(settings.endpoints), settings.prefix
        )
        return store

    def _claim(self, request: ClaimRequest) -> ClaimResult:
        return self._driver.run(self._ops.claim(request))

    def _confirm(self, claim_id: str, holder: str, fence: int) -> Claim:
        return self._driver.run(self._ops.confirm(claim_id, holder, fence))

    def _extend(self, claim_id: str, holder: str, fence: int, ttl: float) -> Claim:
        return self._driver.run(self._ops.extend(claim_id, holder, fence, ttl))

    def _release(self, claim_id: str, holder: str, fence: int) -> bool:
        return self._driver.run(self._ops.release(claim_id, holder, fence))

    def _get(self, claim_id: str) -> Claim | None:
        return self._driver.run(self._ops.get(claim_id))

    def _holder_of(self, target: Unit | Span) -> str | None:
        return self._driver.run(self._ops.holder_of(target))

    def _claims_of(self, holder: str) -> list[Claim]:
        return self._driver.run(self._ops.claims_of(holder))

    def _sweep(self) -> SweepResult:
        return self._driver.run(self._ops.sweep())

    def claim_log(self) -> ClaimLog:
        """Every claim record under this store's prefix, as stored."""
        return ClaimReader(lambda: self._driver.run(self._ops.log()))

    def change_feed(self) -> ChangeFeed:
        """The cluster's revision: it moves on every write to the cluster."""
        return _RevisionFeed(self)

    def _close(self) -> None:
        self._driver.close()


class _RevisionFeed:
    """A :class:`ChangeFeed` reading etcd's revision (any write anywhere moves it)."""

    def __init__(self, store: EtcdStore) -> None:
        self._store = store
        self._closed = False

    def read(self) -> object:
        """The revision; a fresh ``object()`` ("maybe changed") on a transient failure, and
        :class:`~dibs.StoreClosed` once the feed or its store is closed."""
        if self._closed:
            raise StoreClosed("this etcd change feed is closed")
        try:
            return self._store._driver.run(self._store._ops.token())
        except StoreClosed:
            raise  # not transient: a reader must stop, not spin on "maybe changed"
        except Exception:  # a transient failure: "maybe changed", as the protocol says
            return object()

    def close(self) -> None:
        self._closed = True
