"""Verify the durable task processor under worker kills and pauses (SQLite, PostgreSQL).

Worker processes (:mod:`dibs.verify._task_worker`) share one store (a fresh
SQLite file, or a PostgreSQL schema whose job table is empty) and record every
execution in a ledger of their own (a SQLite file outside the store). This
process enqueues one-off jobs, while the nemesis ``kill -9``s workers (and
restarts them) and ``SIGSTOP``s them for longer than the lease. Then it checks, from the job
table and the ledger:

* every one-off job is ``done``, once (one row; its recorded result is the
  process ID of a worker that really ran it); a job may have *run* more than
  once (a stopped worker wakes after the takeover) — counted, not an anomaly,
  as the processor promises at-least-once execution and exactly-once
  completion;
* every occurrence of the recurring schedule between the first and the last
  is there once (no gap of more than one period), and each finished one ran.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import random
import signal
import sqlite3
import subprocess
import sys
import time
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import dibs
from dibs.exceptions import InvalidInput
from dibs.stores import store_class
from dibs.tasks import TaskProcessor
from dibs.verify._tasks_unique import (
    PLANT_ENV,
    UNIQUE_PLANTS,
    check_unique,
    enqueue_in_step,
    ledger_calls,
    register_unique,
)

__all__ = ["TaskReport", "verify_tasks"]

# The worker (dibs.verify._task_worker) reads these; it is not imported here, so
# that ``python -m`` finds it unimported when it starts one.
LEASE = 1.0
"""Seconds: a killed or stopped worker's job is taken over after about this long."""
TICK = 0.1
JOB_SECONDS = 0.03


@dataclass
class TaskReport:
    """What the task verification found."""

    jobs: int
    done: int
    runs: int
    reruns: int
    occurrences: int
    occurrences_done: int
    faults: dict[str, int]
    seconds: float
    anomalies: list[str] = field(default_factory=list)
    unique: dict[str, Any] = field(default_factory=dict)
    """The unique-jobs figures (see :mod:`dibs.verify._tasks_unique`)."""

    def to_json(self) -> dict[str, Any]:
        """The figures as a JSON-able dict."""
        return {
            "verdict": "anomaly" if self.anomalies else "ok",
            "jobs": self.jobs,
            "jobs_done_once": self.done,
            "job_runs": self.runs,
            "job_reruns": self.reruns,
            "occurrences": self.occurrences,
            "occurrences_done": self.occurrences_done,
            "faults": self.faults,
            "seconds": round(self.seconds, 1),
            **self.unique,
            "anomalies": self.anomalies[:20],
        }


def _start(url: str, ledger: Path, plant: str | None = None) -> subprocess.Popen[str]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "dibs.verify._task_worker", url, str(ledger)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, PLANT_ENV: plant or ""},
    )
    assert proc.stdout is not None
    proc.stdout.readline()  # "ready"
    return proc


