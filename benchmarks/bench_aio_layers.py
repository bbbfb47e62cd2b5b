"""Where an awaited PostgreSQL claim's client CPU goes, layer by layer, against the sync claim.

The same single-unit claim statement (the store's own ``claim_fresh``, one
connection, distinct units, 300 s holds), run with one more layer each time,
in interleaved rounds on one private server (fsync off):

* ``sync psycopg``: a sync connection's kept cursor, ``execute`` + ``fetchone``;
* ``sync dibs``: ``store.claim`` on ``dibs.open(url)``;
* ``async psycopg``: the same on an ``AsyncConnection``;
* ``+ async pool``: ``getconn``/``putconn`` of psycopg_pool's async pool around it;
* ``+ inner task``: that run in a task of its own, answering a future the
  caller awaits (what makes a cancelled caller safe: see ``AsyncPostgresStore``);
* ``dibs.aio``: ``await store.claim`` on ``dibs.aio.open(url)``.

Prints the median client CPU per claim (``time.process_time``, which a shared
machine's load moves far less than throughput) and each round's figure.

    python benchmarks/bench_aio_layers.py
    python benchmarks/bench_aio_layers.py --claims 3000 --rounds 7 --loop uvloop
"""

from __future__ import annotations

import argparse
import asyncio
import secrets
import statistics
import time
from collections.abc import Awaitable, Callable
from typing import Any

import psycopg
from psycopg_pool import AsyncConnectionPool

import dibs
import dibs.aio
from dibs.verify.harness import PostgresServer


def params(resource: str, i: int) -> dict[str, Any]:
    return {"r": resource, "sl": str(i), "h": "h", "st": "held", "ttl": 300, "rid": None,
            "fp": None, "retention": 86400.0, "now": None}  # fmt: skip


async def async_layers(
    url: str, schema: str, query: bytes, n: int
) -> dict[str, Callable[[str], Awaitable[None]]]:
    aconn = await psycopg.AsyncConnection.connect(url, autocommit=True)
    kept = aconn.cursor()
    pool: AsyncConnectionPool[Any] = AsyncConnectionPool(
        url, kwargs={"autocommit": True}, min_size=1, max_size=1, open=False
    )
    await pool.open(wait=True)
    store = await dibs.aio.open(f"{url}?schema={schema}&pool_min=1&pool_max=1").open()
    loop = asyncio.get_running_loop()
    cursors: dict[int, Any] = {}

    async def pooled_claim(resource: str, i: int) -> Any:
        conn = await pool.getconn()
        try:
            cur = cursors.get(id(conn)) or cursors.setdefault(id(conn), conn.cursor())
            await cur.execute(query, params(resource, i))
            return await cur.fetchone()
        finally:
            await pool.putconn(conn)

    async def plain(resource: str) -> None:
        for i in range(n):
            await kept.execute(query, params(resource, i))
            await kept.fetchone()

    async def with_pool(resource: str) -> None:
        for i in range(n):
            await pooled_claim(resource, i)

    async def with_task(resource: str) -> None:
        async def inner(i: int, answer: asyncio.Future[Any]) -> None:
            answer.set_result(await pooled_claim(resource, i))

        running = set()  # the store keeps its inner tasks so, too
        for i in range(n):
            answer = loop.create_future()
            task = loop.create_task(inner(i, answer))
            running.add(task)
            task.add_done_callback(running.discard)
            await answer

    async def store_claim(resource: str) -> None:
        for i in range(n):
            await store.claim(dibs.Unit(resource, str(i)), holder="h", ttl=300)

    async def close() -> None:
        await store.close()
        await pool.close()
        await aconn.close()

    layers = {"async psycopg": plain, "+ async pool": with_pool, "+ inner task": with_task,
              "dibs.aio": store_claim}  # fmt: skip
    layers["close"] = lambda _: close()
    return layers


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n", 1)[0])
    parser.add_argument("--claims", type=int, default=2000, help="claims per layer per round")
    parser.add_argument("--rounds", type=int, default=5, help="interleaved rounds")
    parser.add_argument("--loop", choices=["asyncio", "uvloop"], default="asyncio")
    args = parser.parse_args()
    n = args.claims
    cpu: dict[str, list[float]] = {}

    def timed(name: str, run: Callable[[], Any]) -> None:
        started = time.process_time()
        run()
        cpu.setdefault(name, []).append((time.process_time() - started) / n * 1e6)

    if args.loop == "uvloop":
        import uvloop

        loop = uvloop.new_event_loop()
    else:
        loop = asyncio.new_event_loop()
    with PostgresServer() as server:
        url = server.create_database("layers")
        schema = f"layers_{secrets.token_hex(3)}"
        with dibs.open(f"{url}?schema={schema}&pool_min=1&pool_max=1") as store:
            query = store._ops.sql.claim_fresh  # type: ignore[attr-defined]
            with psycopg.connect(url, autocommit=True) as conn:
                kept = conn.cursor()
                layers = loop.run_until_complete(async_layers(url, schema, query, n))

                def sync_plain(resource: str) -> None:
                    for i in range(n):
                        kept.execute(query, params(resource, i))
                        kept.fetchone()

                def sync_dibs(resource: str) -> None:
                    for i in range(n):
                        store.claim(dibs.Unit(resource, str(i)), holder="h", ttl=300)

                for r in range(args.rounds + 1):  # round 0 warms up and is not counted
                    sides: list[tuple[str, Callable[[str], Any]]] = [
                        ("sync psycopg", sync_plain), ("sync dibs", sync_dibs),
                        *((name, lambda res, f=f: loop.run_until_complete(f(res)))
                          for name, f in layers.items() if name != "close"),
                    ]  # fmt: skip
                    for name, run in sides:
                        resource = f"r{r}-{secrets.token_hex(3)}"
                        timed(name, lambda run=run, resource=resource: run(resource))
                loop.run_until_complete(layers["close"](""))
    loop.close()
    print(
        f"client CPU per claim, µs ({args.loop} loop, {n} claims per layer, "
        f"{args.rounds} interleaved rounds): median [rounds]"
    )
    for name, values in cpu.items():
        counted = values[1:]
        print(f"  {name:<14} {statistics.median(counted):6.0f}  {[round(v) for v in counted]}")


if __name__ == "__main__":
    main()
