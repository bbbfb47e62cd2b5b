"""Durable-task features on every store (memory, SQLite, PostgreSQL), in one process.

Queues, priorities, batch enqueue, enqueue inside the caller's transaction,
lock keys, waiting for results (with retention) and the async worker. The
store's clock is real; waits only guard against hangs (nothing asserts on time).
"""

from __future__ import annotations

import asyncio
import json
import os
import sqlite3
import sys
import threading
import time
from collections.abc import Callable, Iterator
from types import SimpleNamespace
from typing import Any

import psycopg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import StoreMaker, kinds_offering
from dibs import InvalidInput, Store
from dibs.stores.jobs import Job
from dibs.stores.sqlite._jobs import SQLiteJobs
from dibs.tasks import (
    JobFailed,
    JobNotFound,
    ProcessorClosed,
    TaskCancelled,
    TaskProcessor,
    WaitTimeout,
    current,
)
from dibs.tasks._jobs import job_table
from dibs.tasks._locks import LockKeys
from dibs.tasks._records import PRIORITY_MAX, PRIORITY_MIN
from dibs.testing import strategies
from eventually import eventually


@pytest.fixture(params=kinds_offering("job_table"))
def store_kind(request: pytest.FixtureRequest) -> str:
    """The stores with a job table (a capability; etcd has none): durable jobs live there."""
    return str(request.param)


GUARD = 60.0


@pytest.fixture
def store(make_store: StoreMaker) -> Store:
    return make_store()


@pytest.fixture
def processors(store: Store) -> Iterator[Callable[..., TaskProcessor]]:
    """Processors on the test's store, shut down after the test."""
    made: list[TaskProcessor] = []

    def make(**options: Any) -> TaskProcessor:
        options = {"workers": 2, "lease": 5, "poll": 0.01, "sweep_every": None, **options}
        processor = TaskProcessor(store=store, **options)
        made.append(processor)
        return processor

    yield make
    for processor in made:
        processor.shutdown(timeout=GUARD)


def register(processor: TaskProcessor, ran: list[tuple[str, Any]]) -> None:
    """The tasks every test uses: ``echo`` records its argument and returns it."""

    @processor.task("echo")
    def echo(value: Any) -> Any:
        ran.append((current().job_id or "", value))
        return value

    @processor.task("mail", queue="mail", priority=5)
    def mail(to: str) -> str:
        ran.append((current().job_id or "", to))
        return f"sent to {to}"

    @processor.task("boom", retries=1, backoff=0.001)
    def boom() -> None:
        raise KeyError("nope")


# --- queues and priorities ---------------------------------------------------------------------


def test_workers_take_only_their_queues(processors: Callable[..., TaskProcessor]) -> None:
    ran: list[tuple[str, Any]] = []
    mail_worker = processors(queues=["mail"])
    register(mail_worker, ran)
    client = processors(take_jobs=False)
    register(client, ran)

    to_mail = client.enqueue("mail", "ann")  # the task's queue
    to_default = client.enqueue("echo", 1)  # "default": nobody takes it yet
    moved = client.enqueue("echo", 2, queue="mail")  # a per-job queue
    assert client.result(to_mail, timeout=GUARD) == "sent to ann"
    assert client.result(moved, timeout=GUARD) == 2
    record = client.job(to_default)
    assert record is not None and record.state == "pending" and record.queue == "default"
    assert client.job(to_mail).queue == "mail"  # type: ignore[union-attr]

    everything = processors()  # queues=None: every queue
    register(everything, ran)
    assert client.result(to_default, timeout=GUARD) == 1


