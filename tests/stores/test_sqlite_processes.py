"""SQLite under the process models users actually run: fork, many threads, ``:memory:``, full disks.

Every fork test ends the same way: a fresh interpreter re-opens the file and checks
that every claim acknowledged as granted (in any process) is still there, held by
its holder, and that a stranger cannot claim its unit. So a lost WAL, or a unit
granted twice, fails the test whatever the order of events was.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import sqlite3
import subprocess
import sys
import textwrap
import threading
import traceback
from collections.abc import Callable
from pathlib import Path

import pytest

import dibs
from dibs import StoreClosed, StoreUnavailable, Unit
from dibs.stores.jobs import Job, JobTable
from dibs.stores.sqlite import SQLiteStore
from eventually import eventually

ROUNDS = 8  # claims per phase per process

# Python 3.12+ warns on fork() with threads running; forking with threads is what we test.
pytestmark = pytest.mark.filterwarnings("ignore:This process .*multi-threaded:DeprecationWarning")

_VERIFY = textwrap.dedent(
    """
    import json, sys
    import dibs
    from dibs import Unit
    from dibs.stores.sqlite import SQLiteStore

    path, acks = sys.argv[1], sys.argv[2]
    store = SQLiteStore(path)
    jobs = store.job_table()
    seen = set()
    for line in open(acks):
        ack = json.loads(line)
        if ack["kind"] == "job":
            assert jobs.get(ack["id"]) is not None, f"acknowledged job lost: {ack}"
            continue
        unit = (ack["resource"], ack["slot"])
        assert unit not in seen, f"unit granted twice: {ack}"
        seen.add(unit)
        claim = store.get(ack["id"])
        assert claim is not None, f"acknowledged claim lost: {ack}"
        assert claim.holder == ack["holder"], (claim, ack)
        assert claim.state == dibs.ClaimState.CONFIRMED, (claim, ack)
        stranger = store.claim(Unit(*unit), holder="stranger")
        assert not stranger, f"stranger got an acknowledged unit: {ack}"
    store.close()
    print(len(seen))
    """
)


class Acks:
    """An append-only log of acknowledged grants, written by every process."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def grant(self, store: dibs.Store, holder: str, i: int) -> None:
        unit = Unit(f"seat-{holder}-{i}", "show-1")
        result = store.claim(unit, holder=holder)
        assert result, f"{holder} lost {unit}"
        assert result.claim is not None
        self._write(
            {"kind": "claim", "resource": unit.resource, "slot": unit.slot,
             "id": result.claim.id, "holder": holder}
        )  # fmt: skip

    def job(self, jobs: JobTable, job_id: str) -> None:
        jobs.add(
            Job(id=job_id, name="t", args="[]", run_at=0.0, attempt=1, max_attempts=1,
                state="pending", schedule_id=None, retries=0, key=None)
        )  # fmt: skip
        self._write({"kind": "job", "id": job_id})

    def _write(self, record: dict[str, str]) -> None:
        # O_APPEND: lines from several processes never interleave.
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
        try:
            os.write(fd, (json.dumps(record) + "\n").encode())
        finally:
            os.close(fd)

    def verify(self, db: Path) -> int:
        """Re-open ``db`` in a fresh interpreter; return how many grants it checked."""
        out = subprocess.run(
            [sys.executable, "-c", _VERIFY, str(db), str(self.path)],
            capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip
        assert out.returncode == 0, out.stderr
        return int(out.stdout)


class Signal:
    """A one-shot cross-process event on a pipe."""

    def __init__(self) -> None:
        self.r, self.w = os.pipe()

    def set(self) -> None:
        os.write(self.w, b"x")

    def wait(self) -> None:
        assert os.read(self.r, 1) == b"x"


def _fork(child: Callable[[], None]) -> int:
    pid = os.fork()
    if pid == 0:  # pragma: no cover - runs in the child
        code = 1
        try:
            child()
            code = 0
        except BaseException:
            traceback.print_exc()
        finally:
            os._exit(code)
    return pid


def _join(pid: int) -> None:
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0, "the child failed (its traceback is above)"


@pytest.fixture
def acks(tmp_path: Path) -> Acks:
    return Acks(tmp_path / "acks.jsonl")


# --- fork -------------------------------------------------------------------------------------


def test_parent_closes_while_the_child_keeps_claiming(tmp_path: Path, acks: Acks) -> None:
    db = tmp_path / "fork.db"
    store = SQLiteStore(db)
    acks.grant(store, "parent", 0)  # the parent holds a connection when it forks
    claimed, closed = Signal(), Signal()

    def child() -> None:
        for i in range(ROUNDS):
            acks.grant(store, "child", i)
        claimed.set()
        closed.wait()
        for i in range(ROUNDS, 2 * ROUNDS):  # after the parent closed: must not vanish
            acks.grant(store, "child", i)

    pid = _fork(child)
    claimed.wait()
    store.close()
    closed.set()
    _join(pid)
    assert acks.verify(db) == 2 * ROUNDS + 1


def test_child_closes_while_the_parent_keeps_claiming(tmp_path: Path, acks: Acks) -> None:
    db = tmp_path / "fork.db"
    store = SQLiteStore(db)
    acks.grant(store, "parent", 0)

    def child() -> None:
        for i in range(ROUNDS):
            acks.grant(store, "child", i)
        store.close()

    pid = _fork(child)
    _join(pid)
    for i in range(1, ROUNDS):
        acks.grant(store, "parent", i)
    other = SQLiteStore(db)  # a second opener, then the parent keeps going
    acks.grant(other, "other", 0)
    other.close()
    for i in range(ROUNDS, 2 * ROUNDS):
        acks.grant(store, "parent", i)
    assert acks.verify(db) == 3 * ROUNDS + 1  # verified while the parent's store is still open
    store.close()


def test_child_opens_a_fresh_store_while_the_parent_holds_connections(
    tmp_path: Path, acks: Acks
) -> None:
    db = tmp_path / "fork.db"
    store = SQLiteStore(db)
    acks.grant(store, "parent", 0)
    claimed, closed = Signal(), Signal()

    def child() -> None:
        fresh = SQLiteStore(db)
        for i in range(ROUNDS):
            acks.grant(fresh, "child", i)
        claimed.set()
        closed.wait()
        for i in range(ROUNDS, 2 * ROUNDS):
            acks.grant(fresh, "child", i)
        fresh.close()

    pid = _fork(child)
    claimed.wait()
    store.close()
    closed.set()
    _join(pid)
    assert acks.verify(db) == 2 * ROUNDS + 1


def _mp_worker(db: str, acks_path: str, n: int, ready: object, go: object) -> None:
    store = _INHERITED_STORE
    assert store is not None
    log = Acks(Path(acks_path))
    for i in range(ROUNDS):
        log.grant(store, f"w{n}", i)
    ready.set()  # type: ignore[attr-defined]
    go.wait()  # type: ignore[attr-defined]
    for i in range(ROUNDS, 2 * ROUNDS):
        log.grant(store, f"w{n}", i)
    fresh = SQLiteStore(db)
    log.grant(fresh, f"w{n}-fresh", 0)
    fresh.close()


_INHERITED_STORE: SQLiteStore | None = None


def test_multiprocessing_fork_workers_share_an_inherited_store(tmp_path: Path, acks: Acks) -> None:
    global _INHERITED_STORE
    db = tmp_path / "mp.db"
    _INHERITED_STORE = store = SQLiteStore(db)
    acks.grant(store, "parent", 0)
    ctx = multiprocessing.get_context("fork")
    readies = [ctx.Event() for _ in range(3)]
    go = ctx.Event()
    procs = [
        ctx.Process(target=_mp_worker, args=(str(db), str(acks.path), n, readies[n], go))
        for n in range(3)
    ]
    try:
        for proc in procs:
            proc.start()
        for ready in readies:
            assert ready.wait(60)
        store.close()  # the parent leaves while its workers keep claiming
        go.set()
        for proc in procs:
            proc.join(60)
            assert proc.exitcode == 0
    finally:
        _INHERITED_STORE = None
    assert acks.verify(db) == 3 * (2 * ROUNDS + 1) + 1


def test_a_forked_job_table_keeps_what_it_acknowledged(tmp_path: Path, acks: Acks) -> None:
    db = tmp_path / "jobs.db"
    store = SQLiteStore(db)
    jobs = store.job_table()
    acks.job(jobs, "parent-0")
    added, closed = Signal(), Signal()

    def child() -> None:
        for i in range(ROUNDS):
            acks.job(jobs, f"child-{i}")
        added.set()
        closed.wait()
        for i in range(ROUNDS, 2 * ROUNDS):
            acks.job(jobs, f"child-{i}")

    pid = _fork(child)
    added.wait()
    jobs.close()
    store.close()
    closed.set()
    _join(pid)
    acks.verify(db)


def test_a_fork_waits_for_a_call_in_another_thread_then_both_sides_work(
    tmp_path: Path, acks: Acks
) -> None:
    db = tmp_path / "wait.db"
    store = SQLiteStore(db)
    acks.grant(store, "parent", 0)
    inside = threading.Event()

    def a_call_that_ends_during_the_fork() -> None:
        with store._immediate():
            inside.set()
            eventually(lambda: store._pool._forking, "the fork has begun and waits for us")
        acks.grant(store, "thread", 0)  # blocked until the fork is over, then fine

    thread = threading.Thread(target=a_call_that_ends_during_the_fork)
    thread.start()
    inside.wait()

    def child() -> None:
        for i in range(ROUNDS):
            acks.grant(store, "child", i)

    pid = _fork(child)
    thread.join()
    store.close()
    _join(pid)
    assert acks.verify(db) == ROUNDS + 2


def test_a_fork_during_a_running_call_refuses_the_file_in_the_child(
    tmp_path: Path, acks: Acks
) -> None:
    db = tmp_path / "busy.db"
    store = SQLiteStore(db, busy_timeout=0.2)  # how long a fork waits for running calls
    acks.grant(store, "parent", 0)
    inside, leave = threading.Event(), threading.Event()

    def hold_a_transaction() -> None:
        with store._immediate():  # a call in flight in another thread while we fork
            inside.set()
            leave.wait()

    thread = threading.Thread(target=hold_a_transaction)
    thread.start()
    inside.wait()

    def child() -> None:
        # SQLite state for this file came from the parent mid-call: no use is safe.
        with pytest.raises(StoreClosed, match="fork"):
            store.claim(Unit("seat-child", "x"), holder="child")
        with pytest.raises(StoreClosed, match="fork"):
            SQLiteStore(db)

    try:
        pid = _fork(child)
        _join(pid)
    finally:
        leave.set()
        thread.join()
    acks.grant(store, "parent", 1)  # the parent is unaffected
    store.close()
    assert acks.verify(db) == 2


# --- :memory: ---------------------------------------------------------------------------------


def test_memory_url_is_one_database_for_every_thread() -> None:
    store = dibs.open("sqlite:///:memory:")
    assert store.claim(Unit("seat", "main"), holder="main")
    results: list[bool] = []
    errors: list[BaseException] = []

    def contend(n: int) -> None:
        try:
            assert store.holder_of(Unit("seat", "main")) == "main"
            results.append(bool(store.claim(Unit("seat", "shared"), holder=f"t{n}")))
            assert store.claim(Unit("seat", f"own-{n}"), holder=f"t{n}")
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=contend, args=(n,)) for n in range(16)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors, errors
    assert results.count(True) == 1
    assert len(store.claims_of("t3")) in (1, 2)
    store.close()


