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
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from statistics import median

import dibs


def _once(run: Callable[[Path], int]) -> float:
    with tempfile.TemporaryDirectory() as tmp:
        started = time.perf_counter()
        done = run(Path(tmp) / "bench.db")
        return done / (time.perf_counter() - started)


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
    variants = {
        "dibs, confirmed claim": with_dibs(n, request_id=False, ttl=None),
        "dibs, hold (ttl=300)": with_dibs(n, request_id=False, ttl=300),
        "dibs, hold + request ID": with_dibs(n, request_id=True, ttl=300),
    }
    # Interleave baseline and dibs runs, and compare within each round: on a
    # shared machine the load moves between rounds, not within one.
    base_rates: list[float] = []
    rates: dict[str, list[float]] = {name: [] for name in variants}
    ratios: dict[str, list[float]] = {name: [] for name in variants}
    for _ in range(args.repeat):
        base = _once(raw(n))
        base_rates.append(base)
        for name, run in variants.items():
            ours = _once(run)
            rates[name].append(ours)
            ratios[name].append(ours / base)
    print(f"sqlite:// vs raw sqlite3 insert-per-transaction, {n:,} claims, {args.repeat} rounds")
    print(f"{'workload':<36}{'claims/s':>10}{'of baseline':>13}  (medians)")
    print(f"{'raw INSERT … ON CONFLICT (baseline)':<36}{median(base_rates):>10,.0f}{1:>12.0%}")
    for name in variants:
        print(f"{name:<36}{median(rates[name]):>10,.0f}{median(ratios[name]):>12.0%}")


if __name__ == "__main__":
    main()
