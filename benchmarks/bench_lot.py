"""Park+remove pairs per second: dibs.Lot on a store vs the seed's per-slot-lock ParkingLot.

Both lots run the same workload in the same process and the same run: T
threads, each parking a vehicle of a mixed length (1, 1, 2 or 3 slots) and
removing it again, N times, on a lot of S slots. The figures printed are pairs
per second (the best round of each), the ratio of the bests dibs / baseline,
and the median and range of the ratios round by round (each round runs every
contender once, so a ratio compares neighbours in time). The baseline is the in-process
design from the seed (one lock per slot taken in increasing order, a metadata
lock for the vehicle index); it cannot cross processes or survive a crash, so
the ratio is the price of putting the decision in a store.

    python benchmarks/bench_lot.py                     # memory:// vs baseline
    python benchmarks/bench_lot.py --store sqlite      # also a SQLite file
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from contextlib import ExitStack
from pathlib import Path
from typing import Protocol

import dibs

_timer = time.process_time  # --clock: CPU seconds of this process by default


class ParkingLot:
    """The seed's thread-safe lot: per-slot locks in position order, a separate index lock."""

    def __init__(self, size: int) -> None:
        self.size = size
        # Domain 1: slot locks guard occupied[i]; always taken in increasing i.
        self.slot_locks = [threading.Lock() for _ in range(size)]
        self.occupied = [""] * size
        # Domain 2: meta_lock guards pos; never held together with a slot lock.
        self.meta_lock = threading.Lock()
        self.pos: dict[str, tuple[int, int]] = {}

    def _occupy(self, start: int, length: int, vehicle_id: str) -> bool:
        with ExitStack() as stack:
            for lock in self.slot_locks[start : start + length]:
                stack.enter_context(lock)
            if any(self.occupied[i] for i in range(start, start + length)):
                return False
            for i in range(start, start + length):
                self.occupied[i] = vehicle_id
            return True

    def park(self, vehicle_id: str, length: int) -> int | None:
        for start in range(self.size - length + 1):
            if self._occupy(start, length, vehicle_id):
                with self.meta_lock:
                    self.pos[vehicle_id] = (start, length)
                return start
        return None

    def remove(self, vehicle_id: str) -> int:
        with self.meta_lock:
            start, length = self.pos[vehicle_id]
        with ExitStack() as stack:
            for lock in self.slot_locks[start : start + length]:
                stack.enter_context(lock)
            for i in range(start, start + length):
                self.occupied[i] = ""
        with self.meta_lock:
            del self.pos[vehicle_id]
        return start


class Parking(Protocol):
    def park(self, vehicle_id: str, length: int) -> int | None: ...
    def remove(self, vehicle_id: str) -> int: ...


