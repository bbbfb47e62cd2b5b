"""SQLite-specific guarantees: many processes on one file, kill -9, schema versions, URLs."""

from __future__ import annotations

import multiprocessing
import os
import random
import signal
import sqlite3
import subprocess
import sys
import textwrap
import threading
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

import dibs
from dibs import SchemaError, Unit
from dibs.stores.sqlite import SCHEMA_VERSION, SQLiteStore

QUICK = True  # in `pytest -m quick` (conftest.is_quick: not slow, no server)

PROCESSES = 4
UNITS = 300


def _start_together(at: float) -> None:
    """Wait until wall-clock ``at`` so every spawned process races from the same instant."""
    time.sleep(max(0.0, at - time.time()))


def _rush(
    url: str, n: int, seed: int, at: float
) -> list[tuple[str, str | None, int | None, list[str]]]:
    """One process racing for every unit in its own order; confirmed claims."""
    store = dibs.open(url)
    _start_together(at)
    rng = random.Random(seed)
    order = list(range(UNITS))
    rng.shuffle(order)
    out: list[tuple[str, str | None, int | None, list[str]]] = []
    for k in order:
        group = (
            [Unit("seat", str(k)), Unit("seat", str((k + 1) % UNITS))]
            if k % 5 == 0
            else [Unit("seat", str(k))]
        )
        holder = f"p{n}"
        rid = f"p{n}-{k}"
        result = store.claim(group, holder=holder, request_id=rid)
        # A retry of the same request must answer the same, whatever happened since.
        again = store.claim(group, holder=holder, request_id=rid)
        assert again.replayed and again.granted == result.granted
        if result:
            assert result.claim is not None
            out.append((holder, result.claim.id, result.claim.fence, []))
        else:
            assert result.taken
            out.append((holder, None, None, [t.slot for t in result.taken]))  # type: ignore[union-attr]
    store.close()
    return out


def _holds(url: str, n: int, rounds: int, at: float) -> int:
    """Short holds on few units: every process keeps taking over the others' dead holds."""
    store = dibs.open(url)
    _start_together(at)
    granted = 0
    for r in range(rounds):
        result = store.claim(Unit("hot", str(r % 3)), holder=f"p{n}-{r}", ttl=0.002)
        granted += bool(result)
    store.close()
    return granted


@pytest.fixture
def url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'race.db'}"


@pytest.mark.slow  # processes: left out of the quick subset
def test_processes_racing_on_one_file_get_one_winner_per_unit(url: str) -> None:
    dibs.open(url).close()
    ctx = multiprocessing.get_context("spawn")
    with ctx.Pool(PROCESSES) as pool:
        results = pool.starmap(_rush, [(url, n, n, time.time() + 2) for n in range(PROCESSES)])
    with dibs.open(url) as store:
        winners: dict[Unit, list[str]] = {}
        taken_slots: set[str] = set()
        for per in results:
            for holder, claim_id, fence, taken in per:
                if claim_id is None:
                    taken_slots.update(taken)
                    continue
                claim = store.get(claim_id)
                assert claim is not None and claim.holder == holder and claim.fence == fence
                for unit in claim.units:
                    winners.setdefault(unit, []).append(holder)
        # A unit only ever asked for inside a group can go unclaimed; every
        # other unit is claimed by exactly one process.
        assert len(winners) >= UNITS * 0.8
        assert all(len(holders) == 1 for holders in winners.values()), winners
        # Every loser was told of targets that someone really holds.
        assert taken_slots <= {u.slot for u in winners}
        for unit, (holder,) in winners.items():
            assert store.holder_of(unit) == holder


def _sweeps(url: str, at: float, done: str) -> int:
    """Sweep in a loop while the claimants run (sweeps race claims and each other), then once."""
    store = dibs.open(url)
    _start_together(at)
    expired = 0
    while not os.path.exists(done):
        expired += store.sweep().expired
    time.sleep(0.01)  # the last holds (2 ms) are dead now: the last sweep finds them
    expired += store.sweep().expired
    store.close()
    return expired


