"""Fair waiting against the old unordered backoff: N waiters contend for one unit.

Each waiter loops: ``with store.lease(unit, wait=None)``, hold it ``--hold`` ms,
release, and ask again at once (the case that starves someone under plain
backoff: whoever just released is the first to ask again). Both modes run in
one command, interleaved round by round, on threads of one process and on
processes, over one SQLite file:

* ``unordered``: the lease's old wait (jittered backoff, no queue);
* ``fcfs``: ``wait=`` as built, first come, first served per key.

Per run: the longest wait and the 99th percentile of waits (ms), the ratio of
the longest wait to the mean wait, and Jain's fairness index over the waiters'
acquisition counts (1.0: all got the unit equally often). Printed as the median
and [min, max] over the rounds.

    python benchmarks/bench_fair.py --waiters 6 --seconds 3 --rounds 3
"""

from __future__ import annotations

import argparse
import multiprocessing
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import dibs
import dibs.lease
from dibs._lease import _claim_policy

UNIT = dibs.Unit("bench-fair", "the-one")


def _mode(mode: str) -> None:
    """Make this process's leases wait the ``mode`` way."""
    if mode == "unordered":
        dibs.lease.fair_claim_policy = _claim_policy  # type: ignore[assignment]


def _waiter(url: str, me: int, hold: float, until: float) -> tuple[int, list[float]]:
    """Acquire and release until ``until`` (wall clock); the waits, in seconds."""
    waits = []
    with dibs.open(url) as store:
        while time.time() < until:
            asked = time.monotonic()
            with store.lease(UNIT, holder=f"w{me}", ttl=10, wait=None):
                waits.append(time.monotonic() - asked)
                time.sleep(hold)
    return me, waits


def _process(url: str, me: int, hold: float, until: float, mode: str, out: Any) -> None:
    _mode(mode)
    out.put(_waiter(url, me, hold, until))


def _run(
    url: str, kind: str, mode: str, waiters: int, hold: float, seconds: float
) -> list[list[float]]:
    until = time.time() + seconds + (2.0 if kind == "processes" else 0.2)
    results: list[list[float]] = [[] for _ in range(waiters)]
    if kind == "threads":
        saved = dibs.lease.fair_claim_policy
        _mode(mode)
        try:

            def run(me: int) -> None:
                results[me] = _waiter(url, me, hold, until)[1]

            threads = [threading.Thread(target=run, args=(me,)) for me in range(waiters)]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
        finally:
            dibs.lease.fair_claim_policy = saved  # type: ignore[assignment]
        return results
    context = multiprocessing.get_context("fork")
    out = context.Queue()
    procs = [
        context.Process(target=_process, args=(url, me, hold, until, mode, out))
        for me in range(waiters)
    ]
    for proc in procs:
        proc.start()
    for _ in procs:
        me, waits = out.get()
        results[me] = waits
    for proc in procs:
        proc.join()
    return results


def _figures(results: list[list[float]]) -> dict[str, float]:
    waits = sorted(w for mine in results for w in mine)
    counts = [len(mine) for mine in results]
    jain = sum(counts) ** 2 / (len(counts) * sum(c * c for c in counts)) if any(counts) else 0.0
    p99 = waits[min(len(waits) - 1, int(0.99 * len(waits)))] if waits else 0.0
    mean = statistics.fmean(waits) if waits else 0.0
    return {
        "acquires": float(len(waits)),
        "max_ms": 1000 * waits[-1] if waits else 0.0,
        "p99_ms": 1000 * p99,
        "max/mean": waits[-1] / mean if mean else 0.0,
        "jain": jain,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--waiters", type=int, default=6)
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--hold", type=float, default=5.0, help="ms each waiter holds the unit")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--kinds", default="threads,processes")
    args = parser.parse_args(argv)
    figures: dict[tuple[str, str], list[dict[str, float]]] = {}
    with tempfile.TemporaryDirectory() as scratch:
        for round_ in range(args.rounds):
            for kind in args.kinds.split(","):
                for mode in ("unordered", "fcfs") if round_ % 2 == 0 else ("fcfs", "unordered"):
                    url = f"sqlite:///{Path(scratch) / f'{kind}-{mode}-{round_}.db'}"
                    results = _run(url, kind, mode, args.waiters, args.hold / 1000, args.seconds)
                    figures.setdefault((kind, mode), []).append(_figures(results))
                    print(
                        f"round {round_} {kind:9} {mode:9} {figures[(kind, mode)][-1]}",
                        file=sys.stderr,
                    )
    names = ["acquires", "max_ms", "p99_ms", "max/mean", "jain"]
    print(
        f"{args.waiters} waiters, {args.seconds:g} s per run, hold {args.hold:g} ms, "
        f"{args.rounds} rounds: median [min, max]"
    )
    print(f"{'':21}" + "".join(f"{name:>24}" for name in names))
    for (kind, mode), runs in sorted(figures.items()):
        cells = []
        for name in names:
            values = [run[name] for run in runs]
            cells.append(f"{statistics.median(values):.3g} [{min(values):.3g}, {max(values):.3g}]")
        print(f"{kind:10} {mode:10}" + "".join(f"{cell:>24}" for cell in cells))
    return 0


if __name__ == "__main__":
    sys.exit(main())
