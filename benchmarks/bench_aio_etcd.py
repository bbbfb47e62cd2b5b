"""Per-call cost on etcd: ``await store.<op>`` (``dibs.aio.open``) vs the sync store.

One caller, no concurrency: the async etcd store (its plans awaited on an
``httpx.AsyncClient``) and the sync one (the same plans on a blocking
``httpx.Client``) each run ``--calls`` claims (holds, distinct units and
holders), then as many ``get``, ``claims_of``, ``confirm`` and ``release``
calls on what they claimed. Rounds alternate sync and async (which goes
first alternates too); round 0 warms both up and is not counted.

Per operation the script prints the median client CPU (``process_time``) and
wall time per call of each face, and the medians and ranges of the per-round
async ÷ sync ratios (above 1: async costs more). This machine is shared and
noisy: a single round means little.

    python benchmarks/bench_aio_etcd.py                      # private 1-member cluster
    python benchmarks/bench_aio_etcd.py --calls 500 --repeat 7
    python benchmarks/bench_aio_etcd.py --url etcd://127.0.0.1:2379
    python benchmarks/bench_aio_etcd.py --profile aio.prof   # cProfile one async round

The last line is the floor: httpx alone, one ``/v3/kv/range`` POST on its
transport (as the drivers send them) in a loop, async vs sync, interleaved
the same way: what httpcore's async path (anyio locks, cancel scopes and
timeouts per read and write) costs per request without dibs.

The private member keeps its data on /dev/shm when it exists, so the disk's
fsync is not measured; both faces pay the same Raft round trips.
"""

from __future__ import annotations

import argparse
import asyncio
import secrets
import statistics
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import httpx

import dibs
import dibs.aio
from dibs.verify.harness import EtcdCluster

OPS = ("claim", "get", "claims_of", "confirm", "release")

Costs = dict[str, tuple[float, float]]  # op -> (CPU s, wall s) for the whole round


@contextmanager
def timed(costs: Costs, op: str) -> Iterator[None]:
    c0, t0 = time.process_time(), time.perf_counter()
    yield
    costs[op] = (time.process_time() - c0, time.perf_counter() - t0)


def sync_round(store: dibs.Store, tag: str, calls: int) -> Costs:
    costs: Costs = {}
    claims = []
    with timed(costs, "claim"):
        for i in range(calls):
            claims.append(store.claim(dibs.Unit(tag, str(i)), holder=f"{tag}-{i}", ttl=300).claim)
    with timed(costs, "get"):
        for c in claims:
            assert store.get(c.id) is not None
    with timed(costs, "claims_of"):
        for c in claims:
            assert store.claims_of(c.holder)
    with timed(costs, "confirm"):
        for c in claims:
            store.confirm(c.id, holder=c.holder, fence=c.fence)
    with timed(costs, "release"):
        for c in claims:
            assert store.release(c.id, holder=c.holder, fence=c.fence)
    return costs


async def async_round(store: dibs.aio.AsyncStore, tag: str, calls: int) -> Costs:
    costs: Costs = {}
    claims = []
    with timed(costs, "claim"):
        for i in range(calls):
            result = await store.claim(dibs.Unit(tag, str(i)), holder=f"{tag}-{i}", ttl=300)
            claims.append(result.claim)
    with timed(costs, "get"):
        for c in claims:
            assert await store.get(c.id) is not None
    with timed(costs, "claims_of"):
        for c in claims:
            assert await store.claims_of(c.holder)
    with timed(costs, "confirm"):
        for c in claims:
            await store.confirm(c.id, holder=c.holder, fence=c.fence)
    with timed(costs, "release"):
        for c in claims:
            assert await store.release(c.id, holder=c.holder, fence=c.fence)
    return costs


def floor(endpoint: str, calls: int, repeat: int) -> str:
    """httpx alone: the same gateway read on each face's transport, CPU and wall per request."""
    body = {"key": "Zmxvb3I="}  # base64 of "floor": absent, a short answer

    def request() -> httpx.Request:
        return httpx.Request("POST", f"{endpoint}/v3/kv/range", json=body)

    loop = asyncio.new_event_loop()
    sync_t, async_t = httpx.HTTPTransport(), httpx.AsyncHTTPTransport()

    def sync_many() -> None:
        for _ in range(calls):
            response = sync_t.handle_request(request())
            response.read()

    async def async_many() -> None:
        for _ in range(calls):
            response = await async_t.handle_async_request(request())
            await response.aread()

    cpu, wall = [], []
    try:
        for r in range(repeat + 1):
            costs: Costs = {}
            for face in ("sync", "async") if r % 2 == 0 else ("async", "sync"):
                with timed(costs, face):
                    sync_many() if face == "sync" else loop.run_until_complete(async_many())
            if r:
                cpu.append(costs["async"][0] / costs["sync"][0])
                wall.append(costs["async"][1] / costs["sync"][1])
    finally:
        sync_t.close()
        loop.run_until_complete(async_t.aclose())
        loop.close()
    med = statistics.median
    return (
        f"httpx alone, one POST per call: aio/sync CPU {med(cpu):.2f} ({min(cpu):.2f}-"
        f"{max(cpu):.2f}), wall {med(wall):.2f} ({min(wall):.2f}-{max(wall):.2f})"
    )


