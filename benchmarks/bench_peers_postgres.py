"""dibs on PostgreSQL against the tools users would pick instead, interleaved.

Two workloads, each run alternately with its peer, round after round, on a
private durable PostgreSQL (fsync on, synchronous_commit on) and a private
``redis-server`` on loopback with AOF and ``appendfsync always`` (so both
acknowledge only what reached the disk):

* **pairs**: hold then confirm one unit, as a checkout does. dibs:
  ``store.claim(Unit, holder, ttl=300)`` then ``store.confirm(...)``. Redis:
  ``SET key holder NX PX 300000`` then a Lua script that confirms (``PERSIST``)
  only if the key still holds the holder. Pairs per second over all
  processes, at 1 and 8 processes.
* **replay**: the retry of a request that already succeeded. dibs:
  ``store.claim(..., request_id=...)`` answering ``replayed``. AWS Lambda
  Powertools' ``idempotent_function`` on its Redis persistence layer answering
  from the stored record. Replays per second.
* **idem-first** and **idem-replay**: ``@dibs.idempotent`` against Powertools'
  ``idempotent_function`` on the same Redis, a function that returns a small
  dict: first calls (a new key each: the function runs and its result is
  stored), and replays of keys stored before the round. Calls per second.

Each process opens its own store or client. Rounds alternate dibs and peer;
the script prints medians and ranges of throughput and p99, the per-round
ratio dibs ÷ peer, and the server-side cost of dibs per operation: WAL bytes
(``pg_current_wal_lsn()`` before and after) and transactions committed
(``pg_stat_database.xact_commit``, read after the workers' sessions end so that
their counters are flushed).

    python benchmarks/bench_peers_postgres.py
    python benchmarks/bench_peers_postgres.py --procs 1 8 --ops 2000 --repeat 5 --json out.json
    python benchmarks/bench_peers_postgres.py --workloads pairs --fsyncs   # + fsyncs per pair

``--base SRC`` also runs the pairs' and the idem workloads' dibs side with the
dibs in another checkout's ``src`` (each of its workers imports that one),
interleaved with this checkout's (the base first every other round), and
prints this ÷ base per round: an A/B in one command.

    mkdir /tmp/base && git archive main src | tar -x -C /tmp/base
    python benchmarks/bench_peers_postgres.py --workloads idem-first idem-replay \
        --procs 1 8 --ops 400 --repeat 5 --base /tmp/base/src
    python benchmarks/bench_peers_postgres.py --workloads pairs --procs 1 8 --ops 400 \
        --repeat 5 --base /tmp/base/src
"""

from __future__ import annotations

import argparse
import importlib
import json
import multiprocessing
import os
import secrets
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import psycopg

import dibs
from dibs.verify.harness import PostgresServer

_spawn = multiprocessing.get_context("spawn")

CONFIRM_LUA = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('PERSIST', KEYS[1])
  return 1
