"""The job table capability, the same on every store (one SQL implementation, two dialects).

Take, extend, finish, reclaim and the maintenance calls, called directly with
explicit ``now`` values (no clock waits): the semantics the runner builds on.
"""

from __future__ import annotations

import threading
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings

import dibs
from conftest import STORE_KINDS, StoreMaker, kinds_offering
from dibs import InvalidInput, Store
from dibs.stores.jobs import Job, JobTable
from dibs.tasks import TaskProcessor
from dibs.testing.strategies import names

QUICK = True  # in `pytest -m quick` (conftest.is_quick: not slow, no server)


@pytest.fixture(params=kinds_offering("job_table"))
def store_kind(request: pytest.FixtureRequest) -> str:
    """The stores with a job table (a capability; etcd has none): durable jobs live there."""
    return str(request.param)


T = 1_000.0


def _job(job_id: str, run_at: float | None = T, schedule: str | None = None, **more: object) -> Job:
    return Job(id=job_id, name="n", args="[[], {}]", run_at=run_at, attempt=1, max_attempts=1,
               state="pending", schedule_id=schedule, **more)  # type: ignore[arg-type]  # fmt: skip


def _table(store: Store) -> JobTable:
    table = store.job_table()
    assert table is not None
    return table


def test_every_store_offers_one_job_table(store: Store) -> None:
    table = store.job_table()
    assert table is not None and store.job_table() is table