def run(
    lot: Parking, threads: int, pairs: int, latencies: list[float] | None = None
) -> tuple[float, int]:
    """Run the workload; return (seconds, pairs completed).

    With ``latencies``, each attempt's seconds are appended to it (a separate,
    slower pass: timing every attempt costs both contenders alike).
    """
    barrier = threading.Barrier(threads + 1)
    done = [0] * threads

    def worker(w: int) -> None:
        rng = random.Random(w)
        lengths = [rng.choice((1, 1, 2, 3)) for _ in range(pairs)]
        clock = time.perf_counter
        mine: list[float] = []
        barrier.wait()
        for i, length in enumerate(lengths):
            vehicle = f"v{w}-{i}"
            started = clock()
            if lot.park(vehicle, length) is not None:
                lot.remove(vehicle)
                done[w] += 1
            if latencies is not None:
                mine.append(clock() - started)
        if latencies is not None:
            latencies.extend(mine)  # list.extend is atomic under the GIL

    pool = [threading.Thread(target=worker, args=(w,)) for w in range(threads)]
    for t in pool:
        t.start()
    barrier.wait()
    started = _timer()
    for t in pool:
        t.join()
    return _timer() - started, sum(done)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument(
        "--threads", default="4", help="threads, or a comma list to measure each (1,2,4,8)"
    )
    parser.add_argument("--pairs", type=int, default=5000, help="park attempts per thread")
    parser.add_argument("--size", type=int, default=64, help="slots in the lot")
    parser.add_argument("--repeat", type=int, default=5, help="rounds; the best of each counts")
    parser.add_argument(
        "--store",
        action="append",
        default=[],
        choices=["sqlite"],
        help="also measure this store (memory:// always runs)",
    )
    parser.add_argument("--json", type=Path, help="write the figures here (see plot.py)")
    parser.add_argument(
        "--clock",
        choices=["cpu", "wall"],
        default="cpu",
        help="time rounds in CPU seconds of this process (default: the machine is shared) "
        "or wall-clock seconds",
    )
    args = parser.parse_args(argv)
    global _timer  # one setting for the whole run
    _timer = time.process_time if args.clock == "cpu" else time.perf_counter
    thread_counts = [int(t) for t in str(args.threads).split(",")]

    counter = iter(range(10**9))

    def lot_on(store: dibs.Store) -> Callable[[], Parking]:
        return lambda: dibs.Lot(store, f"bench-{next(counter)}", args.size)

    with ExitStack() as cleanup:
        contenders: dict[str, Callable[[], Parking]] = {
            "baseline ParkingLot": lambda: ParkingLot(args.size),
            "dibs.Lot on memory://": lot_on(cleanup.enter_context(dibs.open("memory://"))),
        }
        if "sqlite" in args.store:
            tmp = Path(cleanup.enter_context(tempfile.TemporaryDirectory()))
            store = cleanup.enter_context(dibs.open(f"sqlite:///{tmp / 'bench.db'}"))
            contenders["dibs.Lot on sqlite://"] = lot_on(store)

        print(
            f"park+remove, {args.threads} threads x {args.pairs} attempts, lot of {args.size} "
            f"slots, lengths 1/1/2/3, best of {args.repeat} interleaved rounds, {args.clock} time "
            f"(Python {sys.version.split()[0]})"
        )
        series: list[dict[str, object]] = []
        for threads in thread_counts:
            best = dict.fromkeys(contenders, 0.0)
            per_round: dict[str, list[float]] = {name: [] for name in contenders}
            # Interleave the contenders round by round so a noisy neighbour on the
            # machine slows all of them alike instead of one.
            for _ in range(args.repeat):
                rates = {}
                for name, make in contenders.items():
                    seconds, completed = run(make(), threads, args.pairs)
                    rates[name] = completed / seconds
                    best[name] = max(best[name], rates[name])
                for name, rate in rates.items():
                    per_round[name].append(rate / rates["baseline ParkingLot"])
            baseline = best["baseline ParkingLot"]
            for name, rate in best.items():
                latencies: list[float] = []
                run(contenders[name](), threads, args.pairs, latencies)
                latencies.sort()
                p99 = latencies[int(len(latencies) * 0.99)] * 1000
                ratios = per_round[name]
                print(
                    f"  {threads} threads  {name:<24} {rate:>10,.0f} pairs/s   "
                    f"ratio to baseline {rate / baseline:6.3f} (rounds: median "
                    f"{statistics.median(ratios):.3f}, range {min(ratios):.3f}-{max(ratios):.3f})"
                    f"   p99 {p99:.3f} ms"
                )
                series.append(
                    {
                        "name": name,
                        "clients": threads,
                        "throughput": rate,
                        "p99_ms": p99,
                        "ratio_median": statistics.median(ratios),
                        "ratio_min": min(ratios),
                        "ratio_max": max(ratios),
                    }
                )
    if args.json:
        args.json.write_text(
            json.dumps(
                {
                    "benchmark": "park+remove pairs/s: dibs.Lot vs the seed's ParkingLot",
                    "command": "python benchmarks/bench_lot.py "
                    + " ".join(sys.argv[1:] if argv is None else argv),
                    "series": series,
                },
                indent=2,
            )
        )


if __name__ == "__main__":
    main()
