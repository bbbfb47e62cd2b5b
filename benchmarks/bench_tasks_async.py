"""Async durable jobs: the event-loop lane against one thread per coroutine, interleaved.

Each job awaits ``--sleep`` seconds (an I/O wait). *lane* registers the
``async def`` task as is, so its jobs run together on the processor's event
loop (up to ``async_workers``). *threads* registers a plain function that runs
the same coroutine with ``asyncio.run``, so each job holds one of ``--workers``
threads for its whole wait: how ``async def`` work ran before the lane. Both
run on a fresh SQLite file per round, rounds interleaved; the ratio is lane
jobs/s ÷ threads jobs/s (above 1: the lane is faster).

    python benchmarks/bench_tasks_async.py --jobs 400 --sleep 0.05 --repeat 3
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from pathlib import Path

import dibs
from dibs.tasks import TaskProcessor


async def io_wait(seconds: float) -> int:
    await asyncio.sleep(seconds)
    return 1


def run(kind: str, jobs: int, sleep: float, workers: int, place: Path) -> float:
    """Jobs per second for ``jobs`` jobs of one kind, enqueued in one batch."""
    store = dibs.open(f"sqlite:///{place / f'{kind}.db'}")
    with TaskProcessor(
        store=store, workers=workers, async_workers=jobs, poll=0.05, sweep_every=None
    ) as tasks:
        if kind == "lane":
            tasks.task("wait")(io_wait)
        else:

            @tasks.task("wait")
            def blocking(seconds: float) -> int:
                return asyncio.run(io_wait(seconds))

        start = time.perf_counter()
        ids = tasks.enqueue_many("wait", [(sleep,)] * jobs)
        for job_id in ids:
            tasks.wait(job_id, timeout=600)
        elapsed = time.perf_counter() - start
    store.close()
    return jobs / elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=400)
    parser.add_argument("--sleep", type=float, default=0.05)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    rates: dict[str, list[float]] = {"lane": [], "threads": []}
    with tempfile.TemporaryDirectory() as tmp:
        for round_ in range(args.repeat):
            for kind in ("lane", "threads") if round_ % 2 == 0 else ("threads", "lane"):
                place = Path(tmp) / f"{round_}"
                place.mkdir(exist_ok=True)
                rates[kind].append(run(kind, args.jobs, args.sleep, args.workers, place))
    for kind, values in rates.items():
        print(
            f"{kind:8} jobs/s median {statistics.median(values):8.1f} "
            f"range {min(values):.1f}-{max(values):.1f}"
        )
    ratios = [a / b for a, b in zip(rates["lane"], rates["threads"], strict=True)]
    print(
        f"lane ÷ threads: median {statistics.median(ratios):.1f}x "
        f"range {min(ratios):.1f}-{max(ratios):.1f}x"
    )


if __name__ == "__main__":
    main()
