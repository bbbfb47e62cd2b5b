"""The change feed on both faces and every store: one contract, sync and awaited.

``Store.change_feed()`` and ``AsyncStore.change_feed()`` answer a token that
moves whenever anyone may have changed the store: equal tokens promise that
nothing changed in between, a moved token may be a needless refresh, never a
missed one, and a transient failure reads as a fresh ``object()`` ("maybe
changed"), never an exception. memory:// is the one store only its process
changes: its token never moves (whoever changes it says so directly).

The async feed is the service's seat-map feed: native on PostgreSQL (a
connection of the store's one pool) and etcd (its async client), the sync
feed on the workers of a threaded store (SQLite), inline for memory://.
"""

from __future__ import annotations

import asyncio
import secrets
import threading
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

import dibs
import dibs.aio
from conftest import SHARED_STORE_KINDS, STORE_KINDS, fresh_url
from dibs import Unit
from dibs.aio import AsyncStore
from dibs.stores.base import Store
from dibs.verify.harness import free_ports

FACES = ["sync", "aio"]


@pytest.fixture(params=STORE_KINDS)
def url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    yield from fresh_url(request.param, tmp_path, request)


@pytest.fixture(params=SHARED_STORE_KINDS)
def shared_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A store other processes (other stores) share: all but memory://."""
    yield from fresh_url(request.param, tmp_path, request)


@pytest.fixture(params=FACES)
def face(request: pytest.FixtureRequest) -> str:
    return str(request.param)


class Feed:
    """A store of one face and its feed, read the same way for both: ``await feed.read()``."""

    def __init__(self, face: str, url: str, **options: Any) -> None:
        self.face = face
        self.store: Store | AsyncStore
        if face == "sync":
            self.store = dibs.open(url, **options)
        else:  # not opened: the feed's first read opens it
            self.store = dibs.aio.open(url, **options)
        feed = self.store.change_feed()
        assert feed is not None, "every built-in store offers a change feed"
        self.feed = feed

    async def read(self) -> object:
        if self.face == "sync":
            return self.feed.read()  # type: ignore[union-attr]
        token: object = await self.feed.read()  # type: ignore[misc]
        return token

    async def claim(self, name: str) -> None:
        result = self.store.claim(Unit(name, "feed"), holder="alice")
        if self.face == "aio":
            result = await result  # type: ignore[misc]
        assert result

    async def close(self) -> None:
        if self.face == "sync":
            self.feed.close()
            self.store.close()  # type: ignore[unused-coroutine]
        else:
            await self.feed.close()  # type: ignore[misc]
            await self.store.close()  # type: ignore[misc]


def run(face: str, url: str, test: Callable[[Feed], Awaitable[None]], **options: Any) -> None:
    async def main() -> None:
        feed = Feed(face, url, **options)
        try:
            await test(feed)
        finally:
            await feed.close()

    asyncio.run(main())


def test_a_feed_holds_still_while_nothing_changes(face: str, url: str) -> None:
    async def test(feed: Feed) -> None:
        pairs = []
        for _ in range(5):
            pairs.append(await feed.read() == await feed.read())
        if url.startswith("postgresql"):
            # The WAL is the cluster's: the server's own work (autovacuum, a
            # checkpoint) may move it between two reads, a needless refresh the
            # contract allows. A feed stuck at "maybe changed" never holds still.
            assert any(pairs)
        else:
            assert all(pairs)

    run(face, url, test)


def test_a_feed_moves_when_its_store_claims(face: str, url: str) -> None:
    async def test(feed: Feed) -> None:
        for i in range(3):
            before = await feed.read()
            await feed.claim(f"own-{i}")
            after = await feed.read()
            if url == "memory://":
                assert after == before  # the process that changed it says so itself
            else:
                assert after != before

    run(face, url, test)


def test_a_feed_moves_when_another_store_claims(face: str, shared_url: str) -> None:
    url = shared_url

    async def test(feed: Feed) -> None:
        await feed.read()  # the async store opens here
        with dibs.open(url) as other:
            for i in range(3):
                before = await feed.read()
                assert other.claim(Unit(f"other-{i}", "feed"), holder="bob")
                assert await feed.read() != before

    run(face, url, test)


def test_a_feed_reads_a_broken_connection_as_maybe_changed_and_recovers(
    face: str, pg_schema_url: str, pg_admin_url: str
) -> None:
    """PostgreSQL: every connection of the feed's application is cut, between reads."""
    name = f"feed-{secrets.token_hex(4)}"
    admin = pg_admin_url

    def cut() -> int:
        with psycopg.connect(admin, autocommit=True) as conn:
            rows = conn.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                "WHERE application_name = %s",
                (name,),
            ).fetchall()
        return len(rows)

    async def test(feed: Feed) -> None:
        assert isinstance(await feed.read(), str)  # a WAL position
        assert cut() >= 1
        # The read that meets the cut connection answers "maybe changed" (it
        # never raises); a later one reconnects by itself.
        tokens = [await feed.read()]
        assert type(tokens[0]) is object
        while len(tokens) < 5 and not isinstance(tokens[-1], str):
            tokens.append(await feed.read())
        assert isinstance(tokens[-1], str), tokens

    run(face, f"{pg_schema_url}&application_name={name}", test)


