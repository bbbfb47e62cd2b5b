"""Park+remove pairs per second: dibs.aio.Lot with N tasks vs dibs.Lot with N threads.

The same workload as ``bench_lot.py`` (vehicles of 1, 1, 2 or 3 slots parked
and removed again on one row), run by the sync lot on N threads and by the
async lot on N tasks of one event loop, on the same store kind, interleaved
round by round. Printed: pairs per second of each, the ratio async / sync per
round, and the median and range of the ratios. ``--clock wall`` (the
default) times wall-clock seconds: the async face's SQLite calls run on
worker threads, and waiting on them is what a service feels. ``--clock cpu``
times CPU seconds of the process (every thread's), which a shared, noisy
machine disturbs far less: use it for memory://, where both faces only
compute.

    python benchmarks/bench_aio_lot.py                       # memory:// and sqlite://
    python benchmarks/bench_aio_lot.py --store sqlite --tasks 16
    python benchmarks/bench_aio_lot.py --store memory --clock cpu
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import tempfile
import threading
import time
from pathlib import Path

import dibs
import dibs.aio

LENGTHS = (1, 1, 2, 3)
_timer = time.perf_counter  # --clock: wall-clock seconds by default


def _lengths(worker: int, pairs: int) -> list[int]:
    rng = random.Random(worker)
    return [rng.choice(LENGTHS) for _ in range(pairs)]


def sync_round(url: str, workers: int, pairs: int, size: int, name: str) -> float:
    """Pairs per second of dibs.Lot on ``workers`` threads."""
    with dibs.open(url) as store:
        lot = dibs.Lot(store, name, size)
        barrier = threading.Barrier(workers + 1)
        done = [0] * workers

        def worker(w: int) -> None:
            lengths = _lengths(w, pairs)
            barrier.wait()
            for i, length in enumerate(lengths):
                vehicle = f"v{w}-{i}"
                if lot.park(vehicle, length) is not None:
                    lot.remove(vehicle)
                    done[w] += 1

        pool = [threading.Thread(target=worker, args=(w,)) for w in range(workers)]
        for t in pool:
            t.start()
        barrier.wait()
        started = _timer()
        for t in pool:
            t.join()
        return sum(done) / (_timer() - started)


async def async_round(url: str, workers: int, pairs: int, size: int, name: str) -> float:
    """Pairs per second of dibs.aio.Lot on ``workers`` tasks."""
    async with dibs.aio.open(url) as store:
        lot = dibs.aio.Lot(store, name, size)
        done = [0] * workers

        async def worker(w: int) -> None:
            for i, length in enumerate(_lengths(w, pairs)):
                vehicle = f"v{w}-{i}"
                if await lot.park(vehicle, length) is not None:
                    await lot.remove(vehicle)
                    done[w] += 1

        started = _timer()
        await asyncio.gather(*(worker(w) for w in range(workers)))
        return sum(done) / (_timer() - started)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument(
        "--store", action="append", choices=["memory", "sqlite"], help="default: both"
    )
    parser.add_argument(
        "--tasks", type=int, default=8, help="threads of the sync lot, tasks of the async one"
    )
    parser.add_argument(
        "--pairs", type=int, default=0, help="attempts per worker (default per store)"
    )
    parser.add_argument("--size", type=int, default=64, help="slots in the lot")
    parser.add_argument("--repeat", type=int, default=5, help="interleaved rounds")
    parser.add_argument(
        "--clock",
        choices=["wall", "cpu"],
        default="wall",
        help="time rounds in wall-clock seconds (default) or CPU seconds of this process",
    )
    args = parser.parse_args(argv)
    global _timer  # one setting for the whole run
    _timer = time.perf_counter if args.clock == "wall" else time.process_time
    workdir = Path(tempfile.mkdtemp(prefix="dibs-bench-aio-lot-"))
    for kind in args.store or ["memory", "sqlite"]:
        pairs = args.pairs or {"memory": 2000, "sqlite": 150}[kind]
        ratios, sync_rates, async_rates = [], [], []
        for r in range(args.repeat):
            url = "memory://" if kind == "memory" else f"sqlite:///{workdir / f'{kind}-{r}.db'}"
            # Alternate which face goes first, so neither always meets a warm file.
            order = ("sync", "async") if r % 2 == 0 else ("async", "sync")
            rates = {}
            for face in order:
                lot_name = f"{face}-{r}"
                if face == "sync":
                    rates[face] = sync_round(url, args.tasks, pairs, args.size, lot_name)
                else:
                    rates[face] = asyncio.run(
                        async_round(url, args.tasks, pairs, args.size, lot_name)
                    )
            sync_rates.append(rates["sync"])
            async_rates.append(rates["async"])
            ratios.append(rates["async"] / rates["sync"])
            print(
                f"{kind:7} round {r + 1}: dibs.Lot {rates['sync']:9,.0f} pairs/s "
                f"({args.tasks} threads)  dibs.aio.Lot {rates['async']:9,.0f} pairs/s "
                f"({args.tasks} tasks)  ratio {ratios[-1]:.2f}",
                flush=True,
            )
        print(
            f"{kind:7} dibs.aio.Lot / dibs.Lot: median {statistics.median(ratios):.2f}, "
            f"range {min(ratios):.2f}-{max(ratios):.2f}; medians "
            f"{statistics.median(sync_rates):,.0f} vs {statistics.median(async_rates):,.0f} pairs/s"
        )


if __name__ == "__main__":
    main()
