"""One durable-task worker for :mod:`dibs.verify._tasks`.

``python -m dibs.verify._task_worker URL LEDGER``

Runs the tasks ``verify-job`` (one-off), ``verify-tick`` (every 0.1 s,
every occurrence run) and ``verify-unique`` (see :mod:`dibs.verify._tasks_unique`,
which it also enqueues), records each execution in the ledger (a SQLite file of
its own, outside the store), and runs until its stdin closes or it is killed.
"""

from __future__ import annotations

import os
import sqlite3
import sys
import threading
import time

import dibs
from dibs.tasks import Misfire, TaskProcessor, current
from dibs.verify._tasks import JOB_SECONDS, LEASE, TICK
from dibs.verify._tasks_unique import enqueue_in_step, note_to, register_unique

__all__: list[str] = []


def main(url: str, ledger: str) -> None:
    """Run a worker until stdin closes."""
    effects = sqlite3.connect(ledger, timeout=60, isolation_level=None, check_same_thread=False)
    lock = threading.Lock()  # guards the ledger connection

    def record(what: str) -> None:
        with lock:
            effects.execute(
                "INSERT INTO runs VALUES (?, ?, ?, ?)",
                (current().job_id, os.getpid(), what, time.time()),
            )

    store = dibs.open(url)
    processor = TaskProcessor(store=store, workers=2, lease=LEASE, poll=0.02, sweep_every=None)

    @processor.task("verify-job")
    def job(n: int) -> int:
        record("job")
        current().token.sleep(JOB_SECONDS)  # long enough to be caught mid-job by the nemesis
        return os.getpid()

    @processor.task("verify-tick")
    def tick() -> int:
        record("tick")
        return os.getpid()

    processor.every(TICK, "verify-tick", id="verify-tick", misfire=Misfire(coalesce="all"))
    register_unique(processor, record)  # and the plant its verifier names, if any
    enqueue_in_step(processor, note_to(effects, lock))
    print("ready", flush=True)
    sys.stdin.read()
    processor.shutdown(timeout=5)
    store.close()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
