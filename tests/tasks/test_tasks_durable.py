"""Durable tasks: one process with memory://, and 3 worker processes on one SQLite file or one
PostgreSQL schema.

Worker processes run the script below; each run of a job writes an *effect*
row (job, pid, what) to a separate ledger file, so the test can count runs.
Waiting loops poll the files with a hang guard; nothing asserts on time.
"""

from __future__ import annotations

import itertools
import os
import signal
import sqlite3
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

import dibs
from conftest import StoreMaker
from dibs.tasks import TaskProcessor, current
from eventually import eventually
from workers import stop_workers

GUARD = 60.0  # real seconds before a wait is declared hung

WORKER = r"""
import os, sqlite3, sys, time
import dibs
from dibs.tasks import Misfire, TaskProcessor, current

url, ledger, schedule = sys.argv[1], sys.argv[2], sys.argv[3] == "1"
effects = sqlite3.connect(ledger, timeout=30, isolation_level=None, check_same_thread=False)

def effect(what):
    effects.execute("INSERT INTO effects VALUES (?, ?, ?)", (current().job_id, os.getpid(), what))

store = dibs.open(url)
processor = TaskProcessor(store=store, workers=2, lease=1.5, poll=0.02)

@processor.task("quick")
def quick(n, share=False):
    effect("ran")
    # share: wait (bounded) until another worker process has run a job too, so that a
    # machine slow to start the other workers cannot let one process drain the queue.
    deadline = time.monotonic() + 30
    while share and time.monotonic() < deadline:
        own = sqlite3.connect(ledger, timeout=30)  # the shared one is not for threads
        try:
            pids = own.execute("SELECT COUNT(DISTINCT pid) FROM effects").fetchone()[0]
        finally:
            own.close()
        if pids > 1:
            break
        time.sleep(0.01)
    return n

@processor.task("slow")
def slow():
    effect("started")
    current().token.sleep(2.0)
    effect("finished")
    return os.getpid()

@processor.task("tick")
def tick():
    effect("tick")

if schedule:
    # "all": every occurrence runs, even one held back by max_running=1 or a late tick.
    processor.every(0.1, "tick", id="tick", misfire=Misfire(coalesce="all"))
print("ready", flush=True)
sys.stdin.read()  # run until the test closes our stdin
processor.shutdown(timeout=5)
store.close()
"""


class Cluster:
    """Three worker processes on one store, plus the test's own view of it."""

    def __init__(self, tmp_path: Path, url: str) -> None:
        self.url = url
        self.ledger = tmp_path / "ledger.db"
        self.script = tmp_path / "worker.py"
        self.script.write_text(WORKER)
        with sqlite3.connect(self.ledger) as conn:
            conn.execute("PRAGMA journal_mode = WAL")
            conn.execute("CREATE TABLE effects (job TEXT, pid INTEGER, what TEXT)")
        self.store = dibs.open(url)
        self.client = TaskProcessor(store=self.store, workers=1, take_jobs=False)
        for name in ("quick", "slow", "tick"):
            self.client.task(name)(lambda *a: None)  # names only: this process runs nothing
        self.procs: list[subprocess.Popen[str]] = []

    def start(self, count: int = 3, schedule: bool = False) -> None:
        for _ in range(count):
            proc = subprocess.Popen(
                [sys.executable, str(self.script), self.url, str(self.ledger),
                 "1" if schedule else "0"],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
            )  # fmt: skip
            assert proc.stdout is not None
            assert proc.stdout.readline().strip() == "ready"
            self.procs.append(proc)

    def effects(self, what: str | None = None) -> list[tuple[str, int, str]]:
        with sqlite3.connect(self.ledger, timeout=30) as conn:
            rows = conn.execute("SELECT job, pid, what FROM effects").fetchall()
        return [r for r in rows if what is None or r[2] == what]

    def stop(self) -> None:
        stop_workers(self.procs, GUARD)
        self.client.shutdown(timeout=0)
        self.store.close()


def done(cluster: Cluster, job_id: str) -> bool:
    """Whether the job is done; fails the test at once if it failed instead."""
    record = cluster.client.job(job_id)
    assert record is None or record.state != "failed", record
    return record is not None and record.state == "done"


@pytest.fixture(params=["sqlite", "postgresql"])
def cluster(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Cluster]:
    pg = request.getfixturevalue("pg_url") if request.param == "postgresql" else None
    place = StoreMaker(request.param, tmp_path, pg)  # a file, or a fresh schema
    c = Cluster(tmp_path, place.url)
    yield c
    c.stop()
    place.close()


