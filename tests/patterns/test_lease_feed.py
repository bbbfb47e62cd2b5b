"""The async lease waits for taken targets on the store's change feed, as the sync one does."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest

import dibs
import dibs.aio
import dibs.lease
from dibs import FakeClock, Unit
from dibs.aio import AsyncStore
from eventually import aeventually

UNIT = Unit("report", "2026-11-30")


class FeedSpy:
    """An async store whose change feeds count their reads and closes."""

    def __init__(self, store: AsyncStore, broken: bool = False) -> None:
        self.store = store
        self.broken = broken
        self.opened = self.reads = self.closed = 0

    def change_feed(self) -> Any:
        feed = self.store.change_feed()
        if feed is None:
            return None
        self.opened += 1
        spy = self

        class Feed:
            async def read(self) -> object:
                spy.reads += 1
                if spy.broken:
                    raise OSError("the feed's connection broke")
                assert feed is not None
                return await feed.read()

            async def close(self) -> None:
                spy.closed += 1
                assert feed is not None
                await feed.close()

        return Feed()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.store, name)


@pytest.fixture
def astore(make_store: Any, clock: FakeClock) -> Iterator[AsyncStore]:
    url = "memory://" if make_store.kind == "memory" else make_store.url
    yield dibs.aio.open(url, clock=clock)


@pytest.mark.parametrize("broken", [False, True], ids=["feed", "broken feed"])
def test_async_waiter_reads_the_change_feed_and_closes_it(astore: AsyncStore, broken: bool) -> None:
    async def main() -> None:
        async with astore as store:
            other = (await store.claim(UNIT, holder="alice", ttl=30.0)).claim
            assert other is not None
            spy = FeedSpy(store, broken)
            watched = 1 if broken else 2  # a broken feed is read once, then polling takes over

            async def release_once_watched() -> None:
                await aeventually(lambda: spy.reads >= watched, "the waiter read the feed")
                await store.release(other.id, holder="alice", fence=other.fence)

            releasing = asyncio.create_task(release_once_watched())
            waiter = dibs.lease.AsyncLease(spy, UNIT, holder="w1", ttl=30.0, wait=None)  # type: ignore[arg-type]
            async with waiter as lease:
                assert lease.fence > other.fence
                assert spy.opened == 1 and spy.closed == 1  # closed once it held
            await releasing
            if broken:
                assert spy.reads == 1

    asyncio.run(main())
