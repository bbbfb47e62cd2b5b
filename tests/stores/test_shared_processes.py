"""Readers and writers in several processes on one SQLite file, and on one etcd prefix: never a
reader beside a writer, never two writers, checked on one timeline that every process writes
under one lock."""

from __future__ import annotations

import json
import multiprocessing
import os
import time
from pathlib import Path
from typing import Any

import dibs
from dibs import Span, Target, Unit
from dibs._model import target_to_json
from dibs.testing.shared import check_rw_history
from etcd_fixtures import fresh_prefix
from rw_timeline import read_timeline

PROCESSES = 4
ROUNDS = 80
TARGETS: list[Target] = [
    Unit("doc", "1"),
    Span("room", 0, 10),
    Span("room", 5, 15),
    Span("room", 9, 20),
]


def _worker(url: str, n: int, lock: Any, timeline: str, ttl: float | None) -> None:
    store = dibs.open(url)
    with open(timeline, "a") as out:

        def note(step: str, what: str, mode: str, target: Target) -> None:
            # Under the one lock, so the file's line order is the real order of events.
            with lock:
                out.write(json.dumps([step, what, mode, target_to_json(target)]) + "\n")
                out.flush()

        for i in range(ROUNDS):
            mode = "exclusive" if (n + i) % 3 == 0 else "shared"
            target = TARGETS[(n * 7 + i) % len(TARGETS)]
            result = store.claim(target, holder=f"p{n}", mode=mode, ttl=ttl if i % 2 else None)
            if not result:
                continue
            assert result.claim is not None
            step = f"{n}.{i}"
            note(step, "in", mode, target)
            time.sleep(0.002 if mode == "exclusive" else 0)  # writers hold a while
            note(step, "out", mode, target)
            store.release(result.claim.id, holder=f"p{n}", fence=result.claim.fence)
            if mode == "shared":
                time.sleep(0.002)  # and readers rest, or no writer ever gets in
    store.close()


def test_readers_and_writers_in_processes_on_one_sqlite_file(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'rw.db'}"
    dibs.open(url).close()  # the schema, before the workers race to make it
    _race(url, tmp_path, ttl=None)


def test_readers_and_writers_in_processes_on_one_etcd_prefix(tmp_path: Path, etcd_url: str) -> None:
    # Every other claim is a hold: its live key is on an etcd lease (no test clock here).
    _race(f"{etcd_url}/{fresh_prefix()}", tmp_path, ttl=30.0)


def _race(url: str, tmp_path: Path, ttl: float | None) -> None:
    timeline = str(tmp_path / "timeline.jsonl")
    context = multiprocessing.get_context("spawn")
    lock = context.Lock()
    workers = [
        context.Process(target=_worker, args=(url, n, lock, timeline, ttl))
        for n in range(PROCESSES)
    ]
    for w in workers:
        w.start()
    for w in workers:
        w.join(90)
    assert [w.exitcode for w in workers] == [0] * PROCESSES
    events = read_timeline(timeline)
    assert any(e[2] == "exclusive" for e in events) and any(e[2] == "shared" for e in events)
    check_rw_history(events)
    assert os.path.getsize(timeline) > 0