def test_dibs_worker_queue_option_selects_the_apps_queues(
    processors: Callable[..., TaskProcessor], monkeypatch: pytest.MonkeyPatch
) -> None:
    # `dibs worker --queue mail` loads the app with $DIBS_QUEUES set; a processor
    # built without queues= takes only those.
    from dibs.cli import _parser
    from dibs.tasks._command import load_app

    args = _parser().parse_args(["worker", "--app", "x:y", "--queue", "mail", "--queue", "b"])
    assert args.queues == ["mail", "b"]
    monkeypatch.setitem(sys.modules, "dibs_queue_app", SimpleNamespace(app=None))
    # load_app sets os.environ itself: make monkeypatch record the variable's absence first
    # (a delenv of an absent variable records nothing), or the value leaks into later tests.
    monkeypatch.setenv("DIBS_QUEUES", "[]")
    monkeypatch.delenv("DIBS_QUEUES")
    with pytest.raises(InvalidInput):  # the attribute is no processor, but the env is set first
        load_app("dibs_queue_app:app", None, ["mail", "b"])
    assert json.loads(os.environ["DIBS_QUEUES"]) == ["mail", "b"]

    ran: list[tuple[str, Any]] = []
    monkeypatch.setenv("DIBS_QUEUES", '["mail"]')
    mail_worker = processors()
    register(mail_worker, ran)
    monkeypatch.delenv("DIBS_QUEUES")
    client = processors(take_jobs=False)
    register(client, ran)
    to_mail = client.enqueue("mail", "ann")
    to_default = client.enqueue("echo", 1)
    assert client.result(to_mail, timeout=GUARD) == "sent to ann"
    record = client.job(to_default)
    assert record is not None and record.state == "pending"

    for bad in ("not json", '"mail"', "[]", '[""]'):
        monkeypatch.setenv("DIBS_QUEUES", bad)
        with pytest.raises(InvalidInput):
            processors()


def test_registering_a_task_takes_its_due_jobs_without_waiting_for_the_poll(
    processors: Callable[..., TaskProcessor],
) -> None:
    """A processor's tasks are registered after it starts (the decorator runs in its block):
    jobs already due must start then, not at the next poll (an hour here). They waited
    for it before the fix: half a second per worker start with the default poll."""
    ran: list[tuple[str, Any]] = []
    client = processors(take_jobs=False)
    register(client, ran)
    ids = [client.enqueue("echo", n) for n in range(3)]
    worker = processors(poll=3600)
    register(worker, ran)
    assert [client.result(job_id, timeout=GUARD) for job_id in ids] == [0, 1, 2]


def test_higher_priority_runs_first(processors: Callable[..., TaskProcessor]) -> None:
    ran: list[tuple[str, Any]] = []
    client = processors(take_jobs=False)
    register(client, ran)
    order = [3, -7, 0, 100, 3, 42, -(2**31), 2**31 - 1]
    ids = [client.enqueue("echo", i, priority=p) for i, p in enumerate(order)]
    worker = processors(workers=1)
    register(worker, ran)
    for job_id in ids:
        client.wait(job_id, timeout=GUARD)
    # Highest first; equal priorities in the order they became due.
    expected = sorted(range(len(order)), key=lambda i: (-order[i], i))
    assert [value for _, value in ran] == expected


@pytest.mark.parametrize(
    ("option", "value"),
    [("priority", 2**31), ("priority", 1.5), ("priority", True), ("queue", ""),
     ("queue", 7), ("lock_key", ""), ("retention", -1), ("retention", float("nan")),
     ("retention", 10**400), ("retention", float("inf"))],
)  # fmt: skip
def test_bad_options_are_invalid_input(
    processors: Callable[..., TaskProcessor], option: str, value: object
) -> None:
    client = processors(take_jobs=False)
    register(client, [])
    with pytest.raises(InvalidInput) as raised:
        client.enqueue("echo", 1, **{option: value})
    assert raised.value.field == option
    with pytest.raises(InvalidInput):
        client.task("other", **{option: value})
    with pytest.raises(InvalidInput):
        processors(queues=[])
    with pytest.raises(InvalidInput):
        processors(queues="mail")


# --- batch enqueue -----------------------------------------------------------------------------


