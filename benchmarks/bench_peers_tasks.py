"""Durable tasks against the queues users know: dibs vs procrastinate (PostgreSQL), huey (SQLite).

Every workload runs dibs and its peer in the same round, alternating which goes
first, for ``--rounds`` rounds; the summary gives each side's median and range
and the ratio of the medians, written so that **above 1 means dibs is ahead**.

PostgreSQL (a private server from dibs.verify.harness, one database
for both systems):

* **throughput**: ``--jobs`` no-op jobs are enqueued, then 1 or 3 worker
  processes (4 workers each: dibs threads, procrastinate ``concurrency=4`` on
  ``async def`` tasks) run them; jobs/s from the moment every process is ready
  until every job is recorded finished; worker CPU per job: the worker
  processes' user and system CPU (getrusage of the waited-for children,
  start-up included) divided by the jobs, which the machine's load moves
  less than the wall clock. Commits per job: the database's
  ``pg_stat_database.xact_commit`` delta over enqueue and run, minus the
  benchmark's own polling queries, divided by the jobs.
* **enqueue**: ``--jobs`` jobs enqueued one call at a time from one thread
  (dibs ``TaskProcessor.enqueue``; procrastinate ``Task.defer`` on its sync
  connector, the faster of its two here).
* **enqueue→start**: one worker process; a job every 1/``--rate`` s carrying
  its enqueue time; the task records its start minus that.
* **schedule**: a 1 s recurring schedule declared by 3 worker processes for
  ``--schedule-seconds``; lateness is the start minus the nominal time, and
  every nominal second between the first and the last must run exactly once
  (procrastinate: ``@app.periodic(cron="* * * * * *")``).

SQLite (huey 3.5 ``SqliteHuey`` with its default consumer: thread workers,
0.1 s initial poll with backoff): throughput at 1 and 3 processes and
enqueue→start, as above. dibs's tasks keep their leases (kill -9 loses
nothing); huey's dequeue deletes the row before running it.

    python benchmarks/bench_peers_tasks.py [--jobs 2000] [--rounds 3] [--rate 20]
        [--latency-jobs 100] [--schedule-seconds 12] [--only pg sqlite schedule]
        [--json FILE]

``--json FILE`` writes ``{"benchmark": ..., "series": [{"name", "clients",
"throughput", "p99_ms"}]}`` (clients = worker processes; medians over rounds)
for benchmarks/plot.py.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import signal
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg

from dibs.verify.harness import PostgresServer  # the tests' throwaway server

CONCURRENCY = 4

WORKER = r"""
import json, os, sys, time
system, url, mode, ledger, concurrency = sys.argv[1:6]
concurrency = int(concurrency)
out = open(os.path.join(ledger, f"{system}-{os.getpid()}.txt"), "a", buffering=1)

if system == "dibs":
    import dibs
    from datetime import datetime
    from dibs.tasks import TaskProcessor, current
    store = dibs.open(url)
    store.job_table()  # the schema, before the clock starts
    print("ready", flush=True)
    sys.stdin.readline()  # "go": every process starts at once
    p = TaskProcessor(store=store, workers=concurrency, sweep_every=None)
    p.task("noop")(lambda *a: None)

    @p.task("stamp")
    def stamp(sent):
        out.write(f"{time.time() - sent}\n")

    @p.task("tick")
    def tick():
        nominal = datetime.fromisoformat(current().job_id.split("@", 1)[1]).timestamp()
        out.write(f"{nominal} {time.time() - nominal}\n")

    if mode == "schedule":
        p.every(1, "tick", id="bench-tick")
    sys.stdin.read()
    p.shutdown(timeout=5)
    store.close()