def verify_tasks(
    path: str | Path,
    *,
    store_url: str | None = None,
    workers: int = 3,
    jobs: int = 300,
    fault_interval: float = 0.5,
    duration: float = 8.0,
    deadline: float = 120.0,
    plant: str | None = None,
) -> TaskReport:
    """Run the durable task processor under faults and check it.

    The store is a SQLite file created at ``path``, or, given ``store_url``, that
    store (a PostgreSQL schema whose job table must be empty), with ``path``
    the ledger file. Faults go on for at least ``duration`` seconds (the
    schedule keeps ticking) and until every job has finished. Raises
    :class:`~dibs.InvalidInput` for a job table that already holds jobs, and
    :class:`RuntimeError` if the jobs do not all finish by ``deadline`` seconds.
    ``plant``: a planted bug of :data:`~dibs.verify._tasks_UNIQUE_PLANTS`,
    which the check must flag.
    """
    if plant is not None and plant not in UNIQUE_PLANTS:
        raise InvalidInput(
            f"no planted bug {plant!r} for dibs verify tasks (plants: {', '.join(UNIQUE_PLANTS)})",
            field="plant",
            value=plant,
        )
    began = time.monotonic()
    path = Path(path)
    url = store_url or f"sqlite:///{path}"
    if store_class(url).in_process:
        raise InvalidInput(
            "the task verification needs a durable store that processes share (such as "
            f"sqlite:// or postgresql://), got {url.split('://', 1)[0]}://",
            field="store_url",
            value=url,
        )
    ledger = path if store_url else path.with_name(path.name + ".ledger")
    with sqlite3.connect(ledger) as conn:
        conn.execute("PRAGMA journal_mode = WAL")
        conn.execute("CREATE TABLE IF NOT EXISTS runs (job TEXT, pid INTEGER, what TEXT, at REAL)")
    conn.close()
    store = dibs.open(url)
    client = TaskProcessor(store=store, workers=1, take_jobs=False, sweep_every=None)
    for name in ("verify-job", "verify-tick"):
        client.task(name)(lambda *a: None)  # names only: this process runs nothing
    register_unique(client, plant=plant or "")
    if _job_rows(store, ""):
        client.shutdown(timeout=0)
        store.close()
        raise InvalidInput(
            f"the job table of {url.split('?', 1)[0]} already holds jobs; give a fresh one",
            field="store_url",
            value=url,
        )
    procs = [_start(url, ledger, plant) for _ in range(workers)]
    calls: list[tuple[int, str]] = []
    enqueue_in_step(client, lambda key, outcome: calls.append((key, outcome)))
    faults = {"kill": 0, "stop": 0}
    rng = random.Random(0)
    ids = [client.enqueue("verify-job", n) for n in range(jobs)]
    try:
        next_fault = time.monotonic() + fault_interval
        pending = list(ids)
        while pending or time.monotonic() - began < duration:
            if time.monotonic() - began > deadline:
                raise RuntimeError(f"{len(pending)} jobs still unfinished after {deadline:g} s")
            time.sleep(0.05)
            pending = [i for i in pending if _state(client, i) in ("pending", "running")]
            if time.monotonic() < next_fault:
                continue
            next_fault += fault_interval
            victim = rng.randrange(workers)
            if rng.random() < 0.5:
                procs[victim].kill()
                procs[victim].wait()
                _close(procs[victim])
                procs[victim] = _start(url, ledger, plant)
                faults["kill"] += 1
            else:
                procs[victim].send_signal(signal.SIGSTOP)
                time.sleep(LEASE * 2)  # past the lease: its jobs are taken over
                procs[victim].send_signal(signal.SIGCONT)
                faults["stop"] += 1
        time.sleep(LEASE * 2)  # let resumed workers try to record their stale results
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGCONT)
            _close(proc)
        for proc in procs:
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
    try:
        report = _check(client, store, ids, ledger, faults, time.monotonic() - began)
        with contextlib.closing(sqlite3.connect(ledger, timeout=60)) as conn:
            report.unique, found = check_unique(store, calls + ledger_calls(conn))
        report.anomalies += found
        return report
    finally:
        client.shutdown(timeout=0)
        store.close()


def _job_rows(store: dibs.Store, schedule: str) -> list[tuple[str, str]]:
    """(id, state) of every job of ``schedule`` ("": of any kind), read from the job table."""
    table = store.job_table()
    assert table is not None  # the TaskProcessor on this store has refused it otherwise
    return [(job.id, job.state) for job in table.find(schedule or None)]


def _close(proc: subprocess.Popen[str]) -> None:
    for stream in (proc.stdin, proc.stdout):
        if stream is not None:
            with contextlib.suppress(BrokenPipeError):  # the worker was killed
                stream.close()


def _state(client: TaskProcessor, job_id: str) -> str:
    record = client.job(job_id)
    return "missing" if record is None else record.state


def _check(
    client: TaskProcessor,
    store: dibs.Store,
    ids: list[str],
    ledger: Path,
    faults: dict[str, int],
    seconds: float,
) -> TaskReport:
    anomalies: list[str] = []
    with sqlite3.connect(ledger, timeout=60) as conn:
        runs = conn.execute("SELECT job, pid, what FROM runs").fetchall()
    conn.close()
    ran: dict[str, list[int]] = {}
    for job, pid, _ in runs:
        ran.setdefault(job, []).append(pid)
    done = 0
    for job_id in ids:
        record = client.job(job_id)
        if record is None or record.state != "done":
            anomalies.append(f"job {job_id} ended {None if record is None else record.state}")
            continue
        if record.result not in ran.get(job_id, []):
            anomalies.append(f"job {job_id} recorded result {record.result} from no run of it")
            continue
        done += 1
    rows = _job_rows(store, "verify-tick")
    nominal = sorted(
        (datetime.fromisoformat(i.split("@", 1)[1]).timestamp(), i, s) for i, s in rows
    )
    for (a, _, _), (b, later, _) in itertools.pairwise(nominal):
        if b - a > TICK * 1.5:
            anomalies.append(f"occurrences skipped between {a:.1f} and {b:.1f} (next {later})")
    finished = [(i, s) for _, i, s in nominal if s not in ("pending", "running")]
    for job_id, state in finished:
        if state != "done" or job_id not in ran:
            anomalies.append(
                f"occurrence {job_id} ended {state} with {len(ran.get(job_id, []))} runs"
            )
    job_runs = sum(len(ran.get(i, [])) for i in ids)
    return TaskReport(
        jobs=len(ids),
        done=done,
        runs=job_runs,
        reruns=job_runs - len([i for i in ids if i in ran]),
        occurrences=len(nominal),
        occurrences_done=sum(1 for _, s in finished if s == "done"),
        faults=faults,
        seconds=seconds,
        anomalies=anomalies,
    )