def bench(url: str, calls: int, repeat: int, profile: str | None) -> None:
    loop = asyncio.new_event_loop()
    sync_store = dibs.open(url)
    async_store = loop.run_until_complete(dibs.aio.open(url).open())
    rounds: list[tuple[Costs, Costs]] = []  # (async, sync)
    try:
        for r in range(repeat + 1):
            tag = f"r{r}-{secrets.token_hex(3)}"

            def run_async(tag: str = tag) -> Costs:
                return loop.run_until_complete(async_round(async_store, "a" + tag, calls))

            def run_sync(tag: str = tag) -> Costs:
                return sync_round(sync_store, "s" + tag, calls)

            if r % 2:
                a, s = run_async(), run_sync()
            else:
                s, a = run_sync(), run_async()
            if r:
                rounds.append((a, s))
        if profile:
            import cProfile

            profiler = cProfile.Profile(time.process_time)
            profiler.enable()
            loop.run_until_complete(async_round(async_store, "p" + secrets.token_hex(3), calls))
            profiler.disable()
            profiler.dump_stats(profile)
    finally:
        loop.run_until_complete(async_store.close())
        loop.close()
        sync_store.close()
    report(rounds, calls)
    endpoint = "http://" + url.removeprefix("etcd://").split("/")[0].split(",")[0].split("?")[0]
    print(floor(endpoint, calls, repeat))


def report(rounds: list[tuple[Costs, Costs]], calls: int) -> None:
    med = statistics.median
    us = 1e6 / calls
    print(f"{calls} calls per op per round, {len(rounds)} rounds; µs per call (median)")
    print(
        f"{'op':>9} | {'CPU aio':>7} {'sync':>6} {'aio/sync':>17} | "
        f"{'wall aio':>8} {'sync':>6} {'aio/sync':>17}"
    )

    def ratio(values: list[float]) -> str:
        return f"{med(values):>5.2f} ({min(values):.2f}-{max(values):.2f})"

    totals: list[tuple[list[float], list[float]]] = []
    for op in OPS:
        cpu = [a[op][0] / s[op][0] for a, s in rounds]
        wall = [a[op][1] / s[op][1] for a, s in rounds]
        totals.append((cpu, wall))
        print(
            f"{op:>9} | {med(a[op][0] for a, _ in rounds) * us:>7.0f} "
            f"{med(s[op][0] for _, s in rounds) * us:>6.0f} {ratio(cpu):>17} | "
            f"{med(a[op][1] for a, _ in rounds) * us:>8.0f} "
            f"{med(s[op][1] for _, s in rounds) * us:>6.0f} {ratio(wall):>17}"
        )
    cpu_all = [sum(a[op][0] for op in OPS) / sum(s[op][0] for op in OPS) for a, s in rounds]
    wall_all = [sum(a[op][1] for op in OPS) / sum(s[op][1] for op in OPS) for a, s in rounds]
    print(f"{'all':>9} | {'':>14} {ratio(cpu_all):>17} | {'':>15} {ratio(wall_all):>17}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--url", help="an existing cluster (default: a private member)")
    parser.add_argument("--calls", type=int, default=500, help="calls per op per round")
    parser.add_argument("--repeat", type=int, default=5, help="rounds of each, interleaved")
    parser.add_argument("--profile", metavar="FILE", help="cProfile one more async round")
    args = parser.parse_args()
    run: Callable[[str], None] = lambda url: bench(url, args.calls, args.repeat, args.profile)  # noqa: E731
    if args.url:
        run(args.url)
        return
    with EtcdCluster(1, name="bench", base_dir=_shm()) as running:
        run(running.url("bench-" + secrets.token_hex(3)))


def _shm() -> Any:
    import os

    return "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None


if __name__ == "__main__":
    main()