elif system == "procrastinate":
    import procrastinate
    app = procrastinate.App(connector=procrastinate.PsycopgConnector(conninfo=url))

    @app.task(name="noop")
    async def noop(n=0):
        pass

    @app.task(name="stamp")
    async def stamp(sent):
        out.write(f"{time.time() - sent}\n")

    if mode == "schedule":
        @app.periodic(cron="* * * * * *")
        @app.task(name="tick")
        async def tick(timestamp):
            out.write(f"{timestamp} {time.time() - timestamp}\n")

    print("ready", flush=True)
    sys.stdin.readline()
    app.run_worker(concurrency=concurrency, install_signal_handlers=True)
elif system == "huey":
    from huey import SqliteHuey
    huey = SqliteHuey(filename=url)

    @huey.task(name="noop")
    def noop(n=0):
        return 1

    @huey.task(name="stamp")
    def stamp(sent):
        out.write(f"{time.time() - sent}\n")
        return 1

    print("ready", flush=True)
    sys.stdin.readline()
    consumer = huey.create_consumer(workers=concurrency, worker_type="thread")
    consumer.run()
"""


class Bench:
    def __init__(self, tmp: Path, pg_url: str, admin_url: str) -> None:
        self.tmp = tmp
        self.pg_url = pg_url
        self.admin_url = admin_url
        self.script = tmp / "worker.py"
        self.script.write_text(WORKER)
        self.seq = 0

    # --- processes ------------------------------------------------------------------------

    def workers(self, system: str, url: str, mode: str, n: int) -> tuple[list[Any], Path]:
        self.seq += 1
        ledger = self.tmp / f"ledger-{self.seq}"
        ledger.mkdir()
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
        procs = [
            subprocess.Popen(
                [
                    sys.executable,
                    str(self.script),
                    system,
                    url,
                    mode,
                    str(ledger),
                    str(CONCURRENCY),
                ],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL,
                text=True,
                env=env,
            )
            for _ in range(n)
        ]
        for proc in procs:
            assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        for proc in procs:
            proc.stdin.write("go\n")
            proc.stdin.flush()
        return procs, ledger

    @staticmethod
    def stop(system: str, procs: list[Any]) -> None:
        for proc in procs:
            if system == "dibs":
                proc.stdin.close()
            else:
                proc.send_signal(signal.SIGINT if system == "huey" else signal.SIGTERM)
        for proc in procs:
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            proc.stdout.close()
            if proc.stdin and not proc.stdin.closed:
                proc.stdin.close()

    @staticmethod
    def ledger_lines(ledger: Path) -> list[str]:
        return [line for f in ledger.iterdir() for line in f.read_text().splitlines() if line]

    # --- PostgreSQL -----------------------------------------------------------------------

    def fresh_pg(self, system: str) -> str:
        """A fresh schema (dibs) or a fresh database (procrastinate), as its URL."""
        self.seq += 1
        name = f"b{self.seq}"
        with psycopg.connect(self.admin_url, autocommit=True) as conn:
            conn.execute(f"CREATE DATABASE {name} OWNER dibs_app")
        url = self.pg_url.rsplit("/", 1)[0] + f"/{name}"
        if system == "procrastinate":
            import procrastinate

            app = procrastinate.App(connector=procrastinate.SyncPsycopgConnector(conninfo=url))
            with app.open():
                app.schema_manager.apply_schema()
        return url

    @staticmethod
    def commits(url: str) -> int:
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute("SELECT pg_stat_clear_snapshot()")
            row = conn.execute(
                "SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()"
            ).fetchone()
        assert row is not None
        return int(row[0])

    def enqueuer(
        self, system: str, url: str
    ) -> tuple[Callable[[str, Any], None], Callable[[], None]]:
        if system == "dibs":
            import dibs
            from dibs.tasks import TaskProcessor

            store = dibs.open(url)
            client = TaskProcessor(store=store, workers=1, take_jobs=False, sweep_every=None)
            for name in ("noop", "stamp"):
                client.task(name)(lambda *a: None)

            def close() -> None:
                client.shutdown()
                store.close()

            return client.enqueue, close
        if system == "procrastinate":
            import procrastinate

            app = procrastinate.App(connector=procrastinate.SyncPsycopgConnector(conninfo=url))
            tasks = {}
            for name in ("noop", "stamp"):
                tasks[name] = app.task(name=name)(lambda n=0, sent=0: None)
            app.open()
            kw = {"noop": "n", "stamp": "sent"}
            return (lambda name, arg: tasks[name].defer(**{kw[name]: arg})), app.close
        from huey import SqliteHuey

        huey = SqliteHuey(filename=url)
        htasks = {name: huey.task(name=name)(lambda *a: 1) for name in ("noop", "stamp")}
        return (lambda name, arg: htasks[name](arg)), (lambda: None)

    def finished(self, system: str, url: str) -> Callable[[], int]:
        if system == "huey":
            conn = sqlite3.connect(url, timeout=60)
            return lambda: int(conn.execute("SELECT count(*) FROM kv").fetchone()[0])
        if url.startswith("sqlite:///"):
            conn = sqlite3.connect(url.removeprefix("sqlite:///"), timeout=60)
            query = "SELECT count(*) FROM dibs_jobs WHERE state = 'done'"
            return lambda: int(conn.execute(query).fetchone()[0])
        pg = psycopg.connect(url, autocommit=True)
        query = (
            "SELECT count(*) FROM dibs.jobs WHERE state = 'done'"
            if system == "dibs"
            else "SELECT count(*) FROM procrastinate_jobs WHERE status = 'succeeded'"
        )
        return lambda: int(pg.execute(query).fetchone()[0])  # type: ignore[index]

    def throughput(self, system: str, processes: int, jobs: int) -> dict[str, float]:
        url = self.sqlite_url(system) if system in {"huey", "dibs-sqlite"} else None
        pg = url is None
        if pg:
            url = self.fresh_pg(system)
        assert url is not None
        name = "dibs" if system.startswith("dibs") else system
        if pg:
            before = self.commits(url)
        add, close = self.enqueuer(name, url)
        for i in range(jobs):
            add("noop", i)
        close()
        count = self.finished(name, url)
        polls = 0
        cpu_before = _children_cpu()
        procs, _ = self.workers(name, url, "run", processes)
        began = time.perf_counter()
        while count() < jobs:
            polls += 1
            time.sleep(0.005)
        elapsed = time.perf_counter() - began
        self.stop(name, procs)
        # The worker processes' whole CPU (start-up and shutdown included), per job.
        result = {
            "throughput": jobs / elapsed,
            "cpu_us": (_children_cpu() - cpu_before) / jobs * 1e6,
        }
        if pg:
            time.sleep(1.0)  # exited backends have flushed their statistics
            result["commits_per_job"] = (self.commits(url) - before - polls - 2) / jobs
        return result

    def sqlite_url(self, system: str) -> str:
        self.seq += 1
        path = self.tmp / f"{system}-{self.seq}.db"
        return str(path) if system == "huey" else f"sqlite:///{path}"

    def enqueue_rate(self, system: str, jobs: int) -> dict[str, float]:
        url = self.fresh_pg(system)
        add, close = self.enqueuer(system, url)
        add("noop", -1)  # connect and warm up
        began = time.perf_counter()
        for i in range(jobs):
            add("noop", i)
        elapsed = time.perf_counter() - began
        close()
        return {"throughput": jobs / elapsed}

    def latency(self, system: str, count: int, rate: float) -> dict[str, float]:
        if system in ("huey", "dibs-sqlite"):
            url = self.sqlite_url(system)
        else:
            url = self.fresh_pg(system)
        name = "dibs" if system.startswith("dibs") else system
        procs, ledger = self.workers(name, url, "run", 1)
        add, close = self.enqueuer(name, url)
        time.sleep(0.5)  # let the worker settle into its idle state
        start = time.perf_counter()
        for i in range(count):
            target = start + i / rate
            if (pause := target - time.perf_counter()) > 0:
                time.sleep(pause)
            add("stamp", time.time())
        deadline = time.monotonic() + 60
        while len(self.ledger_lines(ledger)) < count and time.monotonic() < deadline:
            time.sleep(0.05)
        close()
        self.stop(name, procs)
        values = sorted(float(x) * 1000 for x in self.ledger_lines(ledger))
        return {"p50_ms": values[len(values) // 2], "p99_ms": values[int(len(values) * 0.99)]}

    def schedule(self, system: str, seconds: float) -> dict[str, float]:
        url = self.fresh_pg(system)
        procs, ledger = self.workers(system, url, "schedule", 3)
        time.sleep(seconds)
        self.stop(system, procs)
        rows = [line.split() for line in self.ledger_lines(ledger)]
        nominal = sorted(round(float(n)) for n, _ in rows)
        late = sorted(float(x) * 1000 for _, x in rows)
        seen = {n: nominal.count(n) for n in set(nominal)}
        span = range(min(seen), max(seen) + 1) if seen else range(0)
        exact = all(seen.get(n) == 1 for n in span)
        return {
            "p50_ms": late[len(late) // 2] if late else float("nan"),
            "occurrences": len(span),
            "exactly_once": float(exact),
        }


def _children_cpu() -> float:
    """User and system CPU seconds of the child processes waited for so far."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def summary(
    label: str, unit: str, dibs: list[float], peer: list[float], peer_name: str, higher_better: bool
) -> float:
    d, p = statistics.median(dibs), statistics.median(peer)
    ratio = d / p if higher_better else p / d
    print(
        f"  {label:<34} dibs {d:>9,.1f} [{min(dibs):,.1f}-{max(dibs):,.1f}]  "
        f"{peer_name} {p:>9,.1f} [{min(peer):,.1f}-{max(peer):,.1f}] {unit}   "
        f"dibs ahead x{ratio:.2f}"
    )
    return ratio


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--jobs", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--rate", type=float, default=20.0)
    parser.add_argument("--latency-jobs", type=int, default=100)
    parser.add_argument("--schedule-seconds", type=float, default=12.0)
    parser.add_argument("--only", nargs="+", default=["pg", "sqlite", "schedule"])
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    results: dict[tuple[str, str], list[dict[str, float]]] = {}

    def run(key: str, system: str, fn: Callable[[], dict[str, float]]) -> None:
        results.setdefault((key, system), []).append(fn())

    with tempfile.TemporaryDirectory() as tmp, PostgresServer() as server:
        bench = Bench(Path(tmp), server.create_database(), server.admin_url)
        for r in range(args.rounds):
            flip = r % 2 == 1
            if "pg" in args.only:
                pair = ["procrastinate", "dibs"] if flip else ["dibs", "procrastinate"]
                for n in (1, 3):
                    for s in pair:
                        run(
                            f"pg-throughput-{n}",
                            s,
                            lambda s=s, n=n: bench.throughput(s, n, args.jobs),
                        )
                for s in pair:
                    run("pg-enqueue", s, lambda s=s: bench.enqueue_rate(s, args.jobs))
                for s in pair:
                    run("pg-latency", s, lambda s=s: bench.latency(s, args.latency_jobs, args.rate))
            if "sqlite" in args.only:
                pair = ["huey", "dibs-sqlite"] if flip else ["dibs-sqlite", "huey"]
                for n in (1, 3):
                    for s in pair:
                        run(
                            f"sq-throughput-{n}",
                            s,
                            lambda s=s, n=n: bench.throughput(s, n, args.jobs),
                        )
                for s in pair:
                    run("sq-latency", s, lambda s=s: bench.latency(s, args.latency_jobs, args.rate))
            if "schedule" in args.only:
                pair = ["procrastinate", "dibs"] if flip else ["dibs", "procrastinate"]
                for s in pair:
                    run("schedule", s, lambda s=s: bench.schedule(s, args.schedule_seconds))
            print(f"round {r + 1}/{args.rounds} done", file=sys.stderr, flush=True)

    def field(key: str, system: str, name: str) -> list[float]:
        return [x[name] for x in results.get((key, system), [])]

    series: list[dict[str, Any]] = []
    print(f"{args.rounds} interleaved rounds; medians [min-max]; ratios: above 1 means dibs ahead")
    if "pg" in args.only:
        print(f"PostgreSQL, {args.jobs} no-op jobs, {CONCURRENCY} workers per process:")
        for n in (1, 3):
            key = f"pg-throughput-{n}"
            summary(
                f"throughput, {n} process{'es' if n > 1 else ''}",
                "jobs/s",
                field(key, "dibs", "throughput"),
                field(key, "procrastinate", "throughput"),
                "procrastinate",
                True,
            )
            for s in ("dibs", "procrastinate"):
                series.append(
                    {
                        "name": f"{s} - PostgreSQL",
                        "clients": n,
                        "p99_ms": None,
                        "throughput": statistics.median(field(key, s, "throughput")),
                    }
                )
            for s in ("dibs", "procrastinate"):
                cpj = field(key, s, "commits_per_job")
                print(f"    commits per job ({s}, {n} proc): {statistics.median(cpj):.2f}")
        summary(
            "enqueue, one call at a time",
            "jobs/s",
            field("pg-enqueue", "dibs", "throughput"),
            field("pg-enqueue", "procrastinate", "throughput"),
            "procrastinate",
            True,
        )
        summary(
            f"enqueue→start p50 at {args.rate:g}/s",
            "ms",
            field("pg-latency", "dibs", "p50_ms"),
            field("pg-latency", "procrastinate", "p50_ms"),
            "procrastinate",
            False,
        )
        summary(
            f"enqueue→start p99 at {args.rate:g}/s",
            "ms",
            field("pg-latency", "dibs", "p99_ms"),
            field("pg-latency", "procrastinate", "p99_ms"),
            "procrastinate",
            False,
        )
    if "sqlite" in args.only:
        print(f"SQLite, {args.jobs} no-op jobs, {CONCURRENCY} workers per process:")
        for n in (1, 3):
            key = f"sq-throughput-{n}"
            summary(
                f"throughput, {n} process{'es' if n > 1 else ''}",
                "jobs/s",
                field(key, "dibs-sqlite", "throughput"),
                field(key, "huey", "throughput"),
                "huey",
                True,
            )
            summary(
                f"worker CPU per job, {n} process{'es' if n > 1 else ''}",
                "µs",
                field(key, "dibs-sqlite", "cpu_us"),
                field(key, "huey", "cpu_us"),
                "huey",
                False,
            )
            for s, label in (
                ("dibs-sqlite", "dibs - SQLite"),
                ("huey", "huey SqliteHuey - SQLite"),
            ):
                series.append(
                    {
                        "name": label,
                        "clients": n,
                        "p99_ms": None,
                        "throughput": statistics.median(field(key, s, "throughput")),
                    }
                )
        summary(
            f"enqueue→start p50 at {args.rate:g}/s",
            "ms",
            field("sq-latency", "dibs-sqlite", "p50_ms"),
            field("sq-latency", "huey", "p50_ms"),
            "huey",
            False,
        )
    if "schedule" in args.only:
        print(f"1 s schedule, 3 processes, {args.schedule_seconds:g} s:")
        summary(
            "lateness p50",
            "ms",
            field("schedule", "dibs", "p50_ms"),
            field("schedule", "procrastinate", "p50_ms"),
            "procrastinate",
            False,
        )
        for s in ("dibs", "procrastinate"):
            once = field("schedule", s, "exactly_once")
            occ = field("schedule", s, "occurrences")
            print(
                f"    {s}: every occurrence exactly once in {sum(once):.0f}/{len(once)} rounds "
                f"({statistics.median(occ):.0f} occurrences)"
            )
    if args.json is not None:
        args.json.write_text(json.dumps({"benchmark": "tasks-peers", "series": series}, indent=1))


if __name__ == "__main__":
    main()
