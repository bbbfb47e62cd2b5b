"""sqlite:// claims per second against raw sqlite3 doing the same insert, same run.

Two comparisons, each run interleaved round by round with its baseline:

1. **One thread, one transaction per claim** (WAL, ``synchronous=NORMAL``).
   Baseline: raw ``sqlite3`` running ``BEGIN IMMEDIATE; INSERT … ON CONFLICT DO
   NOTHING RETURNING; COMMIT`` per claim into a one-table ``WITHOUT ROWID``
   schema. dibs does that plus the fence, the request ID and the ``Claim`` it
   hands back. Goal: ≥ 70 % of the baseline.
2. **Many threads at ``synchronous=FULL``** (every commit waits for the disk).
   Baseline: the same raw insert, one transaction per claim, one connection per
   thread. dibs with ``group_commit=1`` shares each commit among the threads
   claiming at once; dibs without it is shown for the trade-off. Goal: at least twice the
   baseline at 16 threads.

    python benchmarks/bench_sqlite.py [--claims 10000] [--repeat 5]
        [--threads 1,4,16] [--full-claims 1500] [--json out.json] [--clock wall|cpu]

``--clock cpu`` times each round in CPU seconds of the process (user and
system: the WAL writes are system calls) instead of wall-clock seconds: on a
shared machine the disk's stalls and the scheduler move wall time far more
than the work each claim does. Part 2 waits for the disk, so keep it on wall.

``--json`` writes ``{"benchmark": ..., "series": [{"name", "clients",
"throughput", "p99_ms"}, ...]}`` (medians over the rounds) for
``benchmarks/plot.py``.
"""

from __future__ import annotations

import argparse
import json
import sqlite3
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from statistics import median, quantiles

import dibs

# One run: (claims per second, p99 latency of one claim in ms).
Run = Callable[[Path], tuple[float, float]]

_timer = time.perf_counter  # --clock: the rounds' clock (latencies are always wall time)


def _p99(latencies: list[float]) -> float:
    return quantiles(latencies, n=100)[98] * 1000 if len(latencies) > 1 else 0.0


def _once(run: Run, where: str | None) -> tuple[float, float]:
    with tempfile.TemporaryDirectory(dir=where) as tmp:
        return run(Path(tmp) / "bench.db")


def _raw_connection(path: Path, synchronous: str) -> sqlite3.Connection:
    conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False, timeout=60)
    conn.execute("PRAGMA journal_mode = WAL")
    conn.execute(f"PRAGMA synchronous = {synchronous}")
    return conn


def _threads(
    n_threads: int, per_thread: int, claim_one: Callable[[int, int], None]
) -> tuple[float, float]:
    """``n_threads`` threads each making ``per_thread`` claims with ``claim_one(thread, i)``."""
    latencies: list[list[float]] = [[] for _ in range(n_threads)]
    start = threading.Barrier(n_threads + 1)

    def worker(t: int) -> None:
        start.wait()
        mine = latencies[t]
        clock = time.perf_counter
        for i in range(per_thread):
            began = clock()
            claim_one(t, i)
            mine.append(clock() - began)

    workers = [threading.Thread(target=worker, args=(t,)) for t in range(n_threads)]
    for w in workers:
        w.start()
    start.wait()
    began = _timer()
    for w in workers:
        w.join()
    elapsed = _timer() - began
    return n_threads * per_thread / elapsed, _p99([x for lat in latencies for x in lat])


def raw(n_threads: int, per_thread: int, synchronous: str) -> Run:
    def run(path: Path) -> tuple[float, float]:
        setup_conn = _raw_connection(path, synchronous)
        setup_conn.execute(
            "CREATE TABLE units (resource TEXT NOT NULL, slot TEXT NOT NULL, holder TEXT NOT NULL,"
            " PRIMARY KEY (resource, slot)) WITHOUT ROWID"
        )
        conns = [_raw_connection(path, synchronous) for _ in range(n_threads)]

        def claim_one(t: int, i: int) -> None:
            conn = conns[t]
            conn.execute("BEGIN IMMEDIATE")
            conn.execute(
                "INSERT INTO units (resource, slot, holder) VALUES (?, ?, ?) "
                "ON CONFLICT DO NOTHING RETURNING holder",
                ("seat", f"{t}-{i}", "alice"),
            ).fetchone()
            conn.execute("COMMIT")

        try:
            return _threads(n_threads, per_thread, claim_one)
        finally:
            for conn in [*conns, setup_conn]:
                conn.close()

    return run


