"""Many enqueuers of one unique key at once: the tasks, the hammer and a planted bug.

Used by tests/tasks/test_tasks_unique_race.py in its own process and in the
child processes it starts (``python -m unique_race URL KEYS THREADS PLANT``:
prints ``ready``, waits for a line on stdin, enqueues, prints the outcomes as
JSON lines and exits).
"""

from __future__ import annotations

import json
import sys
import threading
import time
from dataclasses import replace
from typing import Any

import dibs
from dibs.stores.jobs import Job
from dibs.tasks import TaskProcessor, Unique

RULES = {
    "u-refuse": Unique(key=("k",)),
    "u-replace": Unique(key=("k",), mode="replace"),
    "u-debounce": Unique(key=("k",), window=3600, mode="debounce"),
}
"""One task per mode; each call's ``who`` argument differs, its key ``k`` is shared."""


def register(processor: TaskProcessor, ran: list[int] | None = None) -> None:
    """Register the tasks of :data:`RULES` (``ran`` collects the refuse task's runs)."""
    for name, rule in RULES.items():

        def run(k: int, who: str, *, _name: str = name) -> None:
            if ran is not None and _name == "u-refuse":
                ran.append(k)

        processor.task(name, unique=rule)(run)


def plant_read_then_write(store: dibs.Store) -> None:
    """Break the store's job table the way a uniqueness check in the client breaks:
    read whether a job holds the key, then add one (its key salted, so that the
    store's index cannot save it). Two callers between the read and the write both add."""
    table = store.job_table()
    assert table is not None
    add = table.add

    def add_unique(
        job: Job, mode: str, window: float | None, connection: object | None = None
    ) -> tuple[str, str]:
        assert job.unique_key is not None
        for row in table.find(name=job.name, states=["pending", "running"]):
            if (row.unique_key or "").startswith(job.unique_key):
                return row.id, "duplicate"
        time.sleep(0.002)  # the gap every read-then-write has (a round trip), made visible
        return add(replace(job, unique_key=f"{job.unique_key}:{job.id}"), connection), "added"

    table.add_unique = add_unique  # type: ignore[method-assign]


def hammer(processor: TaskProcessor, keys: int, threads: int) -> list[list[Any]]:
    """``threads`` threads each enqueue every key of every task, in step; the outcomes."""
    out: list[list[Any]] = []
    lock = threading.Lock()
    start = threading.Barrier(threads)

    def work(n: int) -> None:
        start.wait()
        for k in range(keys):
            for name in RULES:
                got = processor.insert(name, k, f"{processor}-{n}")
                with lock:
                    out.append([name, k, got.job_id, got.outcome])

    workers = [threading.Thread(target=work, args=(n,)) for n in range(threads)]
    for t in workers:
        t.start()
    for t in workers:
        t.join()
    return out


def main(url: str, keys: int, threads: int, plant: bool) -> None:
    """A child enqueuer: see the module's docstring."""
    store = dibs.open(url)
    processor = TaskProcessor(store=store, take_jobs=False, sweep_every=None)
    register(processor)
    if plant:
        plant_read_then_write(store)
    print("ready", flush=True)
    sys.stdin.readline()
    for row in hammer(processor, keys, threads):
        print(json.dumps(row))
    processor.shutdown(timeout=30)
    store.close()


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4] == "1")
