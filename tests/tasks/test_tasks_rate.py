"""``@tasks.task(rate=...)`` on every store with a job table: a job over the rate waits.

Time is a FakeClock shared by the store and the processors, so each run's time
is the store's exact time; real-time waits only guard against hangs.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator

import pytest

from conftest import StoreMaker, kinds_offering
from dibs import FakeClock, InvalidInput, Rate, RateLimit, Store
from dibs.tasks import TaskProcessor
from windows import over_limit

T0 = 1_800_000_000.0
GUARD = 30.0


@pytest.fixture(params=kinds_offering("job_table"))
def store_kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def wait_for(condition: Callable[[], object]) -> None:
    deadline = time.monotonic() + GUARD
    while not condition():
        assert time.monotonic() < deadline, "condition never became true"
        time.sleep(0.01)


class Hosts:
    """Processors on one store, each registering the rate-limited task ``send``."""

    def __init__(self, store: Store, clock: FakeClock) -> None:
        self.store, self.clock = store, clock
        self.runs: list[tuple[float, str]] = []
        self._lock = threading.Lock()
        self.up: list[TaskProcessor] = []

    def host(self, rate: str = "3/10s", rate_key: str | None = None) -> TaskProcessor:
        processor = TaskProcessor(
            store=self.store, clock=self.clock, workers=4, lease=30, poll=0.01, sweep_every=None
        )

        @processor.task("send", rate=rate, rate_key=rate_key)
        def send(n: int) -> int:
            with self._lock:
                self.runs.append((self.clock.now(), str(n)))
            return n

        self.up.append(processor)
        return processor

    def ran(self) -> int:
        with self._lock:
            return len(self.runs)

    def down(self) -> None:
        for processor in self.up:
            processor.shutdown(timeout=GUARD)


@pytest.fixture
def hosts(make_store: StoreMaker) -> Iterator[Hosts]:
    clock = FakeClock(T0)
    h = Hosts(make_store(clock), clock)
    yield h
    h.down()


def test_jobs_over_the_rate_are_deferred_not_failed(hosts: Hosts) -> None:
    a, b = hosts.host(), hosts.host()
    jobs = [(a if n % 2 else b).enqueue("send", n) for n in range(7)]

    def states() -> list[str]:
        return [r.state for r in (a.job(j) for j in jobs) if r is not None]

    def deferred() -> int:
        records = [r for r in map(a.job, jobs) if r is not None and r.state == "pending"]
        return sum(r.run_at.timestamp() > hosts.clock.now() for r in records)

    wait_for(lambda: hosts.ran() == 3 and deferred() == 4)
    due: list[float] = []
    for job in jobs:
        record = a.job(job)
        assert record is not None and record.error is None and record.attempt == 1
        if record.state == "pending":
            # Put back uncounted, due when the first admission's slot ends, and up to a
            # quarter of the wait later, each at its own time (not all at once).
            assert [a.outcome_kind for a in record.attempts] == ["put_back"]
            due.append(record.run_at.timestamp())
    assert all(T0 + 10 - 1e-3 <= t <= T0 + 12.5 + 1e-3 for t in due), due
    assert len(set(due)) == len(due) == 4, due
    hosts.clock.advance(12.5)
    wait_for(lambda: hosts.ran() == 6 and deferred() == 1)
    hosts.clock.advance(12.5)
    wait_for(lambda: states() == ["done"] * 7)
    assert sorted(n for _, n in hosts.runs) == [str(n) for n in range(7)]
    runs = [(round(t * 1_000_000), 1) for t, _ in hosts.runs]
    assert over_limit(runs, 3, 10_000_000) == []
    assert [t - T0 for t, _ in sorted(hosts.runs)] == [0, 0, 0, 12.5, 12.5, 12.5, 25]


def test_a_rate_key_shares_the_limit_with_other_callers(hosts: Hosts) -> None:
    outside = RateLimit(hosts.store, "mail-provider", "3/10s")
    assert outside.acquire(cost=2)
    host = hosts.host(rate_key="mail-provider")
    jobs = [host.enqueue("send", n) for n in range(2)]
    wait_for(lambda: hosts.ran() == 1)
    wait_for(
        lambda: (
            sum(
                r.state == "pending" and r.run_at.timestamp() > hosts.clock.now()
                for r in map(host.job, jobs)
                if r is not None
            )
            == 1
        )
    )
    assert not outside.acquire()
    hosts.clock.advance(12.5)  # past the deferral's spread (up to a quarter of the wait)
    wait_for(lambda: hosts.ran() == 2)


def test_a_rate_key_may_be_a_function_of_the_jobs_arguments(hosts: Hosts) -> None:
    processor = TaskProcessor(
        store=hosts.store, clock=hosts.clock, workers=4, lease=30, poll=0.01, sweep_every=None
    )
    hosts.up.append(processor)

    @processor.task("per-customer", rate="1/10s", rate_key=lambda customer, n: f"sms-{customer}")
    def per_customer(customer: str, n: int) -> str:
        with hosts._lock:
            hosts.runs.append((hosts.clock.now(), f"{customer}{n}"))
        return customer

    jobs = [processor.enqueue("per-customer", c, n) for n in range(2) for c in ("acme", "zeta")]
    wait_for(lambda: hosts.ran() == 2)  # one per customer: each key has its own limit
    assert sorted(n[:4] for _, n in hosts.runs) == ["acme", "zeta"]
    assert not RateLimit(hosts.store, "sms-acme", "1/10s").acquire()  # the key it drew on
    hosts.clock.advance(12.5)
    wait_for(lambda: all((r := processor.job(j)) is not None and r.state == "done" for j in jobs))
    assert hosts.ran() == 4


def test_a_rate_key_function_that_fails_fails_the_attempt(hosts: Hosts) -> None:
    processor = TaskProcessor(
        store=hosts.store, clock=hosts.clock, workers=2, lease=30, poll=0.01, sweep_every=None
    )
    hosts.up.append(processor)
    processor.task("bad-key", rate="5/s", rate_key=lambda n: {"not": "a name"}[n])(print)
    job = processor.enqueue("bad-key", "missing")
    wait_for(lambda: (r := processor.job(job)) is not None and r.state == "failed")
    record = processor.job(job)
    assert record is not None and "KeyError" in (record.error or "")


def test_a_job_taken_while_shutting_down_spends_no_rate_unit(hosts: Hosts) -> None:
    host = hosts.host(rate="2/10s")
    runner = host._durable
    assert runner is not None
    runner.stop_taking()  # as a shutdown does first
    job_id = host.enqueue("send", 1)
    (job,) = runner.jobs.take(None, 1, 30.0, runner.holder)
    # A refill in flight when the shutdown began: the job is put back before the
    # limit is asked, so no unit is spent for a start that would not happen.
    assert not runner._rate_allows(runner.tasks["send"], job)
    record = host.job(job_id)
    assert record is not None and record.state == "pending"
    outside = RateLimit(hosts.store, "send", "2/10s")
    assert outside.acquire(cost=2)  # both units still there


@pytest.mark.parametrize(
    ("options", "field"),
    [
        ({"rate": "0/s"}, "rate"),
        ({"rate": "10/fortnight"}, "rate"),
        ({"rate": 10}, "rate"),
        ({"rate": "10/s", "rate_key": ""}, "rate_key"),
        ({"rate": "10/s", "rate_key": "\ud800"}, "rate_key"),
        ({"rate_key": "k"}, "rate_key"),
    ],
)
def test_bad_rate_options_are_refused_by_name(
    hosts: Hosts, options: dict[str, object], field: str
) -> None:
    processor = TaskProcessor(store=hosts.store, clock=hosts.clock, sweep_every=None)
    hosts.up.append(processor)
    with pytest.raises(InvalidInput) as caught:
        processor.task("bad", **options)(print)  # type: ignore[arg-type]
    assert caught.value.field == field


def test_a_rate_is_parsed_once_at_registration(hosts: Hosts) -> None:
    processor = TaskProcessor(store=hosts.store, clock=hosts.clock, sweep_every=None)
    hosts.up.append(processor)
    processor.task("ok", rate=Rate(5, 1.0))(print)
    processor.task("ok2", rate="5 per second")(print)
