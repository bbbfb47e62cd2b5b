"""memory:// claims per second against a lock + dict check-and-set baseline, same run.

The baseline is seed 000's ``ClaimStore``: one ``threading.Lock`` around a dict
of request records and a set of free spots. It does far less than dibs (no
holders, holds, fences, claim records or group claims), so the ratio measures
what dibs's bookkeeping costs on top of the bare critical section.

    python benchmarks/bench_memory.py [--claims 200000] [--repeat 5]
"""

from __future__ import annotations

import argparse
import statistics
import threading
import time
from collections.abc import Callable

import dibs


class SeedClaimStore:
    """Seed 000's ClaimStore: one lock guards availability and request records together."""

    def __init__(self, spots: range) -> None:
        self._available = set(spots)
        self._results: dict[str, tuple[int, bool]] = {}
        self._lock = threading.Lock()

    def claim(self, request_id: str, spot: int) -> bool:
        if not request_id:
            raise ValueError("A stable request ID is required")
        with self._lock:
            if request_id in self._results:
                previous_spot, result = self._results[request_id]
                if previous_spot != spot:
                    raise ValueError("Request ID reused with different input")
                return result
            result = spot in self._available
            if result:
                self._available.remove(spot)
            self._results[request_id] = (spot, result)
            return result


def _once(run: Callable[[], int]) -> float:
    started = time.perf_counter()
    done = run()
    return done / (time.perf_counter() - started)


def uncontended(n: int) -> tuple[Callable[[], int], Callable[[], int]]:
    """One thread, every claim on a fresh unit with its own request ID."""
    ids = [f"req-{i}" for i in range(n)]
    units = [dibs.Unit("seat", str(i)) for i in range(n)]

    def run_dibs() -> int:
        store = dibs.open("memory://")
        claim = store.claim
        for unit, rid in zip(units, ids, strict=True):
            claim(unit, holder="alice", request_id=rid, ttl=300)
        store.close()
        return n

    def run_seed() -> int:
        store = SeedClaimStore(range(n))
        claim = store.claim
        for i, rid in enumerate(ids):
            claim(rid, i)
        return n

    return run_dibs, run_seed


def hot_unit(n: int, threads: int = 8) -> tuple[Callable[[], int], Callable[[], int]]:
    """``threads`` threads all claiming one unit, each claim with its own request ID."""
    per = n // threads

    def in_threads(work: Callable[[int], None]) -> int:
        workers = [threading.Thread(target=work, args=(t,)) for t in range(threads)]
        for w in workers:
            w.start()
        for w in workers:
            w.join()
        return per * threads

    def run_dibs() -> int:
        store = dibs.open("memory://")
        unit = dibs.Unit("seat", "hot")

        def work(t: int) -> None:
            claim = store.claim
            for i in range(per):
                claim(unit, holder=f"h{t}", request_id=f"{t}-{i}", ttl=300)

        done = in_threads(work)
        store.close()
        return done

    def run_seed() -> int:
        store = SeedClaimStore(range(1))

        def work(t: int) -> None:
            claim = store.claim
            for i in range(per):
                claim(f"{t}-{i}", 0)

        return in_threads(work)

    return run_dibs, run_seed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--claims", type=int, default=200_000)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    print(f"memory:// vs seed ClaimStore, {args.claims:,} claims, {args.repeat} rounds (medians)")
    print(f"{'workload':<34}{'dibs/s':>12}{'baseline/s':>13}{'baseline/dibs':>15}")
    for name, (run_dibs, run_seed) in {
        "uncontended, request ID, hold": uncontended(args.claims),
        "8 threads, one hot unit": hot_unit(args.claims),
    }.items():
        # Interleaved rounds, ratio within each round: the machine is shared.
        ours, base = [], []
        for _ in range(args.repeat):
            base.append(_once(run_seed))
            ours.append(_once(run_dibs))
        ratio = statistics.median(b / o for b, o in zip(base, ours, strict=True))
        print(
            f"{name:<34}{statistics.median(ours):>12,.0f}"
            f"{statistics.median(base):>13,.0f}{ratio:>14.1f}x"
        )


if __name__ == "__main__":
    main()
