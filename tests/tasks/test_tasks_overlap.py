"""Overlap and catch-up rules of recurring schedules, in-process and as pure decisions.

``overlap="skip"|"allow"``, ``catch_up="coalesce"|"all"`` and ``max_catch_up`` on
``every()`` and ``cron()``: on a FakeClock in one processor, and
:meth:`DurableSchedule.decide` checked against properties with Hypothesis (intervals
at both ends of the domain, cron across DST folds and gaps in several zones, every
``max_catch_up``). Bad values raise InvalidInput naming the field.
"""

from __future__ import annotations

import itertools
import math
import threading
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from dibs import FakeClock, InvalidInput
from dibs.limits import RETENTION_MAX as MAX_SECONDS
from dibs.stores.jobs import Job
from dibs.tasks import TaskProcessor, current
from dibs.tasks._durable_schedules import DurableSchedule, occurrence_id
from dibs.tasks._processor import INTERVAL_MIN
from dibs.tasks._schedules import MAX_CATCH_UP, UNLIMITED, policy
from dibs.tasks._time import EPOCH_MAX
from dibs.tasks._triggers import CronTrigger, EveryTrigger, Trigger, zone

QUICK = True  # in `pytest -m quick` (conftest.is_quick: not slow, no server)

T0 = 1_800_000_000.0
WAIT = 10.0


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(T0)


@pytest.fixture
def tasks(clock: FakeClock) -> Iterator[TaskProcessor]:
    processor = TaskProcessor(workers=4, clock=clock)
    yield processor
    processor.shutdown(wait=True, timeout=0)


def barrier(tasks: TaskProcessor, clock: FakeClock, seconds: float) -> None:
    """Move time; wait until the scheduler has dispatched everything due (workers may be busy)."""
    marker = tasks.submit(str, "barrier", at=clock.now() + seconds)
    clock.advance(seconds)
    assert marker.result(timeout=WAIT) == "barrier"