@pytest.mark.parametrize("scheme", ["postgresql", "etcd"])
def test_an_unreachable_async_store_reads_as_maybe_changed(scheme: str) -> None:
    url = f"{scheme}://127.0.0.1:{free_ports(1)[0]}/dibs"

    async def main() -> None:
        store = dibs.aio.open(url)
        feed = store.change_feed()
        assert feed is not None
        first, second = await feed.read(), await feed.read()
        assert type(first) is object and type(second) is object and first != second
        await feed.close()
        await store.close()

    asyncio.run(main())


def test_an_async_feed_refuses_reads_once_its_store_is_closed(url: str) -> None:
    async def main() -> None:
        store = dibs.aio.open(url)
        feed = store.change_feed()
        assert feed is not None
        await feed.read()
        await store.close()
        with pytest.raises(dibs.StoreClosed):
            await feed.read()
        await feed.close()
        await feed.close()  # twice is fine

    asyncio.run(main())


def test_a_closed_feed_refuses_reads_on_both_faces_while_its_store_stays_open(
    face: str, url: str
) -> None:
    """Before: a threaded store's async feed, read after its close, opened a new sync feed
    (and its connection) that nobody closed; the others answered as if open."""

    async def test(feed: Feed) -> None:
        await feed.read()
        if feed.face == "sync":
            feed.feed.close()  # type: ignore[unused-coroutine]
        else:
            await feed.feed.close()  # type: ignore[misc]
        for _ in range(2):
            with pytest.raises(dibs.StoreClosed):
                await feed.read()
        await feed.claim(f"open-{secrets.token_hex(3)}")  # the store itself is still open

    run(face, url, test)  # its close() closes the feed a second time: fine


def test_an_async_feed_closed_before_any_read_holds_nothing(url: str) -> None:
    async def main() -> None:
        async with dibs.aio.open(url) as store:
            feed = store.change_feed()
            assert feed is not None
            await feed.close()

    asyncio.run(main())


def test_async_reads_started_together_share_one_sync_feed(tmp_path: Path) -> None:
    """A store on threads makes one sync feed (one SQLite connection), however many read at once."""
    made: list[object] = []

    async def main() -> None:
        async with dibs.aio.open(f"sqlite:///{tmp_path / 'dibs.db'}") as store:
            assert isinstance(store, dibs.aio.ThreadedStore) and store.sync is not None
            sync = store.sync
            original = sync.change_feed

            def counted() -> Any:
                made.append(None)
                return original()

            sync.change_feed = counted  # type: ignore[method-assign]
            feed = store.change_feed()
            assert feed is not None
            tokens = await asyncio.gather(*(feed.read() for _ in range(16)))
            assert len(set(tokens)) == 1
            await feed.close()

    asyncio.run(main())
    assert len(made) == 1


def test_an_instrumented_async_store_offers_the_wrapped_stores_feed(tmp_path: Path) -> None:
    from dibs.observe import instrument

    async def main() -> None:
        async with instrument(dibs.aio.open(f"sqlite:///{tmp_path / 'dibs.db'}")) as store:
            feed = store.change_feed()
            assert feed is not None
            before = await feed.read()
            assert await store.claim(Unit("traced", "feed"), holder="alice")
            assert await feed.read() != before
            await feed.close()

    asyncio.run(main())


def _read_until_closed(feed: Any, stop: Any, seen: list[BaseException]) -> None:
    """Read ``feed`` until ``stop`` is set or the feed says it is closed; keep anything else."""
    while not stop.is_set():
        try:
            feed.read()
        except dibs.StoreClosed:
            return
        except BaseException as exc:
            seen.append(exc)
            return


def test_a_closed_sync_feed_refuses_reads_and_a_read_racing_close_sees_no_driver_error(
    shared_url: str,
) -> None:
    """Before: a read racing ``close()`` raised sqlite3's ProgrammingError, and on
    PostgreSQL a read after close opened a connection that nobody closed."""
    store = dibs.open(shared_url)
    try:
        for _ in range(20):
            feed = store.change_feed()
            assert feed is not None
            seen: list[BaseException] = []
            stop = threading.Event()
            threads = [
                threading.Thread(target=_read_until_closed, args=(feed, stop, seen))
                for _ in range(3)
            ]
            for thread in threads:
                thread.start()
            feed.close()
            stop.set()
            for thread in threads:
                thread.join(60)
            assert seen == [], seen
            with pytest.raises(dibs.StoreClosed):
                feed.read()
            if shared_url.startswith("postgresql"):
                assert getattr(feed, "_conn", None) is None  # nothing reopened
    finally:
        store.close()
