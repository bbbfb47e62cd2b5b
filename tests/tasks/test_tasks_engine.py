"""Durable tasks across processes on SQLite and PostgreSQL: the take/finish engine.

Worker processes (tests/support/engine_worker.py) share one store and record every
run in a ledger of their own. No timed assertions: waits are bounded only
against hangs (GUARD), and a wake-up is shown by a poll interval far longer
than the guard.
"""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

import dibs
from dibs import Store
from dibs.stores.jobs import Job, JobTable
from dibs.stores.postgres._sql import JOBS as PG_JOBS
from dibs.stores.sqlite._schema import JOBS as SQLITE_JOBS
from dibs.tasks import TaskProcessor
from eventually import eventually
from layout import SUPPORT
from pg_fixtures import schema_url
from workers import stop_workers

pytestmark = pytest.mark.timeout(300)

GUARD = 120.0
WORKER = SUPPORT / "engine_worker.py"


def wait_for(condition: Callable[[], object]) -> object:
    return eventually(condition, timeout=GUARD)  # processes start slowly on a loaded box


@pytest.fixture(params=["sqlite", "postgresql"])
def url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'jobs.db'}"
    return schema_url(request.getfixturevalue("pg_url"))


@pytest.fixture
def ledger(tmp_path: Path) -> Path:
    path = tmp_path / "ledger.db"
    with sqlite3.connect(path) as conn:
        conn.execute("PRAGMA journal_mode = WAL")
        conn.execute("CREATE TABLE runs (job TEXT, pid INTEGER)")
    conn.close()
    return path


def runs(ledger: Path) -> list[tuple[str, int]]:
    with sqlite3.connect(ledger, timeout=60) as conn:
        rows = conn.execute("SELECT job, pid FROM runs").fetchall()
    conn.close()
    return [(str(job), int(pid)) for job, pid in rows]


