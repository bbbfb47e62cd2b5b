"""Readers and writers in several processes on one PostgreSQL schema: never a reader beside a
writer, never two writers, on units, groups of units and overlapping spans, checked on one
timeline that every process writes under one lock."""

from __future__ import annotations

import json
import multiprocessing
import time
from pathlib import Path
from typing import Any

import dibs
from dibs import Span, Target, Unit
from dibs._model import target_to_json
from dibs.testing.shared import check_rw_history
from rw_timeline import read_timeline

PROCESSES = 6
ROUNDS = 150
CLAIMS: list[tuple[Target, ...]] = [
    (Unit("doc", "1"),),
    (Unit("doc", "1"), Unit("doc", "2")),
    (Unit("doc", "2"),),
    (Span("room", 0, 10),),
    (Span("room", 5, 15),),
    (Unit("doc", "2"), Span("room", 9, 20)),
]


def _worker(url: str, n: int, lock: Any, timeline: str) -> None:
    store = dibs.open(url)
    with open(timeline, "a") as out:

        def note(step: str, what: str, mode: str, targets: tuple[Target, ...]) -> None:
            # Under the one lock, so the file's line order is the real order of events.
            with lock:
                for k, target in enumerate(targets):
                    line = [f"{step}.{k}", what, mode, target_to_json(target)]
                    out.write(json.dumps(line) + "\n")
                out.flush()

        for i in range(ROUNDS):
            mode = "exclusive" if (n + i) % 3 == 0 else "shared"
            targets = CLAIMS[(n * 7 + i) % len(CLAIMS)]
            result = store.claim(list(targets), holder=f"p{n}", mode=mode)
            if not result:
                continue
            assert result.claim is not None and result.claim.mode == mode
            step = f"{n}.{i}"
            note(step, "in", mode, targets)
            time.sleep(0.001 if mode == "exclusive" else 0)  # writers hold a while
            note(step, "out", mode, targets)
            store.release(result.claim.id, holder=f"p{n}", fence=result.claim.fence)
            if mode == "shared":
                time.sleep(0.001)  # and readers rest, or no writer ever gets in
    store.close()


def test_readers_and_writers_in_processes_on_one_postgres_schema(
    pg_schema_url: str, tmp_path: Path
) -> None:
    dibs.open(pg_schema_url).close()  # the schema, before the workers race to make it
    timeline = str(tmp_path / "timeline.jsonl")
    context = multiprocessing.get_context("spawn")
    lock = context.Lock()
    workers = [
        context.Process(target=_worker, args=(pg_schema_url, n, lock, timeline))
        for n in range(PROCESSES)
    ]
    for w in workers:
        w.start()
    for w in workers:
        w.join(100)
    assert [w.exitcode for w in workers] == [0] * PROCESSES
    events = read_timeline(timeline)
    granted = {(e[2], type(e[3])) for e in events}
    assert granted == {(m, t) for m in ("exclusive", "shared") for t in (Unit, Span)}
    check_rw_history(events)