@pytest.mark.slow  # processes: left out of the quick subset
def test_processes_taking_over_dead_holds_never_overlap(url: str, tmp_path: Path) -> None:
    dibs.open(url).close()
    ctx = multiprocessing.get_context("spawn")
    at = time.time() + 2
    done = tmp_path / "claimants-done"
    with ctx.Pool(PROCESSES + 2) as pool:
        sweepers = [pool.apply_async(_sweeps, (url, at, str(done))) for _ in range(2)]
        granted = pool.starmap(_holds, [(url, n, 400, at) for n in range(PROCESSES)])
        done.touch()
        swept = sum(s.get() for s in sweepers)
    assert swept > 0, "the sweepers never raced a claim"
    assert sum(granted) > 3
    with dibs.open(url) as store:
        log = store.claim_log()
        assert log is not None
        claims = log.claims()
    assert len(claims) == sum(granted)
    assert [c.fence for c in claims] == sorted(c.fence for c in claims)
    last_expiry: dict[tuple[object, ...], datetime] = {}
    for claim in claims:
        # Ordered by fence, each grant on a unit starts no earlier than the
        # previous hold on it expired: no grant over a live hold.
        assert claim.expires_at is not None
        previous = last_expiry.get(claim.targets)
        assert previous is None or claim.created_at >= previous, claim
        last_expiry[claim.targets] = claim.expires_at


_DURABLE_CHILD = textwrap.dedent(
    """
    import sys, dibs
    store = dibs.open(sys.argv[1])
    i = int(sys.argv[2])
    while True:
        r = store.claim(dibs.Unit("seat", str(i)), holder="h", ttl=600, request_id=f"r{i}")
        print("claimed", r.claim.id, flush=True)
        store.confirm(r.claim.id, holder="h", fence=r.claim.fence)
        print("confirmed", r.claim.id, flush=True)
        i += 1
    """
)


@pytest.mark.slow  # processes: left out of the quick subset
def test_what_returned_to_the_caller_survives_kill_9(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'durable.db'}"
    dibs.open(url).close()
    acknowledged: dict[str, str] = {}
    start = 0
    for round_ in range(4):
        with subprocess.Popen(
            [sys.executable, "-c", _DURABLE_CHILD, url, str(start)],
            stdout=subprocess.PIPE,
            text=True,
        ) as child:
            assert child.stdout is not None
            for _ in range(50 + 37 * round_):
                verb, claim_id = child.stdout.readline().split()
                acknowledged[claim_id] = verb
            os.kill(child.pid, signal.SIGKILL)
            child.wait()
        start += 10_000
    with dibs.open(url) as store:
        for claim_id, verb in acknowledged.items():
            claim = store.get(claim_id)
            assert claim is not None, f"acknowledged claim {claim_id} was lost"
            if verb == "confirmed":
                assert claim.state is dibs.ClaimState.CONFIRMED
    conn = sqlite3.connect(tmp_path / "durable.db")
    assert conn.execute("PRAGMA integrity_check").fetchone() == ("ok",)
    conn.close()


def test_a_newer_schema_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "future.db"
    SQLiteStore(path).close()
    conn = sqlite3.connect(path)
    conn.execute("UPDATE dibs_meta SET value = '99' WHERE key = 'schema_version'")
    conn.commit()
    conn.close()
    with pytest.raises(SchemaError) as raised:
        SQLiteStore(path)
    assert raised.value.found == 99 and "99" in str(raised.value)


def test_schema_is_created_once_and_stamped(tmp_path: Path) -> None:
    path = tmp_path / "s.db"
    for _ in range(3):
        SQLiteStore(path).close()
    conn = sqlite3.connect(path)
    rows = conn.execute("SELECT value FROM dibs_meta WHERE key = 'schema_version'").fetchall()
    assert rows == [(str(SCHEMA_VERSION),)]
    assert conn.execute("PRAGMA journal_mode").fetchone() == ("wal",)
    conn.close()


