"""The stores log through ``logging`` as ``dibs.stores.<store>``, at levels an operator likes.

Claims are silent at INFO however many there are; a sweep that did something
is one INFO line; a lost hold and every retry are DEBUG; an outage is one
WARNING when it starts and one INFO line when it ends (see
tests/stores/test_open_errors.py for PostgreSQL's).

The tests that take ``store`` run on every store and again on its async face
(:func:`dibs.aio.open`, driven through tests/support/aio_face.py), which logs under
the sync store's logger by the same rules; the async faces' retries and
outages are tested in tests/stores/test_aio_postgres.py and below.
"""

from __future__ import annotations

import asyncio
import logging
import sqlite3

import pytest

import dibs
import dibs.aio
from conftest import ALL_STORE_KINDS
from dibs import FakeClock, HoldLost, StoreUnavailable, Unit
from dibs.stores._retry import retrying

LOGGERS = {
    "memory": "dibs.stores.memory",
    "sqlite": "dibs.stores.sqlite",
    "postgresql": "dibs.stores.postgres",
    "etcd": "dibs.stores.etcd",
}


@pytest.fixture(params=ALL_STORE_KINDS)
def store_kind(request: pytest.FixtureRequest) -> str:
    """Every store, and every store again through :func:`dibs.aio.open`."""
    return str(request.param)


def _ours(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name.startswith("dibs.")]


def _scheme(store: object) -> str:
    """The store's scheme; for the async face (tests/support/aio_face.py), the async store's."""
    scheme: str = getattr(store, "aio", store).scheme
    return scheme


def test_claims_are_silent_at_info(store: dibs.Store, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="dibs"):
        for i in range(200):
            result = store.claim(Unit(f"seat-{i % 20}", "show"), holder=f"h{i}", ttl=60)
            if result:
                assert result.claim is not None
                store.confirm(result.claim.id, holder=f"h{i}", fence=result.claim.fence)
            store.holder_of(Unit(f"seat-{i % 20}", "show"))
    assert _ours(caplog) == []


def test_a_sweep_that_did_something_is_one_info_line(
    store: dibs.Store, clock: FakeClock, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.DEBUG, logger="dibs"):
        store.sweep()
        idle = _ours(caplog)
        assert [(r.name, r.levelno) for r in idle] == [(LOGGERS[_scheme(store)], logging.DEBUG)]
        caplog.clear()
        for i in range(3):
            assert store.claim(Unit(f"seat-{i}"), holder="alice", ttl=5)
        clock.advance(10)
        assert store.sweep().expired == 3
    [line] = _ours(caplog)
    assert line.name == LOGGERS[_scheme(store)] and line.levelno == logging.INFO
    assert "expired 3 dead holds" in line.getMessage()


def test_a_lost_hold_is_debug_and_names_no_holder(
    store: dibs.Store, clock: FakeClock, caplog: pytest.LogCaptureFixture
) -> None:
    held = store.claim(Unit("seat-1"), holder="alice-secret-name", ttl=5).claim
    assert held is not None
    clock.advance(10)
    assert store.claim(Unit("seat-1"), holder="bob", ttl=5)  # takes the dead hold over
    with caplog.at_level(logging.DEBUG, logger="dibs"), pytest.raises(HoldLost):
        store.confirm(held.id, holder="alice-secret-name", fence=held.fence)
    [line] = _ours(caplog)
    assert line.levelno == logging.DEBUG and "taken_over" in line.getMessage()
    assert held.id in line.getMessage() and "alice" not in line.getMessage()


def test_a_takeover_is_debug_and_names_no_holder(
    store: dibs.Store, clock: FakeClock, caplog: pytest.LogCaptureFixture
) -> None:
    # The common case: a single-unit hold abandoned and claimed again, with and
    # without a request ID. (A group member taken over through PostgreSQL's claim
    # function is not logged there.)
    held = store.claim(Unit("seat-1"), holder="alice-secret-name", ttl=5).claim
    other = store.claim(Unit("seat-2"), holder="alice-secret-name", ttl=5).claim
    released = store.claim(Unit("seat-3"), holder="alice-secret-name", ttl=5).claim
    assert held is not None and other is not None and released is not None
    store.release(released.id, holder="alice-secret-name", fence=released.fence)
    clock.advance(10)
    with caplog.at_level(logging.DEBUG, logger="dibs"):
        assert store.claim(Unit("seat-1"), holder="bob", ttl=5)
        assert store.claim(Unit("seat-2"), holder="bob", ttl=5, request_id="r-1")
        assert store.claim(Unit("seat-3"), holder="bob", ttl=5)  # released: no takeover
    lines = _ours(caplog)
    assert [line.levelno for line in lines] == [logging.DEBUG, logging.DEBUG]
    assert held.id in lines[0].getMessage() and "taken over" in lines[0].getMessage()
    assert other.id in lines[1].getMessage()
    assert not any("alice" in line.getMessage() for line in lines)


