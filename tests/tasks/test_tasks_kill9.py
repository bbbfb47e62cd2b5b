"""The durable-task features with workers (and an enqueuing caller) killed by SIGKILL.

On one SQLite file and on one PostgreSQL schema: an ``async def`` job whose worker
dies mid-run is taken over and recorded once (and ``dibs jobs show`` tells the lost
attempt from the one that finished); a killed worker's job waits for a worker of its
own queue; a job that kills every worker that takes it is failed as a poison pill;
a caller killed inside its own transaction leaves neither its rows nor its jobs.
Worker processes write each start to a ledger (a SQLite file outside the store).
Waits only guard against hangs; nothing asserts on time.
"""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

import dibs
from conftest import StoreMaker
from dibs.cli import main
from dibs.tasks import JobFailed, TaskProcessor
from eventually import eventually
from workers import stop_workers

pytestmark = pytest.mark.timeout(300)

GUARD = 90.0
LEASE = 4.0  # long enough that a loaded machine never lapses a live lease

WORKER = r"""
import asyncio, json, os, signal, sqlite3, sys, threading
import dibs
from dibs.tasks import TaskProcessor, current

url, ledger, mode, queues, lease = sys.argv[1:6]
effects = sqlite3.connect(ledger, timeout=60, isolation_level=None, check_same_thread=False)
lock = threading.Lock()

def started():
    with lock:
        effects.execute("INSERT INTO starts (job, pid) VALUES (?, ?)",
                        (current().job_id, os.getpid()))

store = dibs.open(url)
processor = TaskProcessor(store=store, workers=4, lease=float(lease), poll=0.05,
                          sweep_every=None, queues=json.loads(queues))

@processor.task("work")
def work(tag):
    started()
    if mode == "block":
        threading.Event().wait()  # mid-job until kill -9
    return os.getpid()

@processor.task("awork")
async def awork(tag):
    started()
    if mode == "block":
        await asyncio.Event().wait()  # mid-job, on the event loop, until kill -9
    await asyncio.sleep(0)
    return os.getpid()

@processor.task("suicide")
def suicide():
    started()
    os.kill(os.getpid(), signal.SIGKILL)

print("ready", flush=True)
sys.stdin.read()
processor.shutdown(timeout=5)
store.close()
"""

CALLER = r"""
import json, sqlite3, sys, threading
import dibs
from dibs.tasks import TaskProcessor

url, kind, where, orders = sys.argv[1:5]
store = dibs.open(url)
client = TaskProcessor(store=store, take_jobs=False, sweep_every=None)
client.task("work")(lambda tag: None)  # the name only
if kind == "sqlite":
    conn = sqlite3.connect(where, isolation_level=None)
    conn.execute("BEGIN IMMEDIATE")
else:
    import psycopg
    conn = psycopg.connect(where)
conn.execute(f"INSERT INTO {orders} (item) VALUES ('book')")
ids = [client.enqueue("work", "one", connection=conn)]
ids += client.enqueue_many("work", [(f"batch-{n}",) for n in range(300)], connection=conn)
print(json.dumps(ids), flush=True)
threading.Event().wait()  # inside the transaction until kill -9
"""


def wait_for(condition: Callable[[], object]) -> object:
    return eventually(condition, timeout=GUARD)  # processes start slowly on a loaded box