def test_enqueue_many_adds_every_job_in_order(processors: Callable[..., TaskProcessor]) -> None:
    ran: list[tuple[str, Any]] = []
    client = processors(take_jobs=False)
    register(client, ran)

    @client.task("pair")
    def pair(a: int, b: int = 0) -> list[int]:
        return [a, b]

    ids = client.enqueue_many("pair", [(1,), {"a": 2, "b": 3}, ((4,), {"b": 5})], priority=9)
    assert len(set(ids)) == 3
    worker = processors()
    worker.task("pair")(pair)
    assert [client.result(i, timeout=GUARD) for i in ids] == [[1, 0], [2, 3], [4, 5]]
    assert {client.job(i).priority for i in ids} == {9}  # type: ignore[union-attr]
    assert client.enqueue_many("pair", []) == []


def test_a_bad_call_in_a_batch_adds_nothing(processors: Callable[..., TaskProcessor]) -> None:
    client = processors(take_jobs=False)
    register(client, [])
    table = job_table(client.store)  # type: ignore[arg-type]
    with pytest.raises(InvalidInput):
        client.enqueue_many("echo", [(1,), (object(),)])
    with pytest.raises(InvalidInput):
        client.enqueue_many("echo", [(1,), "not a call"])  # type: ignore[list-item]
    with pytest.raises(InvalidInput):
        client.enqueue_many("echo", [(1,), (2,)], key="k")  # a key names one job
    for calls in (42, None, "abc", {"a": 1}):  # not a list of calls at all
        with pytest.raises(InvalidInput) as raised:
            client.enqueue_many("echo", calls)  # type: ignore[arg-type]
        assert raised.value.field == "calls"
    assert table.find() == []


# --- enqueue inside the caller's transaction ---------------------------------------------------


def _caller_connection(make_store: StoreMaker) -> Any:
    """The caller's own connection to the store's database, in a transaction (autocommit off)."""
    if make_store.kind == "sqlite":
        conn = sqlite3.connect(make_store.tmp_path / "dibs.db", isolation_level=None)
        conn.execute("CREATE TABLE IF NOT EXISTS caller_orders (id INTEGER PRIMARY KEY)")
        conn.execute("BEGIN IMMEDIATE")
        return conn
    assert make_store.pg_url is not None
    conn = psycopg.connect(make_store.pg_url)
    conn.execute("CREATE TABLE IF NOT EXISTS caller_orders (id serial PRIMARY KEY)")
    conn.commit()
    return conn


def _end(conn: Any, commit: bool) -> None:
    if isinstance(conn, sqlite3.Connection):
        conn.execute("COMMIT" if commit else "ROLLBACK")
    else:
        conn.commit() if commit else conn.rollback()


@pytest.mark.parametrize("commit", [True, False])
def test_a_job_enqueued_in_the_callers_transaction_exists_iff_it_commits(
    make_store: StoreMaker, processors: Callable[..., TaskProcessor], commit: bool
) -> None:
    ran: list[tuple[str, Any]] = []
    client = processors(take_jobs=False)
    register(client, ran)
    if make_store.kind == "memory":
        with pytest.raises(InvalidInput) as raised:
            client.enqueue("echo", 1, connection=object())
        assert raised.value.field == "connection"
        return
    worker = processors()
    register(worker, ran)
    conn = _caller_connection(make_store)
    try:
        conn.execute("INSERT INTO caller_orders DEFAULT VALUES")
        job_id = client.enqueue("echo", "order", connection=conn)
        batch = client.enqueue_many("echo", [("a",), ("b",)], connection=conn)
        _end(conn, commit)
    finally:
        conn.close()
    if commit:
        assert client.result(job_id, timeout=GUARD) == "order"
        assert [client.result(i, timeout=GUARD) for i in batch] == ["a", "b"]
    else:
        assert client.job(job_id) is None and all(client.job(i) is None for i in batch)
        with pytest.raises(JobNotFound):
            client.result(job_id, timeout=GUARD)
        assert worker.join(GUARD)
        assert ran == []


