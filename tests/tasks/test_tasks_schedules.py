"""Recurring schedules: interval anchoring, cron with DST in several zones, misfires, overlap.

All on a FakeClock. A *barrier* (a one-off task due at the same instant,
queued behind the schedule's heap entry) proves the scheduler has processed a
moment before the test looks at what did not happen.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from datetime import datetime, timedelta
from zoneinfo import ZoneInfo

import pytest

import dibs
from dibs import FakeClock
from dibs.tasks import Coalesce, Misfire, TaskProcessor, current
from dibs.tasks._triggers import CronTrigger, EveryTrigger, zone

QUICK = True  # in `pytest -m quick` (conftest.is_quick: not slow, no server)

T0 = 1_800_000_000.0
WAIT = 10.0


class Runs:
    """Records each run's nominal time (epoch) and the clock when it started."""

    def __init__(self, clock: FakeClock) -> None:
        self.clock = clock
        self.nominal: list[float] = []
        self.started: list[float] = []
        self.lock = threading.Lock()

    def __call__(self) -> None:
        context = current()
        assert context.nominal_time is not None
        with self.lock:
            self.nominal.append(context.nominal_time.timestamp())
            self.started.append(self.clock.now())


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(T0)


@pytest.fixture
def tasks(clock: FakeClock) -> Iterator[TaskProcessor]:
    processor = TaskProcessor(workers=2, clock=clock)
    yield processor
    processor.shutdown(wait=True, timeout=0)


def advance(tasks: TaskProcessor, clock: FakeClock, seconds: float) -> None:
    """Move time and wait until the scheduler and workers are done with it."""
    clock.advance(seconds)
    assert tasks.join(timeout=WAIT)


def barrier(tasks: TaskProcessor, clock: FakeClock, seconds: float) -> None:
    """Move time; wait until the scheduler has dispatched everything due (workers may be busy)."""
    marker = tasks.submit(str, "barrier", at=clock.now() + seconds)
    clock.advance(seconds)
    assert marker.result(timeout=WAIT) == "barrier"


def local(ts: list[float], tz: str) -> list[str]:
    return [datetime.fromtimestamp(t, ZoneInfo(tz)).isoformat() for t in ts]


# --- intervals ------------------------------------------------------------------------------


