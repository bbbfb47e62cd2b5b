"""Durable overlap and catch-up rules on every store with a job table, in one process.

Several processors ("hosts") share one store and one FakeClock: ``overlap="skip"``
skips, fleet-wide, an occurrence due while a run is live; ``catch_up`` decides what
the first host back runs after the whole fleet was down; the runs of one catch-up
under ``skip`` never overlap (they share the schedule's lock key); ``allow`` lets
them. Real-time waits only guard against hangs.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import pytest

from conftest import StoreMaker, kinds_offering
from dibs import FakeClock, InvalidInput, Store
from dibs.tasks import TaskProcessor, current
from dibs.tasks._durable_schedules import occurrence_id, schedule_lock_key
from eventually import eventually

T0 = 1_800_000_000.0
GUARD = 30.0


@pytest.fixture(params=kinds_offering("job_table"))
def store_kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


class Fleet:
    """Hosts on one store; each run records its occurrence and how many ran at once."""

    def __init__(self, store: Store, clock: FakeClock) -> None:
        self.store = store
        self.clock = clock
        self.runs: list[float] = []
        self.running = 0
        self.peak = 0
        self.lock = threading.Lock()
        self.gate = threading.Event()
        self.gate.set()
        self.up: list[TaskProcessor] = []

    def host(self, **options: Any) -> TaskProcessor:
        options = {"workers": 3, "lease": 1000, "poll": 0.01, "sweep_every": None, **options}
        processor = TaskProcessor(store=self.store, clock=self.clock, **options)

        @processor.task("tick")
        def tick() -> None:
            context = current()  # a durable run sees its schedule and occurrence
            assert context.nominal_time is not None and context.schedule_id == "s"
            assert context.job_id == occurrence_id("s", context.nominal_time.timestamp())
            with self.lock:
                self.running += 1
                self.peak = max(self.peak, self.running)
                self.runs.append(context.nominal_time.timestamp() - T0)
            self.gate.wait(GUARD)
            threading.Event().wait(0.02)  # a moment in which an overlapping run would show
            with self.lock:
                self.running -= 1

        self.up.append(processor)
        return processor

    def down(self) -> None:
        for processor in self.up:
            processor.shutdown(timeout=GUARD)
        self.up.clear()

    def settle(self, count: int) -> None:
        eventually(lambda: len(self.runs) >= count, timeout=GUARD)
        assert all(p.join(GUARD) for p in self.up)


@pytest.fixture
def fleet(make_store: StoreMaker) -> Iterator[Fleet]:
    clock = FakeClock(T0)
    f = Fleet(make_store(clock), clock)
    yield f
    f.gate.set()
    f.down()


def test_skip_holds_across_hosts(fleet: Fleet) -> None:
    fleet.gate.clear()  # the run at T0 blocks (closed first, or it could end before)
    hosts = [fleet.host(), fleet.host()]
    for host in hosts:
        host.every(10, "tick", id="s", start=T0, overlap="skip", catch_up="all")
    eventually(lambda: len(fleet.runs) >= 1, timeout=GUARD)
    for _ in range(4):
        fleet.clock.advance(10)
        for host in hosts:
            host.join(0.05)  # let each host's tick evaluate: it must skip, not queue
    fleet.gate.set()
    assert all(host.join(GUARD) for host in hosts)
    assert fleet.runs == [0]  # 10..40 came due while 0 ran: skipped, even with catch_up="all"
    fleet.clock.advance(10)
    fleet.settle(2)
    assert fleet.runs == [0, 50] and fleet.peak == 1


@pytest.mark.parametrize(
    ("rules", "expected"),
    [
        ({}, [60]),  # skip, coalesce: once, for the latest
        ({"catch_up": "all"}, [20, 30, 40, 50, 60]),
        ({"catch_up": "all", "max_catch_up": 2}, [50, 60]),  # the most recent two
        ({"overlap": "allow", "catch_up": "all", "max_catch_up": 3}, [40, 50, 60]),
    ],
)
def test_the_first_host_back_catches_up(
    fleet: Fleet, rules: dict[str, Any], expected: list[int]
) -> None:
    first = fleet.host()
    first.every(10, "tick", id="s", start=T0, **rules)
    fleet.settle(1)
    fleet.clock.advance(10)
    fleet.settle(2)
    fleet.down()  # the whole fleet is down from T0 + 10 to T0 + 65.5
    fleet.clock.advance(55.5)
    back = fleet.host()
    back.every(10, "tick", id="s", start=T0, **rules)
    fleet.settle(2 + len(expected))
    other = fleet.host()  # a second host back later evaluates nothing twice
    other.every(10, "tick", id="s", start=T0, **rules)
    assert other.join(GUARD) and back.join(GUARD)
    assert sorted(fleet.runs) == [0, 10, *expected]
    if rules.get("overlap", "skip") == "skip":
        assert fleet.runs == [0, 10, *expected] and fleet.peak == 1  # one after the other


def test_skip_jobs_carry_the_schedules_lock_key(fleet: Fleet) -> None:
    client = fleet.host(take_jobs=False)
    client.every(10, "tick", id="s", start=T0, overlap="skip", catch_up="all")
    client.every(10, "tick", id="a", start=T0, overlap="allow")
    eventually(lambda: len(client.jobs(limit=10)) == 2, timeout=GUARD)
    keys = {r.id: r.lock_key for r in client.jobs(limit=10)}
    assert keys == {occurrence_id("s", T0): schedule_lock_key("s"), occurrence_id("a", T0): None}


def test_allow_lets_runs_of_one_schedule_overlap(fleet: Fleet) -> None:
    fleet.gate.clear()  # before the schedule: its first run must block too
    host = fleet.host()
    host.every(10, "tick", id="s", start=T0, overlap="allow")
    for count in (1, 2, 3):
        eventually(lambda c=count: len(fleet.runs) >= c, timeout=GUARD)  # type: ignore[misc]
        fleet.clock.advance(10)
    eventually(lambda: fleet.peak >= 3, timeout=GUARD)
    fleet.gate.set()


def test_durable_bad_rules_name_the_field(fleet: Fleet) -> None:
    host = fleet.host()
    for rules, field in [
        ({"overlap": "never"}, "overlap"),
        ({"catch_up": "some"}, "catch_up"),
        ({"max_catch_up": 0}, "max_catch_up"),
        ({"overlap": "skip", "max_running": 3}, "max_running"),
    ]:
        with pytest.raises(InvalidInput) as info:
            host.every(10, "tick", id="s", **rules)
        assert info.value.field == field
