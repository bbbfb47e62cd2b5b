"""The unique-jobs part of ``dibs verify tasks``: one job per key while callers race.

Every worker process (:mod:`dibs.verify._task_worker`) and the verifying process
enqueue the task ``verify-unique`` in step: at each boundary of a 0.2 s slot
of the wall clock (shared by the processes of one host) each of them inserts
the slot's number as the key, so several callers on several processes race
for every key. The rule counts done jobs too and has no window, so a key must
end with exactly one job, however the workers are killed and stopped. The
check reads the job table: a key with two jobs is an anomaly.

The plant ``unique-duplicate`` (``dibs verify tasks --plant unique-duplicate``)
breaks every caller's job table the way a uniqueness check outside the store
breaks: read whether a job holds the key, then add one (its key salted, so that
the store's index cannot save it). It must be flagged every run.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import sqlite3
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import dibs
from dibs.exceptions import DibsError
from dibs.stores.jobs import Job
from dibs.tasks import TaskProcessor, Unique

__all__ = [
    "PLANT_ENV",
    "UNIQUE_PLANTS",
    "UNIQUE_TASK",
    "check_unique",
    "enqueue_in_step",
    "ledger_calls",
    "note_to",
    "register_unique",
]

log = logging.getLogger("dibs.verify")

UNIQUE_PLANTS = ("unique-duplicate",)
"""The plants of ``dibs verify tasks``."""
UNIQUE_TASK = "verify-unique"
RULE = Unique(key=("k",), states=("pending", "running", "done"))
"""One job per key, ever: done jobs count and there is no window."""
SLOT = 0.2
"""Seconds between the keys: every caller inserts the same key at each boundary."""
PLANT_ENV = "DIBS_VERIFY_TASK_PLANT"
"""How the verifier tells its worker processes the plant (empty: none)."""
GAP = 0.005
"""Seconds between the planted check's read and its write (a round trip, made visible)."""


def register_unique(
    processor: TaskProcessor,
    effect: Callable[[str], None] | None = None,
    plant: str | None = None,
) -> None:
    """Register ``verify-unique`` (``effect("unique")`` records each run), and plant the bug
    ``plant`` (None: the one :data:`PLANT_ENV` names, if any) in the processor's store."""

    def run(k: int) -> int:
        if effect is not None:
            effect("unique")
        return os.getpid()

    processor.task(UNIQUE_TASK, unique=RULE)(run)
    if (os.environ.get(PLANT_ENV) if plant is None else plant) == "unique-duplicate":
        store = processor.store
        assert store is not None  # durable: the processor has one
        _plant(store)


def _plant(store: dibs.Store) -> None:
    table = store.job_table()
    assert table is not None
    add = table.add

    def add_unique(
        job: Job, mode: str, window: float | None, connection: object | None = None
    ) -> tuple[str, str]:
        key = job.unique_key or ""
        for row in table.find(name=job.name):
            if (row.unique_key or "").startswith(key) and row.state in RULE.states:
                return row.id, "duplicate"
        time.sleep(GAP)
        return add(replace(job, unique_key=f"{key}:{job.id}"), connection), "added"

    table.add_unique = add_unique  # type: ignore[method-assign]


def enqueue_in_step(processor: TaskProcessor, note: Callable[[int, str], None]) -> threading.Thread:
    """Start a daemon thread that inserts the key of every slot at its boundary, calling
    ``note(key, outcome)``; it ends when the processor refuses (it is shut down)."""

    def loop() -> None:
        while True:
            now = time.time()
            key = int(now / SLOT) + 1
            time.sleep(max(0.0, key * SLOT - now))
            try:
                got = processor.insert(UNIQUE_TASK, key)
            except DibsError as exc:
                log.info("unique enqueuer stops: %s", exc)
                return
            with contextlib.suppress(Exception):  # the ledger is a figure, not the check
                note(key, got.outcome)

    thread = threading.Thread(target=loop, name="dibs-verify-unique", daemon=True)
    thread.start()
    return thread


def note_to(ledger: sqlite3.Connection, lock: threading.Lock) -> Callable[[int, str], None]:
    """A ``note`` for :func:`enqueue_in_step` that writes each call to a worker's ledger."""

    def note(key: int, outcome: str) -> None:
        with lock:
            ledger.execute(
                "INSERT INTO runs VALUES (?, ?, ?, ?)",
                (f"unique:{key}", os.getpid(), f"call:{outcome}", time.time()),
            )

    return note


def ledger_calls(ledger: sqlite3.Connection) -> list[tuple[int, str]]:
    """The ``(key, outcome)`` calls the workers noted in the ledger."""
    rows = ledger.execute("SELECT job, what FROM runs WHERE what LIKE 'call:%'").fetchall()
    return [(int(job.split(":", 1)[1]), what.split(":", 1)[1]) for job, what in rows]


def check_unique(
    store: dibs.Store, calls: list[tuple[int, str]]
) -> tuple[dict[str, Any], list[str]]:
    """The figures and anomalies of the unique part: every key must have one job.

    ``calls``: ``(key, outcome)`` of every insert the callers noted.
    """
    table = store.job_table()
    assert table is not None
    jobs = Counter(json.loads(job.args)[0][0] for job in table.find(name=UNIQUE_TASK))
    per_key = Counter(key for key, _ in calls)
    anomalies = [
        f"unique key {key} has {count} jobs (one allowed)"
        for key, count in sorted(jobs.items())
        if count > 1
    ]
    figures = {
        "unique_keys": len(jobs),
        "unique_calls": len(calls),
        "unique_raced_keys": sum(1 for n in per_key.values() if n > 1),
        "unique_duplicates_refused": sum(1 for _, outcome in calls if outcome == "duplicate"),
    }
    return figures, anomalies
