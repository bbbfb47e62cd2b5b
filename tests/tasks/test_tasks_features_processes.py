"""Lock keys and result waiting across worker processes killed with SIGKILL mid-job.

Worker processes (on one SQLite file, or one PostgreSQL schema) write each
start and end of a job to a ledger file; the test reads the ledger to see
what ran where and when. Waits only guard against hangs.
"""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import dibs
from conftest import StoreMaker
from dibs.tasks import TaskProcessor
from eventually import eventually
from workers import stop_workers

GUARD = 90.0
LEASE = 4.0  # long enough that a loaded machine never lapses a live lease

WORKER = r"""
import os, sqlite3, sys, time
import dibs
from dibs.tasks import TaskProcessor, current

url, ledger = sys.argv[1], sys.argv[2]
effects = sqlite3.connect(ledger, timeout=30, isolation_level=None, check_same_thread=False)

def effect(what, key):
    effects.execute("INSERT INTO effects (job, pid, what, key) VALUES (?, ?, ?, ?)",
                    (current().job_id, os.getpid(), what, key))

store = dibs.open(url)
processor = TaskProcessor(store=store, workers=4, lease=LEASE, poll=0.02, sweep_every=None)

@processor.task("locked")
def locked(key, seconds):
    effect("start", key)
    current().token.sleep(seconds)  # wakes early if the job is cancelled
    effect("end", key)
    return os.getpid()

print("ready", flush=True)
sys.stdin.read()
processor.shutdown(timeout=5)
store.close()
""".replace("LEASE", repr(LEASE))


class Workers:
    def __init__(self, tmp_path: Path, url: str) -> None:
        self.url = url
        self.ledger = tmp_path / "ledger.db"
        self.script = tmp_path / "worker.py"
        self.script.write_text(WORKER)
        with sqlite3.connect(self.ledger) as conn:
            conn.execute("PRAGMA journal_mode = WAL")
            conn.execute("CREATE TABLE effects (job TEXT, pid INTEGER, what TEXT, key TEXT)")
        self.store = dibs.open(url)
        self.client = TaskProcessor(store=self.store, take_jobs=False, sweep_every=None)
        self.client.task("locked")(lambda key, seconds: None)  # the name only
        self.procs: list[subprocess.Popen[str]] = []

    def start(self, count: int) -> None:
        for _ in range(count):
            proc = subprocess.Popen(
                [sys.executable, str(self.script), self.url, str(self.ledger)],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
            )  # fmt: skip
            assert proc.stdout is not None
            assert proc.stdout.readline().strip() == "ready"
            self.procs.append(proc)

    def effects(self) -> list[tuple[str, int, str, str]]:
        with sqlite3.connect(self.ledger, timeout=30) as conn:
            return conn.execute("SELECT job, pid, what, key FROM effects ORDER BY rowid").fetchall()

    def stop(self) -> None:
        stop_workers(self.procs, GUARD)
        self.client.shutdown(timeout=0)
        self.store.close()


def wait_for(condition: Callable[[], object]) -> object:
    return eventually(condition, timeout=GUARD)  # processes start slowly on a loaded box


@pytest.fixture(params=["sqlite", "postgresql"])
def workers(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Workers]:
    pg = request.getfixturevalue("pg_url") if request.param == "postgresql" else None
    place = StoreMaker(request.param, tmp_path, pg)
    w = Workers(tmp_path, place.url)
    yield w
    w.stop()
    place.close()


def never_overlap(effects: list[tuple[str, int, str, str]], victim: int) -> None:
    """Per lock key, runs alternate start/end; a run cut short by the kill ends at its start.

    Those are every run of the killed process that has no end: the victim job, and any
    job of another key its other threads were running when it died (a CI run failed when
    only the victim job counted as cut short, on key "b"'s job taken over after the kill).
    """
    ended = {(job, pid) for job, pid, what, _ in effects if what == "end"}
    dead = {(job, pid) for job, pid, what, _ in effects if pid == victim and what == "start"}
    dead -= ended
    running: dict[str, tuple[str, int] | None] = {}
    for job, pid, what, key in effects:
        if what == "start":
            assert running.get(key) is None, f"{key}: {job} started while {running[key]} ran"
            running[key] = None if (job, pid) in dead else (job, pid)
        else:
            assert running.get(key) == (job, pid)
            running[key] = None


def test_lock_keys_hold_across_processes_and_free_after_a_killed_workers_lease(
    workers: Workers,
) -> None:
    workers.start(3)  # 12 threads that would all run these at once without the lock
    keys = ("a", "b")
    ids = [workers.client.enqueue("locked", keys[i % 2], 0.02, lock_key=keys[i % 2])
           for i in range(40)]  # fmt: skip
    victim_job = workers.client.enqueue("locked", "a", 3600.0, lock_key="a")
    ids += [workers.client.enqueue("locked", "a", 0.02, lock_key="a") for _ in range(5)]
    wait_for(lambda: any(job == victim_job for job, *_ in workers.effects()))
    ((_, victim, _, _),) = [e for e in workers.effects() if e[0] == victim_job]
    os.kill(victim, signal.SIGKILL)
    # Its job would be taken over for another hour-long run: cancel it. Its lease
    # lapses, and so does the dead worker's hold on "a": every other job of "a" runs.
    assert workers.client.cancel(victim_job)
    for job_id in ids:
        assert workers.client.wait(job_id, timeout=GUARD).state == "done"
    never_overlap(workers.effects(), victim)
    assert workers.client.wait(victim_job, timeout=GUARD).state in ("cancelled", "done")


def test_a_client_waiting_for_a_result_outlives_the_worker_it_waited_on(
    workers: Workers,
) -> None:
    workers.start(2)
    job = workers.client.enqueue("locked", "x", 1.5)
    answer: list[Any] = []
    waiter = threading.Thread(target=lambda: answer.append(workers.client.result(job)))
    waiter.start()
    wait_for(lambda: [e for e in workers.effects() if e[0] == job])
    ((_, victim, _, _),) = [e for e in workers.effects() if e[0] == job]
    os.kill(victim, signal.SIGKILL)
    waiter.join(GUARD)
    assert not waiter.is_alive()
    survivor = next(p.pid for p in workers.procs if p.pid != victim)
    assert answer == [survivor]
    record = workers.client.job(job)
    assert record is not None and record.attempt == 2
    assert [a.outcome_kind for a in record.attempts] == ["lost", "ok"]
