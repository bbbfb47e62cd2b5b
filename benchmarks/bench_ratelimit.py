"""dibs.RateLimit against the ``limits`` library on a real Redis: decisions per second.

Each round runs every contender once, in turn (interleaved, so that a busy
machine slows them alike), and the script prints medians and ranges over the
rounds and the per-round ratio against ``limits``' moving window on Redis
(the peer that keeps the same guarantee: a log of admissions, at most the
limit in any window ending now).

Two workloads, each ``--ops`` decisions per process:

* **admit**: a rate so high (``10000/s``) that almost every decision admits:
  the cost of a grant.
* **refuse**: a key kept full (``10/minute``): every decision after the first
  ten refuses, the cost of saying "retry after t".

Contenders: dibs on memory:// (one process), on SQLite (a file on local disk,
its default durability) and on a private PostgreSQL (fsync on); on the same
PostgreSQL, GCRA as one atomic ``UPDATE`` of a table of its own (the
"dedicated step per store" alternative to slots as claims, for scale); ``limits``
``MovingWindowRateLimiter`` and ``FixedWindowRateLimiter`` on a private
``redis-server`` on loopback (no persistence: a rate limit's usual setting).
Each process opens its own store or client. With ``--procs 1 4`` the shared
contenders also run four processes hammering one key.

    python benchmarks/bench_ratelimit.py
    python benchmarks/bench_ratelimit.py --ops 2000 --repeat 5 --procs 1 4 --json out.json

Needs the ``bench`` extra (``limits``, ``redis``) and ``redis-server``
(``apt-get install -y redis-server``).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import secrets
import shutil
import statistics
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import dibs
from dibs.verify.harness import PostgresServer, free_ports

_spawn = multiprocessing.get_context("spawn")

RATES = {"admit": "10000/s", "refuse": "10/minute"}
LIMITS_RATES = {"admit": "10000/second", "refuse": "10/minute"}


@contextmanager
def redis_server() -> Iterator[str]:
    """A throwaway redis-server on loopback, no persistence; stopped on exit."""
    binary = shutil.which("redis-server")
    if binary is None:
        raise SystemExit("redis-server not found: apt-get install -y redis-server")
    workdir = tempfile.mkdtemp(prefix="dibs-bench-redis-")
    port = free_ports(1)[0]
    proc = subprocess.Popen(
        [binary, "--port", str(port), "--bind", "127.0.0.1", "--dir", workdir,
         "--save", "", "--appendonly", "no", "--daemonize", "no", "--logfile", ""],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )  # fmt: skip
    import redis

    url = f"redis://127.0.0.1:{port}/0"
    try:
        for _ in range(200):
            try:
                redis.Redis.from_url(url).ping()
                break
            except redis.ConnectionError:
                time.sleep(0.05)
        else:
            raise SystemExit("redis-server did not start")
        yield url
    finally:
        proc.terminate()
        proc.wait(10)
        shutil.rmtree(workdir, ignore_errors=True)


# --- one process's decisions ---------------------------------------------------------------------


def _dibs(url: str, workload: str, key: str) -> tuple[Callable[[], bool], Callable[[], None]]:
    store = dibs.open(url)
    limit = dibs.RateLimit(store, key, RATES[workload])
    return (lambda: bool(limit.acquire())), store.close


def _limits(url: str, workload: str, key: str, strategy: str) -> tuple[Callable[[], bool], Any]:
    from limits import parse, storage, strategies

    backend = storage.storage_from_string(url)
    cls = {"moving": strategies.MovingWindowRateLimiter,
           "fixed": strategies.FixedWindowRateLimiter}[strategy]  # fmt: skip
    limiter, item = cls(backend), parse(LIMITS_RATES[workload])
    return (lambda: limiter.hit(item, key)), (lambda: None)


GCRA_STEP = """
UPDATE bench_gcra SET tat = greatest(tat, clock_timestamp()) + %(t)s * interval '1 microsecond'
WHERE key = %(key)s
  AND greatest(tat, clock_timestamp()) - clock_timestamp()
      <= %(tolerance)s * interval '1 microsecond'
