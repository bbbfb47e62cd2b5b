"""A durable-task worker process for tests/tasks/test_tasks_engine.py (not a test module).

``python tests/support/engine_worker.py URL LEDGER MODE POLL LEASE``

Registers the task ``work``, which records ``(job_id, pid)`` in the ledger (a
SQLite file outside the store) and returns the pid; with MODE ``block`` it
then blocks until the process is killed. Prints ``ready`` once it takes jobs
and runs until stdin closes.
"""

from __future__ import annotations

import os
import sqlite3
import sys
import threading

import dibs
from dibs.tasks import TaskProcessor, current


def main(url: str, ledger: str, mode: str, poll: float, lease: float) -> None:
    effects = sqlite3.connect(ledger, timeout=60, isolation_level=None, check_same_thread=False)
    lock = threading.Lock()  # guards the ledger connection
    store = dibs.open(url)
    processor = TaskProcessor(store=store, workers=4, lease=lease, poll=poll, sweep_every=None)

    @processor.task("work")
    def work(n: int) -> int:
        with lock:
            effects.execute("INSERT INTO runs VALUES (?, ?)", (current().job_id, os.getpid()))
        if mode == "block":
            threading.Event().wait()  # mid-job until kill -9
        return os.getpid()

    print("ready", flush=True)
    sys.stdin.read()
    processor.shutdown(timeout=5)
    store.close()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4]), float(sys.argv[5]))