end
return 0
"""


# --- a private redis-server ------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def redis_server() -> Iterator[str]:
    """A throwaway redis-server on loopback, AOF with fsync on every write."""
    binary = shutil.which("redis-server")
    if binary is None:
        raise SystemExit("redis-server not found: apt-get install -y redis-server")
    workdir = tempfile.mkdtemp(prefix="dibs-bench-redis-")
    port = _free_port()
    proc = subprocess.Popen(
        [
            binary,
            "--port",
            str(port),
            "--bind",
            "127.0.0.1",
            "--dir",
            workdir,
            "--appendonly",
            "yes",
            "--appendfsync",
            "always",
            "--save",
            "",
            "--protected-mode",
            "yes",
            "--daemonize",
            "no",
            "--logfile",
            "",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
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


# --- the workers (one process each) ------------------------------------------------------------


def _dibs_pairs(url: str, tag: str, n: int, ops: int) -> Callable[[int], None]:
    lib: Any = importlib.import_module("dibs")  # at call time: --base may have swapped it
    store = lib.open(f"{url}?schema=peers_{tag}&pool_min=1&pool_max=1")

    def op(i: int) -> None:
        claim = store.claim(lib.Unit(f"seat-{n}", f"{tag}-{i}"), holder=f"h{n}", ttl=300).claim
        assert claim is not None
        store.confirm(claim.id, holder=f"h{n}", fence=claim.fence)

    return op


def _redis_pairs(url: str, tag: str, n: int, ops: int) -> Callable[[int], None]:
    import redis

    client = redis.Redis.from_url(url)
    confirm = client.register_script(CONFIRM_LUA)

    def op(i: int) -> None:
        key = f"seat-{n}:{tag}-{i}"
        assert client.set(key, f"h{n}", nx=True, px=300_000)
        assert confirm(keys=[key], args=[f"h{n}"]) == 1

    return op


def _dibs_replay(url: str, tag: str, n: int, ops: int) -> Callable[[int], None]:
    store = dibs.open(f"{url}?schema=peers_{tag}&pool_min=1&pool_max=1")
    unit, rid = dibs.Unit(f"order-{n}", tag), f"req-{tag}-{n}"
    assert store.claim(unit, holder=f"h{n}", ttl=300, request_id=rid)

    def op(i: int) -> None:
        assert store.claim(unit, holder=f"h{n}", ttl=300, request_id=rid).replayed

    return op


def _powertools_replay(url: str, tag: str, n: int, ops: int) -> Callable[[int], None]:
    import redis
    from aws_lambda_powertools.utilities.idempotency import IdempotencyConfig, idempotent_function
    from aws_lambda_powertools.utilities.idempotency.persistence.redis import (
        RedisCachePersistenceLayer,
    )

    layer = RedisCachePersistenceLayer(client=redis.Redis.from_url(url))
    config = IdempotencyConfig(expires_after_seconds=3600)

    @idempotent_function(data_keyword_argument="order", persistence_store=layer, config=config)
    def place(order: dict[str, Any]) -> dict[str, Any]:
        return {"order": order["id"], "holder": order["holder"], "unit": order["unit"]}

    order = {"id": f"req-{tag}-{n}", "holder": f"h{n}", "unit": f"order-{n}"}
    place(order=order)

    def op(i: int) -> None:
        assert place(order=order)["order"] == order["id"]

    return op


def _dibs_idem(url: str, tag: str, n: int, ops: int, replay: bool) -> Callable[[int], None]:
    # Looked up now, not at import: with --base the worker has swapped in the other dibs.
    lib: Any = importlib.import_module("dibs")
    store = lib.open(f"{url}?schema=peers_{tag}&pool_min=1&pool_max=1")

    @lib.idempotent(store, key="order_id", name=f"peers.{n}")
    def place(order_id: str, cents: int) -> dict[str, Any]:
        return {"order": order_id, "cents": cents}

    for i in range(ops if replay else 20):  # replays: the keys; first calls: a warm-up
        place(f"{'o' if replay else 'warm'}-{i}", 1250)

    def op(i: int) -> None:
        assert place(f"o-{i}", 1250)["order"] == f"o-{i}"

    return op


def _powertools_idem(url: str, tag: str, n: int, ops: int, replay: bool) -> Callable[[int], None]:
    import redis
    from aws_lambda_powertools.utilities.idempotency import IdempotencyConfig, idempotent_function
    from aws_lambda_powertools.utilities.idempotency.persistence.redis import (
        RedisCachePersistenceLayer,
    )

    layer = RedisCachePersistenceLayer(client=redis.Redis.from_url(url))
    config = IdempotencyConfig(expires_after_seconds=3600)

    @idempotent_function(data_keyword_argument="order", persistence_store=layer, config=config)
    def place(order: dict[str, Any]) -> dict[str, Any]:
        return {"order": order["id"], "cents": order["cents"]}

    def order(i: int, kind: str = "o") -> dict[str, Any]:
        return {"id": f"{tag}-{n}-{kind}-{i}", "cents": 1250}

    for i in range(ops if replay else 20):
        place(order=order(i, "o" if replay else "warm"))

    def op(i: int) -> None:
        assert place(order=order(i))["order"] == order(i)["id"]

    return op


WORKERS: dict[str, Callable[[str, str, int, int], Callable[[int], None]]] = {
    "dibs_pairs": _dibs_pairs,
    "redis_pairs": _redis_pairs,
    "dibs_replay": _dibs_replay,
    "powertools_replay": _powertools_replay,
    "dibs_idem_first": lambda *a: _dibs_idem(*a, replay=False),
    "dibs_idem_replay": lambda *a: _dibs_idem(*a, replay=True),
    "powertools_idem_first": lambda *a: _powertools_idem(*a, replay=False),
    "powertools_idem_replay": lambda *a: _powertools_idem(*a, replay=True),
}


PAIRS = {
    "pairs": ("dibs_pairs", "redis_pairs"),
    "replay": ("dibs_replay", "powertools_replay"),
    "idem-first": ("dibs_idem_first", "powertools_idem_first"),
    "idem-replay": ("dibs_idem_replay", "powertools_idem_replay"),
}
"""Each workload's two contenders: dibs's worker, the peer's."""


