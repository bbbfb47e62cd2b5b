"""Single-unit claims per second on PostgreSQL: dibs vs a raw psycopg INSERT, same server.

For each client count C (1, 4, 16 by default), C threads share one pool of C
connections and claim distinct units as fast as they can for a fixed number
of claims per round. The baseline does what the issue names: raw psycopg
running one ``INSERT … ON CONFLICT DO NOTHING RETURNING`` per transaction
(autocommit) into a one-table schema, through a pool of the same size on the
same server. dibs does ``store.claim(Unit(...), holder=..., ttl=300)``.
Rounds of baseline and dibs alternate, and the script prints medians of
throughput and p99 latency and the median of per-round ratios: this machine
is shared and noisy, so a single round means little.

    python benchmarks/bench_postgres.py                    # private server, fsync off
    python benchmarks/bench_postgres.py --durable          # fsync on
    python benchmarks/bench_postgres.py --url postgresql://user:pw@host/db
    python benchmarks/bench_postgres.py --clients 1 4 --claims 2000 --repeat 5
    python benchmarks/bench_postgres.py --json postgres.json   # figures for benchmarks/plot.py

After the rounds it measures the server-side cost per claim of each, one
client, untimed: WAL bytes (``pg_current_wal_lsn()`` before and after) and
transactions committed (``pg_stat_database.xact_commit``, read once the
claiming sessions have ended so that their counters are flushed).
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import statistics
import threading
import time
from collections.abc import Callable
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import psycopg
from psycopg_pool import ConnectionPool

import dibs

# The throwaway server lives with the tests (it is not part of the package).
from dibs.verify.harness import PostgresServer

Op = Callable[[int, int], None]


def run_round(op: Op, clients: int, claims: int) -> tuple[float, list[float]]:
    """Run ``claims`` ops split over ``clients`` threads; return (ops/s, latencies)."""
    per = claims // clients
    latencies: list[list[float]] = [[] for _ in range(clients)]
    barrier = threading.Barrier(clients + 1)

    def client(n: int) -> None:
        mine = latencies[n]
        clock = time.perf_counter
        barrier.wait()
        for i in range(per):
            t0 = clock()
            op(n, i)
            mine.append(clock() - t0)

    threads = [threading.Thread(target=client, args=(n,)) for n in range(clients)]
    for t in threads:
        t.start()
    barrier.wait()
    start = time.perf_counter()
    for t in threads:
        t.join()
    elapsed = time.perf_counter() - start
    flat = [x for per_client in latencies for x in per_client]
    return len(flat) / elapsed, flat


def p99(values: list[float]) -> float:
    """The 99th percentile of ``values``."""
    return statistics.quantiles(values, n=100)[98]


def bench(url: str, tag: str, clients: int, claims: int, repeat: int) -> tuple[str, list[Any]]:
    """Alternate baseline and dibs rounds at one client count; return the row and series."""
    store = dibs.open(f"{url}?schema=bench_{tag}&pool_min={clients}&pool_max={clients}")
    pool = ConnectionPool(
        url, min_size=clients, max_size=clients, kwargs={"autocommit": True}, open=True
    )
    insert = (
        f"INSERT INTO baseline_{tag} (resource, slot, holder) VALUES (%s, %s, %s) "
        "ON CONFLICT DO NOTHING RETURNING holder"
    )
    rounds: list[tuple[float, float, float, float]] = []
    try:
        pool.wait()
        for r in range(repeat + 1):  # round 0 warms both up and is not counted
            resource = f"c{clients}-r{r}"

            def base(n: int, i: int, resource: str = resource) -> None:
                with pool.connection() as conn:
                    row = conn.execute(insert, (resource, f"{n}-{i}", f"h{n}")).fetchone()
                assert row is not None

            def claim(n: int, i: int, resource: str = resource) -> None:
                result = store.claim(dibs.Unit(resource, f"{n}-{i}"), holder=f"h{n}", ttl=300)
                assert result

            b_rate, b_lat = run_round(base, clients, claims)
            d_rate, d_lat = run_round(claim, clients, claims)
            if r:
                rounds.append((d_rate, b_rate, p99(d_lat), p99(b_lat)))
    finally:
        pool.close()
        store.close()
    med = statistics.median
    ratios = [x[0] / x[1] for x in rounds]
    row = (
        f"{clients:>7} | {med(x[0] for x in rounds):>8,.0f} {med(x[1] for x in rounds):>8,.0f} "
        f"{med(ratios):>6.0%} ({min(ratios):.0%}-{max(ratios):.0%}) | "
        f"{med(x[2] for x in rounds) * 1e3:>7.2f}ms {med(x[3] for x in rounds) * 1e3:>7.2f}ms "
        f"{med(x[2] / x[3] for x in rounds):>5.2f}x"
    )
    series = [
        {"name": "dibs postgresql://", "clients": clients,
         "throughput": med(x[0] for x in rounds), "p99_ms": med(x[2] for x in rounds) * 1e3},
        {"name": "raw psycopg INSERT", "clients": clients,
         "throughput": med(x[1] for x in rounds), "p99_ms": med(x[3] for x in rounds) * 1e3},
    ]  # fmt: skip
    return row, series


def _wal_and_commits(url: str) -> tuple[int, int, int]:
    """WAL position, committed transactions, next transaction ID (write transactions)."""
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute(
            "SELECT pg_current_wal_lsn() - '0/0'::pg_lsn, xact_commit, "
            "pg_snapshot_xmax(pg_current_snapshot())::text::bigint "
            "FROM pg_stat_database WHERE datname = current_database()"
        ).fetchone()
    assert row is not None
    return int(row[0]), int(row[1]), int(row[2])


def server_cost(url: str, tag: str, claims: int) -> dict[str, dict[str, float]]:
    """WAL bytes and commits per claim, for dibs and the baseline, one client, untimed."""
    out: dict[str, dict[str, float]] = {}
    for name in ("dibs", "baseline"):
        resource = f"cost-{secrets.token_hex(3)}"
        time.sleep(1.1)  # earlier sessions' counters reach the stats
        wal0, commits0, xid0 = _wal_and_commits(url)
        if name == "dibs":
            with dibs.open(f"{url}?schema=bench_{tag}&pool_min=1&pool_max=1") as store:
                for i in range(claims):
                    assert store.claim(dibs.Unit(resource, str(i)), holder="h", ttl=300)
        else:
            with psycopg.connect(url, autocommit=True) as conn:
                for i in range(claims):
                    conn.execute(
                        f"INSERT INTO baseline_{tag} (resource, slot, holder) VALUES (%s, %s, %s) "
                        "ON CONFLICT DO NOTHING RETURNING holder",
                        (resource, str(i), "h"),
                    ).fetchone()
        wal1, _, xid1 = _wal_and_commits(url)
        time.sleep(1.1)
        _, commits1, _ = _wal_and_commits(url)
        # Each read is a read-only transaction of its own: two fall in the window
        # (dibs.open also reads the schema version once: not a claim's cost).
        out[name] = {
            "wal_bytes": (wal1 - wal0) / claims,
            "commits": (commits1 - commits0 - 2) / claims,
            "write_xacts": (xid1 - xid0) / claims,
        }
    return out


def _backend_cpu(pid: int) -> float:
    """CPU seconds a local server backend has used (Linux /proc; the server runs here)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def cpu_profile(url: str, tag: str, claims: int) -> dict[str, dict[str, float]]:
    """Where one client's time goes, per claim: client CPU, server backend CPU, wall.

    CPU time, unlike throughput, hardly moves with the machine's load, so on a
    shared machine this is the steadier comparison. Needs the server on this
    host (the private one).
    """
    out: dict[str, dict[str, float]] = {}
    for name in ("dibs", "baseline"):
        resource = f"cpu-{secrets.token_hex(3)}"
        with ExitStack() as stack:
            if name == "dibs":
                store = stack.enter_context(
                    dibs.open(f"{url}?schema=bench_{tag}&pool_min=1&pool_max=1")
                )
                with store._pool.connection() as conn:  # type: ignore[attr-defined]
                    row = conn.execute("SELECT pg_backend_pid()").fetchone()

                def op(i: int, store: dibs.Store = store, resource: str = resource) -> None:
                    assert store.claim(dibs.Unit(resource, str(i)), holder="h", ttl=300)

            else:
                conn = stack.enter_context(psycopg.connect(url, autocommit=True))
                row = conn.execute("SELECT pg_backend_pid()").fetchone()

                def op(
                    i: int, conn: psycopg.Connection[Any] = conn, resource: str = resource
                ) -> None:
                    conn.execute(
                        f"INSERT INTO baseline_{tag} (resource, slot, holder) VALUES (%s, %s, %s) "
                        "ON CONFLICT DO NOTHING RETURNING holder",
                        (resource, str(i), "h"),
                    ).fetchone()

            assert row is not None
            for i in range(50):  # warm up: statements prepared, caches filled
                op(-1 - i)
            server0, client0, wall0 = _backend_cpu(row[0]), time.process_time(), time.perf_counter()
            for i in range(claims):
                op(i)
            server1, client1, wall1 = _backend_cpu(row[0]), time.process_time(), time.perf_counter()
        out[name] = {
            "client_cpu_us": (client1 - client0) / claims * 1e6,
            "server_cpu_us": (server1 - server0) / claims * 1e6,
            "wall_us": (wall1 - wall0) / claims * 1e6,
        }
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--url", help="an existing database (default: a private server)")
    parser.add_argument("--clients", type=int, nargs="+", default=[1, 4, 16])
    parser.add_argument("--claims", type=int, default=4000, help="claims per round")
    parser.add_argument("--repeat", type=int, default=5, help="rounds of each, interleaved")
    parser.add_argument("--durable", action="store_true", help="fsync on (private server)")
    parser.add_argument("--json", metavar="FILE", help="also write the figures as JSON")
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
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(
                f"CREATE TABLE baseline_{tag} (resource text, slot text, holder text NOT NULL, "
                "PRIMARY KEY (resource, slot))"
            )
        print(f"PostgreSQL ({where}); {args.claims} single-unit claims per round,")
        print(f"{args.repeat} rounds of dibs and of the baseline, interleaved; medians")
        print(
            f"{'clients':>7} | {'dibs/s':>8} {'base/s':>8} {'ratio':>6} | "
            f"{'dibs p99':>9} {'base p99':>9} {'p99 x':>6}"
        )
        series: list[Any] = []
        for clients in args.clients:
            row, more = bench(url, tag, clients, args.claims, args.repeat)
            print(row, flush=True)
            series += more
        cost = server_cost(url, tag, min(args.claims, 1000))
        for name, c in cost.items():
            print(
                f"{name}: {c['wal_bytes']:,.0f} WAL bytes, {c['commits']:.2f} commits, "
                f"{c['write_xacts']:.2f} write transactions per claim"
            )
        profile = cpu_profile(url, tag, min(args.claims, 2000)) if not args.url else {}
        for name, p in profile.items():
            print(
                f"{name}: per claim {p['client_cpu_us']:.0f} µs client CPU, "
                f"{p['server_cpu_us']:.0f} µs server CPU, {p['wall_us']:.0f} µs wall (1 client)"
            )
        if args.json:
            Path(args.json).write_text(
                json.dumps(
                    {
                        "benchmark": "postgres",
                        "series": series,
                        "server_cost": cost,
                        "cpu_profile": profile,
                    },
                    indent=2,
                )
            )


if __name__ == "__main__":
    main()
