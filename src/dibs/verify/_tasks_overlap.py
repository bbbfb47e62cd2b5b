"""The recurring-overlap part of ``dibs verify tasks``: no two runs of a schedule at once.

Every worker process (:mod:`dibs.verify._task_worker`) declares the durable
schedule ``verify-overlap``: every 0.1 s, ``overlap="skip"``, of a run that takes
0.25 s, so that without the rule runs would overlap at every beat. Each run
writes its start and its end, with its attempt, to the worker's ledger. The
check takes the runs whose attempt is the one the job table recorded done (a
run whose worker was killed, or stopped past its lease, is not the recorded
one: its overlap is the documented exception) and flags two of different
occurrences whose spans overlap on the host's clock.

The plant ``overlapping-runs`` (``dibs verify tasks --plant overlapping-runs``)
breaks every worker's job table the way a skipped overlap check does: each
evaluation of a schedule is told that none of its jobs is live, and the jobs it
adds lose the schedule's lock key. It must be flagged every run.
"""

from __future__ import annotations

import os
import sqlite3
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import dibs
from dibs.stores.jobs import Decide, Job
from dibs.tasks import TaskProcessor, current

__all__ = ["OVERLAP_PLANTS", "OVERLAP_TASK", "check_overlap", "register_overlap"]

OVERLAP_PLANTS = ("overlapping-runs",)
"""The plants of this part."""
OVERLAP_TASK = "verify-overlap"
"""The task, and the ID of its schedule."""
EVERY = 0.1
RUN = 0.25
"""Seconds a run takes: longer than the period, so that overlaps would be the rule."""
PLANT_ENV = "DIBS_VERIFY_TASK_PLANT"
"""The variable the verifier names the plant in (as :mod:`._tasks_unique` reads it)."""


def register_overlap(processor: TaskProcessor, effect: Callable[[str], None]) -> None:
    """Register ``verify-overlap`` and its schedule; ``effect(what)`` writes each start and end.

    Plants the bug :data:`PLANT_ENV` names, if it is ``overlapping-runs``.
    """
    if os.environ.get(PLANT_ENV) == "overlapping-runs":
        store = processor.store
        assert store is not None  # durable: the processor has one
        _plant(store)

    def run() -> int:
        attempt = current().attempt
        effect(f"overlap-start:{attempt}")
        current().token.sleep(RUN)
        effect(f"overlap-end:{attempt}")
        return os.getpid()

    processor.task(OVERLAP_TASK)(run)
    processor.every(EVERY, OVERLAP_TASK, id=OVERLAP_TASK, overlap="skip", catch_up="coalesce")


def _plant(store: dibs.Store) -> None:
    table = store.job_table()
    assert table is not None
    advance = table.advance

    def blind(schedule_id: str, decide: Decide) -> list[Job]:
        def nothing_live(watermark: float | None, live: int) -> tuple[float, list[Job]] | None:
            decision = decide(watermark, 0)
            if decision is None:
                return None
            mark, jobs = decision
            return mark, [replace(job, lock_key=None) for job in jobs]

        return advance(schedule_id, nothing_live)

    table.advance = blind  # type: ignore[method-assign]


def check_overlap(
    store: dibs.Store, ledger: sqlite3.Connection
) -> tuple[dict[str, Any], list[str]]:
    """The figures and anomalies of this part: no two recorded runs of the schedule overlap."""
    table = store.job_table()
    assert table is not None
    recorded = {
        job.id: job.attempt
        for job in table.find(OVERLAP_TASK, states=["done"])  # the schedule's ID is the task's
    }
    rows = ledger.execute(
        "SELECT job, pid, what, at FROM runs WHERE what LIKE 'overlap-%' ORDER BY rowid"
    ).fetchall()
    starts: dict[tuple[str, int, int], float] = {}
    spans: list[tuple[float, float, str]] = []
    stale = 0
    for job, pid, what, at in rows:
        kind, attempt = what.split(":", 1)
        run = (job, pid, int(attempt))
        if kind == "overlap-start":
            starts[run] = at
        elif run in starts:
            if recorded.get(job) == int(attempt):
                spans.append((starts[run], at, job))
            else:
                stale += 1  # a run that lost its lease: not the recorded one
    spans.sort()
    anomalies: list[str] = []
    latest = (float("-inf"), "")  # the span that ends last so far: (end, job)
    for start, end, job in spans:
        if start < latest[0] and job != latest[1]:
            anomalies.append(f"runs of {latest[1]} and {job} overlapped ({OVERLAP_TASK})")
        latest = max(latest, (end, job))
    figures = {
        "overlap_runs": len(spans),
        "overlap_stale_runs": stale,
        "overlap_occurrences_done": len(recorded),
    }
    return figures, anomalies