def test_a_job_committed_by_the_caller_wakes_this_processs_workers(
    make_store: StoreMaker, processors: Callable[..., TaskProcessor]
) -> None:
    """The enqueue's own wake-up runs before the caller commits, so the commit's wake-up
    (NOTIFY; SQLite's data_version) must reach this process too: with an hour's poll, the
    job would wait for it. (This process's own adds skip their NOTIFY, except these.)"""
    if make_store.kind == "memory":
        return  # takes no connection
    ran: list[tuple[str, Any]] = []
    worker = processors(poll=3600)
    register(worker, ran)
    for n in range(5):
        conn = _caller_connection(make_store)
        try:
            job_id = worker.enqueue("echo", n, connection=conn)
            _end(conn, commit=True)
        finally:
            conn.close()
        assert worker.result(job_id, timeout=GUARD) == n


def test_a_foreign_connection_is_invalid_input(
    make_store: StoreMaker, processors: Callable[..., TaskProcessor]
) -> None:
    client = processors(take_jobs=False)
    register(client, [])
    for wrong in (object(), "sqlite:///x.db", 42):
        with pytest.raises(InvalidInput) as raised:
            client.enqueue("echo", 1, connection=wrong)
        assert raised.value.field == "connection"


def test_an_unusable_connection_is_invalid_input_not_unavailable(
    make_store: StoreMaker, processors: Callable[..., TaskProcessor]
) -> None:
    """A closed connection, one to another database or an aborted transaction is the caller's
    mistake: InvalidInput naming the connection, never a retryable StoreUnavailable."""
    if make_store.kind == "memory":
        return  # takes no connection at all (the test above)
    client = processors(take_jobs=False)
    register(client, [])
    closed = _caller_connection(make_store)
    closed.close()
    unusable = [closed]
    if make_store.kind == "sqlite":
        unusable.append(sqlite3.connect(make_store.tmp_path / "another.db"))
    else:
        aborted = _caller_connection(make_store)
        with pytest.raises(psycopg.Error):
            aborted.execute("SELECT * FROM no_such_table_here")
        unusable.append(aborted)
    for conn in unusable:
        with pytest.raises(InvalidInput) as raised:
            client.enqueue("echo", 1, connection=conn)
        assert raised.value.field == "connection"
        conn.close()


# --- lock keys ---------------------------------------------------------------------------------


