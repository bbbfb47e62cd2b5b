"""Single-unit claims per second on PostgreSQL: ``await store.claim`` vs the sync store.

The async store (``dibs.aio.open``, native on psycopg's async pool) and the
sync store (``dibs.open``) claim distinct units on the same server, in rounds
that alternate between them:

* 1 client: one task awaiting ``store.claim`` in a loop, against one thread
  calling it (goal: async >= 90 % of sync);
* 16 clients: 16 tasks on one event loop in one process, against 16 threads
  sharing one sync store (goal: async >= sync).

Each store has a pool of as many connections as clients. The script prints,
per client count, the median throughput of each, the median of per-round
ratios with their range, and the median p99 latencies: this machine is shared
and noisy, so a single round means little.

    python benchmarks/bench_aio_postgres.py                    # private server, fsync off
    python benchmarks/bench_aio_postgres.py --clients 1 16 --claims 4000 --repeat 7
    python benchmarks/bench_aio_postgres.py --url postgresql://user:pw@host/db
    python benchmarks/bench_aio_postgres.py --json aio-postgres.json   # for benchmarks/plot.py
    python benchmarks/bench_aio_postgres.py --loop uvloop      # the async side on uvloop
    python benchmarks/bench_aio_postgres.py --async-store threaded   # see below

``--async-store threaded`` replaces the native async store with dibs's
``ThreadedStore`` over a sync PostgreSQL store (its calls on worker threads, as
``dibs.aio`` runs SQLite): a measurement of the other async I/O path, not
something ``dibs.aio.open`` does for PostgreSQL.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import secrets
import statistics
import sys
import time
from collections.abc import Callable
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import psycopg

import dibs
import dibs.aio

# The throwaway server lives with the tests; run_round and p99 with the sync benchmark.
sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_postgres import p99, run_round
from dibs.stores.threaded import ThreadedStore
from dibs.verify.harness import PostgresServer


async def async_round(
    store: dibs.aio.AsyncStore, resource: str, clients: int, claims: int
) -> tuple[float, list[float]]:
    """Run ``claims`` awaited claims split over ``clients`` tasks; return (claims/s, latencies)."""
    per = claims // clients
    latencies: list[list[float]] = [[] for _ in range(clients)]

    async def client(n: int) -> None:
        mine = latencies[n]
        clock = time.perf_counter
        for i in range(per):
            t0 = clock()
            result = await store.claim(dibs.Unit(resource, f"{n}-{i}"), holder=f"h{n}", ttl=300)
            mine.append(clock() - t0)
            assert result

    start = time.perf_counter()
    await asyncio.gather(*(client(n) for n in range(clients)))
    elapsed = time.perf_counter() - start
    flat = [x for per_client in latencies for x in per_client]
    return len(flat) / elapsed, flat


def loop_factory(name: str) -> Callable[[], asyncio.AbstractEventLoop]:
    """``asyncio``'s default event loop, or uvloop's (installed separately)."""
    if name == "uvloop":
        import uvloop

        return uvloop.new_event_loop
    return asyncio.new_event_loop


def bench(
    url: str,
    tag: str,
    clients: int,
    claims: int,
    repeat: int,
    new_loop: Callable[[], asyncio.AbstractEventLoop],
    async_kind: str = "native",
) -> tuple[str, list[Any]]:
    """Alternate sync and async rounds at one client count; return the row and series."""
    options = f"schema=bench_{tag}&pool_min={clients}&pool_max={clients}"
    loop = new_loop()
    sync_store = dibs.open(f"{url}?{options}")
    async_store: Any
    if async_kind == "threaded":
        inner = dibs.open(f"{url}?{options}")
        async_store = ThreadedStore(None, {}, store=inner, threads=clients)
    else:
        async_store = loop.run_until_complete(dibs.aio.open(f"{url}?{options}").open())
    rounds: list[tuple[float, float, float, float]] = []
    cpu: list[tuple[float, float]] = []  # client CPU µs per claim: async, sync
    try:
        for r in range(repeat + 1):  # round 0 warms both up and is not counted
            resource = f"c{clients}-r{r}-{secrets.token_hex(2)}"

            def claim(n: int, i: int, resource: str = resource) -> None:
                result = sync_store.claim(
                    dibs.Unit(resource + "s", f"{n}-{i}"), holder=f"h{n}", ttl=300
                )
                assert result

            cpu0 = time.process_time()
            s_rate, s_lat = run_round(claim, clients, claims)
            cpu1 = time.process_time()
            a_rate, a_lat = loop.run_until_complete(
                async_round(async_store, resource + "a", clients, claims)
            )
            cpu2 = time.process_time()
            if r:
                rounds.append((a_rate, s_rate, p99(a_lat), p99(s_lat)))
                cpu.append(((cpu2 - cpu1) / claims * 1e6, (cpu1 - cpu0) / claims * 1e6))
    finally:
        loop.run_until_complete(async_store.close())
        loop.close()
        sync_store.close()
    med = statistics.median
    ratios = [x[0] / x[1] for x in rounds]
    row = (
        f"{clients:>7} | {med(x[0] for x in rounds):>8,.0f} {med(x[1] for x in rounds):>8,.0f} "
        f"{med(ratios):>6.0%} ({min(ratios):.0%}-{max(ratios):.0%}) | "
        f"{med(x[2] for x in rounds) * 1e3:>7.2f}ms {med(x[3] for x in rounds) * 1e3:>7.2f}ms | "
        f"{med(c[0] for c in cpu):>5.0f} {med(c[1] for c in cpu):>5.0f} µs"
    )
    series = [
        {"name": "dibs.aio postgresql:// (tasks)", "clients": clients,
         "throughput": med(x[0] for x in rounds), "p99_ms": med(x[2] for x in rounds) * 1e3,
         "ratio_median": med(ratios), "ratio_min": min(ratios), "ratio_max": max(ratios),
         "cpu_us_per_claim": med(c[0] for c in cpu)},
        {"name": "dibs postgresql:// (threads)", "clients": clients,
         "throughput": med(x[1] for x in rounds), "p99_ms": med(x[3] for x in rounds) * 1e3,
         "cpu_us_per_claim": med(c[1] for c in cpu)},
    ]  # fmt: skip
    return row, series


def driver_floor(
    url: str, queries: int, repeat: int, new_loop: Callable[[], asyncio.AbstractEventLoop]
) -> str:
    """psycopg itself, one connection, ``SELECT 1`` round trips: async vs sync, interleaved.

    The ceiling of any async store on this driver at one client: the async
    connection's own cost per round trip, without dibs.
    """
    loop = new_loop()
    aconn = loop.run_until_complete(psycopg.AsyncConnection.connect(url, autocommit=True))
    sconn = psycopg.connect(url, autocommit=True)

    async def many() -> None:
        for _ in range(queries):
            await (await aconn.execute(b"SELECT 1")).fetchone()

    ratios, cpus = [], []
    try:
        for r in range(repeat + 1):
            c0, t0 = time.process_time(), time.perf_counter()
            for _ in range(queries):
                sconn.execute(b"SELECT 1").fetchone()
            c1, t1 = time.process_time(), time.perf_counter()
            loop.run_until_complete(many())
            c2, t2 = time.process_time(), time.perf_counter()
            if r:
                ratios.append((t1 - t0) / (t2 - t1))
                cpus.append(((c2 - c1) / queries * 1e6, (c1 - c0) / queries * 1e6))
    finally:
        sconn.close()
        loop.run_until_complete(aconn.close())
        loop.close()
    med = statistics.median
    return (
        f"psycopg alone, 1 connection, SELECT 1: async/sync {med(ratios):.0%} "
        f"({min(ratios):.0%}-{max(ratios):.0%}); client CPU per query "
        f"{med(c[0] for c in cpus):.0f} µs async, {med(c[1] for c in cpus):.0f} µs sync"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--url", help="an existing database (default: a private server)")
    parser.add_argument("--clients", type=int, nargs="+", default=[1, 16])
    parser.add_argument("--claims", type=int, default=3200, help="claims per round")
    parser.add_argument("--repeat", type=int, default=7, help="rounds of each, interleaved")
    parser.add_argument("--durable", action="store_true", help="fsync on (private server)")
    parser.add_argument("--json", metavar="FILE", help="also write the figures as JSON")
    parser.add_argument(
        "--loop", choices=["asyncio", "uvloop"], default="asyncio", help="the async side's loop"
    )
    parser.add_argument(
        "--async-store",
        choices=["native", "threaded"],
        default="native",
        help="the async side: dibs.aio's native store, or ThreadedStore over a sync store",
    )
    args = parser.parse_args()

    with ExitStack() as stack:
        if args.url:
            url = args.url
            where = "existing server"
        else:
            server = stack.enter_context(
                PostgresServer(durable=args.durable, settings={"max_connections": "100"})
            )
            url = server.create_database("dibs_bench")
            where = f"private server, fsync {'on' if args.durable else 'off'}"
        tag = secrets.token_hex(3)
        new_loop = loop_factory(args.loop)
        print(
            f"PostgreSQL ({where}); {args.loop} event loop, {args.async_store} async store; "
            f"{args.claims} claims per round,"
        )
        print(f"{args.repeat} rounds of async and sync, interleaved; medians (ratio range)")
        print(
            f"{'clients':>7} | {'async/s':>8} {'sync/s':>8} {'ratio':>6} {'':>11} | "
            f"{'async p99':>9} {'sync p99':>9} | client CPU/claim async sync"
        )
        series: list[Any] = []
        for clients in args.clients:
            row, more = bench(
                url, tag, clients, args.claims, args.repeat, new_loop, args.async_store
            )
            print(row, flush=True)
            series += more
        print(driver_floor(url, args.claims, args.repeat, new_loop), flush=True)
        if args.json:
            Path(args.json).write_text(
                json.dumps({"benchmark": "dibs.aio on PostgreSQL", "series": series}, indent=2)
            )


if __name__ == "__main__":
    main()