def _use_dibs_from(src: str) -> None:
    """Make ``import dibs`` in this (worker) process load the dibs in ``src``."""
    for name in [m for m in sys.modules if m == "dibs" or m.startswith("dibs.")]:
        del sys.modules[name]
    sys.path.insert(0, src)


def _worker(kind: str, url: str, tag: str, n: int, ops: int, barrier: Any, out: Any) -> None:
    import warnings

    # Powertools warns that no Lambda context tells it the time left: none here.
    warnings.filterwarnings("ignore", message="Couldn't determine the remaining time")
    kind, _, src = kind.partition("@")  # "dibs_idem_first@/other/src": that checkout's dibs
    if src:
        _use_dibs_from(src)
    op = WORKERS[kind](url, tag, n, ops)
    clock = time.perf_counter
    lat: list[float] = []
    barrier.wait()
    for i in range(ops):
        t0 = clock()
        op(i)
        lat.append(clock() - t0)
    out.put(lat)


def run_round(kind: str, url: str, procs: int, ops: int) -> tuple[float, float]:
    """``procs`` processes doing ``ops`` operations each; returns (ops/s, p99 seconds)."""
    tag = secrets.token_hex(4)
    barrier = _spawn.Barrier(procs + 1)
    out = _spawn.Queue()
    workers = [
        _spawn.Process(target=_worker, args=(kind, url, tag, n, ops, barrier, out))
        for n in range(procs)
    ]
    for w in workers:
        w.start()
    barrier.wait()
    start = time.perf_counter()
    lats = [out.get() for _ in workers]
    elapsed = time.perf_counter() - start
    for w in workers:
        w.join()
    flat = [x for per in lats for x in per]
    return len(flat) / elapsed, statistics.quantiles(flat, n=100)[98]


# --- server-side cost of dibs ------------------------------------------------------------------


def server_cost(kind: str, url: str, ops: int) -> tuple[float, float, float]:
    """WAL bytes, commits and write transactions per operation of one dibs worker.

    Commits count every committed transaction (read-only ones too, and any
    autovacuum worker's); write transactions are transaction IDs assigned,
    which is what writes a commit record and waits for the WAL flush.
    """
    tag = secrets.token_hex(4)

    def read() -> tuple[int, int, int]:
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute("SELECT pg_stat_clear_snapshot()")
            row = conn.execute(
                "SELECT pg_current_wal_lsn() - '0/0'::pg_lsn, xact_commit, "
                "pg_snapshot_xmax(pg_current_snapshot())::text::bigint "
                "FROM pg_stat_database WHERE datname = current_database()"
            ).fetchone()
        assert row is not None
        return int(row[0]), int(row[1]), int(row[2])

    op = WORKERS[kind](url, tag, 0, ops)
    time.sleep(1.1)  # let the setup's counters reach the stats
    wal0, commits0, xid0 = read()
    for i in range(ops):
        op(i)
    wal1, _, xid1 = read()  # WAL first: the reads below write none
    del op
    import gc

    gc.collect()  # closes the worker's store: its session flushes its counters
    time.sleep(1.1)
    _, commits1, _ = read()
    # Each read() is one read-only transaction of its own: two fall in the window.
    return (wal1 - wal0) / ops, (commits1 - commits0 - 2) / ops, (xid1 - xid0) / ops