def test_every_is_anchored_and_does_not_drift(tasks: TaskProcessor, clock: FakeClock) -> None:
    runs = Runs(clock)
    start = T0 + 0.1
    tasks.every(7.3, runs, start=start)
    steps = [3.1, 4.9, 0.7, 6.6, 2.2]  # irregular, never a multiple of the interval
    for i in range(300):
        advance(tasks, clock, steps[i % len(steps)])
    assert len(runs.nominal) == int((clock.now() - start) // 7.3) + 1
    # Nominal times travel as datetimes (microsecond resolution), hence approx.
    assert runs.nominal == pytest.approx(
        [start + k * 7.3 for k in range(len(runs.nominal))], abs=1e-6, rel=0
    )
    for nominal, started in zip(runs.nominal, runs.started, strict=True):
        assert nominal - 1e-6 <= started < nominal + max(steps)


def test_every_trigger_computes_each_occurrence_from_the_anchor() -> None:
    trigger = EveryTrigger(0.1, 5.0)
    k = 10_000_000
    assert trigger.first_at_or_after(5.0 + k * 0.1) == 5.0 + k * 0.1
    assert trigger.last_at_or_before(5.0 + k * 0.1) == 5.0 + k * 0.1
    assert trigger.first_at_or_after(0) == 5.0
    assert trigger.last_at_or_before(4.99) is None
    drifted = 5.0
    for _ in range(k):
        drifted += 0.1
    assert drifted != 5.0 + k * 0.1  # what repeated addition would have done


def test_every_defaults_to_one_interval_from_now(tasks: TaskProcessor, clock: FakeClock) -> None:
    runs = Runs(clock)
    schedule = tasks.every(timedelta(minutes=1), runs)
    assert schedule.next_run is not None and schedule.next_run.timestamp() == T0 + 60
    advance(tasks, clock, 59)
    assert runs.nominal == []
    advance(tasks, clock, 1)
    assert runs.nominal == [T0 + 60]


def test_every_with_a_past_start_keeps_its_phase(tasks: TaskProcessor, clock: FakeClock) -> None:
    runs = Runs(clock)
    tasks.every(10, runs, start=T0 - 1003)  # occurrences at T0 - 3 + 10k
    for _ in range(30):
        advance(tasks, clock, 1)
    assert runs.nominal == [T0 + 7, T0 + 17, T0 + 27]


def test_run_context_names_schedule_and_occurrence(tasks: TaskProcessor, clock: FakeClock) -> None:
    seen: list[tuple[str | None, float | None]] = []

    def job() -> None:
        context = current()
        assert context.nominal_time is not None
        seen.append((context.schedule_id, context.nominal_time.timestamp()))

    tasks.every(5, job, id="heartbeat", start=T0 + 5)
    advance(tasks, clock, 5)
    assert seen == [("heartbeat", T0 + 5)]


# --- cron and DST -----------------------------------------------------------------------------


def cron_local(expr: str, tz: str, start: str, count: int) -> list[str]:
    trigger = CronTrigger(expr, zone(tz))
    t = datetime.fromisoformat(start).timestamp()
    out: list[float] = []
    for _ in range(count):
        at = trigger.first_at_or_after(t)
        assert at is not None
        out.append(at)
        t = at + 0.5
    return local(out, tz)


@pytest.mark.parametrize(
    ("tz", "expr", "start", "expected"),
    [
        # Spring forward: 02:30 does not exist on the day; it runs once, at 03:00.
        (
            "America/New_York", "30 2 * * *", "2026-03-07T00:00:00-05:00",
            ["2026-03-07T02:30:00-05:00", "2026-03-08T03:00:00-04:00", "2026-03-09T02:30:00-04:00"],
        ),
        (
            "Europe/Berlin", "30 2 * * *", "2026-03-28T00:00:00+01:00",
            ["2026-03-28T02:30:00+01:00", "2026-03-29T03:00:00+02:00", "2026-03-30T02:30:00+02:00"],
        ),
        # Lord Howe moves by 30 minutes: 02:15 is skipped and runs at 02:30.
        (
            "Australia/Lord_Howe", "15 2 * * *", "2026-10-03T00:00:00+10:30",
            ["2026-10-03T02:15:00+10:30", "2026-10-04T02:30:00+11:00", "2026-10-05T02:15:00+11:00"],
        ),
        # Fall back: 01:30 happens twice; it runs once, the first time.
        (
            "America/New_York", "30 1 * * *", "2026-10-31T00:00:00-04:00",
            ["2026-10-31T01:30:00-04:00", "2026-11-01T01:30:00-04:00", "2026-11-02T01:30:00-05:00"],
        ),
        (
            "Europe/Berlin", "30 2 * * *", "2026-10-24T00:00:00+02:00",
            ["2026-10-24T02:30:00+02:00", "2026-10-25T02:30:00+02:00", "2026-10-26T02:30:00+01:00"],
        ),
        # Southern hemisphere, fall back in April.
        (
            "Australia/Sydney", "30 2 * * *", "2026-04-04T00:00:00+11:00",
            ["2026-04-04T02:30:00+11:00", "2026-04-05T02:30:00+11:00", "2026-04-06T02:30:00+10:00"],
        ),
    ],
)  # fmt: skip
def test_cron_dst_policy(tz: str, expr: str, start: str, expected: list[str]) -> None:
    assert cron_local(expr, tz, start, 3) == expected


def test_cron_skipped_times_collapse_into_one_run_after_the_gap() -> None:
    got = cron_local("*/15 * * * *", "America/New_York", "2026-03-08T01:30:00-05:00", 4)
    assert got == [
        "2026-03-08T01:30:00-05:00",
        "2026-03-08T01:45:00-05:00",
        "2026-03-08T03:00:00-04:00",  # 02:00, 02:15, 02:30, 02:45 and 03:00: one run
        "2026-03-08T03:15:00-04:00",
    ]


def test_cron_repeated_hour_adds_no_runs() -> None:
    got = cron_local("*/30 * * * *", "Europe/Berlin", "2026-10-25T01:30:00+02:00", 5)
    assert got == [
        "2026-10-25T01:30:00+02:00",
        "2026-10-25T02:00:00+02:00",
        "2026-10-25T02:30:00+02:00",
        "2026-10-25T03:00:00+01:00",  # the second 02:00 and 02:30 (+01:00) do not run
        "2026-10-25T03:30:00+01:00",
    ]


def test_cron_last_at_or_before_inside_the_repeated_hour() -> None:
    trigger = CronTrigger("*/20 * * * *", zone("America/New_York"))
    second_pass = datetime.fromisoformat("2026-11-01T01:30:00-05:00").timestamp()
    last = trigger.last_at_or_before(second_pass)
    assert last is not None
    assert local([last], "America/New_York") == ["2026-11-01T01:20:00-04:00"]


@pytest.mark.parametrize(
    ("tz", "start", "expected"),
    [
        (
            "America/New_York", "2026-03-07T00:00:00-05:00",
            ["2026-03-07T02:30:00-05:00", "2026-03-08T03:00:00-04:00", "2026-03-09T02:30:00-04:00"],
        ),
        (
            "Europe/Berlin", "2026-10-24T00:00:00+02:00",
            ["2026-10-24T02:30:00+02:00", "2026-10-25T02:30:00+02:00", "2026-10-26T02:30:00+01:00"],
        ),
    ],
)  # fmt: skip
def test_cron_runs_once_per_day_across_dst(tz: str, start: str, expected: list[str]) -> None:
    clock = FakeClock(datetime.fromisoformat(start).timestamp())
    runs = Runs(clock)
    with TaskProcessor(workers=1, clock=clock) as processor:
        processor.cron("30 2 * * *", runs, tz=tz)
        for _ in range(3 * 24 * 4):
            advance(processor, clock, 900)
    assert local(runs.nominal, tz) == expected
    assert runs.started == runs.nominal  # steps land on each instant: never late


# --- misfires and overlap -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("misfire", "expected"),
    [
        (Misfire(), [50]),  # default: catch up once, for the latest
        (Misfire(coalesce="earliest"), [10]),
        (Misfire(coalesce=Coalesce.ALL), [10, 20, 30, 40, 50]),
        (Misfire(window=25, coalesce="all"), [30, 40, 50]),
        (Misfire(window=3), []),  # the latest is 5 s late: past its window
    ],
)
def test_misfire_policy(
    tasks: TaskProcessor, clock: FakeClock, misfire: Misfire, expected: list[int]
) -> None:
    runs = Runs(clock)
    tasks.every(10, runs, start=T0 + 10, misfire=misfire)
    advance(tasks, clock, 55)  # asleep through five occurrences
    assert [n - T0 for n in runs.nominal] == expected
    assert all(started == T0 + 55 for started in runs.started)
    advance(tasks, clock, 5)
    assert [n - T0 for n in runs.nominal] == [*expected, 60]  # then back on the beat