class Fleet:
    """Worker processes on one store, a client in this process, a ledger of starts."""

    def __init__(self, tmp_path: Path, place: StoreMaker) -> None:
        self.place = place
        self.tmp_path = tmp_path
        self.ledger = tmp_path / "ledger.db"
        with sqlite3.connect(self.ledger) as conn:
            conn.execute("PRAGMA journal_mode = WAL")
            conn.execute("CREATE TABLE starts (job TEXT, pid INTEGER)")
        conn.close()
        self.script = tmp_path / "worker.py"
        self.script.write_text(WORKER)
        self.store = dibs.open(place.url)
        self.client = TaskProcessor(store=self.store, take_jobs=False, sweep_every=None)
        for name in ("work", "awork", "suicide"):
            self.client.task(name)(lambda *args: None)  # the names only
        self.procs: list[subprocess.Popen[str]] = []

    def start(self, mode: str, queues: list[str] | None = None, lease: float = LEASE) -> int:
        proc = subprocess.Popen(
            [sys.executable, str(self.script), self.place.url, str(self.ledger), mode,
             json.dumps(queues), str(lease)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
        )  # fmt: skip
        self.procs.append(proc)  # stopped and its pipes closed even if it never gets ready
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        return proc.pid

    def starts(self, job_id: str) -> list[int]:
        """The pids that started ``job_id``, in order."""
        with sqlite3.connect(self.ledger, timeout=60) as conn:
            rows = conn.execute("SELECT pid FROM starts WHERE job = ? ORDER BY rowid", (job_id,))
            pids = [int(pid) for (pid,) in rows.fetchall()]
        conn.close()
        return pids

    def kill_when_started(self, job_id: str) -> int:
        wait_for(lambda: self.starts(job_id))
        (victim,) = self.starts(job_id)
        os.kill(victim, signal.SIGKILL)
        next(p for p in self.procs if p.pid == victim).wait(GUARD)
        return victim

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


def test_an_async_job_killed_mid_run_is_taken_over_and_recorded_once(
    fleet: Fleet, capsys: pytest.CaptureFixture[str]
) -> None:
    fleet.start("block")
    job_id = fleet.client.enqueue("awork", "x")
    victim = fleet.kill_when_started(job_id)
    survivor = fleet.start("run")
    assert fleet.client.result(job_id, timeout=GUARD) == survivor
    assert fleet.starts(job_id) == [victim, survivor]
    record = fleet.client.job(job_id)
    assert record is not None and (record.state, record.attempt) == ("done", 2)
    assert [a.outcome_kind for a in record.attempts] == ["lost", "ok"]
    # The command line tells the lost attempt (the dead process's) from the finished one.
    assert main(["jobs", "show", "--store", fleet.place.url, job_id, "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    holders = [a["holder"] for a in shown["attempts"]]
    assert [a["outcome"] for a in shown["attempts"]] == ["lost", "ok"]
    assert [int(h.split(":")[1]) for h in holders] == [victim, survivor]


def test_a_killed_workers_job_waits_for_a_worker_of_its_queue(fleet: Fleet) -> None:
    fleet.start("block", queues=["mail"])
    fleet.start("run", queues=["reports"])  # alive throughout: it reclaims the lapsed lease
    job_id = fleet.client.enqueue("work", "x", queue="mail", priority=100)
    victim = fleet.kill_when_started(job_id)
    wait_for(lambda: (r := fleet.client.job(job_id)) is not None and r.attempt == 2)
    # The reports worker takes by priority among its queues: had it taken from every
    # queue, the mail job (priority 100) would have gone before this one (priority 0).
    sentinel = fleet.client.enqueue("work", "y", queue="reports")
    assert fleet.client.wait(sentinel, timeout=GUARD).state == "done"
    record = fleet.client.job(job_id)
    assert record is not None and (record.state, record.holder) == ("pending", None)
    assert fleet.starts(job_id) == [victim]
    mailer = fleet.start("run", queues=["mail"])
    assert fleet.client.result(job_id, timeout=GUARD) == mailer
    record = fleet.client.job(job_id)
    assert record is not None and [a.outcome_kind for a in record.attempts] == ["lost", "ok"]
    assert (record.queue, record.priority) == ("mail", 100)


def test_a_job_that_kills_every_worker_is_failed_as_a_poison_pill(fleet: Fleet) -> None:
    job_id = fleet.client.enqueue("suicide")  # retries=0: 1 attempt, plus 3 lost ones
    deaths = 0
    while (record := fleet.client.job(job_id)) is not None and not record.finished:
        proc_pid = fleet.start("run", lease=1.0)
        proc = next(p for p in fleet.procs if p.pid == proc_pid)

        def over(proc: subprocess.Popen[str] = proc) -> bool:
            # Either it took the job and died, or it found the job failed (it stays up).
            record = fleet.client.job(job_id)
            return proc.poll() is not None or (record is not None and record.finished)

        wait_for(over)
        deaths += proc.poll() is not None
        assert deaths <= 8, "the job is retried forever"
    assert record is not None and record.state == "failed"
    assert [a.outcome_kind for a in record.attempts] == ["lost"] * 4
    assert deaths == 4 and len(fleet.starts(job_id)) == 4
    with pytest.raises(JobFailed) as failed:
        fleet.client.result(job_id)
    assert failed.value.error is None  # a poison pill has no traceback


def test_a_caller_killed_inside_its_transaction_leaves_no_job(fleet: Fleet) -> None:
    place = fleet.place
    if place.kind == "sqlite":
        where, orders = str(place.tmp_path / "dibs.db"), "caller_orders"
    else:
        assert place.pg_url is not None
        where, orders = place.pg_url, f"{place.pg_schema}.caller_orders"

    def count_orders(create: bool = False) -> int:
        if place.kind == "sqlite":
            with sqlite3.connect(where, timeout=60) as conn:
                if create:
                    conn.execute(f"CREATE TABLE {orders} (id INTEGER PRIMARY KEY, item TEXT)")
                (count,) = conn.execute(f"SELECT count(*) FROM {orders}").fetchone()
            conn.close()
            return int(count)
        import psycopg

        with psycopg.connect(where) as pg:
            if create:
                pg.execute(f"CREATE TABLE {orders} (id serial PRIMARY KEY, item text)")
            row = pg.execute(f"SELECT count(*) FROM {orders}").fetchone()
            assert row is not None
            return int(row[0])

    assert count_orders(create=True) == 0
    worker = fleet.start("run")  # would run any job that became visible
    script = fleet.tmp_path / "caller.py"
    script.write_text(CALLER)
    caller = subprocess.Popen(
        [sys.executable, str(script), place.url, place.kind, where, orders],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert caller.stdout is not None
        ids = json.loads(caller.stdout.readline())
        assert len(ids) == 301
        caller.kill()
        caller.wait(GUARD)
    finally:
        if caller.stdout is not None:
            caller.stdout.close()
    # The store is usable at once (SQLite: the dead caller's write lock went with it).
    after = fleet.client.enqueue("work", "after")
    assert fleet.client.result(after, timeout=GUARD) == worker
    assert all(fleet.client.job(job_id) is None for job_id in ids)
    assert [job.id for job in fleet.client.jobs()] == [after]
    assert fleet.starts(ids[0]) == [] and count_orders() == 0