class Slow:
    """A run that blocks until released; records nominal times and the most at once."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.started = threading.Semaphore(0)
        self.nominal: list[float] = []
        self.running = 0
        self.peak = 0
        self.lock = threading.Lock()

    def __call__(self) -> None:
        context = current()
        assert context.nominal_time is not None
        with self.lock:
            self.running += 1
            self.peak = max(self.peak, self.running)
            self.nominal.append(context.nominal_time.timestamp() - T0)
        self.started.release()
        self.release.wait(WAIT)
        with self.lock:
            self.running -= 1


# --- in-process -----------------------------------------------------------------------------


def test_skip_drops_occurrences_due_while_a_run_is_live(
    tasks: TaskProcessor, clock: FakeClock
) -> None:
    slow = Slow()
    tasks.every(10, slow, start=T0 + 10, overlap="skip")
    barrier(tasks, clock, 10)
    assert slow.started.acquire(timeout=WAIT)
    for _ in range(3):
        barrier(tasks, clock, 10)  # 20, 30, 40 come due while 10 still runs: skipped
    (schedule,) = tasks.schedules()
    assert (schedule.running, schedule.runs, schedule.skipped) == (1, 1, 3)
    assert (schedule.overlap, schedule.catch_up, schedule.max_catch_up) == ("skip", "coalesce", 1)
    slow.release.set()
    assert tasks.join(timeout=WAIT)
    assert slow.nominal == [10]  # not queued: the old rules would have run 40 now
    barrier(tasks, clock, 10)
    assert tasks.join(timeout=WAIT)
    assert slow.nominal == [10, 50] and slow.peak == 1


def test_allow_runs_occurrences_beside_each_other(tasks: TaskProcessor, clock: FakeClock) -> None:
    slow = Slow()
    tasks.every(10, slow, start=T0 + 10, overlap="allow")
    for _ in range(3):
        barrier(tasks, clock, 10)
        assert slow.started.acquire(timeout=WAIT)
    assert slow.peak == 3 and tasks.schedules()[0].max_running == UNLIMITED
    slow.release.set()


@pytest.mark.parametrize(
    ("rules", "expected"),
    [
        ({}, [50]),  # the default of the new names: skip, coalesce
        ({"catch_up": "coalesce"}, [50]),
        ({"catch_up": "all"}, [10, 20, 30, 40, 50]),
        ({"catch_up": "all", "max_catch_up": 2}, [40, 50]),  # the most recent two
        ({"catch_up": "all", "max_catch_up": 1}, [50]),
        ({"overlap": "allow", "catch_up": "all", "max_catch_up": 3}, [30, 40, 50]),
    ],
)
def test_catch_up_after_a_sleep(
    tasks: TaskProcessor, clock: FakeClock, rules: dict[str, Any], expected: list[int]
) -> None:
    runs: list[float] = []
    at_once = [0, 0]
    lock = threading.Lock()

    def run() -> None:
        context = current()
        assert context.nominal_time is not None
        with lock:
            at_once[0] += 1
            at_once[1] = max(at_once)
            runs.append(context.nominal_time.timestamp() - T0)
        threading.Event().wait(0.01)  # a moment, so that runs allowed to overlap can
        with lock:
            at_once[0] -= 1

    tasks.every(10, run, start=T0 + 10, **rules)
    clock.advance(55)  # asleep through five occurrences
    assert tasks.join(timeout=WAIT)
    assert sorted(runs) == expected
    if rules.get("overlap", "skip") == "skip":
        assert runs == expected and at_once[1] == 1  # one after the other, oldest first
    barrier(tasks, clock, 5)
    assert tasks.join(timeout=WAIT)
    assert sorted(runs) == [*expected, 60]  # then back on the beat


def test_cron_takes_the_new_names(tasks: TaskProcessor, clock: FakeClock) -> None:
    schedule = tasks.cron("* * * * *", print, overlap="allow", catch_up="all", max_catch_up=7)
    assert (schedule.overlap, schedule.catch_up, schedule.max_catch_up) == ("allow", "all", 7)
    old = tasks.cron("* * * * *", print, max_running=2)  # the older names keep working
    assert (old.overlap, old.max_running, old.misfire.coalesce) == (None, 2, "latest")


# --- bad values -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("rules", "field"),
    [
        ({"overlap": "queue"}, "overlap"),
        ({"overlap": 1}, "overlap"),
        ({"overlap": ""}, "overlap"),
        ({"catch_up": "latest"}, "catch_up"),
        ({"catch_up": None, "overlap": "SKIP"}, "overlap"),
        ({"catch_up": b"all"}, "catch_up"),
        ({"max_catch_up": 0}, "max_catch_up"),
        ({"max_catch_up": -1}, "max_catch_up"),
        ({"max_catch_up": MAX_CATCH_UP + 1}, "max_catch_up"),
        ({"max_catch_up": 2**64}, "max_catch_up"),
        ({"max_catch_up": True}, "max_catch_up"),
        ({"max_catch_up": 1.0}, "max_catch_up"),
        ({"max_catch_up": "3"}, "max_catch_up"),
        ({"overlap": "skip", "max_running": 2}, "max_running"),
        ({"catch_up": "all", "misfire": object()}, "misfire"),
        ({"max_running": 0}, "max_running"),
    ],
)
@pytest.mark.parametrize("kind", ["every", "cron"])
def test_bad_rules_raise_invalid_input_naming_the_field(
    tasks: TaskProcessor, rules: dict[str, Any], field: str, kind: str
) -> None:
    with pytest.raises(InvalidInput) as info:
        if kind == "every":
            tasks.every(10, print, **rules)
        else:
            tasks.cron("* * * * *", print, **rules)
    assert info.value.field == field
    assert tasks.schedules() == []


def test_misfire_with_the_new_names_is_refused() -> None:
    from dibs.tasks import Misfire

    with pytest.raises(InvalidInput) as info:
        policy(misfire=Misfire(), overlap="skip")
    assert info.value.field == "misfire"


# --- durable decisions, by property ---------------------------------------------------------


def decider(trigger: Trigger, **rules: Any) -> DurableSchedule:
    def make(job_id: str, nominal: float) -> Job:
        return Job(job_id, "t", "[[], {}]", nominal, 1, 1, "pending")

    return DurableSchedule("s", trigger, policy(**rules), make)


def check_decision(trigger: Trigger, mark: float, now: float, live: int, rules: Any) -> None:
    """The decision of an evaluation at ``now`` from watermark ``mark``, by its properties."""
    schedule = decider(trigger, **rules)
    decision = schedule.decide(now, mark, live)
    last = trigger.last_at_or_before(now)
    if last is None or last <= mark:
        assert decision is None  # nothing due: nothing changes
        return
    assert decision is not None
    new_mark, jobs = decision
    assert new_mark == last  # every due occurrence is evaluated, run or skipped
    if rules.get("overlap", "skip") == "skip" and live > 0:
        assert jobs == []  # skipped, not queued
        return
    picks = [j.run_at for j in jobs]
    assert picks, "a due occurrence with nothing live must run"
    assert picks[-1] == last and all(p is not None and mark < p <= now for p in picks)
    most = rules.get("max_catch_up") or MAX_CATCH_UP
    most = 1 if rules.get("catch_up", "coalesce") == "coalesce" else most
    assert len(picks) <= most
    # Contiguous, the most recent ones. Occurrences closer than a microsecond share
    # one job ID (an ISO instant), and so one job: the later of them.
    for a, b in itertools.pairwise(picks):
        assert a is not None and b is not None
        after = trigger.first_at_or_after(math.nextafter(a, math.inf))
        assert after is not None and after <= b and same_id(after, b)
    if len(picks) < most:  # fewer than allowed: none older was left out
        first = trigger.first_at_or_after(math.nextafter(mark, math.inf))
        assert first is not None and picks[0] is not None and same_id(first, picks[0])
    assert len({j.id for j in jobs}) == len(jobs)  # one job per occurrence ID


def same_id(a: float, b: float) -> bool:
    return occurrence_id("s", a) == occurrence_id("s", b)


RULES = st.fixed_dictionaries(
    {},
    optional={
        "overlap": st.sampled_from(["skip", "allow"]),
        "catch_up": st.sampled_from(["coalesce", "all"]),
        "max_catch_up": st.one_of(
            st.integers(1, 4), st.just(MAX_CATCH_UP), st.integers(1, MAX_CATCH_UP)
        ),
    },
).filter(bool)


@settings(max_examples=300, deadline=None)
@given(
    interval=st.one_of(
        st.just(INTERVAL_MIN),
        st.just(float(MAX_SECONDS)),
        st.floats(INTERVAL_MIN, 10.0),
        st.floats(INTERVAL_MIN, float(MAX_SECONDS)),
    ),
    anchor=st.floats(0, 4e9),
    mark_steps=st.floats(-3, 2000),
    gap_steps=st.floats(0, 3000),
    live=st.integers(0, 3),
    rules=RULES,
)
def test_every_decisions_at_both_ends_of_the_interval(
    interval: float,
    anchor: float,
    mark_steps: float,
    gap_steps: float,
    live: int,
    rules: dict[str, Any],
) -> None:
    mark = anchor + mark_steps * interval
    now = min(mark + gap_steps * interval, EPOCH_MAX)  # the domain ends in year 9999
    assume(mark < now)
    check_decision(EveryTrigger(interval, anchor), mark, now, live, rules)


ZONES = ["America/New_York", "Europe/Berlin", "Australia/Sydney", "Australia/Lord_Howe"]
# Instants near the DST changes of 2026 in each zone: the hours around a fold or a gap.
DST_2026 = [
    datetime(2026, 3, 8, 7, tzinfo=UTC),  # New York springs forward
    datetime(2026, 11, 1, 6, tzinfo=UTC),  # New York falls back
    datetime(2026, 3, 29, 1, tzinfo=UTC),  # Berlin
    datetime(2026, 10, 25, 1, tzinfo=UTC),
    datetime(2026, 4, 4, 16, tzinfo=UTC),  # Sydney falls back (16:00 UTC = 03:00 AEDT)
    datetime(2026, 10, 3, 16, tzinfo=UTC),  # Sydney springs forward
    datetime(2026, 4, 4, 15, tzinfo=UTC),  # Lord Howe, 30 minutes
    datetime(2026, 10, 3, 15, 30, tzinfo=UTC),
]
CRONS = ["*/15 * * * *", "30 2 * * *", "0,30 1-3 * * *", "45 1 * * *", "* 2 * * *", "0 * * * *"]


@settings(max_examples=200, deadline=None)
@given(
    tz=st.sampled_from(ZONES),
    expr=st.sampled_from(CRONS),
    around=st.sampled_from(DST_2026),
    mark_minutes=st.integers(-600, 600),
    gap_minutes=st.integers(0, 1500),
    live=st.integers(0, 2),
    rules=RULES,
)
def test_cron_decisions_across_dst_folds_and_gaps(
    tz: str,
    expr: str,
    around: datetime,
    mark_minutes: int,
    gap_minutes: int,
    live: int,
    rules: dict[str, Any],
) -> None:
    mark = (around + timedelta(minutes=mark_minutes)).timestamp()
    now = mark + gap_minutes * 60 + 0.5
    check_decision(CronTrigger(expr, zone(tz)), mark, now, live, rules)


def test_decide_skips_while_a_run_is_live_and_catches_up_the_most_recent() -> None:
    schedule = decider(EveryTrigger(1.0, 0.0), overlap="skip", catch_up="all", max_catch_up=3)
    assert schedule.decide(10.5, None, 0) == (math.nextafter(10.5, -math.inf), [])
    assert schedule.decide(20.5, 10.0, 1) == (20.0, [])  # a run is live: 11..20 skipped
    mark, jobs = schedule.decide(20.5, 10.0, 0) or (0.0, [])
    assert (mark, [j.run_at for j in jobs]) == (20.0, [18.0, 19.0, 20.0])
    assert {j.lock_key for j in jobs} == {None}  # the processor adds the lock key, not decide
    allow = decider(EveryTrigger(1.0, 0.0), overlap="allow", catch_up="all")
    mark, jobs = allow.decide(20.5, 10.0, 5) or (0.0, [])
    assert len(jobs) == 10  # live runs hold nothing back