@pytest.mark.parametrize(
    "kind", [k for k in STORE_KINDS if k not in kinds_offering("job_table")] or ["none"]
)
def test_durable_tasks_on_a_store_without_one_raise_a_typed_error_naming_it(
    kind: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    # etcd offers no job table: asking it for durable tasks is a mistake, told at once.
    assert kind != "none", "every store offers a job table: drop this test"
    url = request.getfixturevalue("etcd_url") if kind == "etcd" else None
    maker = StoreMaker(kind, tmp_path, etcd_url=url)
    try:
        store = maker()
        assert store.job_table() is None
        with pytest.raises(
            InvalidInput, match="durable tasks need a store with a job table"
        ) as info:
            TaskProcessor(store=store)
        assert info.value.field == "store" and info.value.value is store
        assert not isinstance(info.value, dibs.StoreUnavailable)  # a mistake, never retryable
    finally:
        maker.close()


def test_find_lists_every_row_or_one_schedules(store: Store) -> None:
    table = _table(store)
    assert table.find() == []
    for job in (_job("b", 2.0, "s"), _job("a", 2.0), _job("c", 1.0, "s"), _job("d", 3.0, "t")):
        table.add(job)
    assert [j.id for j in table.find()] == ["c", "a", "b", "d"]
    assert [j.id for j in table.find("s")] == ["c", "b"]
    assert table.find("nobody") == []
    (taken,) = table.take(None, 1, 5.0, "w", now=1.5)
    assert taken.id == "c" and taken.fence is not None
    assert table.finish("c", taken.fence, "ok", "1", now=5.0) == "done"
    assert [(j.id, j.state) for j in table.find("s")] == [("c", "done"), ("b", "pending")]
    assert [j.id for j in table.find(states=["pending"], limit=2)] == ["a", "b"]
    assert [j.id for j in table.find(states=["done", "failed"])] == ["c"]


def test_add_sets_run_at_and_enqueued_at_from_the_store_clock(store: Store) -> None:
    table = _table(store)
    before = store.now().timestamp()
    table.add(_job("now", None))
    row = table.get("now")
    assert row is not None and row.run_at is not None and row.enqueued_at == row.run_at
    assert row.run_at >= before - 1  # the store's clock, read by the insert


def test_take_hands_each_due_job_out_once_by_priority_then_due_time(store: Store) -> None:
    table = _table(store)
    table.add_many([_job("late", 3.0), _job("early", 1.0), _job("urgent", 2.0, priority=5),
                    _job("future", 50.0)])  # fmt: skip
    first = table.take(None, 2, 10.0, "w1", now=10.0)
    assert [(j.id, j.state, j.holder, j.lease_expires) for j in first] == [
        ("urgent", "running", "w1", 20.0),
        ("early", "running", "w1", 20.0),
    ]
    assert [j.id for j in table.take(None, 5, 10.0, "w2", now=10.0)] == ["late"]
    assert table.take(None, 5, 10.0, "w3", now=10.0) == []  # "future" is not due
    assert [j.started_at for j in first] == [10.0, 10.0]


def test_take_filters_by_queue_and_task_name(store: Store) -> None:
    table = _table(store)
    other = replace(_job("c", queue="mail"), name="other")
    table.add_many([_job("a", queue="mail"), _job("b", queue="img"), other])
    assert [j.id for j in table.take(["img"], 5, 1.0, "w", now=T)] == ["b"]
    assert [j.id for j in table.take(["mail"], 5, 1.0, "w", names=["n"], now=T)] == ["a"]
    assert [j.id for j in table.take(None, 5, 1.0, "w", names=["other"], now=T)] == ["c"]


def test_lock_key_jobs_run_one_at_a_time_oldest_first(store: Store) -> None:
    table = _table(store)
    table.add_many([_job("k1", 1.0, lock_key="k"), _job("k2", 2.0, lock_key="k"),
                    _job("free", 3.0)])  # fmt: skip
    taken = table.take(None, 5, 10.0, "w", now=T)
    assert [j.id for j in taken] == ["k1", "free"]  # never two of one key at once
    assert table.take(None, 5, 10.0, "w", now=T) == []
    k1 = taken[0]
    assert k1.fence is not None and table.finish("k1", k1.fence, "ok", "null", now=T) == "done"
    assert [j.id for j in table.take(None, 5, 10.0, "w", now=T)] == ["k2"]


def test_extend_reports_held_leases_and_cancel_requests(store: Store) -> None:
    table = _table(store)
    table.add_many([_job("a"), _job("b")])
    a, b = table.take(None, 2, 10.0, "w", now=T)
    assert a.fence is not None and b.fence is not None
    assert table.cancel("b", now=T)
    held = table.extend([(a.id, a.fence), (b.id, b.fence), ("x", 1), (a.id, a.fence + 1)], 30.0,
                        now=T + 5)  # fmt: skip
    assert held == {(a.id, a.fence): False, (b.id, b.fence): True}
    row = table.get(a.id)
    assert row is not None and row.lease_expires == T + 35
    assert table.extend([], 1.0) == {}


def test_finish_records_once_and_ends_the_lease(store: Store) -> None:
    table = _table(store)
    table.add(_job("j"))
    (job,) = table.take(None, 1, 10.0, "w", now=T)
    assert job.fence is not None
    assert table.finish("j", job.fence + 1, "ok", "1", now=T) is None  # not its fence
    assert table.finish("j", job.fence, "ok", "2", now=T + 1) == "done"
    assert table.finish("j", job.fence, "ok", "3", now=T + 2) is None  # already recorded
    row = table.get("j")
    assert row is not None
    assert (row.state, row.outcome_kind, row.outcome, row.finished_at) == ("done", "ok", "2", T + 1)
    assert (row.holder, row.lease_expires) == (None, None)
    ended = [(a.attempt, a.holder, a.started_at, a.ended_at, a.outcome_kind) for a in row.attempts]
    assert ended == [(1, "w", T, T + 1, "ok")]


def test_an_error_is_retried_while_retries_remain_then_fails(store: Store) -> None:
    table = _table(store)
    table.add(Job(id="r", name="n", args="[]", run_at=T, attempt=1, max_attempts=5,
                  state="pending", retries=1))  # fmt: skip
    (job,) = table.take(None, 1, 10.0, "w", now=T)
    assert job.fence is not None
    assert table.finish("r", job.fence, "error", "boom", retry_delay=7.0, now=T) == "pending"
    row = table.get("r")
    assert row is not None and (row.attempt, row.failures, row.run_at) == (2, 1, T + 7)
    assert table.take(None, 1, 10.0, "w", now=T + 6) == []  # backing off
    (again,) = table.take(None, 1, 10.0, "w", now=T + 7)
    assert again.fence is not None
    assert table.finish("r", again.fence, "error", "boom", retry_delay=7.0, now=T + 8) == "failed"
    row = table.get("r")
    assert row is not None and (row.state, row.attempt, row.failures) == ("failed", 2, 2)
    assert [a.outcome_kind for a in row.attempts] == ["error", "error"]


def test_cancelled_outcome_and_a_requested_cancel_stop_retries(store: Store) -> None:
    table = _table(store)
    table.add_many([Job(id=i, name="n", args="[]", run_at=T, attempt=1, max_attempts=5,
                        state="pending", retries=3) for i in ("c", "e")])  # fmt: skip
    c, e = sorted(table.take(None, 2, 10.0, "w", now=T), key=lambda j: j.id)
    assert c.fence is not None and e.fence is not None
    assert table.finish("c", c.fence, "cancelled", "stopped", now=T) == "cancelled"
    assert table.cancel("e", now=T)  # running: flagged
    assert table.finish("e", e.fence, "error", "x", retry_delay=1.0, now=T) == "failed"


def test_reclaim_retries_a_lapsed_attempt_until_the_poison_pill_limit(store: Store) -> None:
    table = _table(store)
    table.add(Job(id="p", name="n", args="[]", run_at=T, attempt=1, max_attempts=2,
                  state="pending"))  # fmt: skip
    table.take(None, 1, 10.0, "w1", now=T)
    assert table.reclaim(now=T + 9) == 0  # the lease is still good
    assert table.reclaim(now=T + 10) == 1
    row = table.get("p")
    assert row is not None and (row.state, row.attempt, row.holder) == ("pending", 2, None)
    table.take(None, 1, 10.0, "w2", now=T + 10)
    assert table.reclaim(now=T + 30) == 1
    row = table.get("p")
    assert row is not None and (row.state, row.attempt, row.outcome_kind) == ("failed", 2, "lost")
    assert [(a.holder, a.outcome_kind) for a in row.attempts] == [("w1", "lost"), ("w2", "lost")]


def test_reclaim_ends_a_lapsed_job_that_was_asked_to_cancel(store: Store) -> None:
    table = _table(store)
    table.add(replace(_job("c"), max_attempts=5))
    table.take(None, 1, 10.0, "w", now=T)
    assert table.cancel("c", now=T)
    assert table.reclaim(now=T + 11) == 1
    row = table.get("c")
    assert row is not None and (row.state, row.finished_at) == ("cancelled", T + 11)


def test_put_back_returns_the_attempt_uncounted(store: Store) -> None:
    table = _table(store)
    table.add(_job("b"))
    (job,) = table.take(None, 1, 10.0, "w", now=T)
    assert job.fence is not None
    assert table.put_back("b", job.fence, now=T)
    assert not table.put_back("b", job.fence, now=T)
    row = table.get("b")
    assert row is not None and (row.state, row.attempt, row.failures) == ("pending", 1, 0)
    (again,) = table.take(None, 1, 10.0, "w", now=T)
    assert again.fence == job.fence + 1


def test_cancel_cancels_a_pending_job_and_flags_a_running_one(store: Store) -> None:
    table = _table(store)
    table.add(_job("r", 1.0))
    table.add(_job("p", 2.0))
    (running,) = table.take(None, 1, 10.0, "w", now=T)
    assert running.id == "r"
    assert table.cancel("p", now=9.0) and table.cancel("r", now=9.0)
    p, r = table.get("p"), table.get("r")
    assert p is not None and (p.state, p.outcome_kind, p.finished_at) == (
        "cancelled",
        "cancelled",
        9.0,
    )
    assert r is not None and (r.state, r.cancel_requested) == ("running", True)
    assert running.fence is not None  # the heartbeat is how a worker learns of the flag
    assert table.extend([("r", running.fence)], 10.0, now=9.0) == {("r", running.fence): True}
    assert not table.cancel("p", now=10.0)


def test_retry_delete_and_purge(store: Store) -> None:
    table = _table(store)
    table.add_many([_job("f"), _job("d"), _job("kept", retention=1e9), _job("live")])
    for job in table.take(None, 3, 10.0, "w", names=None, now=T):
        assert job.fence is not None
        table.finish(job.id, job.fence, "error" if job.id == "f" else "ok", "x", now=T)
    assert not table.retry("d") and not table.retry("live") and not table.retry("nobody")
    assert table.retry("f", now=T + 1)
    row = table.get("f")
    assert row is not None and (row.state, row.attempt, row.max_attempts, row.run_at) == (
        "pending", 2, 2, T + 1,
    )  # fmt: skip
    assert table.purge(100.0, now=T + 50) == 0  # kept for 100 s
    assert table.purge(100.0, states=["failed"], now=T + 200) == 0
    assert table.purge(100.0, queues=["other"], now=T + 200) == 0
    assert table.purge(100.0, now=T + 200) == 1  # "d"; "kept" keeps its own retention
    assert table.delete(["kept", "f", "live", "nobody"]) == 1  # finished ones only
    assert sorted(j.id for j in table.find()) == ["f", "live"]


def test_add_many_keeps_keys_unique_among_live_jobs(store: Store) -> None:
    table = _table(store)
    standing = table.add_many([_job("a", key="k"), _job("b", key="k"), _job("c"), _job("a")])
    assert standing == ["a", "a", "c", "a"]
    assert sorted(j.id for j in table.find()) == ["a", "c"]
    assert table.add_many([]) == []


@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(job_id=names(), key=names())
def test_ids_and_keys_in_the_whole_name_domain_round_trip(
    store: Store, job_id: str, key: str
) -> None:
    table = _table(store)
    for j in table.find():  # the rows of an earlier example
        table.cancel(j.id)
    table.delete([j.id for j in table.find()])
    assert table.add(_job(job_id, key=key)) == job_id
    assert table.add(_job(job_id + "-2", key=key)) == job_id  # the key is live
    row = table.get(job_id)
    assert row is not None and (row.id, row.key) == (job_id, key)
    (taken,) = table.take(None, 5, 1.0, "w", now=T)
    assert taken.id == job_id and taken.fence is not None
    assert table.finish(job_id, taken.fence, "ok", "null", now=T) == "done"


def test_wait_returns_the_finished_row(store: Store) -> None:
    table = _table(store)
    table.add(_job("w"))
    (job,) = table.take(None, 1, 10.0, "w", now=T)
    assert job.fence is not None
    fence = job.fence
    finisher = threading.Timer(0.05, lambda: table.finish("w", fence, "ok", "42"))
    finisher.start()
    row = table.wait("w", 30.0)  # bounded: returns once finished
    finisher.join()
    assert row is not None and (row.state, row.outcome) == ("done", "42")
    assert table.wait("nobody", 0.01) is None


def test_add_on_a_connection_the_store_does_not_know_is_invalid_input(store: Store) -> None:
    table = _table(store)
    with pytest.raises(InvalidInput) as raised:
        table.add(_job("x"), connection=object())
    assert raised.value.field == "connection"
    assert table.find() == []


def test_add_on_the_callers_sqlite_connection_commits_with_it(tmp_path: object) -> None:
    import sqlite3
    from pathlib import Path

    import dibs

    path = Path(str(tmp_path)) / "jobs.db"
    store = dibs.open(f"sqlite:///{path}")
    try:
        table = _table(store)
        conn = sqlite3.connect(path)
        conn.execute("CREATE TABLE orders (id INTEGER)")
        conn.execute("INSERT INTO orders VALUES (1)")
        table.add(_job("kept"), connection=conn)
        conn.commit()
        conn.execute("INSERT INTO orders VALUES (2)")
        table.add_many([_job("dropped")], connection=conn)
        conn.rollback()
        conn.close()
        assert [j.id for j in table.find()] == ["kept"]
    finally:
        store.close()


def test_add_on_the_callers_psycopg_connection_commits_with_it(pg_url: str) -> None:
    import psycopg

    import dibs
    from pg_fixtures import schema_url

    url = schema_url(pg_url, "caller_conn")
    store = dibs.open(url)
    try:
        table = _table(store)
        table.delete([j.id for j in table.find()])
        base = pg_url.split("?", 1)[0]
        with psycopg.connect(base) as conn:
            with conn.transaction():
                table.add(_job("kept"), connection=conn)
            with pytest.raises(ZeroDivisionError), conn.transaction():
                table.add_many([_job("dropped")], connection=conn)
                raise ZeroDivisionError
        assert [j.id for j in table.find()] == ["kept"]
    finally:
        store.close()


def test_a_lock_key_runs_its_oldest_job_first_whatever_the_priorities(store: Store) -> None:
    """FIFO within a lock key on every store: a later, higher-priority job of a key waits for
    the oldest pending one of that key (memory:// is the reference; it used to differ)."""
    table = _table(store)
    table.add_many([_job("old", 1.0, lock_key="k"), _job("urgent", 2.0, lock_key="k",
                                                          priority=9)])  # fmt: skip
    assert [j.id for j in table.take(None, 1, 10.0, "w", now=T)] == ["old"]


def test_retry_never_makes_a_second_live_job_of_one_key(store: Store) -> None:
    table = _table(store)
    table.add(_job("first", key="k"))
    (first,) = table.take(None, 1, 10.0, "w", now=T)
    assert first.fence is not None
    assert table.finish("first", first.fence, "error", "x", now=T) == "failed"
    assert table.add(_job("second", key="k")) == "second"  # the key is free once it failed
    assert not table.retry("first", now=T)  # "second" holds the key now
    assert [j.id for j in table.find(states=["pending", "running"])] == ["second"]


@pytest.mark.parametrize("delay", [None, 5.0])
def test_the_put_back_log_is_bounded(store: Store, delay: float | None) -> None:
    from dibs.stores.jobs import PUT_BACK_LOG_MAX

    table = _table(store)
    table.add(_job("p"))
    for n in range(PUT_BACK_LOG_MAX + 15):  # a job deferred at every poll, for a long time
        (job,) = table.take(None, 1, 10.0, "w", now=T + 10 * n)
        assert job.fence is not None and table.put_back("p", job.fence, T + 10 * n, delay)
    row = table.get("p")
    assert row is not None and row.state == "pending"
    kinds = [a.outcome_kind for a in row.attempts]
    assert kinds == ["put_back"] * PUT_BACK_LOG_MAX  # the first ones; the row stops growing
    if delay is not None:
        assert row.run_at == T + 10 * (PUT_BACK_LOG_MAX + 14) + delay  # still deferred