def test_a_takeover_rolled_back_with_a_losing_claim_is_not_logged(
    store: dibs.Store, clock: FakeClock, caplog: pytest.LogCaptureFixture
) -> None:
    # A group claim meets a dead hold on one unit and a live claim on the other:
    # it loses, and its takeover of the dead hold is rolled back with it, so
    # nothing may say the hold was taken over. (SQLite logged it from inside the
    # transaction, before it knew the claim would lose.)
    dead = store.claim(Unit("seat-1"), holder="alice", ttl=5).claim
    assert dead is not None
    clock.advance(10)
    assert store.claim(Unit("seat-2"), holder="carol")
    with caplog.at_level(logging.DEBUG, logger="dibs"):
        lost = store.claim([Unit("seat-1"), Unit("seat-2")], holder="bob", ttl=5)
    assert not lost and lost.taken == (Unit("seat-2"),)
    assert not any("taken over" in line.getMessage() for line in _ours(caplog))
    after = store.get(dead.id)
    assert after is not None and not after.taken_over


def test_each_retry_is_a_debug_line(caplog: pytest.LogCaptureFixture) -> None:
    tries = []

    def flaky() -> str:
        tries.append(1)
        if len(tries) < 3:
            raise sqlite3.OperationalError("database is locked")
        return "done"

    log = logging.getLogger("dibs.stores.test")
    with caplog.at_level(logging.DEBUG, logger="dibs"):
        assert (
            retrying(flaky, transient=lambda e: True, gave_up=lambda e, n: e, delay=0, logger=log)
            == "done"
        )
    assert [(r.name, r.levelno) for r in caplog.records] == [
        ("dibs.stores.test", logging.DEBUG),
        ("dibs.stores.test", logging.DEBUG),
    ]
    assert "database is locked" in caplog.records[0].getMessage()


def test_a_sqlite_outage_is_one_warning_then_one_info(
    tmp_path: pytest.TempPathFactory, caplog: pytest.LogCaptureFixture
) -> None:
    path = f"{tmp_path}/x.db"
    with dibs.open(f"sqlite:///{path}?busy_timeout=0.05") as store:
        blocker = sqlite3.connect(path, isolation_level=None)
        blocker.execute("BEGIN EXCLUSIVE")  # every write and read waits past busy_timeout
        with caplog.at_level(logging.INFO, logger="dibs"):
            for i in range(5):
                with pytest.raises(StoreUnavailable):
                    store.claim(Unit(f"seat-{i}"), holder="alice")
            blocker.execute("ROLLBACK")
            blocker.close()
            assert store.claim(Unit("seat-9"), holder="alice")
            assert store.claim(Unit("seat-8"), holder="alice")
    lines = [(r.name, r.levelno) for r in _ours(caplog)]
    assert lines == [("dibs.stores.sqlite", logging.WARNING), ("dibs.stores.sqlite", logging.INFO)]


def test_an_async_sqlite_outage_is_one_warning_then_one_info(
    tmp_path: pytest.TempPathFactory, caplog: pytest.LogCaptureFixture
) -> None:
    path = f"{tmp_path}/x.db"

    async def main() -> None:
        async with dibs.aio.open(f"sqlite:///{path}?busy_timeout=0.05") as store:
            await store.sweep()  # opened
            blocker = sqlite3.connect(path, isolation_level=None)
            blocker.execute("BEGIN EXCLUSIVE")
            with caplog.at_level(logging.INFO, logger="dibs"):
                for i in range(5):
                    with pytest.raises(StoreUnavailable):
                        await store.claim(Unit(f"seat-{i}"), holder="alice")
                blocker.execute("ROLLBACK")
                blocker.close()
                assert await store.claim(Unit("seat-9"), holder="alice")
                assert await store.claim(Unit("seat-8"), holder="alice")

    asyncio.run(main())
    lines = [(r.name, r.levelno) for r in _ours(caplog)]
    assert lines == [("dibs.stores.sqlite", logging.WARNING), ("dibs.stores.sqlite", logging.INFO)]