class Overlap:
    """Counts how many jobs of each lock key run at once, and the most ever seen."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.now: dict[str, int] = {}
        self.most: dict[str, int] = {}

    def run(self, key: str, seconds: float) -> None:
        with self.lock:
            self.now[key] = self.now.get(key, 0) + 1
            self.most[key] = max(self.most.get(key, 0), self.now[key])
        time.sleep(seconds)  # real time, the point: runs overlap while this one lasts
        with self.lock:
            self.now[key] -= 1


def test_jobs_sharing_a_lock_key_never_run_at_once(
    processors: Callable[..., TaskProcessor],
) -> None:
    overlap = Overlap()

    def define(host: TaskProcessor) -> None:
        @host.task("sync")
        def sync(account: str) -> None:
            overlap.run(account, 0.005)

        @host.task("locked", lock_key="global")
        def locked() -> None:
            overlap.run("global", 0.005)

    client = processors(take_jobs=False)
    define(client)
    # All due before any worker starts: each take gets several jobs of one key at once,
    # so only the lock key's claim keeps them apart.
    ids = [client.enqueue("sync", f"acct-{i % 3}", lock_key=f"acct-{i % 3}") for i in range(60)]
    ids += [client.enqueue("locked") for _ in range(10)]
    for _ in range(2):  # 8 threads on 2 "hosts"
        define(processors(workers=4))
    for job_id in ids:
        assert client.wait(job_id, timeout=GUARD).state == "done"
    assert overlap.most == {"acct-0": 1, "acct-1": 1, "acct-2": 1, "global": 1}
    assert client.job(ids[0]).lock_key == "acct-0"  # type: ignore[union-attr]
    put_back = [a for i in ids for a in client.job(i).attempts if a.outcome_kind == "put_back"]  # type: ignore[union-attr]
    assert all(a.attempt == 1 for a in put_back)  # putting back never counts as an attempt


def test_a_lock_key_claim_admits_one_attempt_at_a_time(store: Store, fine_switching: None) -> None:
    """The arbiter itself, without the job table's help: 8 threads, one holder name."""
    locks = LockKeys(store, "host:1:abc", lease=30.0)  # one worker process's
    overlap = Overlap()
    admitted = [0] * 8

    def attempts(thread: int) -> None:
        for n in range(60):
            job = Job(id=f"j-{thread}-{n}", name="t", args="[[], {}]", run_at=0.0, attempt=1,
                      max_attempts=1, state="running", fence=1, lock_key="k")  # fmt: skip
            if locks.acquire(job):
                admitted[thread] += 1
                overlap.run("k", 0)
                locks.release((job.id, job.fence))

    threads = [threading.Thread(target=attempts, args=(i,)) for i in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(GUARD)
    assert overlap.most == {"k": 1}
    assert sum(admitted) > 8  # released holds are claimed again


def test_different_lock_keys_do_run_at_once(processors: Callable[..., TaskProcessor]) -> None:
    worker = processors(workers=2)
    both = threading.Barrier(2, timeout=GUARD)  # breaks (fails the jobs) if they never meet

    @worker.task("meet")
    def meet() -> None:
        both.wait()

    ids = [worker.enqueue("meet", lock_key=key) for key in ("a", "b")]
    assert [worker.wait(i, timeout=GUARD * 2).state for i in ids] == ["done", "done"]


# --- results ---------------------------------------------------------------------------------


def test_results_and_errors_reach_a_waiting_client(
    processors: Callable[..., TaskProcessor],
) -> None:
    ran: list[tuple[str, Any]] = []
    worker = processors()
    register(worker, ran)
    client = processors(take_jobs=False)
    register(client, ran)

    ok = client.enqueue("echo", {"nested": [1, 2.5, None]})
    assert client.result(ok, timeout=GUARD) == {"nested": [1, 2.5, None]}
    record = client.wait(ok)
    assert record.finished and record.finished_at is not None and record.started_at is not None
    assert [a.outcome_kind for a in record.attempts] == ["ok"]

    bad = client.enqueue("boom")
    with pytest.raises(JobFailed) as failed:
        client.result(bad, timeout=GUARD)
    assert failed.value.job_id == bad and "KeyError: 'nope'" in (failed.value.error or "")
    assert [a.outcome_kind for a in client.wait(bad).attempts] == ["error", "error"]

    nobody = client.enqueue("echo", 1, delay=3600)  # not due for an hour
    with pytest.raises(WaitTimeout):
        client.result(nobody, timeout=0.05)
    assert client.cancel(nobody)
    with pytest.raises(TaskCancelled):
        client.result(nobody, timeout=GUARD)
    with pytest.raises(JobNotFound):
        client.result("j-never-added")
    with pytest.raises(InvalidInput):
        client.result("")


def test_results_are_kept_for_their_retention(
    store: Store, processors: Callable[..., TaskProcessor]
) -> None:
    ran: list[tuple[str, Any]] = []
    worker = processors()
    register(worker, ran)

    @worker.task("brief", retention=0)
    def brief() -> str:
        return "gone soon"

    short = worker.enqueue("brief")
    kept = worker.enqueue("echo", "kept")
    longer = worker.enqueue("brief", retention=3600)  # the job's own wins over the task's
    for job_id in (short, kept, longer):
        worker.wait(job_id, timeout=GUARD)
    eventually(lambda: job_table(store).purge(3600) >= 1)  # finished_at < now, on the store's clock
    with pytest.raises(JobNotFound):
        worker.result(short)
    assert worker.result(kept) == "kept" and worker.result(longer) == "gone soon"


# --- async def tasks ---------------------------------------------------------------------------


def test_async_tasks_run_together_on_one_event_loop(
    processors: Callable[..., TaskProcessor],
) -> None:
    count = 40
    worker = processors(workers=1, async_workers=count)
    loops: set[int] = set()
    threads: set[int] = set()
    started = 0
    everyone: asyncio.Event | None = None

    @worker.task("gather")
    async def gather(n: int) -> int:
        nonlocal started, everyone
        loops.add(id(asyncio.get_running_loop()))
        threads.add(threading.get_ident())
        assert current().job_id is not None and current().attempt == 1
        if everyone is None:
            everyone = asyncio.Event()
        started += 1
        if started == count:
            everyone.set()
        # Returns only once all have started: they run at once, or the guard fails them.
        await asyncio.wait_for(everyone.wait(), GUARD)
        return n * 2

    ids = worker.enqueue_many("gather", [(n,) for n in range(count)])
    assert [worker.result(i, timeout=GUARD * 2) for i in ids] == [n * 2 for n in range(count)]
    assert len(loops) == 1 and len(threads) == 1


def test_thread_and_async_jobs_share_batched_finishes_within_each_lanes_slots(
    processors: Callable[..., TaskProcessor],
) -> None:
    # Outcomes of both lanes are recorded together (finish_and_take), and each
    # transaction refills only the slots of its lane: never more attempts on the
    # loop than async_workers, nor on the threads than workers. An hour's poll:
    # every job after the first takes is started by a refill or a wake-up.
    lock = threading.Lock()
    now = {"threads": 0, "loop": 0, "locked": 0}
    most = dict(now)
    ran: list[str] = []

    def enter(*lanes: str) -> None:
        with lock:
            for lane in lanes:
                now[lane] += 1
                most[lane] = max(most[lane], now[lane])
            ran.append(current().job_id or "")

    def leave(*lanes: str) -> None:
        with lock:
            for lane in lanes:
                now[lane] -= 1

    worker = processors(workers=2, async_workers=3, poll=3600)

    # Each task lasts a little real time, the point: runs overlap up to each lane's limit.
    @worker.task("plain")
    def plain(n: int) -> int:
        enter("threads")
        time.sleep(0.002)
        leave("threads")
        return n

    @worker.task("coro")
    async def coro(n: int) -> int:
        enter("loop")
        await asyncio.sleep(0.002)
        leave("loop")
        return n

    @worker.task("coro-locked", lock_key="one-at-a-time")
    async def coro_locked(n: int) -> int:
        enter("loop", "locked")
        await asyncio.sleep(0.002)
        leave("loop", "locked")
        return n

    calls = [(n,) for n in range(80)]
    ids = worker.enqueue_many("plain", calls) + worker.enqueue_many("coro", calls)
    ids += worker.enqueue_many("coro-locked", calls[:20])
    expected = list(range(80)) * 2 + list(range(20))
    assert [worker.result(i, timeout=GUARD) for i in ids] == expected
    assert sorted(ran) == sorted(ids)  # each ran once
    assert most["threads"] <= 2 and most["loop"] <= 3 and most["locked"] == 1


@pytest.mark.parametrize("store_kind", ["sqlite"])  # the one job table with a write turn
def test_outcomes_queued_while_the_recording_waits_for_the_write_turn_share_its_transaction(
    store: Store, processors: Callable[..., TaskProcessor]
) -> None:
    # On SQLite, the first outcome's recording waits for the file's write turn (here
    # held by the test, as another process's transaction would hold it); the other
    # workers' outcomes queue meanwhile, and all go in the one transaction it then
    # makes. Gathered before the turn, the first transaction would hold one outcome.
    assert isinstance(job_table(store), SQLiteJobs)
    worker = processors(workers=4, poll=3600)
    release = threading.Event()
    started = threading.Semaphore(0)

    @worker.task("wait")
    def wait(n: int) -> int:
        started.release()
        assert release.wait(GUARD)
        return n

    runner = worker._durable
    assert runner is not None
    batches: list[int] = []
    real = runner.jobs.finish_and_take

    def spy(items: Any, *args: Any, **kwargs: Any) -> Any:
        batches.append(len(items))
        return real(items, *args, **kwargs)

    runner.jobs.finish_and_take = spy  # type: ignore[method-assign]
    ids = worker.enqueue_many("wait", [(n,) for n in range(4)])
    for _ in ids:
        assert started.acquire(timeout=GUARD)
    with runner.jobs.turn():
        release.set()
        eventually(lambda: len(runner._to_record) == 4, "every outcome queued")
    assert [worker.result(i, timeout=GUARD) for i in ids] == [0, 1, 2, 3]
    assert batches[0] == 4, batches


def test_async_tasks_are_cancelled_at_an_await_and_time_out(
    processors: Callable[..., TaskProcessor],
) -> None:
    worker = processors()
    started = threading.Event()

    @worker.task("forever")
    async def forever() -> None:
        started.set()
        await asyncio.sleep(3600)

    @worker.task("slow", timeout=0.05, retries=1, backoff=0.001)
    async def slow() -> None:
        await asyncio.sleep(3600)

    job = worker.enqueue("forever")
    assert started.wait(GUARD)
    assert worker.cancel(job)
    with pytest.raises(TaskCancelled):
        worker.result(job, timeout=GUARD)
    timed_out = worker.enqueue("slow")
    with pytest.raises(JobFailed) as failed:
        worker.result(timed_out, timeout=GUARD)
    assert "TaskTimeout" in (failed.value.error or "")
    assert worker.job(timed_out).attempt == 2  # type: ignore[union-attr]


def test_shutdown_cancels_async_tasks_at_its_deadline_and_leaves_them_to_others(
    store: Store,
) -> None:
    worker = TaskProcessor(store=store, workers=1, lease=5, poll=0.01, sweep_every=None)
    started = threading.Event()

    @worker.task("forever")
    async def forever() -> None:
        started.set()
        await asyncio.sleep(3600)

    job = worker.enqueue("forever")
    assert started.wait(GUARD)
    worker.shutdown(timeout=0.05)
    row: Job | None = job_table(store).get(job)
    assert row is not None and row.state == "running"  # unrecorded: taken over after the lease


# --- the processor's with block ----------------------------------------------------------------


def test_an_exception_leaving_the_block_does_not_wait_for_timed_work() -> None:
    ran = threading.Event()
    with pytest.raises(KeyError), TaskProcessor(workers=1) as tasks:
        handle = tasks.submit(ran.set, delay=3600)
        raise KeyError("boom")
    assert handle.status == "cancelled" and not ran.is_set()
    with pytest.raises(ProcessorClosed):
        tasks.submit(ran.set)


# --- the input domain ------------------------------------------------------------------------


@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    queue=strategies.names(),
    lock_key=strategies.names(),
    priority=st.integers(min_value=PRIORITY_MIN, max_value=PRIORITY_MAX),
    retention=st.floats(min_value=0, max_value=1e9),
)
def test_any_name_in_the_domain_is_a_queue_and_a_lock_key(
    store: Store,
    processors: Callable[..., TaskProcessor],
    queue: str,
    lock_key: str,
    priority: int,
    retention: float,
) -> None:
    # The fixtures are made once for all examples: one enqueue-only client on one store.
    client = processors(take_jobs=False, name="client")
    client.task("echo")(lambda value: value)
    job_id = client.enqueue(
        "echo", queue, queue=queue, lock_key=lock_key, priority=priority, retention=retention
    )
    record = client.job(job_id)
    assert record is not None
    assert (record.queue, record.lock_key, record.priority) == (queue, lock_key, priority)
    assert record.args == [queue]
    table = job_table(store)
    assert job_id in [j.id for j in table.find(queues=[queue])]
    # The lock key is a unit slot on the store: any name in the domain can be claimed.
    locks = LockKeys(store, "host:1:abc", lease=30.0)
    row = table.get(job_id)
    assert row is not None
    assert locks.acquire(row) and not LockKeys(store, "host:2:def", lease=30.0).acquire(row)
    locks.release((row.id, row.fence))
    assert client.cancel(job_id)