def test_default_url_is_dibs_db_in_the_working_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("DIBS_URL", raising=False)
    with dibs.open() as store:
        assert isinstance(store, SQLiteStore)
        store.claim(Unit("x"), holder="a")
    assert (tmp_path / "dibs.db").exists()
    monkeypatch.setenv("DIBS_URL", "memory://")
    with dibs.open() as store:
        assert store.scheme == "memory"


@pytest.mark.parametrize(
    ("url", "fragment"),
    [
        ("sqlite://", "no file path"),
        ("sqlite://otherhost/x.db", "otherhost"),
        ("sqlite:///x.db?synchronous=sometimes", "sometimes"),
        ("sqlite:///x.db?busy_timeout=soon", "soon"),
        ("sqlite:///x.db?group_commit=maybe", "maybe"),
        ("sqlite:///x.db?colour=blue", "colour"),
        ("redis://localhost/0", "redis"),
        ("seats.db", "seats.db"),
        ("memory://extra", "extra"),
    ],
)
def test_bad_urls_name_the_problem(
    url: str, fragment: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(dibs.InvalidInput) as raised:
        dibs.open(url)
    assert fragment in str(raised.value)


def test_url_options_are_applied(tmp_path: Path) -> None:
    with dibs.open(
        f"sqlite:///{tmp_path / 'o.db'}?synchronous=full&busy_timeout=5&request_retention=60"
    ) as store:
        assert isinstance(store, SQLiteStore)
        assert (store.synchronous, store.busy_timeout, store.request_retention) == ("full", 5, 60)


def test_store_survives_fork(tmp_path: Path) -> None:
    store = dibs.open(f"sqlite:///{tmp_path / 'f.db'}")
    store.claim(Unit("before-fork"), holder="parent")

    def child(i: int) -> None:
        # The parent's connection must not be reused across fork().
        ok = store.claim(Unit("child", str(i)), holder="child")
        os._exit(0 if ok else 1)

    ctx = multiprocessing.get_context("fork")
    procs = [ctx.Process(target=child, args=(i,)) for i in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join()
    assert [p.exitcode for p in procs] == [0, 0]
    assert store.holder_of(Unit("child", "1")) == "child"
    assert store.claim(Unit("after-fork"), holder="parent")
    store.close()


def test_busy_writers_wait_instead_of_failing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "busy.db"
    claiming, began = threading.Event(), threading.Event()

    class Watched(sqlite3.Connection):
        def execute(self, sql: str, *args: Any) -> sqlite3.Cursor:
            if sql.startswith("BEGIN IMMEDIATE") and not began.is_set() and claiming.is_set():
                began.set()  # the claim's write starts here, and blocks on the file's lock
            return super().execute(sql, *args)

    connect = sqlite3.connect
    monkeypatch.setattr(sqlite3, "connect", lambda *a, **k: connect(*a, factory=Watched, **k))
    store = SQLiteStore(path, busy_timeout=60)
    blocker = connect(path, isolation_level=None, check_same_thread=False)
    blocker.execute("BEGIN IMMEDIATE")
    order: list[str] = []

    def claim() -> None:
        claiming.set()
        order.append("claimed" if store.claim(Unit("x"), holder="a") else "refused")

    t = threading.Thread(target=claim)
    t.start()
    assert began.wait(60), "the claim never began its write"
    # Real time, the point of the test: the other writer keeps the lock a while
    # after the claim asked for it (a busy_timeout of 1 ms fails here).
    time.sleep(0.2)
    order.append("committed")  # the claim cannot finish before this: the lock is held
    blocker.execute("COMMIT")
    t.join()
    assert order == ["committed", "claimed"]  # it waited for the other writer, then won
    blocker.close()
    store.close()
