"""sqlite:// claims per second against raw sqlite3 doing the same insert, same run.

The baseline is the floor for "one transaction per claim": raw ``sqlite3``
running ``BEGIN IMMEDIATE; INSERT … ON CONFLICT DO NOTHING RETURNING; COMMIT``
with the store's pragmas (WAL, synchronous=NORMAL). dibs does that plus the
claim record, the request record and the Claim it hands back.

    python benchmarks/bench_sqlite.py [--claims 20000] [--repeat 5]
"""

from __future__ import annotations

import argparse
import sqlite3
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import dibs


def _rate(run: Callable[[Path], int], repeat: int) -> float:
    rates = []
    for _ in range(repeat):
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / "bench.db"
            started = time.perf_counter()
            done = run(path)
            rates.append(done / (time.perf_counter() - started))
    return statistics.median(rates)


def raw(n: int) -> Callable[[Path], int]:
    def run(path: Path) -> int:
        conn = sqlite3.connect(path, isolation_level=None)
        conn.execute("PRAGMA journal_mode = WAL")
        conn.execute("PRAGMA synchronous = NORMAL")
        conn.execute(
            "CREATE TABLE units (resource TEXT NOT NULL, slot TEXT NOT NULL, holder TEXT NOT NULL,"
            " PRIMARY KEY (resource, slot)) WITHOUT ROWID"
        )
        for i in range(n):
            conn.execute("BEGIN IMMEDIATE")
            conn.execute(
                "INSERT INTO units (resource, slot, holder) VALUES (?, ?, ?) "
                "ON CONFLICT DO NOTHING RETURNING holder",
                ("seat", str(i), "alice"),
            ).fetchone()
            conn.execute("COMMIT")
        conn.close()
        return n

    return run


def with_dibs(n: int, *, request_id: bool, ttl: float | None) -> Callable[[Path], int]:
    units = [dibs.Unit("seat", str(i)) for i in range(n)]

    def run(path: Path) -> int:
        store = dibs.open(f"sqlite:///{path}")
        claim = store.claim
        for i, unit in enumerate(units):
            claim(unit, holder="alice", request_id=f"r{i}" if request_id else None, ttl=ttl)
        store.close()
        return n

    return run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--claims", type=int, default=20_000)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    n = args.claims
    base = _rate(raw(n), args.repeat)
    print(f"sqlite:// vs raw sqlite3 insert-per-transaction, {n:,} claims, median of {args.repeat}")
    print(f"{'workload':<36}{'claims/s':>10}{'of baseline':>13}")
    print(f"{'raw INSERT … ON CONFLICT (baseline)':<36}{base:>10,.0f}{1:>12.0%}")
    for name, run in {
        "dibs, confirmed claim": with_dibs(n, request_id=False, ttl=None),
        "dibs, hold (ttl=300)": with_dibs(n, request_id=False, ttl=300),
        "dibs, hold + request ID": with_dibs(n, request_id=True, ttl=300),
    }.items():
        ours = _rate(run, args.repeat)
        print(f"{name:<36}{ours:>10,.0f}{ours / base:>12.0%}")


if __name__ == "__main__":
    main()
