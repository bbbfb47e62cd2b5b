"""Durable tasks on a store that is closed, before or under a processor, on every job table.

A closed store refuses every call with ``StoreClosed``; its job table must too
(the memory store's kept adding jobs after close), a processor must refuse a
closed store at once, and one whose store closes under it must stop taking
jobs with one log line, not one per poll.
"""

from __future__ import annotations

import logging

import pytest

from conftest import StoreMaker, kinds_offering
from dibs import StoreClosed
from dibs.stores.jobs import Job
from dibs.tasks import TaskProcessor
from eventually import eventually

GUARD = 60.0


@pytest.fixture(params=kinds_offering("job_table"))
def store_kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def test_a_closed_stores_job_table_refuses_every_call(make_store: StoreMaker) -> None:
    store = make_store()
    table = store.job_table()
    assert table is not None
    store.close()
    job = Job(
        id="j-1", name="x", args="[[], {}]", run_at=None, attempt=1, max_attempts=1, state="pending"
    )
    calls = {
        "add": lambda: table.add(job),
        "add_many": lambda: table.add_many([job]),
        "get": lambda: table.get("j-1"),
        "find": table.find,
        "take": lambda: table.take(None, 1, 30.0, "worker"),
        "reclaim": table.reclaim,
        "cancel": lambda: table.cancel("j-1"),
        "retry": lambda: table.retry("j-1"),
        "delete": lambda: table.delete(["j-1"]),
        "wait": lambda: table.wait("j-1", 0.0),
    }
    for name, call in calls.items():
        with pytest.raises(StoreClosed):
            call()
            pytest.fail(f"{name} answered on a closed store")


def test_a_processor_refuses_a_closed_store(make_store: StoreMaker) -> None:
    store = make_store()
    store.close()
    with pytest.raises(StoreClosed):
        TaskProcessor(store=store, sweep_every=None)


def test_a_store_closed_under_a_processor_stops_its_taking_with_one_line(
    make_store: StoreMaker, caplog: pytest.LogCaptureFixture
) -> None:
    """Before: "taking durable jobs failed; trying again", with a traceback, every poll."""
    store = make_store()
    caplog.set_level(logging.ERROR, logger="dibs.tasks")
    processor = TaskProcessor(store=store, workers=1, poll=0.01, sweep_every=None)
    try:

        @processor.task("one")
        def one() -> int:
            return 1

        assert processor.result(processor.enqueue("one"), timeout=GUARD) == 1
        store.close()
        with pytest.raises(StoreClosed):
            processor.enqueue("one")
        eventually(
            lambda: any("closed under this processor" in r.getMessage() for r in caplog.records),
            "the processor saw its store closed",
        )
    finally:
        processor.shutdown(timeout=GUARD)
    messages = [r.getMessage() for r in caplog.records if r.name.startswith("dibs.tasks")]
    assert not any("trying again" in m for m in messages), messages
    assert sum("closed under this processor" in m for m in messages) == 1, messages