def test_jobs_lists_and_retry_runs_a_failed_job_again(
    processors: Callable[..., TaskProcessor],
) -> None:
    ran: list[tuple[str, Any]] = []
    worker = processors()
    register(worker, ran)
    bad = worker.enqueue("boom")
    ok = worker.enqueue("mail", "bo")
    later = worker.enqueue("echo", 1, delay=3600)
    assert worker.wait(bad, timeout=GUARD).state == "failed"
    worker.wait(ok, timeout=GUARD)
    assert [r.id for r in worker.jobs(states=["failed"])] == [bad]
    assert [r.id for r in worker.jobs(queues=["mail"])] == [ok]
    assert {r.id for r in worker.jobs(task="echo")} == {later}
    assert len(worker.jobs(limit=2)) == 2 and len(worker.jobs()) == 3
    assert worker.retry(bad) and not worker.retry(ok) and not worker.retry("j-nope")
    with pytest.raises(JobFailed):
        worker.result(bad, timeout=GUARD)
    record = worker.wait(bad)
    assert [a.outcome_kind for a in record.attempts] == ["error"] * 4  # 2 + 2 after the retry
    for wrong in ({"states": ["lost"]}, {"queues": []}, {"limit": 0}, {"task": ""}):
        with pytest.raises(InvalidInput):
            worker.jobs(**wrong)  # type: ignore[arg-type]
    # A limit no store can hold, and states that are not a list of states.
    for wrong in ({"limit": 2**70}, {"states": "done"}, {"states": 42}):
        with pytest.raises(InvalidInput) as raised:
            worker.jobs(**wrong)  # type: ignore[arg-type]
        assert raised.value.field in wrong


