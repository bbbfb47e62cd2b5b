"""sqlite:// with ``group_commit``: many threads' writes in one transaction, each its own.

Each test pushes enough threads through shared batches that a planted bug
(answering before the commit, or a failing claim's writes kept in the batch)
fails it: both were tried once.
"""

from __future__ import annotations

import itertools
import os
import signal
import sqlite3
import subprocess
import sys
import tempfile
import textwrap
import threading
from collections import Counter
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, settings

import dibs
from dibs import FakeClock, RequestConflict, SpanKindMismatch, Store, Unit
from dibs.stores.sqlite import SQLiteStore
from dibs.stores.sqlite._group import GroupCommit
from dibs.testing import StoreContract, StoreStateMachine
from eventually import eventually

THREADS = 16
ROUNDS = 150
UNITS = 40


# --- the whole contract and the state machine, with group commit on ------------------------------


class TestGroupCommitContract(StoreContract):
    @pytest.fixture
    def reopen(self, tmp_path: Path, clock: FakeClock) -> Iterator[Callable[[], Store]]:
        opened: list[Store] = []

        def make() -> Store:
            store = SQLiteStore(tmp_path / "contract.db", clock=clock, group_commit=True)
            opened.append(store)
            return store

        yield make
        for store in opened:
            store.close()

    @pytest.fixture
    def store(self, reopen: Callable[[], Store]) -> Store:
        return reopen()


class GroupCommitMachine(StoreStateMachine):
    @staticmethod
    def make_store(clock: FakeClock, retention: float) -> Store:
        path = _machine_dir / f"m{next(_machine_files)}.db"
        return SQLiteStore(path, clock=clock, request_retention=retention, group_commit=True)


_machine_dir = Path(tempfile.mkdtemp(prefix="dibs-group-machine-"))
_machine_files = itertools.count()
TestGroupCommitMachine = GroupCommitMachine.TestCase
TestGroupCommitMachine.settings = settings(
    max_examples=60, stateful_step_count=40, deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)  # fmt: skip


# --- many threads -------------------------------------------------------------------------------


