"""Durable mode's rules on every store (memory, SQLite, PostgreSQL), in one process.

Schedules' catch-up from the watermark, ``max_running``, cancellation, keys
and the built-in sweeper. Time is a FakeClock shared by the store and the
processors; real-time waits only guard against hangs.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from conftest import StoreMaker, kinds_offering
from dibs import FakeClock, InvalidInput, Store, Unit
from dibs.stores.jobs import Job
from dibs.tasks import Misfire, TaskProcessor, current
from dibs.tasks._durable_schedules import DurableSchedule
from dibs.tasks._schedules import policy
from dibs.tasks._triggers import EveryTrigger
from eventually import eventually


@pytest.fixture(params=kinds_offering("job_table"))
def store_kind(request: pytest.FixtureRequest) -> str:
    """The stores with a job table (a capability; etcd has none): durable jobs live there."""
    return str(request.param)


T0 = 1_800_000_000.0
GUARD = 30.0


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(T0)


class Fleet:
    """Processors started and stopped on one store, like hosts of a fleet."""

    def __init__(self, store: Store, clock: FakeClock) -> None:
        self.store = store
        self.clock = clock
        self.runs: list[str] = []
        self.gate = threading.Event()
        self.gate.set()
        self.up: list[TaskProcessor] = []

    def host(self, **options: Any) -> TaskProcessor:
        options = {"workers": 2, "lease": 5, "poll": 0.01, "sweep_every": None, **options}
        processor = TaskProcessor(store=self.store, clock=self.clock, **options)

        @processor.task("tick")
        def tick() -> None:
            self.runs.append(current().job_id or "")
            self.gate.wait(GUARD)

        @processor.task("loop")
        def loop() -> str:
            token = current().token
            while not token.sleep(0.01):
                pass
            current().raise_if_cancelled()
            return "ignored"

        self.up.append(processor)
        return processor

    def down(self) -> None:
        for processor in self.up:
            processor.shutdown(timeout=GUARD)
        self.up.clear()


@pytest.fixture
def fleet(make_store: StoreMaker, clock: FakeClock) -> Iterator[Fleet]:
    f = Fleet(make_store(clock), clock)
    yield f
    f.gate.set()
    f.down()


def ran(fleet: Fleet, schedule: str) -> list[float]:
    """Nominal times (seconds after T0) of the schedule's runs so far."""
    from datetime import datetime

    stamps = [datetime.fromisoformat(r.split("@", 1)[1]).timestamp() for r in fleet.runs]
    return sorted(s - T0 for s, r in zip(stamps, fleet.runs, strict=True) if r.startswith(schedule))


def settle(fleet: Fleet, processor: TaskProcessor, count: int) -> None:
    eventually(lambda: len(fleet.runs) >= count)
    assert processor.join(GUARD)


@pytest.mark.parametrize(
    ("misfire", "expected"),
    [
        (Misfire(), [60]),  # catch up once, for the latest missed occurrence
        (Misfire(coalesce="earliest"), [20]),
        (Misfire(coalesce="all"), [20, 30, 40, 50, 60]),
        (Misfire(window=25, coalesce="all"), [50, 60]),
        (Misfire(window=5), []),  # the latest missed one is 5.5 s late: skipped
    ],
)
def test_the_first_host_back_catches_up_from_the_watermark(
    fleet: Fleet, clock: FakeClock, misfire: Misfire, expected: list[int]
) -> None:
    first = fleet.host()
    first.every(10, "tick", id="s", start=T0, misfire=misfire, max_running=10)
    settle(fleet, first, 1)  # the occurrence at T0, before time moves on
    clock.advance(10)
    settle(fleet, first, 2)
    assert ran(fleet, "s") == [0, 10]
    fleet.down()  # the whole fleet is down from T0 + 10 to T0 + 65.5
    clock.advance(55.5)
    back = fleet.host()
    back.every(10, "tick", id="s", start=T0, misfire=misfire, max_running=10)
    settle(fleet, back, 2 + len(expected))
    assert ran(fleet, "s") == [0, 10, *expected]
    other = fleet.host()  # a second host back later evaluates nothing twice
    other.every(10, "tick", id="s", start=T0, misfire=misfire, max_running=10)
    assert other.join(GUARD) and back.join(GUARD)
    assert ran(fleet, "s") == [0, 10, *expected]


def test_max_running_holds_across_hosts(fleet: Fleet, clock: FakeClock) -> None:
    # Runs block until the gate opens; closed first, or the first run could end before it.
    fleet.gate.clear()
    hosts = [fleet.host(lease=1000), fleet.host(lease=1000)]  # fake time jumps past short leases
    for host in hosts:
        host.every(10, "tick", id="s", start=T0, misfire=Misfire(coalesce="all"))
    eventually(lambda: len(fleet.runs) >= 1)
    for _ in range(4):
        clock.advance(10)
        for host in hosts:
            host.join(0.05)  # let each host's tick evaluate (it must start nothing)
    assert ran(fleet, "s") == [0]  # one at a time: the rest wait their turn
    fleet.gate.set()
    eventually(lambda: len(fleet.runs) >= 5)
    assert all(host.join(GUARD) for host in hosts)
    assert ran(fleet, "s") == [0, 10, 20, 30, 40]