def _wal_syncs(url: str) -> int:
    """The cluster's WAL fsyncs so far (``pg_stat_wal.wal_sync``, every process's)."""
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute("SELECT wal_sync FROM pg_stat_wal").fetchone()
    assert row is not None
    return int(row[0])


def fsyncs_per_op(kind: str, url: str, procs: int, ops: int) -> float | None:
    """Untimed: fsyncs per operation of one round, counted on the server's side.

    PostgreSQL: ``pg_stat_wal.wal_sync`` (each a WAL ``fdatasync``), read once the
    workers' sessions have ended and reported. Redis: ``fdatasync`` calls of
    ``redis-server``, counted with ``strace -c`` (None without strace). Either
    way one fsync may carry several clients' commits (group commit).
    """
    if kind.startswith("dibs"):
        before = _wal_syncs(url)
        run_round(kind, url, procs, ops)
        time.sleep(1.1)  # the walwriter reports its own syncs at most once a second
        return (_wal_syncs(url) - before) / (procs * ops)
    import redis

    strace = shutil.which("strace")
    if strace is None:
        return None
    pid = redis.Redis.from_url(url).info()["process_id"]
    with tempfile.NamedTemporaryFile("r", suffix=".strace") as out:
        tracer = subprocess.Popen(
            [strace, "-f", "-c", "-e", "trace=fdatasync,fsync", "-o", out.name, "-p", str(pid)],
            stderr=subprocess.DEVNULL,
        )
        time.sleep(1.0)  # attached
        run_round(kind, url, procs, ops)
        tracer.terminate()
        tracer.wait(10)
        calls = 0
        for line in out.read().splitlines():
            fields = line.split()
            if fields and fields[-1] in ("fdatasync", "fsync"):
                calls += int(fields[3])
    return calls / (procs * ops)


# --- the benchmark -----------------------------------------------------------------------------