def test_memory_store_is_refused_in_a_forked_child() -> None:
    store = dibs.open("sqlite:///:memory:")
    assert store.claim(Unit("seat", "1"), holder="parent")

    def child() -> None:
        # The child's copy would grant what the parent grants: refuse instead.
        with pytest.raises(StoreClosed, match="memory"):
            store.claim(Unit("seat", "2"), holder="child")
        store.close()  # closing the refused copy is harmless

    _join(_fork(child))
    assert store.claim(Unit("seat", "2"), holder="parent")
    assert not store.claim(Unit("seat", "1"), holder="stranger")
    store.close()


# --- file descriptors -------------------------------------------------------------------------

_FD_SCRIPT = textwrap.dedent(
    """
    import resource, sys, threading
    from dibs import Unit
    from dibs.stores.sqlite import SQLiteStore

    resource.setrlimit(resource.RLIMIT_NOFILE, (256, 256))
    store = SQLiteStore(sys.argv[1])
    jobs = store.job_table()
    errors = []

    def work(n):
        try:
            assert store.claim(Unit("seat", str(n)), holder="h")
            assert jobs.get(f"job-{n}") is None
        except BaseException as exc:
            errors.append(exc)

    for wave in range(20):  # 1,000 short-lived threads, 50 at a time
        threads = [threading.Thread(target=work, args=(wave * 50 + k,)) for k in range(50)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert not errors, errors[0]
    store.close()
    print("ok")
    """
)


