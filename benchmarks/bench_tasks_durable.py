"""Durable task processor on SQLite: scheduling lateness and jobs/s, against in-process.

Lateness: 1,000 durable jobs timed over two seconds (500/s), then over ten
(100/s), run by one
processor in this process (4 workers, ``poll`` as given); each records its
start minus its due time. Baseline in the same run: the same 1,000 timed
tasks through the in-process ``TaskProcessor.submit(at=)``. A job timed for
later is found by the poll, so its lateness is bounded below by ``poll`` (a
job due now wakes the workers at once); it also pays for a take and a finish,
two statements on the job row. For the comparison with huey and procrastinate
see bench_peers_tasks.py.

Throughput: N no-op durable jobs are enqueued first, then 1 or 3 worker
processes (4 workers each) run them; the rate is N over the time from the
workers' start until every row is done. Baseline in the same run: N no-op
tasks through the in-process processor.

    python benchmarks/bench_tasks_durable.py [--jobs 2000] [--timed 1000] [--poll 0.01]
        [--spread 2 10]
"""

from __future__ import annotations

import argparse
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import dibs
from dibs.tasks import TaskProcessor

sys.path.insert(0, str(Path(__file__).parent))
from bench_tasks import percentiles  # the sibling benchmark's formatting


def noop(*args: object) -> None:
    pass


def lateness(db: Path, count: int, poll: float, spread: float) -> None:
    lock = threading.Lock()

    def plan() -> list[float]:
        start = time.time() + 0.5
        return [start + spread * i / count for i in range(count)]

    baseline: list[float] = []

    def record(late: list[float], due: float) -> None:
        now = time.time()
        with lock:
            late.append(now - due)

    with TaskProcessor(workers=4) as processor:
        for due in plan():
            processor.submit(record, baseline, due, at=due)

    durable: list[float] = []
    store = dibs.open(f"sqlite:///{db}")
    processor = TaskProcessor(store=store, workers=4, poll=poll, sweep_every=None)

    @processor.task("late")
    def late(due: float) -> None:
        record(durable, due)

    for due in plan():
        processor.enqueue("late", due, at=due)
    while len(durable) < count:
        time.sleep(0.05)
    processor.shutdown()
    store.close()
    print(f"scheduling lateness (start - due), {count} tasks over {spread:g} s, 4 workers:")
    print(f"  in-process submit(at=)          {percentiles(baseline)}")
    print(f"  durable on SQLite, poll {poll:g}s   {percentiles(durable)}")


WORKER = """
import sys, time
import dibs
from dibs.tasks import TaskProcessor
store = dibs.open(sys.argv[1])
processor = TaskProcessor(store=store, workers=4, poll=float(sys.argv[2]), sweep_every=None)
processor.task("noop")(lambda *a: None)
print("ready", flush=True)
sys.stdin.read()
processor.shutdown(timeout=5)
"""


def done_count(db: Path) -> int:
    with sqlite3.connect(db, timeout=60) as conn:
        (n,) = conn.execute("SELECT count(*) FROM dibs_jobs WHERE state = 'done'").fetchone()
    return int(n)


def throughput(tmp: Path, jobs: int, poll: float) -> None:
    started = time.perf_counter()
    with TaskProcessor(workers=4) as processor:
        handles = [processor.submit(noop) for _ in range(jobs)]
        for handle in handles:
            handle.wait()
    base = jobs / (time.perf_counter() - started)
    print(f"throughput, {jobs} no-op jobs, 4 workers per process:")
    print(f"  in-process TaskProcessor           {base:>9,.0f} jobs/s")
    for processes in (1, 3):
        db = tmp / f"throughput-{processes}.db"
        store = dibs.open(f"sqlite:///{db}")
        client = TaskProcessor(store=store, workers=1, take_jobs=False)
        client.task("noop")(noop)
        for i in range(jobs):
            client.enqueue("noop", i)
        script = tmp / "worker.py"
        script.write_text(WORKER)
        procs = [
            subprocess.Popen(
                [sys.executable, str(script), f"sqlite:///{db}", str(poll)],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                text=True,
            )
            for _ in range(processes)
        ]
        for proc in procs:
            assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        began = time.perf_counter()
        while done_count(db) < jobs:
            time.sleep(0.02)
        rate = jobs / (time.perf_counter() - began)
        for proc in procs:
            proc.communicate("")
        client.shutdown()
        store.close()
        label = f"durable, {processes} worker process{'es' if processes > 1 else ''}"
        print(f"  {label:<34} {rate:>9,.0f} jobs/s   ratio {rate / base:.3f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--jobs", type=int, default=2000)
    parser.add_argument("--timed", type=int, default=1000)
    parser.add_argument("--poll", type=float, default=0.01)
    parser.add_argument(
        "--spread", type=float, nargs="+", default=[2.0, 10.0], help="seconds the timed tasks span"
    )
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        for i, spread in enumerate(args.spread):
            lateness(Path(tmp) / f"lateness-{i}.db", args.timed, args.poll, spread)
        throughput(Path(tmp), args.jobs, args.poll)


if __name__ == "__main__":
    main()