def test_a_job_taken_as_shutdown_begins_goes_back_uncounted(
    store: Store, processors: Callable[..., TaskProcessor]
) -> None:
    """A refill that was in flight when shutdown began (its take committed, the processor then
    refused new work) puts its jobs back, uncounted, instead of leaving them to lapse as lost."""
    worker = processors()
    register(worker, [])
    worker.shutdown(wait=False)  # takes nothing more; its job table stays open
    client = processors(take_jobs=False)
    register(client, [])
    job_id = client.enqueue("echo", 1)
    runner = worker._durable
    assert runner is not None
    # As the group commit's take does when it lands just after shutdown began.
    taken = runner.jobs.take(None, 1, 30.0, runner.holder)
    assert [j.id for j in taken] == [job_id]
    assert runner._start(taken) == 0
    row = runner.jobs.get(job_id)
    assert row is not None and (row.state, row.attempt, row.holder) == ("pending", 1, None)
    assert [a.outcome_kind for a in row.attempts] == ["put_back"]


def test_a_closed_async_lane_refuses_an_attempt_and_stays_idle() -> None:
    """An attempt handed to a closed lane (a refill racing shutdown) is refused with
    ProcessorClosed, which the runner answers by putting the job back; before, it was
    counted as active forever and wait_idle() never returned True."""
    from dibs.tasks._async import AsyncLane
    from dibs.tasks._handle import CancelToken, TaskContext

    lane = AsyncLane("test", 2)
    lane.close()

    async def nothing() -> None:
        return None

    context = TaskContext(task_id="t", attempt=1, token=CancelToken("t", None))
    with pytest.raises(ProcessorClosed):
        lane.start(nothing, [], {}, context, None, lambda outcome: None)
    assert lane.wait_idle(GUARD) and lane.free == 0
