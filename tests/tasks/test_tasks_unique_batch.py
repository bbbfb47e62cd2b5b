"""``enqueue_many`` / ``insert_many`` of a unique task: a batch decides each job's key in order.

A batch is one transaction of the job table; each of its calls meets the key as an
``insert`` of its own would, in order: a later call of a key an earlier one in the
batch took is its ``duplicate`` (refuse) or ``replaced`` it (replace, debounce).
Checked against single inserts of the same calls (Hypothesis), inside the caller's
transaction (a rollback leaves no job and no key), and under threads that enqueue
the same keys in batches at once (one job per key; a planted read-then-write check
fails it). Every store with a job table.
"""

from __future__ import annotations

import json
import random
import secrets
import sqlite3
import threading
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import dibs
from conftest import StoreMaker, kinds_offering
from dibs import FakeClock, Store
from dibs.stores.jobs import Job, JobTable
from dibs.tasks import Inserted, TaskProcessor, Unique
from pg_fixtures import drop_schema, schema_url

T0 = 1_800_000_000.0
GUARD = 60.0
MODES = {
    "refuse": Unique(key=("k",)),
    "replace": Unique(key=("k",), mode="replace"),
    "debounce": Unique(key=("k",), window=30, mode="debounce"),
}


@pytest.fixture(params=kinds_offering("job_table"))
def store_kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(T0)


@pytest.fixture
def store(make_store: StoreMaker, clock: FakeClock) -> Store:
    return make_store(clock)


def _register(processor: TaskProcessor, prefix: str = "") -> None:
    for mode, rule in MODES.items():
        processor.task(f"{prefix}{mode}", unique=rule)(lambda k, who="": k)


@pytest.fixture
def tasks(store: Store, clock: FakeClock) -> Iterator[TaskProcessor]:
    processor = TaskProcessor(store=store, clock=clock, take_jobs=False, sweep_every=None)
    _register(processor)
    _register(processor, "seq-")
    yield processor
    processor.shutdown(timeout=GUARD)


def _table(store: Store) -> JobTable:
    table = store.job_table()
    assert table is not None
    return table


def _args(store: Store, job_id: str) -> list[Any]:
    job = _table(store).get(job_id)
    assert job is not None
    return list(json.loads(job.args)[0])


def test_refuse_a_later_call_of_a_key_in_the_batch_is_the_earlier_ones_duplicate(
    tasks: TaskProcessor, store: Store
) -> None:
    before = tasks.insert("refuse", 3, "before")
    got = tasks.insert_many("refuse", [(1, "a"), (2, "b"), (1, "c"), (3, "d")])
    assert [g.outcome for g in got] == ["added", "added", "duplicate", "duplicate"]
    assert got[2].job_id == got[0].job_id and got[3].job_id == before.job_id
    assert _args(store, got[0].job_id) == [1, "a"]  # the first call stands
    assert len(_table(store).find(name="refuse")) == 3
    # enqueue_many answers what enqueue would: the standing job of each call.
    ids = tasks.enqueue_many("refuse", [(2, "e"), (4, "f")])
    assert ids[0] == got[1].job_id and ids[1] not in {g.job_id for g in got}


@pytest.mark.parametrize("mode", ["replace", "debounce"])
def test_replace_and_debounce_the_last_call_of_a_key_in_the_batch_wins(
    tasks: TaskProcessor, store: Store, clock: FakeClock, mode: str
) -> None:
    before = tasks.insert(mode, 3, "before")
    clock.advance(5)
    got = tasks.insert_many(mode, [(1, "a"), (1, "b"), (3, "c"), (1, "d")])
    assert [g.outcome for g in got] == ["added", "replaced", "replaced", "replaced"]
    assert got[1].job_id == got[0].job_id == got[3].job_id and got[2].job_id == before.job_id
    assert _args(store, got[0].job_id) == [1, "d"] and _args(store, before.job_id) == [3, "c"]
    assert len(_table(store).find(name=mode)) == 2
    if mode == "debounce":  # due a window after the batch, the last call's time
        job = _table(store).get(got[0].job_id)
        assert job is not None and job.run_at == pytest.approx(clock.now() + 30)


