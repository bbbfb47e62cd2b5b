"""dibs.aio on SQLite: how to run a blocking store's calls off the event loop, measured.

Each round opens a fresh SQLite file per option and has ``--tasks`` tasks claim
``--claims`` distinct seats each (with request IDs, ttl 60 s), options
interleaved in a rotating order. The options:

- ``sync-threads``: the sync store, one thread per task (the baseline: no loop at all);
- ``writer``: one dedicated worker thread fed by the loop through a queue,
  handing results back a batch per loop wake-up (``threads=1``);
- ``pool-2``, ``pool-4``: the same with 2 or 4 worker threads (``threads=N``;
  4 is dibs.aio's default);
- ``executor-4``: a ``ThreadPoolExecutor`` of 4 through ``run_in_executor``, each
  finished call waking the loop on its own;
- ``to_thread``: ``asyncio.to_thread``, the loop's default executor;

each with SQLite's group commit off and on (``?group_commit=1``). A ticker task
sleeps 5 ms in a loop beside the claims and records how late each wake-up is:
the loop's stalls (the goal: never beyond 50 ms). ``sync-threads`` ticks an idle
loop beside its threads: the control, what the machine and the GIL cost any loop.
Printed: claims/s medians and ranges, each option's ratio to the first option
in the same round, the process's CPU time per claim (less noisy than claims/s
on a shared machine) and its ratio, and the loop's lateness (p99 and worst over
all rounds).

    python benchmarks/bench_aio_sqlite.py --tasks 8 --claims 150 --repeat 15
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

import dibs
import dibs.aio
from dibs.aio import ThreadedStore

_T = TypeVar("_T")
TICK = 0.005


class ToThreadStore(ThreadedStore):
    """The threaded face with its calls on ``asyncio.to_thread`` (the loop's default pool)."""

    async def _run(self, fn: Callable[..., _T], *args: Any) -> _T:
        return await asyncio.to_thread(fn, *args)


class ExecutorStore(ThreadedStore):
    """The threaded face on a ``ThreadPoolExecutor`` of 4 through ``run_in_executor``.

    Each finished call wakes the loop on its own (dibs.aio's first design).
    """

    def __init__(self, url: str, options: dict[str, Any]) -> None:
        super().__init__(url, options, threads=1)
        self._pool = ThreadPoolExecutor(4)

    async def _run(self, fn: Callable[..., _T], *args: Any) -> _T:
        return await asyncio.get_running_loop().run_in_executor(self._pool, fn, *args)

    async def _close(self) -> None:
        await super()._close()
        self._pool.shutdown()


def sync_threads(url: str, tasks: int, claims: int) -> tuple[float, float, list[float]]:
    """Claims/s with the sync store and one thread per task, a ticking loop beside them.

    The loop does nothing but tick, so its lateness is what the machine and the
    GIL cost any loop in a process whose threads claim: the control for the stalls.
    """
    store = dibs.open(url)
    barrier = threading.Barrier(tasks + 1)

    def work(n: int) -> None:
        barrier.wait()
        for i in range(claims):
            store.claim(
                dibs.Unit("seat", f"{n}-{i}"), holder=f"t{n}", request_id=f"{n}-{i}", ttl=60
            )

    async def main() -> tuple[float, float, list[float]]:
        stop = asyncio.Event()
        late: list[float] = []
        ticker = asyncio.create_task(_ticker(stop, late))
        await asyncio.sleep(2 * TICK)
        threads = [threading.Thread(target=work, args=(n,)) for n in range(tasks)]
        for t in threads:
            t.start()
        barrier.wait()
        start, cpu = time.perf_counter(), time.process_time()
        while any(t.is_alive() for t in threads):
            await asyncio.sleep(TICK)
        elapsed, cpu = time.perf_counter() - start, time.process_time() - cpu
        stop.set()
        await ticker
        return tasks * claims / elapsed, cpu / (tasks * claims), late

    try:
        return asyncio.run(main())
    finally:
        store.close()


async def _ticker(stop: asyncio.Event, late: list[float]) -> None:
    while not stop.is_set():
        before = time.perf_counter()
        await asyncio.sleep(TICK)
        late.append(time.perf_counter() - before - TICK)


async def _async_run(
    store: dibs.aio.AsyncStore, tasks: int, claims: int
) -> tuple[float, float, list[float]]:
    async with store:
        stop = asyncio.Event()
        late: list[float] = []
        ticker = asyncio.create_task(_ticker(stop, late))

        async def work(n: int) -> None:
            for i in range(claims):
                unit = dibs.Unit("seat", f"{n}-{i}")
                await store.claim(unit, holder=f"t{n}", request_id=f"{n}-{i}", ttl=60)

        await asyncio.sleep(2 * TICK)
        start, cpu = time.perf_counter(), time.process_time()
        await asyncio.gather(*(work(n) for n in range(tasks)))
        elapsed, cpu = time.perf_counter() - start, time.process_time() - cpu
        stop.set()
        await ticker
    return tasks * claims / elapsed, cpu / (tasks * claims), late


def async_option(kind: str, url: str, tasks: int, claims: int) -> tuple[float, float, list[float]]:
    store: dibs.aio.AsyncStore
    if kind == "to_thread":
        store = ToThreadStore.from_url(url)
    elif kind == "executor-4":
        store = ExecutorStore(url, {})
    else:
        threads = 1 if kind == "writer" else int(kind.removeprefix("pool-"))
        store = dibs.aio.open(url, threads=threads)
    return asyncio.run(_async_run(store, tasks, claims))


KINDS = ["sync-threads", "writer", "pool-2", "pool-4", "executor-4", "to_thread"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=8)
    parser.add_argument("--claims", type=int, default=200, help="claims per task")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--kinds", default=",".join(KINDS), help="options, the baseline first")
    args = parser.parse_args()
    options = [(kind, gc) for kind in args.kinds.split(",") for gc in (0, 1)]
    rates: dict[tuple[str, int], list[float]] = {o: [] for o in options}
    cpus: dict[tuple[str, int], list[float]] = {o: [] for o in options}
    late: dict[tuple[str, int], list[float]] = {o: [] for o in options}
    with tempfile.TemporaryDirectory() as tmp:
        for round_ in range(args.repeat):
            shift = round_ % len(options)
            for kind, gc in options[shift:] + options[:shift]:
                url = f"sqlite:///{Path(tmp) / f'{round_}-{kind}-{gc}.db'}?group_commit={gc}"
                if kind == "sync-threads":
                    rate, cpu, ticks = sync_threads(url, args.tasks, args.claims)
                else:
                    rate, cpu, ticks = async_option(kind, url, args.tasks, args.claims)
                rates[kind, gc].append(rate)
                cpus[kind, gc].append(cpu)
                late[kind, gc].extend(ticks)
    base, base_cpu = rates[options[0]], cpus[options[0]]
    print(f"{args.tasks} tasks x {args.claims} claims, {args.repeat} rounds interleaved")
    print(
        f"{'option':>16} {'claims/s':>8} {'range':>13}  {'÷ ' + options[0][0]:>22}"
        f"  {'CPU µs/claim':>12} {'÷ ' + options[0][0]:>16}  loop lateness p99 / worst"
    )
    for kind, gc in options:
        values = rates[kind, gc]
        ratios = [a / b for a, b in zip(values, base, strict=True)]
        cpu_ratios = [a / b for a, b in zip(cpus[kind, gc], base_cpu, strict=True)]
        ticks = sorted(late[kind, gc])
        p99 = ticks[int(0.99 * (len(ticks) - 1))]
        print(
            f"{kind + (' gc' if gc else ''):>16} {statistics.median(values):8.0f} "
            f"{min(values):6.0f}-{max(values):<6.0f}  "
            f"{statistics.median(ratios):5.2f}x ({min(ratios):.2f}-{max(ratios):.2f})"
            f"   {1e6 * statistics.median(cpus[kind, gc]):12.0f} "
            f"{statistics.median(cpu_ratios):8.2f}x ({min(cpu_ratios):.2f}-{max(cpu_ratios):.2f})"
            f"  {1000 * p99:5.1f} / {1000 * ticks[-1]:5.1f} ms"
        )


if __name__ == "__main__":
    main()