def test_decide_keeps_the_watermark_while_max_running_is_reached() -> None:
    made: list[float] = []

    def make(job_id: str, nominal: float) -> Job:
        made.append(nominal)
        return Job(job_id, "t", "[[], {}]", nominal, 1, 1, "pending")

    schedule = DurableSchedule(
        "s", EveryTrigger(1.0, 0.0), policy(Misfire(coalesce="all"), 2), make
    )
    # First evaluation: the watermark starts at now; earlier occurrences are not run.
    assert schedule.decide(10.5, None, 0) == (math.nextafter(10.5, -math.inf), [])
    assert schedule.decide(12.5, 10.0, 2) is None  # full: nothing evaluated
    mark, jobs = schedule.decide(13.5, 10.0, 1) or (0.0, [])
    assert (mark, [j.run_at for j in jobs]) == (11.0, [11.0])  # one slot, the rest wait
    mark, jobs = schedule.decide(13.5, 11.0, 0) or (0.0, [])
    assert (mark, [j.run_at for j in jobs]) == (13.0, [12.0, 13.0])


def test_a_job_that_keeps_losing_its_worker_is_failed(fleet: Fleet, clock: FakeClock) -> None:
    host = fleet.host(lease=1)
    job = host.enqueue("loop")  # no retries: 1 attempt + MAX_LOST (3) takeovers
    for attempt in range(1, 5):
        eventually(
            lambda a=attempt: (
                (r := host.job(job)) is not None and (r.state, r.attempt) == ("running", a)
            )
        )
        clock.advance(2)  # the lease lapses, as if the worker had stopped
    eventually(lambda: (r := host.job(job)) is not None and r.state == "failed")
    record = host.job(job)
    assert record is not None and record.attempt == 4  # a poison pill, not retried forever


def test_cancel_a_pending_job_it_never_runs(fleet: Fleet, clock: FakeClock) -> None:
    host = fleet.host()
    job = host.enqueue("tick", delay=5)
    assert host.cancel(job)
    assert not host.cancel(job)  # finished: nothing to cancel
    witness = host.enqueue("tick", delay=5)  # due with it, queued after it
    clock.advance(10)
    assert host.result(witness, timeout=GUARD) is None  # the poll that took due jobs is over
    record = host.job(job)
    assert record is not None and record.state == "cancelled"
    assert fleet.runs == [witness]


def test_cancel_a_running_job_from_another_host(fleet: Fleet) -> None:
    runner = fleet.host(lease=0.3)
    client = fleet.host(take_jobs=False)
    job = client.enqueue("loop")
    eventually(lambda: (r := client.job(job)) is not None and r.state == "running")
    assert client.cancel(job)  # the runner learns it at its next heartbeat
    eventually(lambda: (r := client.job(job)) is not None and r.state == "cancelled")
    assert runner.join(GUARD)


def test_a_key_deduplicates_while_its_job_is_live(fleet: Fleet, clock: FakeClock) -> None:
    host = fleet.host()
    first = host.enqueue("tick", key="k", delay=5)
    assert host.enqueue("tick", key="k") == first
    clock.advance(5)
    eventually(lambda: (r := host.job(first)) is not None and r.state == "done")
    second = host.enqueue("tick", key="k")
    assert second != first  # finished: the key is free again
    eventually(lambda: (r := host.job(second)) is not None and r.state == "done")


def test_the_sweeper_is_a_durable_schedule(fleet: Fleet, clock: FakeClock) -> None:
    assert T0 % 30 == 0  # occurrences are anchored at the epoch: T0 is one
    hosts = [fleet.host(sweep_every=30), fleet.host(sweep_every=30)]
    eventually(
        lambda: (r := hosts[0].job(f"dibs.sweep@{_iso(T0)}")) is not None and r.state == "done"
    )
    dead = fleet.store.claim(Unit("seat", "1"), holder="gone", ttl=1)
    assert dead.claim is not None
    clock.advance(30)
    occurrence = f"dibs.sweep@{_iso(T0 + 30)}"
    eventually(lambda: (r := hosts[0].job(occurrence)) is not None and r.state == "done")
    record = hosts[1].job(occurrence)
    assert record is not None and record.result["expired"] == 1  # swept once, not twice
    assert fleet.store.get(dead.claim.id).state.value == "expired"  # type: ignore[union-attr]


def _iso(t: float) -> str:
    from datetime import UTC, datetime

    return datetime.fromtimestamp(t, UTC).isoformat()


def test_postgresql_wakes_workers_by_notify(pg_url: str, tmp_path: Path, clock: FakeClock) -> None:
    place = StoreMaker("postgresql", tmp_path, pg_url)
    fleet = Fleet(place(clock), clock)
    worker = fleet.host(poll=3600)  # only a notification can wake it within the guard
    client = fleet.host(take_jobs=False)
    try:
        assert worker.join(GUARD)
        job = client.enqueue("tick")
        eventually(lambda: (r := client.job(job)) is not None and r.state == "done")
    finally:
        fleet.down()
        place.close()


