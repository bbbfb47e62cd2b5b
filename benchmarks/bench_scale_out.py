"""Claims per second and latency on each engine dibs can spread over, at 1, 4 and 16 clients.

The figures behind docs/scale-out.md. Every engine runs on this machine, on
loopback, durable (fsync on), and is started privately by the script:

* ``sqlite``: one file, WAL, ``synchronous=full`` (durable against power loss);
* ``postgresql``: one primary, no standby;
* ``postgresql-sync``: a primary with two streaming standbys and
  ``synchronous_standby_names = 'ANY 1 (s1, s2)'`` (no claim is acknowledged
  before a standby has it);
* ``etcd-1`` and ``etcd-3``: etcd with one member and with three (Raft).

Each client is a thread with its own store handle's share of the pool; every
claim is a hold (TTL 30 s) on a unit no one else claims, so the figures are
the engine's cost of an uncontended claim, not of contention. Rounds of every
engine alternate (round 0 warms up and is not counted), and the script prints
medians with their ranges, and each engine's throughput as a ratio of one
PostgreSQL primary's in the same rounds: this machine is shared and noisy, so
only the ratios travel.

    python benchmarks/bench_scale_out.py
    python benchmarks/bench_scale_out.py --engines postgresql etcd-3 --clients 1 4 --repeat 3
    python benchmarks/bench_scale_out.py --json scale.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, ExitStack, contextmanager
from pathlib import Path
from typing import Any

import dibs

Starter = Callable[[], AbstractContextManager[str]]


@contextmanager
def _sqlite() -> Iterator[str]:
    with tempfile.TemporaryDirectory(prefix="dibs-scale-") as tmp:
        yield f"sqlite:///{tmp}/claims.db?synchronous=full"


@contextmanager
def _postgresql() -> Iterator[str]:
    from dibs.verify.harness import PostgresServer

    with PostgresServer(durable=True, settings={"max_connections": "100"}) as server:
        yield server.create_database("dibs_scale")


@contextmanager
def _postgresql_sync() -> Iterator[str]:
    from dibs.verify.harness import ReplicatedCluster

    with ReplicatedCluster(2, synchronous="ANY 1 (s1, s2)", durable=True) as cluster:
        yield cluster.url(cluster.create_database("dibs_scale"))


def _etcd(members: int) -> Starter:
    @contextmanager
    def start() -> Iterator[str]:
        from dibs.verify.harness import EtcdCluster

        # On disk, as PostgreSQL's and SQLite's data are, not in /dev/shm.
        with EtcdCluster(members, election_timeout=500, base_dir="/var/tmp") as cluster:
            yield cluster.url()

    return start


ENGINES: dict[str, Starter] = {
    "sqlite": _sqlite,
    "postgresql": _postgresql,
    "postgresql-sync": _postgresql_sync,
    "etcd-1": _etcd(1),
    "etcd-3": _etcd(3),
}


def run_round(
    store: dibs.Store, resource: str, clients: int, claims: int
) -> tuple[float, list[float]]:
    """``claims`` uncontended holds split over ``clients`` threads: (claims/s, latencies)."""
    per = max(1, claims // clients)
    latencies: list[list[float]] = [[] for _ in range(clients)]
    barrier = threading.Barrier(clients + 1)

    def client(n: int) -> None:
        mine = latencies[n]
        clock = time.perf_counter
        barrier.wait()
        for i in range(per):
            t0 = clock()
            result = store.claim(dibs.Unit(resource, f"{n}-{i}"), holder=f"h{n}", ttl=30)
            mine.append(clock() - t0)
            assert result, result

    threads = [threading.Thread(target=client, args=(n,)) for n in range(clients)]
    for t in threads:
        t.start()
    barrier.wait()
    start = time.perf_counter()
    for t in threads:
        t.join()
    elapsed = time.perf_counter() - start
    flat = [x for mine in latencies for x in mine]
    return len(flat) / elapsed, flat


def _quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--engines", nargs="+", default=list(ENGINES), choices=list(ENGINES))
    parser.add_argument("--clients", type=int, nargs="+", default=[1, 4, 16])
    parser.add_argument("--claims", type=int, default=600, help="claims per round and engine")
    parser.add_argument("--repeat", type=int, default=5, help="counted rounds (plus one warm-up)")
    parser.add_argument("--json", metavar="FILE", help="also write the figures as JSON")
    args = parser.parse_args()

    # rates[engine][clients] = [claims/s per round]; lat[...] = [(p50, p99) per round]
    rates: dict[str, dict[int, list[float]]] = {
        e: {c: [] for c in args.clients} for e in args.engines
    }
    lat: dict[str, dict[int, list[tuple[float, float]]]] = {
        e: {c: [] for c in args.clients} for e in args.engines
    }
    with ExitStack() as stack:
        stores: dict[str, dibs.Store] = {}
        for engine in args.engines:
            print(f"starting {engine} ...", file=sys.stderr, flush=True)
            url = stack.enter_context(ENGINES[engine]())
            extra = "" if engine.startswith(("sqlite", "etcd")) else "&pool_max=16"
            joiner = "&" if "?" in url else "?"
            full = url + (joiner + extra.lstrip("&") if extra else "")
            stores[engine] = stack.enter_context(dibs.open(full))
        for r in range(args.repeat + 1):
            for clients in args.clients:
                for engine in args.engines:
                    rate, latencies = run_round(
                        stores[engine], f"r{r}-c{clients}", clients, args.claims
                    )
                    if r:
                        rates[engine][clients].append(rate)
                        lat[engine][clients].append(
                            (_quantile(latencies, 0.5), _quantile(latencies, 0.99))
                        )
            print(f"round {r} done", file=sys.stderr, flush=True)

    med = statistics.median
    base = "postgresql" if "postgresql" in args.engines else args.engines[0]
    print(
        f"Uncontended holds, {args.claims} per round, {args.repeat} rounds interleaved; "
        f"medians [min-max]; ratio = throughput / {base}'s in the same round"
    )
    print(
        f"{'engine':<16} {'clients':>7} | {'claims/s':>22} | {'ratio':>16} | "
        f"{'p50 ms':>6} {'p99 ms':>7}"
    )
    series: list[dict[str, Any]] = []
    for engine in args.engines:
        for clients in args.clients:
            xs = rates[engine][clients]
            ratios = [a / b for a, b in zip(xs, rates[base][clients], strict=True)]
            p50 = med(x[0] for x in lat[engine][clients]) * 1e3
            p99 = med(x[1] for x in lat[engine][clients]) * 1e3
            print(
                f"{engine:<16} {clients:>7} | {med(xs):>8,.0f} [{min(xs):,.0f}-{max(xs):,.0f}] | "
                f"{med(ratios):>5.2f} [{min(ratios):.2f}-{max(ratios):.2f}] | "
                f"{p50:>6.1f} {p99:>7.1f}"
            )
            series.append(
                {"name": engine, "clients": clients, "throughput": med(xs),
                 "ratio": med(ratios), "p50_ms": p50, "p99_ms": p99}
            )  # fmt: skip
    if args.json:
        Path(args.json).write_text(
            json.dumps({"benchmark": "scale-out", "series": series}, indent=2)
        )


if __name__ == "__main__":
    main()