def with_dibs(
    n_threads: int,
    per_thread: int,
    *,
    synchronous: str = "normal",
    group_commit: bool = False,
    request_id: bool = False,
    ttl: float | None = None,
) -> Run:
    units = [[dibs.Unit("seat", f"{t}-{i}") for i in range(per_thread)] for t in range(n_threads)]
    flag = int(group_commit)

    def run(path: Path) -> tuple[float, float]:
        store = dibs.open(f"sqlite:///{path}?synchronous={synchronous}&group_commit={flag}")
        claim = store.claim

        def claim_one(t: int, i: int) -> None:
            claim(units[t][i], holder="alice", request_id=f"r{t}-{i}" if request_id else None,
                  ttl=ttl)  # fmt: skip

        try:
            return _threads(n_threads, per_thread, claim_one)
        finally:
            store.close()

    return run


def _compare(
    title: str,
    baseline_name: str,
    baseline: Run,
    variants: dict[str, Run],
    repeat: int,
    where: str | None,
) -> dict[str, tuple[list[float], list[float], list[float]]]:
    """Interleave baseline and variants; per-round ratios (the load moves between rounds)."""
    rates: dict[str, list[float]] = {name: [] for name in [baseline_name, *variants]}
    p99s: dict[str, list[float]] = {name: [] for name in rates}
    ratios: dict[str, list[float]] = {name: [] for name in rates}
    for _ in range(repeat):
        base, base_p99 = _once(baseline, where)
        rates[baseline_name].append(base)
        p99s[baseline_name].append(base_p99)
        ratios[baseline_name].append(1.0)
        for name, run in variants.items():
            ours, ours_p99 = _once(run, where)
            rates[name].append(ours)
            p99s[name].append(ours_p99)
            ratios[name].append(ours / base)
    print(title)
    print(f"{'workload':<44}{'claims/s':>10}{'p99 ms':>9}{'of baseline':>13}{'range':>15}")
    for name, rate in rates.items():
        rs = ratios[name]
        print(
            f"{name:<44}{median(rate):>10,.0f}{median(p99s[name]):>9.2f}"
            f"{median(rs):>12.0%}  {min(rs):>5.0%}-{max(rs):<5.0%}"
        )
    print()
    return {name: (rates[name], p99s[name], ratios[name]) for name in rates}


def plot_name(name: str) -> str:
    """``"<contender> - <workload>"``, the shape benchmarks/plot.py colours by workload."""
    full = name.startswith("FULL: ")
    contender, _, what = name.removeprefix("FULL: ").split(" (")[0].partition(", ")
    contender = "raw sqlite3" if contender.startswith("raw") else f"dibs {what}"
    return f"{contender} - synchronous={'FULL' if full else 'NORMAL'}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--claims", type=int, default=10_000, help="claims per round, part 1")
    parser.add_argument("--full-claims", type=int, default=1_500, help="claims per round, part 2")
    parser.add_argument("--threads", default="1,4,16", help="thread counts for part 2")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--dir", default=None, help="where the files go (a real disk for FULL)")
    parser.add_argument("--json", default=None, help="write the medians here")
    parser.add_argument("--part", choices=["1", "2", "both"], default="both")
    parser.add_argument("--clock", choices=["wall", "cpu"], default="wall")
    args = parser.parse_args()
    global _timer  # one setting for the whole run
    _timer = time.process_time if args.clock == "cpu" else time.perf_counter
    series: list[dict[str, object]] = []

    def record(results: dict[str, tuple[list[float], list[float], list[float]]], n: int) -> None:
        for name, (rates, p99s, ratios) in results.items():
            series.append({
                "name": plot_name(name), "clients": n, "throughput": median(rates),
                "p99_ms": median(p99s), "of_baseline": median(ratios),
            })  # fmt: skip

    if args.part in ("1", "both"):
        n = args.claims
        results = _compare(
            f"1. one thread, synchronous=NORMAL: {n:,} claims, {args.repeat} rounds",
            "raw INSERT … ON CONFLICT (baseline)",
            raw(1, n, "normal"),
            {
                "dibs, confirmed claim": with_dibs(1, n),
                "dibs, hold (ttl=300)": with_dibs(1, n, ttl=300),
                "dibs, hold + request ID": with_dibs(1, n, ttl=300, request_id=True),
            },
            args.repeat,
            args.dir,
        )
        record(results, 1)
    if args.part in ("2", "both"):
        for n_threads in [int(x) for x in args.threads.split(",")]:
            per = max(1, args.full_claims // n_threads)
            results = _compare(
                f"2. {n_threads} threads, synchronous=FULL: {per * n_threads:,} claims, "
                f"{args.repeat} rounds",
                "raw, one transaction per claim (baseline)",
                raw(n_threads, per, "full"),
                {
                    "dibs, group_commit=1": with_dibs(
                        n_threads, per, synchronous="full", group_commit=True, ttl=300
                    ),
                    "dibs, no group commit": with_dibs(n_threads, per, synchronous="full", ttl=300),
                },
                args.repeat,
                args.dir,
            )
            record({f"FULL: {k}": v for k, v in results.items()}, n_threads)
    if args.json:
        Path(args.json).write_text(
            json.dumps({"benchmark": "sqlite", "series": series}, indent=2) + "\n"
        )


if __name__ == "__main__":
    main()
