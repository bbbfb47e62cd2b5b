"""The recurring guarantees across worker processes running one durable schedule.

Four processes on one SQLite file or one PostgreSQL schema all declare the same
``overlap="skip"`` schedule, every 0.2 s, of a run that takes 0.5 s: without the
rule runs would overlap at every beat. Each start and end of a run is written to a
ledger outside the store (a file per process, appended to, so a worker stopped
mid-write holds no lock the others wait on) with its job, occurrence, process and
wall-clock time (one host, one clock). Checked, as docs/tasks.md states them:

* enqueue: exactly one job per occurrence run, fleet-wide (never two for one
  nominal time);
* start: at least once: a run whose worker is killed (``kill -9``) or stopped
  (``SIGSTOP`` longer than the lease) starts again elsewhere, as attempt 2;
* recorded result: exactly once, and never the stopped worker's;
* no two runs of different occurrences overlap, except the run of a worker
  stopped past its lease (documented);
* an occurrence due while a run executed is skipped, not run afterwards.

Waits only guard against hangs; nothing asserts on time.
"""

from __future__ import annotations

import itertools
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path

import pytest

import dibs
from conftest import StoreMaker
from dibs.tasks import TaskProcessor
from eventually import eventually
from workers import stop_workers

pytestmark = pytest.mark.timeout(300)

GUARD = 120.0
LEASE = 3.0  # long enough that a loaded machine never lapses a live lease
INTERVAL = 0.2
RUN = 0.5
PROCESSES = 4
SKEW = 0.005

WORKER = r"""
import json, os, sys, time
import dibs
from dibs.tasks import TaskProcessor, current

url, ledger, lease, interval, run = sys.argv[1:6]
# This process's own ledger, appended to with one write per line (atomic with O_APPEND).
# A shared SQLite ledger would let a worker stopped mid-INSERT (SIGSTOP) hold its write
# lock, and every other worker's next run would wait on it instead of running.
effects = os.open(
    os.path.join(ledger, f"{os.getpid()}.jsonl"), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644
)

def note(what):
    context = current()
    line = [what, context.job_id, context.nominal_time.timestamp(), os.getpid(), time.time()]
    os.write(effects, (json.dumps(line) + "\n").encode())

store = dibs.open(url)
processor = TaskProcessor(store=store, workers=2, lease=float(lease), poll=0.02,
                          sweep_every=None)

@processor.task("tick")
def tick():
    note("start")
    current().token.sleep(float(run))
    note("end")
    return os.getpid()

processor.every(float(interval), "tick", id="s", overlap="skip", catch_up="all")
print("ready", flush=True)
sys.stdin.read()
processor.shutdown(timeout=5)
store.close()
"""


class Run:
    def __init__(self, job: str, nominal: float, pid: int, start: float) -> None:
        self.job, self.nominal, self.pid, self.start = job, nominal, pid, start
        self.end: float | None = None


class Fleet:
    def __init__(self, tmp_path: Path, place: StoreMaker) -> None:
        self.place = place
        self.ledger = tmp_path / "ledger"  # a file per worker process
        self.ledger.mkdir()
        self.script = tmp_path / "worker.py"
        self.script.write_text(WORKER)
        self.store = dibs.open(place.url)
        self.client = TaskProcessor(store=self.store, take_jobs=False, sweep_every=None)
        self.client.task("tick")(lambda: None)  # the name only
        self.procs: list[subprocess.Popen[str]] = []
        self.killed: dict[int, float] = {}  # pid -> when it was dead for sure

    def start(self, count: int) -> None:
        for _ in range(count):
            proc = subprocess.Popen(
                [sys.executable, str(self.script), self.place.url, str(self.ledger),
                 str(LEASE), str(INTERVAL), str(RUN)],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
            )  # fmt: skip
            self.procs.append(proc)
            assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"

    def runs(self) -> list[Run]:
        """Every run, in start order; a run that never ended has ``end`` None."""
        found: dict[tuple[str, int], Run] = {}
        for ledger in self.ledger.glob("*.jsonl"):
            text = ledger.read_text()
            # A line being written as we read is not whole yet: it counts next time.
            for line in text[: text.rfind("\n") + 1].splitlines():
                what, job, nominal, pid, at = json.loads(line)
                if what == "start":
                    found[(job, pid)] = Run(job, nominal, pid, at)
                else:
                    found[(job, pid)].end = at
        return sorted(found.values(), key=lambda r: r.start)

    def done(self) -> list[str]:
        """IDs of the schedule's jobs recorded done."""
        return [r.id for r in self.client.jobs(states=["done"]) if r.id.startswith("s@")]

    def running_victim(self) -> Run:
        """Wait until a run is executing in a worker; return it."""

        def executing() -> Run | None:
            live = [r for r in self.runs() if r.end is None and r.pid not in self.killed]
            return live[-1] if live else None

        run = eventually(executing, timeout=GUARD)
        assert isinstance(run, Run)
        return run

    def stop(self) -> None:
        stop_workers(self.procs, GUARD)
        self.client.shutdown(timeout=0)
        self.store.close()