def test_max_running_blocks_overlap_then_catches_up_once(
    tasks: TaskProcessor, clock: FakeClock
) -> None:
    release = threading.Event()
    started = threading.Semaphore(0)
    nominal: list[float] = []
    running, peak = [0], [0]
    lock = threading.Lock()

    def slow() -> None:
        context = current()
        assert context.nominal_time is not None
        with lock:
            running[0] += 1
            peak[0] = max(peak[0], running[0])
            nominal.append(context.nominal_time.timestamp() - T0)
        started.release()
        release.wait(WAIT)
        with lock:
            running[0] -= 1

    tasks.every(10, slow, start=T0 + 10, id="slow")
    barrier(tasks, clock, 10)
    assert started.acquire(timeout=WAIT)
    for _ in range(3):
        barrier(tasks, clock, 10)  # occurrences 20, 30, 40 come due while 10 still runs
    (schedule,) = tasks.schedules()
    assert (schedule.running, schedule.runs) == (1, 1)
    release.set()
    assert started.acquire(timeout=WAIT)
    assert tasks.join(timeout=WAIT)
    assert nominal == [10, 40]
    assert peak[0] == 1


def test_max_running_two_allows_two_at_once(tasks: TaskProcessor, clock: FakeClock) -> None:
    release = threading.Event()
    started = threading.Semaphore(0)

    def slow() -> None:
        started.release()
        release.wait(WAIT)

    tasks.every(10, slow, start=T0 + 10, max_running=2)
    clock.advance(10)
    assert started.acquire(timeout=WAIT)
    clock.advance(10)
    assert started.acquire(timeout=WAIT)
    assert tasks.schedules()[0].running == 2
    release.set()


# --- listing and removing -----------------------------------------------------------------------


def test_schedules_and_unschedule(tasks: TaskProcessor, clock: FakeClock) -> None:
    runs = Runs(clock)
    a = tasks.every(10, runs, id="a", start=T0 + 10)
    b = tasks.cron("7 * * * *", runs, tz="Europe/Berlin")
    assert [s.id for s in tasks.schedules()] == ["a", b.id]
    assert a.description.startswith("every 10s")
    assert b.description == "cron 7 * * * * Europe/Berlin"
    with pytest.raises(dibs.InvalidInput) as info:
        tasks.every(5, runs, id="a")
    assert info.value.field == "id"
    assert tasks.unschedule("a") is True
    assert tasks.unschedule("a") is False
    assert [s.id for s in tasks.schedules()] == [b.id]
    advance(tasks, clock, 30)
    assert runs.nominal == []


def test_misfire_rejects_bad_values() -> None:
    with pytest.raises(dibs.InvalidInput):
        Misfire(window=-1)
    with pytest.raises(dibs.InvalidInput):
        Misfire(coalesce="sometimes")
