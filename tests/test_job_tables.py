"""The job table capability, the same on every store (one SQL implementation, two dialects)."""

from __future__ import annotations

from dibs import Store
from dibs.stores.jobs import Job


def _job(job_id: str, run_at: float, schedule: str | None = None) -> Job:
    return Job(id=job_id, name="n", args="[[], {}]", run_at=run_at, attempt=1, max_attempts=1,
               state="pending", schedule_id=schedule)  # fmt: skip


def test_every_store_offers_one_job_table(store: Store) -> None:
    table = store.job_table()
    assert table is not None and store.job_table() is table


def test_find_lists_every_row_or_one_schedules(store: Store) -> None:
    table = store.job_table()
    assert table is not None
    assert table.find() == []
    for job in (_job("b", 2.0, "s"), _job("a", 2.0), _job("c", 1.0, "s"), _job("d", 3.0, "t")):
        table.add(job)
    assert [j.id for j in table.find()] == ["c", "a", "b", "d"]
    assert [j.id for j in table.find("s")] == ["c", "b"]
    assert table.find("nobody") == []
    assert table.start("c", 1, None, 1, 7, "claim-7")
    assert table.settle("c", 1, 7, "done", None, 5.0)
    assert [(j.id, j.state) for j in table.find("s")] == [("c", "done"), ("b", "pending")]


def test_cancel_cancels_a_pending_job_and_flags_a_running_one(store: Store) -> None:
    table = store.job_table()
    assert table is not None
    table.add(_job("p", 1.0))
    table.add(_job("r", 1.0))
    assert table.start("r", 1, None, 1, 3, "claim-3")
    assert table.cancel("p", 9.0) and table.cancel("r", 9.0)
    pending, running = table.get("p"), table.get("r")
    assert pending is not None and (pending.state, pending.finished_at) == ("cancelled", 9.0)
    assert running is not None and (running.state, running.cancel_requested) == ("running", True)
    assert table.cancel_requested(["p", "r", "x"]) == {"r"}
    assert not table.cancel("p", 10.0)