RETURNING tat
"""


def _gcra_step(url: str, workload: str, key: str) -> tuple[Callable[[], bool], Any]:
    """The alternative to slots as claims: GCRA as one atomic UPDATE of its own table.

    What a dedicated step per store would be on PostgreSQL: one statement, one durable
    commit per admission (autocommit), nothing written on a refusal.
    """
    import psycopg

    rate = dibs.Rate.parse(RATES[workload])
    t = rate.window_us // rate.limit  # the emission interval, µs
    conn = psycopg.connect(url.partition("?")[0], autocommit=True)
    conn.execute("CREATE TABLE IF NOT EXISTS bench_gcra (key text PRIMARY KEY, tat timestamptz)")
    conn.execute(
        "INSERT INTO bench_gcra VALUES (%s, clock_timestamp()) ON CONFLICT DO NOTHING", (key,)
    )
    params = {"t": t, "key": key, "tolerance": rate.window_us - t}
    return (lambda: conn.execute(GCRA_STEP, params).fetchone() is not None), conn.close


def _worker(contender: str, url: str, workload: str, key: str, ops: int, out: Any) -> None:
    if contender == "gcra-step-postgresql":
        decide, close = _gcra_step(url, workload, key)
    elif contender.startswith("limits-"):
        decide, close = _limits(url, workload, key, contender.removeprefix("limits-"))
    else:
        decide, close = _dibs(url, workload, key)
    decide()  # connect and warm up outside the timed part
    admitted = 0
    began = time.perf_counter()
    for _ in range(ops):
        admitted += decide()
    elapsed = time.perf_counter() - began
    close()
    out.put((ops / elapsed, admitted))


def run(contender: str, url: str, workload: str, procs: int, ops: int) -> float:
    """Decisions per second over ``procs`` processes on one fresh key."""
    key = f"bench-{secrets.token_hex(4)}"
    if contender == "dibs-memory":  # one process: a memory store is not shared
        out: Any = _Local()
        _worker(contender, url, workload, key, ops, out)
        return float(out.items[0][0])
    queue = _spawn.Queue()
    workers = [
        _spawn.Process(target=_worker, args=(contender, url, workload, key, ops, queue))
        for _ in range(procs)
    ]
    for w in workers:
        w.start()
    rates = [queue.get(timeout=600)[0] for _ in workers]
    for w in workers:
        w.join()
    return float(sum(rates))


class _Local:
    def __init__(self) -> None:
        self.items: list[tuple[float, int]] = []

    def put(self, item: tuple[float, int]) -> None:
        self.items.append(item)


def _summary(values: list[float]) -> str:
    return f"{statistics.median(values):>10,.0f}  ({min(values):,.0f} to {max(values):,.0f})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ops", type=int, default=2000, help="decisions per process per round")
    parser.add_argument("--repeat", type=int, default=5, help="rounds")
    parser.add_argument("--procs", type=int, nargs="+", default=[1, 4])
    parser.add_argument("--workloads", nargs="+", default=["admit", "refuse"])
    parser.add_argument("--json", help="write the figures here")
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="dibs-bench-rate-"))
    figures: dict[str, Any] = {}
    try:
        with PostgresServer(durable=True) as server, redis_server() as rd:
            pg = server.create_database("dibs_rate")
            urls = {
                "dibs-memory": "memory://",
                "dibs-sqlite": f"sqlite:///{tmp / 'rate.db'}",
                "dibs-postgresql": f"{pg}?pool_min=1&pool_max=1",
                "gcra-step-postgresql": pg,
                "limits-moving": rd,
                "limits-fixed": rd,
            }
            for name in ("dibs-sqlite", "dibs-postgresql"):
                dibs.open(urls[name]).close()  # the schema, before processes race to make it
            for workload in args.workloads:
                for procs in args.procs:
                    names = [n for n in urls if procs == 1 or n != "dibs-memory"]
                    got: dict[str, list[float]] = {n: [] for n in names}
                    for _ in range(args.repeat):
                        for name in names:
                            got[name].append(run(name, urls[name], workload, procs, args.ops))
                    base = got["limits-moving"]
                    print(f"\n{workload} ({RATES[workload]}), {procs} process(es), "
                          f"{args.ops} decisions each, {args.repeat} rounds: decisions/s "
                          "median (range), ratio to limits-moving median (range)")  # fmt: skip
                    for name in names:
                        r = [a / b for a, b in zip(got[name], base, strict=True)]
                        print(f"  {name:<21} {_summary(got[name])}   x{statistics.median(r):.2f}"
                              f" ({min(r):.2f} to {max(r):.2f})")  # fmt: skip
                    figures[f"{workload}/{procs}"] = got
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    if args.json:
        Path(args.json).write_text(json.dumps(figures, indent=2))


if __name__ == "__main__":
    main()