class Workers:
    """Worker processes started on one store; stopped (or killed) at the end."""

    def __init__(self, url: str, ledger: Path) -> None:
        self.url, self.ledger = url, ledger
        self.procs: list[subprocess.Popen[str]] = []

    def start(self, mode: str = "run", poll: float = 0.05, lease: float = 30.0) -> int:
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
        proc = subprocess.Popen(
            [sys.executable, str(WORKER), self.url, str(self.ledger), mode, str(poll), str(lease)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env,
        )  # fmt: skip
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        self.procs.append(proc)
        return proc.pid

    def close(self) -> None:
        stop_workers(self.procs, 30)


@pytest.fixture
def env(url: str, ledger: Path) -> Iterator[tuple[Store, JobTable, Workers]]:
    store = dibs.open(url)
    table = store.job_table()
    assert table is not None
    workers = Workers(url, ledger)
    try:
        yield store, table, workers
    finally:
        workers.close()
        store.close()


def _job(job_id: str, n: int = 0) -> Job:
    return Job(id=job_id, name="work", args=f"[[{n}], {{}}]", run_at=None, attempt=1,
               max_attempts=4, state="pending")  # fmt: skip


def test_three_processes_run_every_job_once(env: tuple[Store, JobTable, Workers]) -> None:
    _store, table, workers = env
    for _ in range(3):
        workers.start()
    ids = [f"j{n}" for n in range(300)]
    for start in range(0, len(ids), 50):  # while the workers race for them
        table.add_many([_job(i, n) for n, i in enumerate(ids[start : start + 50])])
    wait_for(lambda: len(table.find(states=["done"])) == len(ids))
    ran = Counter(job for job, _ in runs(workers.ledger))
    assert ran == Counter(ids)  # none lost, none run twice
    for job in table.find():
        assert job.state == "done" and [a.outcome_kind for a in job.attempts] == ["ok"]
        assert job.holder is None and job.lease_expires is None  # nothing stays held
    assert len({pid for _, pid in runs(workers.ledger)}) >= 2  # shared out, not serialized


def test_a_worker_killed_mid_job_is_taken_over_after_its_lease(
    env: tuple[Store, JobTable, Workers],
) -> None:
    _store, table, workers = env
    victim = workers.start(mode="block", lease=1.0)
    table.add(_job("victim"))
    wait_for(lambda: runs(workers.ledger) == [("victim", victim)])
    os.kill(victim, signal.SIGKILL)
    workers.procs[0].wait()
    rescuer = workers.start(lease=1.0)
    wait_for(lambda: (j := table.get("victim")) is not None and j.state == "done")
    job = table.get("victim")
    assert job is not None and job.outcome == str(rescuer) and job.attempt == 2
    assert [a.outcome_kind for a in job.attempts] == ["lost", "ok"]
    assert runs(workers.ledger) == [("victim", victim), ("victim", rescuer)]


def test_an_enqueue_in_another_process_wakes_a_worker_without_its_poll(
    env: tuple[Store, JobTable, Workers],
) -> None:
    _store, table, workers = env
    workers.start(poll=3600)  # only a wake-up can start the job within the guard
    table.add(_job("wake"))
    wait_for(lambda: (j := table.get("wake")) is not None and j.state == "done")


def test_an_enqueue_in_this_process_wakes_its_workers_without_the_poll(url: str) -> None:
    store = dibs.open(url)
    try:
        with TaskProcessor(store=store, workers=2, poll=3600, sweep_every=None) as processor:
            processor.task("double")(lambda n: 2 * n)
            job = processor.enqueue("double", 21)
            wait_for(lambda: (r := processor.job(job)) is not None and r.state == "done")
            record = processor.job(job)
            assert record is not None and record.result == 42
    finally:
        store.close()


def test_an_enqueue_while_a_finish_refills_the_slot_still_wakes_a_worker(url: str) -> None:
    """Each job is enqueued while the one before it is finishing: the finish's transaction
    holds the free slots for its own take, which may read the table before the new job
    commits. The wake-up the poller could not act on then must not be lost (with an hour's
    poll, the job would wait for it). Before the fix this stalled within the first few
    jobs on PostgreSQL."""
    store = dibs.open(url)
    started = threading.Semaphore(0)
    try:
        with TaskProcessor(store=store, workers=2, poll=3600, sweep_every=None) as processor:

            @processor.task("tick")
            def tick(n: int) -> int:
                started.release()
                return n

            for n in range(150):
                processor.enqueue("tick", n)
                assert started.acquire(timeout=GUARD), f"job {n} was never woken"
    finally:
        store.close()


def test_a_take_skips_the_rows_another_take_holds(url: str) -> None:
    """Worker A's take has locked its rows and not committed. On PostgreSQL worker B's
    take does not wait for A: it skips A's rows (FOR UPDATE SKIP LOCKED) and gets
    others at once. On SQLite the same statement runs under the file's write lock, so B
    waits for A's commit and then gets others. Either way, no job is handed out twice."""
    store = dibs.open(url)
    table = store.job_table()
    assert table is not None
    try:
        table.add_many([_job(f"j{n:02}", n) for n in range(20)])
        holding, release = threading.Event(), threading.Event()
        by_a: list[Job] = []
        by_b: list[Job] = []

        def take_and_hold(conn: object) -> None:
            statement, params = table._take_args(None, 5, 30.0, "a", None, None)  # type: ignore[attr-defined]
            by_a.extend(table._take_on(conn, statement, params))  # type: ignore[attr-defined]
            holding.set()
            assert release.wait(GUARD)

        a = threading.Thread(target=table._atomic, args=(take_and_hold,))  # type: ignore[attr-defined]
        a.start()
        assert holding.wait(GUARD)
        b = threading.Thread(target=lambda: by_b.extend(table.take(None, 5, 30.0, "b")))
        b.start()
        if url.startswith("postgresql"):
            b.join(GUARD)  # while A still holds its rows
            assert not b.is_alive(), "B waited for A's rows instead of skipping them"
        release.set()
        a.join(GUARD)
        b.join(GUARD)
        assert len(by_a) == len(by_b) == 5
        assert not {j.id for j in by_a} & {j.id for j in by_b}
        assert {j.holder for j in table.find(states=["running"])} == {"a", "b"}
    finally:
        store.close()


# --- commits per job ------------------------------------------------------------------------


def count_commits(table: JobTable, monkeypatch: pytest.MonkeyPatch) -> Counter[str]:
    """Count the job table's ``commits``: each write transaction, and on PostgreSQL each
    autocommit statement too (reads included: the server counts them). SQLite's reads
    commit nothing. The calls of the test's own thread are left out, except enqueues
    (its waits for results are not the job's cost)."""
    from dibs.stores.sqlite._jobs import SQLiteJobs

    counts: Counter[str] = Counter()
    atomic, single = table._atomic, table._single  # type: ignore[attr-defined]
    sqlite = isinstance(table, SQLiteJobs)
    test = threading.current_thread()

    def count(kind: str) -> None:
        if threading.current_thread() is not test or counts["enqueueing"]:
            counts[kind] += 1

    def counted_atomic(work: Callable[[object], object]) -> object:
        count("commits")
        return atomic(work)

    def counted_single(work: Callable[[object], object], write: bool = True) -> object:
        if not sqlite:
            count("commits")  # autocommit: one statement, one commit
        return single(work, write)  # a SQLite write goes through _atomic, counted there

    monkeypatch.setattr(table, "_atomic", counted_atomic)
    monkeypatch.setattr(table, "_single", counted_single)
    return counts


def test_a_job_costs_at_most_three_commits_including_its_enqueue(
    url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue #16's target: enqueue, take (which starts the lease) and finish (which ends
    it, and takes the next job in the same transaction) are one transaction each. Counted
    on the job table while jobs come one at a time to an idle worker, each added only once
    the one before is recorded (nothing to share a transaction with: exactly three each),
    then in a burst. The enqueuing process's own notification wakes nobody a second time.
    No heartbeat, reclaim or sweep falls in the test (a 600 s lease, no sweeper)."""
    store = dibs.open(url)
    table = store.job_table()
    assert table is not None
    jobs = 40
    try:
        processor = TaskProcessor(store=store, workers=2, lease=600, poll=3600, sweep_every=None)
        processor.task("tick")(lambda n: n)
        # A first job added through another store object, which only the processor's
        # listener (NOTIFY, or SQLite's data_version watcher) can report: once it is done,
        # the start-up's takes are over and counting begins.
        other = dibs.open(url)
        try:
            first = Job(id="first", name="tick", args="[[0], {}]", run_at=None, attempt=1,
                        max_attempts=1, state="pending")  # fmt: skip
            other.job_table().add(first)  # type: ignore[union-attr]
        finally:
            other.close()
        assert processor.wait("first", timeout=GUARD).state == "done"
        counts = count_commits(table, monkeypatch)

        def enqueue(n: int) -> str:
            counts["enqueueing"] = 1
            try:
                return processor.enqueue("tick", n)
            finally:
                counts["enqueueing"] = 0

        for n in range(jobs // 2):  # one at a time
            assert processor.wait(enqueue(n), timeout=GUARD).state == "done"
        one_at_a_time = counts["commits"]
        ids = [enqueue(n) for n in range(jobs // 2)]  # a burst
        for job_id in ids:
            assert processor.wait(job_id, timeout=GUARD).state == "done"
        processor.shutdown(timeout=GUARD)
        committed = counts["commits"]
        monkeypatch.undo()
        assert one_at_a_time == 3 * (jobs // 2)
        assert committed <= 3 * jobs, f"{committed / jobs:.2f} commits per job"
    finally:
        store.close()


# --- the upgrade from job schema version 1 --------------------------------------------------

V1_COLUMNS = (
    "id, name, args, run_at, attempt, max_attempts, state, fence, claim_id, outcome_kind, "
    "outcome, schedule_id, retries, failures, key, cancel_requested, finished_at"
)
V1_ROWS = [
    ("pending", "work", "[[1], {}]", 1.0, 1, 4, "pending", None, None, None, None, None, 0, 0,
     "k", False, None),
    ("running", "work", "[[2], {}]", 1.0, 2, 4, "running", 7, "c-7", "ok", "9", None, 0, 0,
     None, False, None),
    ("done", "work", "[[3], {}]", 1.0, 1, 4, "done", 3, "c-3", "ok", "3", "s", 0, 0, None,
     False, 5.0),
]  # fmt: skip


def _check_upgraded(table: JobTable) -> None:
    rows = {j.id: j for j in table.find()}
    assert sorted(rows) == ["done", "pending", "running"]
    done = rows["done"]
    assert (done.state, done.outcome, done.schedule_id, done.holder, done.queue) == (
        "done", "3", "s", "c-3", "default",
    )  # fmt: skip
    assert rows["pending"].key == "k" and rows["pending"].priority == 0
    # The attempt running under version 1 has no lease: reclaimed, then taken again.
    assert table.reclaim() == 1
    running = table.get("running")
    assert running is not None and (running.state, running.attempt) == ("pending", 3)
    assert running.outcome is None  # version 1's unconfirmed proposal is not a result
    assert sorted(j.id for j in table.take(None, 5, 30.0, "w")) == ["pending", "running"]


def test_a_populated_version_1_sqlite_job_table_upgrades_in_place(tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    store = dibs.open(f"sqlite:///{path}")  # the claim tables, not yet the job tables
    store.close()
    with sqlite3.connect(path, isolation_level=None) as conn:
        conn.execute("BEGIN")
        for statement in SQLITE_JOBS.steps[0].split(";"):
            if statement.strip() and not all(
                line.strip().startswith("--") for line in statement.strip().splitlines()
            ):
                conn.execute(statement)
        conn.execute("INSERT INTO dibs_meta (key, value) VALUES ('jobs_schema_version', '1')")
        conn.executemany(f"INSERT INTO dibs_jobs ({V1_COLUMNS}) VALUES ({', '.join('?' * 17)})",
                         V1_ROWS)  # fmt: skip
        conn.execute("COMMIT")
    conn.close()
    store = dibs.open(f"sqlite:///{path}")
    try:
        table = store.job_table()
        assert table is not None
        _check_upgraded(table)
    finally:
        store.close()


def test_a_populated_version_1_postgresql_job_table_upgrades_in_place(pg_url: str) -> None:
    import psycopg

    schema = f"up_{os.getpid()}_{time.monotonic_ns() % 10**6}"
    url = schema_url(pg_url, schema)
    store = dibs.open(url)  # the claim tables, not yet the job tables
    store.close()
    with psycopg.connect(pg_url.split("?", 1)[0]) as conn:
        conn.execute(PG_JOBS.steps[0].replace("{s}", f'"{schema}"').encode())
        conn.execute(
            f'INSERT INTO "{schema}".meta (key, value) VALUES (%s, %s)',  # type: ignore[arg-type]
            ("jobs_schema_version", "1"),
        )
        with conn.cursor() as cur:
            cur.executemany(
                f'INSERT INTO "{schema}".jobs ({V1_COLUMNS}) VALUES ({", ".join(["%s"] * 17)})',  # type: ignore[arg-type]
                V1_ROWS,
            )
    store = dibs.open(url)
    try:
        table = store.job_table()
        assert table is not None
        _check_upgraded(table)
    finally:
        store.close()