def test_finished_attempts_hold_nothing(fleet: Fleet, clock: FakeClock) -> None:
    host = fleet.host(lease=1000)  # fake time jumps past short leases
    failed: set[str] = set()

    @host.task("flaky", retries=1, backoff=0)
    def flaky(n: int) -> int:
        job_id = current().job_id or ""
        if job_id not in failed:  # the first attempt fails; its retry succeeds
            failed.add(job_id)
            raise ValueError(n)
        return n

    jobs = [host.enqueue("tick") for _ in range(10)] + [host.enqueue("flaky", n) for n in range(5)]
    eventually(lambda: all((r := host.job(j)) is not None and r.state == "done" for j in jobs))
    host.every(10, "tick", id="s", start=T0, misfire=Misfire(coalesce="all"))

    def occurrences() -> list[str]:
        return [r for r in fleet.runs if r.startswith("s@")]

    for step in range(1, 6):
        eventually(lambda s=step: len(occurrences()) == s)
        clock.advance(10)
    eventually(lambda: len(occurrences()) == 6)
    host.unschedule("s")
    assert host.join(GUARD)
    assert host._durable is not None
    table = host._durable.jobs
    finished = [table.get(j) for j in jobs + occurrences()]
    # Finishing ended every attempt's lease in the same statement: nothing stays held.
    assert all(j is not None and j.state == "done" for j in finished)
    assert all(j.holder is None and j.lease_expires is None for j in finished)  # type: ignore[union-attr]
    assert {host.job(j).attempt for j in jobs[10:]} == {2}  # type: ignore[union-attr]
    kinds = [[a.outcome_kind for a in table.get(j).attempts] for j in jobs[10:]]  # type: ignore[union-attr]
    assert kinds == [["error", "ok"]] * 5
    # Nor in the store: durable jobs take no claims.
    assert fleet.store.claims_of(host._durable.holder) == []


def test_a_stale_fence_changes_nothing(fleet: Fleet, clock: FakeClock) -> None:
    client = fleet.host(take_jobs=False)
    assert client._durable is not None
    jobs = client._durable.jobs
    job_id = client.enqueue("tick")
    (first,) = jobs.take(None, 5, 1.0, "a")  # a worker that then stalls past its lease
    assert first.fence is not None
    clock.advance(2)
    assert jobs.reclaim() == 1
    (second,) = jobs.take(None, 5, 1.0, "b")  # the next attempt, another fence
    assert (second.attempt, second.fence) == (2, first.fence + 1)
    # The stalled worker wakes: its heartbeat, finish and put-back all change nothing.
    assert jobs.extend([(job_id, first.fence)], 1.0) == {}
    assert jobs.finish(job_id, first.fence, "ok", "1") is None
    assert not jobs.put_back(job_id, first.fence)
    assert second.fence is not None
    assert jobs.finish(job_id, second.fence, "ok", "2") == "done"
    assert jobs.finish(job_id, second.fence, "ok", "3") is None  # recorded once
    done = jobs.get(job_id)
    assert done is not None and (done.state, done.outcome) == ("done", "2")
    assert [(a.attempt, a.holder, a.outcome_kind) for a in done.attempts] == [
        (1, "a", "lost"),
        (2, "b", "ok"),
    ]
    assert jobs.take(None, 5, 1.0, "c") == []  # finished: never taken again


def test_a_dead_workers_job_is_taken_over_after_its_lease(fleet: Fleet, clock: FakeClock) -> None:
    client = fleet.host(take_jobs=False)
    assert client._durable is not None
    jobs = client._durable.jobs
    job_id = client.enqueue("tick")
    assert len(jobs.take(None, 1, 5.0, "gone")) == 1  # a worker that died mid-job
    worker = fleet.host(lease=5)
    clock.advance(6)  # its lease lapses on the store's clock
    eventually(lambda: (r := client.job(job_id)) is not None and r.state == "done")
    assert worker.join(GUARD)
    record = client.job(job_id)
    assert record is not None and record.attempt == 2
    assert fleet.runs == [job_id]


@pytest.mark.parametrize(
    "name", ["job\x00id", "caf\udce9", "x" * 1025], ids=["NUL", "lone surrogate", "too long"]
)
def test_names_outside_the_domain_are_invalid_input_for_durable_tasks(
    fleet: Fleet, name: str
) -> None:
    # Job IDs, keys and schedule IDs become store names: the same domain, the same error,
    # never a driver's exception.
    processor = fleet.host()
    calls: list[Callable[[], object]] = [
        lambda: processor.enqueue("tick", key=name),
        lambda: processor.job(name),
        lambda: processor.cancel(name),
        lambda: processor.every(10, "tick", id=name),
    ]
    for call in calls:
        with pytest.raises(InvalidInput):
            call()


def test_a_durable_schedule_id_leaves_room_for_its_occurrences(fleet: Fleet) -> None:
    processor = fleet.host()
    with pytest.raises(InvalidInput) as raised:
        processor.every(10, "tick", id="s" * 1000)
    assert raised.value.field == "id"
    processor.every(10, "tick", id="s" * 900)