def compare(
    name: str,
    ours: str,
    peer: str,
    url: dict[str, str],
    procs: int,
    ops: int,
    repeat: int,
    base: str | None = None,
) -> dict[str, Any]:
    rounds: list[tuple[float, float, float, float]] = []
    based: list[float] = []
    for r in range(repeat + 1):  # round 0 warms both up and is not counted
        p_rate, p_p99 = run_round(peer, url[peer], procs, ops)
        if base is not None and r % 2:  # the base first every other round: no order bias
            b_rate, _ = run_round(f"{ours}@{base}", url[ours], procs, ops)
        d_rate, d_p99 = run_round(ours, url[ours], procs, ops)
        if base is not None:
            if not r % 2:
                b_rate, _ = run_round(f"{ours}@{base}", url[ours], procs, ops)
            if r:
                based.append(d_rate / b_rate)
        if r:
            rounds.append((d_rate, p_rate, d_p99, p_p99))
    med = statistics.median
    ratios = [x[0] / x[1] for x in rounds]
    against = f" | this÷base {med(based):.2f} ({min(based):.2f}-{max(based):.2f})" if based else ""
    print(
        f"{name:>11} {procs:>5} | {med(x[0] for x in rounds):>8,.0f} "
        f"{med(x[1] for x in rounds):>8,.0f} | {med(ratios):>5.2f}x "
        f"({min(ratios):.2f}-{max(ratios):.2f}) | "
        f"{med(x[2] for x in rounds) * 1e3:>7.2f}ms {med(x[3] for x in rounds) * 1e3:>7.2f}ms"
        f"{against} | load {os.getloadavg()[0]:.1f}",
        flush=True,
    )
    return {
        "workload": name,
        "clients": procs,
        "rounds": [
            {"dibs": d, "peer": p, "dibs_p99_ms": dp * 1e3, "peer_p99_ms": pp * 1e3}
            for d, p, dp, pp in rounds
        ],
        "this_over_base": based,
        "series": [
            {"name": f"dibs {name}", "clients": procs, "throughput": med(x[0] for x in rounds),
             "p99_ms": med(x[2] for x in rounds) * 1e3},
            {"name": f"{peer.partition('_')[0]} {name}", "clients": procs,
             "throughput": med(x[1] for x in rounds), "p99_ms": med(x[3] for x in rounds) * 1e3},
        ],
    }  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--url", help="an existing PostgreSQL database (default: private)")
    parser.add_argument("--procs", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--ops", type=int, default=1000, help="operations per process per round")
    parser.add_argument("--repeat", type=int, default=5, help="rounds of each, interleaved")
    parser.add_argument("--workloads", nargs="+", default=["pairs", "replay"])
    parser.add_argument("--json", metavar="FILE", help="also write the figures as JSON")
    parser.add_argument(
        "--fsyncs", action="store_true", help="also count fsyncs per operation (untimed rounds)"
    )
    parser.add_argument(
        "--base", metavar="SRC", help="pairs, idem: also run the dibs in this src directory"
    )
    args = parser.parse_args()

    with PostgresServer(durable=True, settings={"max_connections": "100"}) as server:
        pg = args.url or server.create_database("dibs_peers")
        with redis_server() as rd:
            urls = {kind: pg if kind.startswith("dibs") else rd for kind in WORKERS}
            print(
                f"PostgreSQL (fsync on) vs redis-server (AOF, appendfsync always), "
                f"{os.cpu_count()} cores;"
            )
            print(f"{args.ops} ops per process per round, {args.repeat} rounds interleaved")
            print(
                f"{'work':>11} {'procs':>5} | {'dibs/s':>8} {'peer/s':>8} | "
                f"{'dibs÷peer (range)':>18} | {'dibs p99':>9} {'peer p99':>9}"
            )
            results = []
            for workload in args.workloads:
                ours, peer = PAIRS[workload]
                for procs in args.procs:
                    base = args.base if workload != "replay" else None
                    results.append(
                        compare(workload, ours, peer, urls, procs, args.ops, args.repeat, base)
                    )
            costs = {}
            for workload, (kind, _) in PAIRS.items():
                if workload in args.workloads:
                    wal, commits, xids = server_cost(kind, pg, min(args.ops, 500))
                    costs[workload] = {"wal_bytes": wal, "commits": commits, "write_xacts": xids}
                    print(
                        f"dibs {workload}: {wal:,.0f} WAL bytes, {commits:.2f} commits, "
                        f"{xids:.2f} write transactions per operation"
                    )
            if args.fsyncs:
                for workload in args.workloads:
                    ours, peer = PAIRS[workload]
                    for procs in args.procs:
                        d = fsyncs_per_op(ours, urls[ours], procs, args.ops)
                        p = fsyncs_per_op(peer, urls[peer], procs, args.ops)
                        costs[f"fsyncs {workload} {procs}"] = {"dibs": d, "peer": p}
                        print(
                            f"fsyncs per {workload} operation, {procs} process(es): "
                            f"dibs (WAL) {d:.2f}, peer "
                            + ("(no strace)" if p is None else f"(AOF fdatasync) {p:.2f}")
                        )
    if args.json:
        series = [s for r in results for s in r["series"]]
        Path(args.json).write_text(
            json.dumps(
                {
                    "benchmark": "peers_postgres",
                    "series": series,
                    "comparisons": results,
                    "server_cost": costs,
                },
                indent=2,
            )
        )


if __name__ == "__main__":
    main()
