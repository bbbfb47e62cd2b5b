"""A durable worker paused inside a schedule's evaluation stalls the fleet only briefly.

On PostgreSQL a schedule's evaluation is a transaction that locks the
schedule's row, and the end of every ``overlap="skip"`` run evaluates the
schedule first. A worker stopped inside that transaction (``SIGSTOP``, a frozen
VM) kept the lock for the whole pause, so no run of the schedule could finish
anywhere: a loaded CI run stalled so. The store's connections carry
``idle_in_transaction_session_timeout``
(``dibs.stores.postgres._connect.IDLE_IN_TRANSACTION``), so the server ends the
paused transaction and the runs go on. Here the paused worker is one of the
store's own pooled connections, idle in a transaction that holds the row.
Waits are hang guards, not timing claims.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import psycopg
import pytest

import dibs
from dibs.stores.postgres import PostgresStore, _connect
from dibs.tasks import TaskProcessor
from eventually import eventually

pytestmark = pytest.mark.timeout(300)

GUARD = 120.0


@pytest.fixture
def store(pg_schema_url: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[PostgresStore]:
    # Short, for the test; the processor's own transactions live under it too, and one
    # descheduled past it under load is only retried.
    monkeypatch.setattr(_connect, "IDLE_IN_TRANSACTION", 2.0)
    opened = dibs.open(pg_schema_url)
    assert isinstance(opened, PostgresStore)
    yield opened
    opened.close()


@pytest.fixture
def processor(store: PostgresStore) -> Iterator[TaskProcessor]:
    proc = TaskProcessor(store=store, workers=2, lease=3.0, poll=0.02, sweep_every=None)

    @proc.task("tick")
    def tick() -> None:
        time.sleep(0.05)

    proc.every(0.1, "tick", id="s", overlap="skip", catch_up="all")
    yield proc
    proc.shutdown(timeout=30)


def _done(proc: TaskProcessor) -> int:
    return sum(1 for job in proc.jobs(states=["done"]) if job.id.startswith("s@"))


def test_a_paused_evaluation_holds_the_schedule_only_until_the_server_ends_it(
    store: PostgresStore, processor: TaskProcessor
) -> None:
    eventually(lambda: _done(processor) >= 2, "the schedule's first runs", timeout=GUARD)
    with store._pool.connection() as paused:
        # One query string: the limit cannot end it between its BEGIN and its lock.
        paused.execute(
            f"BEGIN; SELECT 1 FROM \"{store.schema}\".job_schedules WHERE id = 's' FOR UPDATE"
        )  # and the worker that ran this stops here
        before = _done(processor)
        eventually(lambda: _done(processor) >= before + 3, "runs after the pause", timeout=GUARD)
        with pytest.raises(psycopg.Error):  # IdleInTransactionSessionTimeout: rolled back
            paused.execute("SELECT 1")