@pytest.fixture(params=["sqlite", "postgresql"])
def fleet(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Fleet]:
    pg = request.getfixturevalue("pg_url") if request.param == "postgresql" else None
    place = StoreMaker(request.param, tmp_path, pg)
    f = Fleet(tmp_path, place)
    yield f
    f.stop()
    place.close()


def check(fleet: Fleet, stale: tuple[str, int] | None = None) -> list[Run]:
    """Assert the stated guarantees over every run so far; return the runs."""
    runs = fleet.runs()
    # Enqueue, exactly once: one job per occurrence run.
    jobs_of: dict[float, set[str]] = {}
    for run in runs:
        jobs_of.setdefault(run.nominal, set()).add(run.job)
    assert all(len(jobs) == 1 for jobs in jobs_of.values()), {
        n: j for n, j in jobs_of.items() if len(j) > 1
    }
    # Recorded result, exactly once, by a process that started the job, never a stale one.
    for record in fleet.client.jobs():
        if record.id.startswith("s@") and record.state == "done":
            starters = [r.pid for r in runs if r.job == record.id]
            assert record.result in starters
            assert [a.outcome_kind for a in record.attempts].count("ok") == 1
            assert stale is None or (record.id, record.result) != stale
        assert record.state in ("pending", "running", "done"), record
    # No two runs of different occurrences overlap (a killed run ended when it died).
    spans = []
    for run in runs:
        if (run.job, run.pid) == stale:
            continue  # a worker stopped past its lease: the documented exception
        end = run.end if run.end is not None else fleet.killed.get(run.pid, time.time() + 1e6)
        spans.append((run.start, end, run.nominal, run.pid))
    spans.sort()
    latest = (float("-inf"), 0.0, 0)  # the span that ends last so far: (end, nominal, pid)
    for start, end, nominal, pid in spans:
        if start < latest[0] and nominal != latest[1]:
            raise AssertionError(f"{nominal} ({pid}) overlaps {latest[1]} ({latest[2]})")
        latest = max(latest, (end, nominal, pid))
    # Skipped, not queued: no occurrence run was due before the previous run ended.
    order = sorted(
        {r.nominal: r for r in runs if (r.job, r.pid) != stale}.values(),
        key=lambda r: r.start,
    )
    for before, after in itertools.pairwise(order):
        ended = before.end if before.end is not None else fleet.killed.get(before.pid)
        if ended is not None and after.nominal > before.nominal:
            # (the store's clock and time.time() are one host's clock: a few ms apart at most)
            assert after.nominal > ended - SKEW, (before.nominal, ended, after.nominal)
    return runs


def nominal_of(job_id: str) -> float:
    return datetime.fromisoformat(job_id.split("@", 1)[1]).timestamp()


def test_skip_runs_one_at_a_time_across_processes(fleet: Fleet) -> None:
    fleet.start(PROCESSES)
    eventually(lambda: len(fleet.done()) >= 15, timeout=GUARD)
    runs = check(fleet)
    assert len({r.pid for r in runs}) > 1  # the schedule was shared by the processes
    assert all(len([r for r in runs if r.job == job]) == 1 for job in fleet.done())


def test_kill_9_mid_run_is_started_again_and_recorded_once(fleet: Fleet) -> None:
    fleet.start(PROCESSES)
    eventually(lambda: len(fleet.done()) >= 2, timeout=GUARD)
    victim = fleet.running_victim()
    os.kill(victim.pid, signal.SIGKILL)
    next(p for p in fleet.procs if p.pid == victim.pid).wait(GUARD)
    fleet.killed[victim.pid] = time.time()
    eventually(lambda: victim.job in fleet.done(), timeout=GUARD)  # started again elsewhere
    seen = len(fleet.done())
    eventually(lambda: len(fleet.done()) >= seen + 5, timeout=GUARD)  # the schedule goes on
    check(fleet)
    record = fleet.client.job(victim.job)
    assert record is not None and record.attempt == 2 and record.result != victim.pid


def test_a_worker_stopped_past_its_lease_records_nothing(fleet: Fleet) -> None:
    fleet.start(PROCESSES)
    eventually(lambda: len(fleet.done()) >= 2, timeout=GUARD)
    victim = fleet.running_victim()
    os.kill(victim.pid, signal.SIGSTOP)
    eventually(lambda: victim.job in fleet.done(), timeout=GUARD)  # taken over after its lease
    seen = len(fleet.done())
    eventually(lambda: len(fleet.done()) >= seen + 3, timeout=GUARD)
    os.kill(victim.pid, signal.SIGCONT)
    eventually(  # the stale run ends; its result must not be recorded
        lambda: any(
            r.end is not None for r in fleet.runs() if (r.job, r.pid) == (victim.job, victim.pid)
        ),
        timeout=GUARD,
    )
    seen = len(fleet.done())
    eventually(lambda: len(fleet.done()) >= seen + 3, timeout=GUARD)
    check(fleet, stale=(victim.job, victim.pid))
    record = fleet.client.job(victim.job)
    assert record is not None and record.attempt == 2 and record.result != victim.pid