@pytest.fixture
def batch_sizes(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The size of every batch run, to show the threads really shared transactions."""
    sizes: list[int] = []
    attempt = GroupCommit._attempt

    def counting(self: GroupCommit, batch: list[Any]) -> list[tuple[Any, BaseException | None]]:
        sizes.append(len(batch))
        return attempt(self, batch)

    monkeypatch.setattr(GroupCommit, "_attempt", counting)
    return sizes


def _race(store: dibs.Store, t: int, out: list[tuple[str, str, str | None, int | None]]) -> None:
    for r in range(ROUNDS):
        k = (t * 7 + r * 13) % UNITS
        targets = [Unit("seat", str(k))]
        if r % 4 == 0:  # a group claim over two units
            targets.append(Unit("seat", str((k + 1) % UNITS)))
        rid = f"t{t}-r{r}"
        result = store.claim(targets, holder=f"h{t}", request_id=rid)
        again = store.claim(targets, holder=f"h{t}", request_id=rid)
        assert again.replayed and again.granted == result.granted
        if result.granted and not result.replayed:
            assert result.claim is not None and again.claim is not None
            assert again.claim.fence == result.claim.fence
            out.append((rid, f"h{t}", result.claim.id, result.claim.fence))


def test_threads_sharing_batches_never_double_grant_and_keep_every_grant(
    tmp_path: Path, batch_sizes: list[int]
) -> None:
    path = tmp_path / "g.db"
    store = SQLiteStore(path, group_commit=True)
    outs: list[list[tuple[str, str, str | None, int | None]]] = [[] for _ in range(THREADS)]
    threads = [threading.Thread(target=_race, args=(store, t, outs[t])) for t in range(THREADS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    store.close()
    assert max(batch_sizes) > 1, "the threads never shared a transaction"
    grants = [g for out in outs for g in out]
    fences = [fence for *_, fence in grants]
    assert len(set(fences)) == len(fences)
    with SQLiteStore(path) as reopened:
        held: Counter[Unit] = Counter()
        for rid, holder, claim_id, fence in grants:
            assert claim_id is not None
            claim = reopened.get(claim_id)
            assert claim is not None and (claim.holder, claim.fence) == (holder, fence), rid
            held.update(t for t in claim.targets if isinstance(t, Unit))
            replay = reopened.claim(claim.targets, holder=holder, request_id=rid)
            assert replay.replayed and replay.claim is not None and replay.claim.fence == fence
        # Confirmed claims never end here: each unit was granted at most once, ever.
        assert all(n == 1 for n in held.values()), held.most_common(3)
        for unit in held:
            assert reopened.holder_of(unit) is not None


def _mixed(store: dibs.Store, t: int, good: list[tuple[str, int]], bad: list[int]) -> None:
    for r in range(ROUNDS):
        unit = Unit("m", f"{t}-{r}")
        if r % 3 == 1:
            # Fails in its turn after writing its first target: a span of the other kind.
            kind_clash = dibs.Span("times", 1, 2)
            try:
                store.claim([unit, kind_clash], holder=f"h{t}")
            except SpanKindMismatch:
                bad.append(r)
        elif r % 3 == 2:
            try:
                store.claim(Unit("m", f"other-{t}-{r}"), holder=f"h{t}", request_id=f"dup-{t}")
            except RequestConflict:
                bad.append(r)
        else:
            result = store.claim(unit, holder=f"h{t}", ttl=600)
            assert result.claim is not None
            good.append((result.claim.id, result.claim.fence))


def test_a_claim_failing_inside_a_batch_leaves_nothing_and_touches_no_other(
    tmp_path: Path, batch_sizes: list[int]
) -> None:
    path = tmp_path / "m.db"
    store = SQLiteStore(path, group_commit=True)
    day = datetime(2030, 1, 1, tzinfo=UTC)
    store.claim(dibs.Span("times", day, day + timedelta(days=1)), holder="seed")  # time spans
    goods: list[list[tuple[str, int]]] = [[] for _ in range(THREADS)]
    bads: list[list[int]] = [[] for _ in range(THREADS)]
    threads = [
        threading.Thread(target=_mixed, args=(store, t, goods[t], bads[t])) for t in range(THREADS)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    store.close()
    assert max(batch_sizes) > 1, "the threads never shared a transaction"
    with SQLiteStore(path) as reopened:
        for t in range(THREADS):
            assert len(goods[t]) == len(range(0, ROUNDS, 3))
            for claim_id, fence in goods[t]:
                claim = reopened.get(claim_id)
                assert claim is not None and claim.fence == fence
            for r in bads[t]:
                # The failed claim's first write (its unit) was rolled back with it.
                assert reopened.holder_of(Unit("m", f"{t}-{r}")) is None
                assert reopened.holder_of(Unit("m", f"other-{t}-{r}")) is None
        log = reopened.claim_log()
        assert log is not None
        assert {c.holder for c in log.claims()} <= {"seed", *(f"h{t}" for t in range(THREADS))}


_CRASH_CHILD = textwrap.dedent(
    """
    import sys, threading, dibs
    store = dibs.open(sys.argv[1])
    lock = threading.Lock()

    def claimer(t):
        i = 0
        while True:
            r = store.claim(dibs.Unit("seat", f"{t}-{i}"), holder=f"h{t}", ttl=600,
                            request_id=f"r{t}-{i}")
            with lock:
                print(r.claim.id, r.claim.fence, t, i, flush=True)
            i += 1

    for t in range(8):
        threading.Thread(target=claimer, args=(t,), daemon=True).start()
    threading.Event().wait()
    """
)


@pytest.mark.parametrize("synchronous", ["normal", "full"])
def test_kill_9_mid_batch_loses_nothing_acknowledged(tmp_path: Path, synchronous: str) -> None:
    url = f"sqlite:///{tmp_path / 'crash.db'}?group_commit=1&synchronous={synchronous}"
    dibs.open(url).close()
    acknowledged: list[tuple[str, int, str]] = []
    for _ in range(3):
        child = subprocess.Popen(
            [sys.executable, "-c", _CRASH_CHILD, url],
            stdout=subprocess.PIPE,
            text=True,
            env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
        )
        assert child.stdout is not None
        for lines, line in enumerate(child.stdout, 1):  # kill once well into its batches
            claim_id, fence, t, i = line.split()
            acknowledged.append((claim_id, int(fence), f"r{t}-{i}"))
            if lines == 400:
                os.kill(child.pid, signal.SIGKILL)
                break
        child.wait()
        child.stdout.close()
        with dibs.open(url) as store:
            for claim_id, fence, rid in acknowledged:
                claim = store.get(claim_id)
                assert claim is not None and claim.fence == fence, (claim_id, rid)
            assert store.integrity_check() == "ok"
    assert len(acknowledged) == 1200


def test_a_store_with_group_commit_keeps_working_in_a_fork_child(tmp_path: Path) -> None:
    store = SQLiteStore(tmp_path / "f.db", group_commit=True)
    assert store.claim(Unit("a", "1"), holder="parent")
    pid = os.fork()
    if pid == 0:  # the child: a batch of its own, on connections of its own
        code = 1
        try:
            code = 0 if store.claim(Unit("a", "2"), holder="child") else 2
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert store.holder_of(Unit("a", "2")) == "child"
    assert store.claim(Unit("a", "3"), holder="parent")
    store.close()


@pytest.mark.parametrize(
    ("flag", "on"), [("1", True), ("true", True), ("0", False), ("off", False)]
)
def test_group_commit_is_a_url_option(tmp_path: Path, flag: str, on: bool) -> None:
    with dibs.open(f"sqlite:///{tmp_path / 'o.db'}?group_commit={flag}") as store:
        assert isinstance(store, SQLiteStore) and store.group_commit is on
        assert store.claim(Unit("a"), holder="h")


def test_group_commit_must_be_a_bool(tmp_path: Path) -> None:
    with pytest.raises(dibs.InvalidInput) as raised:
        SQLiteStore(tmp_path / "o.db", group_commit="yes")  # type: ignore[arg-type]
    assert raised.value.field == "group_commit"


class _Interrupt(BaseException):
    """Stands for a KeyboardInterrupt arriving in the thread that leads a batch."""


def test_an_interrupt_in_the_leading_thread_is_its_own_and_others_may_retry(
    tmp_path: Path,
) -> None:
    # The others in the batch get StoreUnavailable (retryable, outcome to learn by
    # replay), never the leader's KeyboardInterrupt raised in their own threads; and
    # the batch was rolled back as a whole.
    store = SQLiteStore(tmp_path / "i.db", group_commit=True)
    group = store._group
    assert group is not None
    go, started = threading.Event(), threading.Event()
    errors: dict[str, BaseException] = {}

    def blocked(conn: Any) -> None:  # holds the lead while the others queue
        started.set()
        go.wait()

    def interrupted(conn: Any) -> None:
        conn.execute("INSERT INTO dibs_meta (key, value) VALUES ('planted', 'x')")
        raise _Interrupt

    def writes(conn: Any) -> None:
        conn.execute("INSERT INTO dibs_meta (key, value) VALUES ('other', 'x')")

    def call(name: str, work: Callable[[Any], None]) -> None:
        try:
            group.run(work)
        except BaseException as exc:
            errors[name] = exc

    def queued(n: int) -> None:
        def there() -> bool:
            with group._lock:
                return len(group._queue) >= n

        eventually(there, f"{n} call(s) queued")

    first = threading.Thread(target=call, args=("first", blocked))
    first.start()
    started.wait()  # the first leads a batch of its own; the queue is empty
    leader = threading.Thread(target=call, args=("leader", interrupted))
    leader.start()
    queued(1)
    other = threading.Thread(target=call, args=("other", writes))
    other.start()
    queued(2)
    go.set()
    for thread in (first, leader, other):
        thread.join()
    assert "first" not in errors
    assert isinstance(errors["leader"], _Interrupt)
    assert isinstance(errors["other"], dibs.StoreUnavailable)
    rows = sqlite3.connect(tmp_path / "i.db").execute("SELECT key FROM dibs_meta")
    keys = {row[0] for row in rows}
    assert not keys & {"planted", "other"}
    store.claim(Unit("seat", "after"), holder="h")  # the group still leads and commits
    store.close()
