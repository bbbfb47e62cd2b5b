"""Exactly one job per unique key when many threads and processes enqueue it at once.

On every store with a job table: threads of this process (memory://), and on the
shared stores (SQLite, PostgreSQL) child processes too, all enqueue every key of a
refuse, a replace and a debounce task in step. Then each key has one job, every
"added" answer is that job, and a worker runs each refuse job once. The negative
control runs the same race on a planted read-then-write check (read whether a job
holds the key, then add one): it must end with duplicates, every run.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

import unique_race
from conftest import SHARED_STORE_KINDS, StoreMaker, kinds_offering
from dibs import Store
from dibs.tasks import TaskProcessor
from eventually import eventually

pytestmark = [pytest.mark.processes, pytest.mark.timeout(300)]

GUARD = 120.0
KEYS = 40
THREADS = 4
PROCESSES = 3
CHILD_THREADS = 3


@pytest.fixture(params=kinds_offering("job_table"))
def store_kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def _children(url: str, plant: bool) -> list[subprocess.Popen[str]]:
    support = str(Path(unique_race.__file__).parent)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([support, os.environ.get("PYTHONPATH", "")])}
    procs = []
    for _ in range(PROCESSES):
        proc = subprocess.Popen(
            [sys.executable, "-m", "unique_race", url, str(KEYS), str(CHILD_THREADS),
             "1" if plant else "0"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env,
        )  # fmt: skip
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "ready"
        procs.append(proc)
    return procs


def _race(make_store: StoreMaker, plant: bool) -> tuple[Store, list[list[Any]]]:
    store = make_store()
    processor = TaskProcessor(store=store, take_jobs=False, sweep_every=None)
    unique_race.register(processor)
    if plant:
        unique_race.plant_read_then_write(store)
    shared = make_store.kind in SHARED_STORE_KINDS
    procs = _children(make_store.url, plant) if shared else []
    for proc in procs:
        assert proc.stdin is not None
        proc.stdin.write("go\n")
        proc.stdin.flush()
    outcomes = unique_race.hammer(processor, KEYS, THREADS)
    for proc in procs:
        out, _ = proc.communicate(timeout=GUARD)
        assert proc.returncode == 0
        outcomes += [json.loads(line) for line in out.splitlines()]
    processor.shutdown(timeout=GUARD)
    calls = KEYS * len(unique_race.RULES) * (THREADS + (PROCESSES * CHILD_THREADS if shared else 0))
    assert len(outcomes) == calls
    return store, outcomes


def _jobs_per_key(store: Store) -> Counter[tuple[str, int]]:
    table = store.job_table()
    assert table is not None
    return Counter((job.name, json.loads(job.args)[0][0]) for job in table.find())


def test_one_job_per_key_however_many_threads_and_processes_enqueue_it(
    make_store: StoreMaker,
) -> None:
    store, outcomes = _race(make_store, plant=False)
    per_key = _jobs_per_key(store)
    assert set(per_key.values()) == {1} and len(per_key) == KEYS * len(unique_race.RULES)
    by_key: dict[tuple[str, int], set[str]] = {}
    for name, k, job_id, outcome in outcomes:
        by_key.setdefault((name, k), set()).add(job_id)
        assert outcome in ("added", "duplicate", "replaced")
    assert all(len(ids) == 1 for ids in by_key.values())  # every caller got the one job
    added = Counter((name, k) for name, k, _, outcome in outcomes if outcome == "added")
    assert set(added.values()) == {1} and len(added) == len(per_key)
    # Each refuse job runs once.
    ran: list[int] = []
    worker = TaskProcessor(store=store, workers=4, poll=0.02, sweep_every=None)
    unique_race.register(worker, ran)
    try:
        eventually(lambda: len(ran) >= KEYS, timeout=GUARD)
        table = store.job_table()
        assert table is not None
        eventually(lambda: len(table.find(name="u-refuse", states=["done"])) == KEYS, timeout=GUARD)
    finally:
        worker.shutdown(timeout=GUARD)
    assert sorted(ran) == list(range(KEYS))


def test_the_race_catches_a_read_then_write_check(make_store: StoreMaker) -> None:
    """Negative control: the same race on a check made outside the store's index."""
    store, _ = _race(make_store, plant=True)
    assert max(_jobs_per_key(store).values()) > 1