def test_a_per_call_rule_applies_to_the_batch(tasks: TaskProcessor, store: Store) -> None:
    tasks.task("plain")(lambda k, who="": k)
    rule = Unique(key=("k",), mode="replace")
    got = tasks.insert_many("plain", [(1, "a"), (1, "b")], unique=rule)
    assert [g.outcome for g in got] == ["added", "replaced"]
    plain = tasks.insert_many("plain", [(1, "c"), (1, "d")])  # no rule: each call is a job
    assert [g.outcome for g in plain] == ["added", "added"]
    assert len({got[0].job_id, plain[0].job_id, plain[1].job_id}) == 3
    assert tasks.insert_many("plain", []) == []


@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    mode=st.sampled_from(list(MODES)),
    keys=st.lists(st.integers(min_value=-(2**64), max_value=2**64) | st.sampled_from([0, 1]),
                  max_size=12),
    held=st.lists(st.integers(min_value=0, max_value=1), max_size=2),
)  # fmt: skip
def test_a_batch_ends_as_the_same_calls_inserted_one_by_one(
    tasks: TaskProcessor, store: Store, mode: str, keys: list[int], held: list[int]
) -> None:
    """Each task twice (``mode`` and ``seq-mode``): the batch on one, single inserts on the
    other, after the same jobs added before. Same outcomes, the same calls' jobs
    standing, and the same arguments in each standing job."""
    run = secrets.token_hex(4)  # a fresh key space per example: the store is shared
    calls = [(f"{run}{k}", f"who{i}") for i, k in enumerate(keys)]
    for k in held:
        tasks.insert(mode, f"{run}{k}", "held")
        tasks.insert(f"seq-{mode}", f"{run}{k}", "held")
    batch = tasks.insert_many(mode, calls)
    single = [tasks.insert(f"seq-{mode}", *call) for call in calls]
    assert [b.outcome for b in batch] == [s.outcome for s in single]

    def shape(got: list[Inserted]) -> list[Any]:
        first: dict[str, int] = {}
        return [first.setdefault(g.job_id, i) for i, g in enumerate(got)]

    assert shape(batch) == shape(single)
    for b, s in zip(batch, single, strict=True):
        assert _args(store, b.job_id) == _args(store, s.job_id)


# --- inside the caller's transaction ----------------------------------------------------------


def _in_caller_transaction(processor: TaskProcessor, store: Store, begin: Any, end: Any) -> None:
    begin("rollback")
    got = processor.insert_many("replace", [(1, "a"), (2, "b"), (1, "c")], connection=end.conn)
    assert [g.outcome for g in got] == ["added", "added", "replaced"]
    end("rollback")
    assert _table(store).find(name="replace") == []  # no job, and no key left taken
    begin("commit")
    again = processor.insert_many("replace", [(1, "d"), (1, "e")], connection=end.conn)
    end("commit")
    assert [g.outcome for g in again] == ["added", "replaced"]
    assert [_args(store, j.id) for j in _table(store).find(name="replace")] == [[1, "e"]]


class _Ender:
    def __init__(self, conn: Any, sql: bool) -> None:
        self.conn, self.sql = conn, sql

    def __call__(self, how: str) -> None:
        if self.sql:
            self.conn.execute("ROLLBACK" if how == "rollback" else "COMMIT")
        else:
            (self.conn.rollback if how == "rollback" else self.conn.commit)()


def test_a_batch_in_a_sqlite_transaction_goes_with_it(tmp_path: Path) -> None:
    path = tmp_path / "jobs.db"
    store = dibs.open(f"sqlite:///{path}")
    processor = TaskProcessor(store=store, take_jobs=False, sweep_every=None)
    _register(processor)
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        _in_caller_transaction(
            processor, store, lambda _: conn.execute("BEGIN IMMEDIATE"), _Ender(conn, True)
        )
    finally:
        conn.close()
        processor.shutdown(timeout=GUARD)
        store.close()