def test_a_thousand_short_lived_threads_fit_under_256_descriptors(tmp_path: Path) -> None:
    out = subprocess.run(
        [sys.executable, "-c", _FD_SCRIPT, str(tmp_path / "fd.db")],
        capture_output=True, text=True, timeout=100, check=False,
    )  # fmt: skip
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-2000:]


# --- a failing write ----------------------------------------------------------------------------

_FULL_SCRIPT = textwrap.dedent(
    """
    import os, resource, signal, sys, threading
    from dibs import StoreUnavailable, Unit
    from dibs.stores.sqlite import SQLiteStore

    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # EFBIG from write(), not a killed process
    path = sys.argv[1]
    store = SQLiteStore(path)
    assert store.claim(Unit("seat", "before"), holder="h")
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    big = [Unit("row", f"{k:06d}" + "x" * 200) for k in range(3000)]  # many pages at COMMIT
    resource.setrlimit(resource.RLIMIT_FSIZE, (os.path.getsize(path + "-wal") + 4096, hard))
    try:
        store.claim(big, holder="h")
    except StoreUnavailable as exc:
        print("failed:", exc)
    else:
        raise AssertionError("the write should have hit the file size limit")
    resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))  # space is back
    # Same thread, same connection: it must not be stuck inside the failed transaction.
    assert store.claim(Unit("seat", "after"), holder="h")
    assert store.claim(big, holder="h2"), "the failed claim must have been rolled back"
    done = []
    t = threading.Thread(target=lambda: done.append(bool(store.claim(Unit("s", "t"), holder="h"))))
    t.start()
    t.join()
    assert done == [True]
    store.close()
    print("ok")
    """
)


