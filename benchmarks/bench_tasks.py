"""In-process task processor: no-op throughput and scheduling lateness, against baselines.

Throughput: N no-op tasks through ``TaskProcessor(workers=W)`` against
``concurrent.futures.ThreadPoolExecutor(max_workers=W)`` in the same run
(goal: at least 50 % of the executor's rate). The processor does more per task
(a handle with status and attempts, a cancellation token and context, retry
and timeout machinery, the live-task table for drain and keys).

Lateness: 1,000 tasks timed over about two seconds; each records its start
minus its due time. The baseline is ``sched.scheduler`` on one thread doing
nothing but sleeping until each due time: the floor the OS timer allows.
(Goal: p99 under 5 ms on an idle machine.)

    python benchmarks/bench_tasks.py [--tasks 100000] [--workers 4] [--repeat 5]
"""

from __future__ import annotations

import argparse
import sched
import statistics
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor, wait

from dibs.tasks import TaskProcessor


def noop() -> None:
    pass


def rate(run: Callable[[], int], repeat: int) -> float:
    rates = []
    for _ in range(repeat):
        started = time.perf_counter()
        done = run()
        rates.append(done / (time.perf_counter() - started))
    return statistics.median(rates)


def throughput(n: int, workers: int, repeat: int) -> None:
    executor = ThreadPoolExecutor(max_workers=workers)
    processor = TaskProcessor(workers=workers)

    def run_executor() -> int:
        futures = [executor.submit(noop) for _ in range(n)]
        wait(futures)
        return n

    def run_processor() -> int:
        handles = [processor.submit(noop) for _ in range(n)]
        for handle in handles:
            handle.wait()
        return n

    run_executor(), run_processor()  # warm up threads and allocators
    base = rate(run_executor, repeat)
    ours = rate(run_processor, repeat)
    executor.shutdown()
    processor.shutdown()
    print(f"no-op throughput, {n} tasks, {workers} workers (median of {repeat}):")
    print(f"  ThreadPoolExecutor   {base:>10,.0f} tasks/s")
    print(f"  TaskProcessor        {ours:>10,.0f} tasks/s   ratio {ours / base:.2f}")


def percentiles(samples: list[float]) -> str:
    ordered = sorted(samples)

    def at(q: float) -> float:
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000

    return f"p50 {at(0.50):6.2f} ms   p99 {at(0.99):6.2f} ms   max {ordered[-1] * 1000:6.2f} ms"


def lateness(count: int, workers: int) -> None:
    spread = 2.0
    lock = threading.Lock()

    def plan() -> list[float]:
        start = time.time() + 0.3
        return [start + spread * i / count for i in range(count)]

    def record(late: list[float], due: float) -> None:
        now = time.time()
        with lock:
            late.append(now - due)

    baseline: list[float] = []
    timer = sched.scheduler(time.time, time.sleep)
    for due in plan():
        timer.enterabs(due, 0, record, (baseline, due))
    timer.run()

    ours: list[float] = []
    with TaskProcessor(workers=workers) as processor:
        for due in plan():
            processor.submit(record, ours, due, at=due)
    print(f"scheduling lateness (start - due), {count} tasks over {spread:g} s:")
    print(f"  sched.scheduler, 1 thread   {percentiles(baseline)}")
    print(f"  TaskProcessor, {workers} workers   {percentiles(ours)}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tasks", type=int, default=100_000)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--timed", type=int, default=1000)
    args = parser.parse_args()
    throughput(args.tasks, args.workers, args.repeat)
    lateness(args.timed, args.workers)


if __name__ == "__main__":
    main()
