"""Shared holds on etcd, under the race the contract's pressure test meets only sometimes.

A writer's claim transaction must fail if a reader took the unit after the writer's view
(the range compare over the unit key and its readers' keys). Readers here churn without
rest, so a writer's view often finds the last one just gone and a new one comes while the
writer's grant is on the wire; check_rw_history then sees every overlap. Both faces.
"""

from __future__ import annotations

import functools
import threading
import time

import pytest

from dibs import Store, Target, Unit
from dibs.testing.shared import _join, check_rw_history

DOC = Unit("doc", "1")
READERS = 6
WRITERS = 4
ROUNDS = 150


@pytest.fixture(params=["etcd", "aio-etcd"])
def store_kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def test_a_writer_never_gets_in_beside_a_reader_that_came_after_its_view(store: Store) -> None:
    lock = threading.Lock()
    events: list[tuple[int, str, str, Target]] = []
    counter = iter(range(10**9))
    start = threading.Barrier(READERS + WRITERS)

    def work(n: int, mode: str) -> None:
        start.wait()
        for _ in range(ROUNDS):
            with lock:
                step = next(counter)
            result = store.claim(DOC, holder=f"h{n}", mode=mode)
            if not result:
                continue
            assert result.claim is not None and result.claim.mode == mode
            with lock:
                events.append((step, "in", mode, DOC))
            time.sleep(0.001)  # held a while, so an overlap shows on the timeline
            with lock:
                events.append((step, "out", mode, DOC))
            assert store.release(result.claim.id, holder=f"h{n}", fence=result.claim.fence)

    _join(
        [functools.partial(work, n, "shared") for n in range(READERS)]
        + [functools.partial(work, READERS + n, "exclusive") for n in range(WRITERS)]
    )
    assert any(e[2] == "shared" for e in events)
    check_rw_history(events)
