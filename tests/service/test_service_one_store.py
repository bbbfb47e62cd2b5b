"""The service on one async store: claims, lots, match and seat maps await it, on every store.

No request hops to a thread of the service's (``anyio.to_thread``,
``run_in_executor``), no sync store is opened beside the async one (a store on
threads has exactly one, its own), and on PostgreSQL the service opens one pool
and holds no connection outside it.
"""

from __future__ import annotations

import asyncio
import json
import secrets
import threading
from collections.abc import Iterator
from typing import Any

import anyio.to_thread
import psycopg
import psycopg_pool
import pytest

import dibs
from dibs import Unit
from dibs.aio import ThreadedStore
from dibs.service import ServiceConfig, Showing
from dibs.service._config import LotSpec
from dibs.stores import store_class
from dibs.stores.base import Store
from service_support import Running, serve_in_thread

SHOW = Showing("show-1", 2, 3)


class Hops:
    """Records every thread hop and every sync store made while it is armed (or always)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.armed = False
        self.hops: list[str] = []
        self.sync_stores: list[type[Store]] = []
        hops = self

        run_sync = anyio.to_thread.run_sync

        async def to_thread(func: Any, *args: Any, **kwargs: Any) -> Any:
            if hops.armed:
                hops.hops.append(f"anyio.to_thread.run_sync({func!r})")
            return await run_sync(func, *args, **kwargs)

        run_in_executor = asyncio.base_events.BaseEventLoop.run_in_executor

        def in_executor(loop: Any, executor: Any, func: Any, *args: Any) -> Any:
            if hops.armed:
                hops.hops.append(f"run_in_executor({func!r})")
            return run_in_executor(loop, executor, func, *args)

        init = Store.__init__

        def made(store: Store, *args: Any, **kwargs: Any) -> None:
            hops.sync_stores.append(type(store))
            init(store, *args, **kwargs)

        monkeypatch.setattr(anyio.to_thread, "run_sync", to_thread)
        monkeypatch.setattr(asyncio.base_events.BaseEventLoop, "run_in_executor", in_executor)
        monkeypatch.setattr(Store, "__init__", made)


def next_snapshot(lines: Iterator[str]) -> dict[str, Any]:
    for line in lines:
        if line.startswith("data: "):
            doc: dict[str, Any] = json.loads(line[6:])
            return doc
    raise AssertionError("the event stream ended")


def exercise(s: Running, url: str) -> None:
    """Claims, lots, match and the seat maps (snapshot and live stream), each checked."""
    with (
        s.client("alice") as a,
        s.client("bob") as b,
        s.client() as watcher,
        watcher.stream("GET", f"/v1/showings/{SHOW.slot}/events") as events,
    ):
        lines = events.iter_lines()
        assert next_snapshot(lines)["seats"]["seat-A1"]["state"] == "free"
        # Claims.
        r = a.post("/v1/claims", json={"targets": [{"resource": "seat-A1", "slot": SHOW.slot}]})
        assert r.status_code == 201, r.text
        assert [c["id"] for c in a.get("/v1/claims").json()["claims"]] == [r.json()["id"]]
        while next_snapshot(lines)["seats"]["seat-A1"]["state"] != "confirmed":
            pass
        # A change this instance did not make: the board learns it from the change feed.
        if url != "memory://":
            with dibs.open(url) as other:
                assert other.claim(Unit("seat-B2", SHOW.slot), holder="carol", ttl=600)
            while next_snapshot(lines)["seats"]["seat-B2"]["state"] != "held":
                pass
        snapshot = a.get(f"/v1/showings/{SHOW.slot}").json()
        assert snapshot["seats"]["seat-A1"]["state"] == "confirmed"
        # Lots.
        parked = a.post("/v1/lots/row/vehicles", json={"vehicle": "van", "length": 2})
        assert parked.status_code == 201, parked.text
        position = parked.json()["position"]
        assert b.post("/v1/lots/row/vehicles", json={"vehicle": "car"}).status_code == 201
        slots = a.get("/v1/lots/row").json()["slots"]
        assert [x["state"] for x in slots].count("yours") == 2
        assert [x["state"] for x in slots].count("taken") == 1
        assert a.get("/v1/lots/row/vehicles/van").json()["position"] == position
        assert a.delete("/v1/lots/row/vehicles/van").status_code == 200
        assert a.get("/v1/lots/row/vehicles/van").status_code == 404
        # Match.
        drivers = [{"resource": f"driver-{i}", "slot": "shift"} for i in range(3)]
        key = {"Idempotency-Key": '"ride-1"'}
        first = a.post("/v1/match", json={"candidates": drivers, "ttl": 60}, headers=key)
        assert first.status_code == 201, first.text
        again = a.post("/v1/match", json={"candidates": drivers, "ttl": 60}, headers=key)
        assert again.headers["idempotent-replayed"] == "true"
        second = b.post("/v1/match", json={"candidates": drivers}, headers=key)
        assert second.json()["candidate"] == drivers[1]
        assert a.get("/readyz").status_code == 200


def config_for(url: str, **options: Any) -> ServiceConfig:
    return ServiceConfig(
        store_url=url,
        keys_file=None,
        showings=(SHOW,),
        lots=(LotSpec("row", 6),),
        poll_interval=0.05,
        **options,
    )


def test_every_request_awaits_the_async_store_and_no_thread(
    aio_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    hops = Hops(monkeypatch)
    native = not isinstance(dibs.aio.open(aio_url), ThreadedStore)
    with serve_in_thread(config_for(aio_url)) as s:
        assert s.service is not None
        hops.armed = True  # after start-up: a native store's one-time schema set-up may use one
        exercise(s, aio_url)
        hops.armed = False
        behind = s.service.store
    assert hops.hops == []
    made = hops.sync_stores
    if native:  # only the library caller's store in exercise(), never the service's
        assert made == [store_class(aio_url)]
        assert behind is None
    else:  # the one store behind the async face (and, on SQLite, the library caller's)
        assert behind is not None and made[0] is type(behind)
        assert len(made) == (1 if aio_url == "memory://" else 2)


def test_the_service_on_postgresql_opens_one_pool(
    pg_schema_url: str, pg_admin_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One async pool, and every connection of the service's inside it.

    The service's connections are counted by their ``application_name`` in
    ``pg_stat_activity`` while claims, lots, match and a live seat map run,
    with a pool of at most 2: two stores (or a feed's own connection) would
    show more, and open a second pool.
    """
    name = f"svc-{secrets.token_hex(4)}"
    url = f"{pg_schema_url}&application_name={name}&pool_min=2&pool_max=2"
    pools: list[str] = []
    for cls in (psycopg_pool.ConnectionPool, psycopg_pool.AsyncConnectionPool):
        init = cls.__init__

        def made(pool: Any, *args: Any, __init: Any = init, **kwargs: Any) -> None:
            if name in str(args[0] if args else kwargs.get("conninfo")):  # the service's
                pools.append(_base(pool))
            __init(pool, *args, **kwargs)

        monkeypatch.setattr(cls, "__init__", made)
    seen: list[int] = []
    done = threading.Event()

    def count() -> int:
        with psycopg.connect(pg_admin_url, autocommit=True) as conn:
            row = conn.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE application_name = %s", (name,)
            ).fetchone()
        assert row is not None
        return int(row[0])

    def sample() -> None:
        while not done.is_set():
            seen.append(count())
            done.wait(0.02)

    with serve_in_thread(config_for(url)) as s:
        sampler = threading.Thread(target=sample)
        sampler.start()
        try:
            exercise(s, pg_schema_url)  # its library caller's store is not the service's
            seen.append(count())  # with the stream closed, the pool stays
        finally:
            done.set()
            sampler.join(30)
    assert pools == ["AsyncConnectionPool"]
    assert seen and max(seen) <= 2, seen
    assert seen[-1] >= 1


def _base(pool: Any) -> str:
    """Which of psycopg_pool's two pool classes ``pool`` is."""
    if isinstance(pool, psycopg_pool.AsyncConnectionPool):
        return "AsyncConnectionPool"
    return "ConnectionPool"