def test_a_batch_in_a_postgres_transaction_goes_with_it(pg_url: str) -> None:
    import psycopg

    plain = pg_url.split("?", 1)[0]
    schema = f"t_{secrets.token_hex(6)}"
    store = dibs.open(schema_url(pg_url, schema))
    processor = TaskProcessor(store=store, take_jobs=False, sweep_every=None)
    _register(processor)
    try:
        with psycopg.connect(plain) as conn:
            _in_caller_transaction(processor, store, lambda _: None, _Ender(conn, False))
    finally:
        processor.shutdown(timeout=GUARD)
        store.close()
        drop_schema(plain, schema)


# --- batches racing for the same keys --------------------------------------------------------

KEYS, THREADS, ROUNDS = 24, 8, 3


def _plant_read_then_write(store: Store) -> None:
    """A batch whose keys are checked by a read outside the store's index, then added (the
    key salted, so the index cannot save it): batches between the read and the write
    both add."""
    table = store.job_table()
    assert table is not None
    add_many = table.add_many

    def add_unique_many(
        jobs: list[Job], mode: str, window: float | None, connection: object | None = None
    ) -> list[tuple[str, str]]:
        held = {
            (row.unique_key or "").split("|")[0]: row.id
            for row in table.find(name=jobs[0].name, states=["pending", "running"])
        }
        time.sleep(0.002)  # the round trip every read-then-write has, made visible
        fresh = [replace(j, unique_key=f"{j.unique_key}|{j.id}") for j in jobs
                 if j.unique_key not in held]  # fmt: skip
        add_many(fresh, connection)
        return [(held[j.unique_key], "duplicate") if j.unique_key in held else (j.id, "added")
                for j in jobs if j.unique_key is not None]  # fmt: skip

    table.add_unique_many = add_unique_many  # type: ignore[method-assign]


def _race(make_store: StoreMaker, plant: bool) -> tuple[Store, list[tuple[str, Any, Inserted]]]:
    store = make_store()  # the system clock: windows and due times as in production
    processor = TaskProcessor(store=store, take_jobs=False, sweep_every=None)
    _register(processor)
    if plant:
        _plant_read_then_write(store)
    out: list[tuple[str, Any, Inserted]] = []
    lock = threading.Lock()
    start = threading.Barrier(THREADS)

    def work(n: int) -> None:
        rng = random.Random(n)
        start.wait()
        for r in range(ROUNDS):
            for mode in MODES:
                keys = list(range(KEYS)) * 2  # each key twice in a batch, shuffled
                rng.shuffle(keys)
                got = processor.insert_many(mode, [(k, f"{n}.{r}") for k in keys])
                with lock:
                    out.extend((mode, k, g) for k, g in zip(keys, got, strict=True))

    threads = [threading.Thread(target=work, args=(n,)) for n in range(THREADS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(GUARD)
    processor.shutdown(timeout=GUARD)
    return store, out


def test_batches_racing_for_the_same_keys_add_one_job_per_key(make_store: StoreMaker) -> None:
    store, out = _race(make_store, plant=False)
    modes = list(MODES)
    per_key = Counter(
        (job.name, json.loads(job.args)[0][0]) for job in _table(store).find() if job.name in modes
    )
    assert len(per_key) == KEYS * len(MODES) and set(per_key.values()) == {1}, per_key
    ids: dict[tuple[str, Any], set[str]] = {}
    for mode, k, got in out:
        ids.setdefault((mode, k), set()).add(got.job_id)
    assert all(len(found) == 1 for found in ids.values())  # every call got the one job
    added = Counter((mode, k) for mode, k, got in out if got.outcome == "added")
    assert set(added.values()) == {1} and len(added) == KEYS * len(MODES)


def test_the_batch_race_catches_a_read_then_write_check(make_store: StoreMaker) -> None:
    """Negative control: the same race on a check made outside the store's index."""
    store, _ = _race(make_store, plant=True)
    per_key = Counter(
        (job.name, json.loads(job.args)[0][0]) for job in _table(store).find(name="refuse")
    )
    assert max(per_key.values()) > 1