def test_thousand_jobs_each_complete_exactly_once(cluster: Cluster) -> None:
    ids = [cluster.client.enqueue("quick", i, True) for i in range(1000)]
    cluster.start(3)

    eventually(lambda: all(done(cluster, i) for i in ids))
    runs = cluster.effects("ran")
    assert sorted(job for job, _, _ in runs) == sorted(ids)  # each ran once, none twice
    assert len({pid for _, pid, _ in runs}) > 1  # the work was shared
    assert [cluster.client.job(i).result for i in ids[:5]] == [0, 1, 2, 3, 4]  # type: ignore[union-attr]


def test_every_occurrence_of_a_schedule_runs_exactly_once(cluster: Cluster) -> None:
    cluster.start(3, schedule=True)
    eventually(lambda: len(cluster.effects("tick")) >= 30)
    ticks = cluster.effects("tick")
    nominal = sorted(job.split("@", 1)[1] for job, _, _ in ticks)
    assert len(nominal) == len(set(nominal)), "an occurrence ran twice"
    stamps = [dibs_time(n) for n in nominal]
    gaps = {round(b - a, 3) for a, b in itertools.pairwise(stamps)}
    assert gaps == {0.1}, f"occurrences missing between first and last: {nominal}"


def dibs_time(iso: str) -> float:
    from datetime import datetime

    return datetime.fromisoformat(iso).timestamp()


def test_kill_9_mid_job_is_taken_over_and_recorded_once(cluster: Cluster) -> None:
    cluster.start(3)
    job = cluster.client.enqueue("slow")
    eventually(lambda: cluster.effects("started"))
    ((_, victim, _),) = cluster.effects("started")
    os.kill(victim, signal.SIGKILL)
    eventually(lambda: done(cluster, job))
    record = cluster.client.job(job)
    assert record is not None
    assert record.result != victim and record.attempt == 2
    assert [pid for _, pid, _ in cluster.effects("finished")] == [record.result]


def test_stopped_worker_cannot_record_its_stale_result(cluster: Cluster) -> None:
    cluster.start(3)
    job = cluster.client.enqueue("slow")
    eventually(lambda: cluster.effects("started"))
    ((_, sleeper, _),) = cluster.effects("started")
    os.kill(sleeper, signal.SIGSTOP)
    eventually(lambda: len(cluster.effects("started")) >= 2)  # taken over
    owner = next(pid for _, pid, _ in cluster.effects("started") if pid != sleeper)
    # Wake the stale worker while the new owner is mid-job: its run ends at once
    # (its sleep is long over) and races to record first. The fenced writes and
    # the confirm must drop its result.
    os.kill(sleeper, signal.SIGCONT)
    eventually(lambda: done(cluster, job))
    eventually(lambda: len(cluster.effects("finished")) >= 2)  # both runs ended
    winner = cluster.client.job(job)
    assert winner is not None and (winner.result, winner.attempt) == (owner, 2)


# --- one process, memory:// -------------------------------------------------------------------


def test_durable_jobs_retry_and_record_results_on_memory_store() -> None:
    store = dibs.open("memory://")
    processor = TaskProcessor(store=store, workers=2, lease=5, poll=0.01)
    calls: list[int] = []

    @processor.task("flaky", retries=2, backoff=0.001)
    def flaky(x: int) -> int:
        calls.append(x)
        assert current().job_id is not None
        if len(calls) < 3:
            raise ValueError("not yet")
        return x * 10

    @processor.task("broken")
    def broken() -> None:
        raise KeyError("nope")

    gate = threading.Event()

    @processor.task("gated")
    def gated() -> None:
        assert gate.wait(GUARD)  # live until the second enqueue has met it
        raise KeyError("nope")

    ok = processor.enqueue(flaky, 4)
    bad = processor.enqueue("broken")
    # A key is unique while its job is live: the job must not finish between the two
    # enqueues (it did under load, and the second enqueue rightly added a new job).
    again = processor.enqueue("gated", key="once")
    assert processor.enqueue("gated", key="once") == again
    gate.set()
    eventually(lambda: all(processor.job(j).state in ("done", "failed") for j in (ok, bad, again)))  # type: ignore[union-attr]
    record = processor.job(ok)
    assert record is not None and (record.state, record.result, record.attempt) == ("done", 40, 3)
    failed = processor.job(bad)
    assert failed is not None and failed.state == "failed"
    assert failed.error is not None and "KeyError: 'nope'" in failed.error
    processor.shutdown()
    store.close()


def test_durable_calls_need_a_store_and_registered_tasks() -> None:
    with TaskProcessor(workers=1) as plain:
        with pytest.raises(dibs.InvalidInput) as info:
            plain.enqueue("anything")
        assert info.value.field == "store"
    store = dibs.open("memory://")
    with TaskProcessor(store=store, workers=1) as processor:
        with pytest.raises(dibs.InvalidInput) as info:
            processor.enqueue("unknown")
        assert info.value.field == "task"
        processor.task("echo")(str)
        with pytest.raises(dibs.InvalidInput):
            processor.enqueue("echo", object())  # not JSON
    store.close()