def test_a_commit_that_fails_rolls_back_and_the_next_call_works(tmp_path: Path) -> None:
    out = subprocess.run(
        [sys.executable, "-c", _FULL_SCRIPT, str(tmp_path / "full.db")],
        capture_output=True, text=True, timeout=100, check=False,
    )  # fmt: skip
    assert out.returncode == 0 and out.stdout.strip().endswith("ok"), out.stdout + out.stderr


def test_a_full_database_is_store_unavailable_and_recovers(tmp_path: Path) -> None:
    db = tmp_path / "pages.db"
    store = SQLiteStore(db)
    assert store.claim(Unit("seat", "0"), holder="h")
    with store._immediate() as conn:  # no bigger than it is now: SQLITE_FULL on the next page
        pages = conn.execute("PRAGMA page_count").fetchone()[0]
    big = [Unit("row", f"{k:06d}" + "y" * 200) for k in range(500)]
    with store._immediate() as conn:  # one thread, one connection: the limit applies below
        conn.execute(f"PRAGMA max_page_count = {pages}")
    with pytest.raises(StoreUnavailable, match="full"):
        store.claim(big, holder="h")
    with store._immediate() as conn:  # the same connection, no longer in a transaction
        conn.execute("PRAGMA max_page_count = 1073741823")
    assert store.claim(big, holder="h")
    assert store.claim(Unit("seat", "1"), holder="h")
    store.close()


def test_a_commit_left_inside_its_transaction_is_rolled_back(tmp_path: Path) -> None:
    # A deferred constraint makes COMMIT fail while SQLite stays inside the transaction (as
    # SQLITE_BUSY would); SQLITE_FULL and I/O errors roll back by themselves (tests above).
    store = SQLiteStore(tmp_path / "deferred.db")
    with store._immediate() as conn:
        conn.execute("CREATE TABLE parent (id INTEGER PRIMARY KEY)")
        conn.execute(
            "CREATE TABLE child (p INTEGER REFERENCES parent (id) DEFERRABLE INITIALLY DEFERRED)"
        )
    with store._pool.connection() as conn:
        conn.execute("PRAGMA foreign_keys = ON")  # this (pooled, reused) connection only
    with pytest.raises(sqlite3.IntegrityError), store._immediate() as conn:
        conn.execute("INSERT INTO child (p) VALUES (42)")
    assert store.claim(Unit("seat", "after"), holder="h")  # not "within a transaction"
    with store._immediate() as conn:
        assert conn.execute("SELECT count(*) FROM child").fetchone() == (0,)
    store.close()
