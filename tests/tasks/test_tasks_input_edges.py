"""The task surface's edges: every argument outside the domain is ``InvalidInput``.

Found by sweeping every argument of ``TaskProcessor`` with odd values: an int
past Python's int-to-str digit limit raised a bare ``ValueError`` while the
error message was being written (or ``OverflowError`` converting it), a due
time past year 9999 was stored and then broke every read of the job, a huge
lease killed the heartbeat thread, a huge ``workers`` ran out of memory, and a
refused option left the processor's threads running. Only the sync face:
``dibs.aio`` has no task processor.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest

import dibs
from conftest import StoreMaker, kinds_offering
from dibs import InvalidInput, Store
from dibs.tasks import Backoff, Misfire, TaskProcessor

GUARD = 60.0
HUGE = 10**5000  # past the int -> str digit limit (4300 digits by default)


@pytest.fixture(params=kinds_offering("job_table"))
def store_kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def store(make_store: StoreMaker) -> Store:
    return make_store()


@pytest.fixture
def client(store: Store) -> Iterator[TaskProcessor]:
    processor = TaskProcessor(store=store, take_jobs=False, sweep_every=None)

    @processor.task("t")
    def t(*args: Any, **kwargs: Any) -> None:
        return None

    yield processor
    processor.shutdown(timeout=GUARD)


def _calls(p: TaskProcessor, bad: object) -> dict[str, Callable[[], object]]:
    """Every call of the task surface with ``bad`` in one argument."""
    b: Any = bad
    return {
        "enqueue at": lambda: p.enqueue("t", at=b),
        "enqueue delay": lambda: p.enqueue("t", delay=b),
        "enqueue key": lambda: p.enqueue("t", key=b),
        "enqueue queue": lambda: p.enqueue("t", queue=b),
        "enqueue priority": lambda: p.enqueue("t", priority=b),
        "enqueue lock_key": lambda: p.enqueue("t", lock_key=b),
        "enqueue retention": lambda: p.enqueue("t", retention=b),
        "enqueue task": lambda: p.enqueue(b),
        "enqueue_many calls": lambda: p.enqueue_many("t", b),
        "enqueue_many call": lambda: p.enqueue_many("t", [b]),
        "result job_id": lambda: p.result(b, timeout=0),
        "result timeout": lambda: p.result("j-x", timeout=b),
        "wait timeout": lambda: p.wait("j-x", timeout=b),
        "cancel": lambda: p.cancel(b),
        "job": lambda: p.job(b),
        "retry": lambda: p.retry(b),
        "jobs limit": lambda: p.jobs(limit=b),
        "jobs task": lambda: p.jobs(task=b),
        "task name": lambda: p.task(b)(lambda: None),
        "task retries": lambda: p.task("t2", retries=b),
        "task backoff": lambda: p.task("t2", backoff=b),
        "task timeout": lambda: p.task("t2", timeout=b),
        "task priority": lambda: p.task("t2", priority=b),
        "task retention": lambda: p.task("t2", retention=b),
        "every interval": lambda: p.every(b, "t"),
        "every start": lambda: p.every(60, "t", start=b),
        "every id": lambda: p.every(60, "t", id=b),
        "cron expr": lambda: p.cron(b, "t"),
        "cron tz": lambda: p.cron("* * * * *", "t", tz=b),
        "submit delay": lambda: p.submit(lambda: None, delay=b),
        "join timeout": lambda: p.join(timeout=b),
        "shutdown timeout": lambda: TaskProcessor(sweep_every=None).shutdown(timeout=b),
        "Backoff base": lambda: Backoff(base=b),
        "Backoff factor": lambda: Backoff(factor=b),
    }


@pytest.mark.parametrize("bad", [HUGE, -HUGE], ids=["huge", "-huge"])
def test_an_int_past_the_digit_limit_is_invalid_input_everywhere(
    client: TaskProcessor, bad: int
) -> None:
    """Before: ValueError ("Exceeds the limit (4300 digits)") from the message's repr, or
    OverflowError from float(); never the typed error."""
    leaked = {}
    for name, call in _calls(client, bad).items():
        try:
            call()
        except InvalidInput:
            pass
        except Exception as exc:  # the point: nothing but InvalidInput
            leaked[name] = type(exc).__name__
        else:
            leaked[name] = "accepted"
    assert leaked == {}


@pytest.mark.parametrize(
    "bad",
    [
        1e308,
        -1e308,
        datetime(9999, 12, 31, 23, tzinfo=timezone(-timedelta(hours=23))),  # past year 9999
        datetime(1, 1, 1, tzinfo=timezone(timedelta(hours=23))),  # before year 1
    ],
    ids=["1e308", "-1e308", "after-9999", "before-1"],
)
def test_a_due_time_outside_the_years_1_to_9999_is_refused(
    client: TaskProcessor, bad: object
) -> None:
    """Before: ``at=1e308`` was stored, and every read of the job (``job``, ``jobs``,
    ``wait``) then raised OverflowError converting it to a datetime."""
    with pytest.raises(InvalidInput) as raised:
        client.enqueue("t", at=bad)
    assert raised.value.field == "at"
    assert client.jobs() == []


def test_the_latest_due_time_is_accepted_and_reads_back(client: TaskProcessor) -> None:
    last = datetime(9999, 12, 30, tzinfo=UTC)
    job_id = client.enqueue("t", at=last)
    record = client.job(job_id)
    assert record is not None and record.run_at == last
    assert [r.id for r in client.jobs()] == [job_id]


def _dibs_threads() -> set[threading.Thread]:
    return {t for t in threading.enumerate() if t.name.startswith("dibs")}


@pytest.mark.parametrize(
    "options",
    [
        {"lease": 1e308},  # before: the heartbeat thread died of OverflowError
        {"lease": "x"},
        {"poll": HUGE},
        {"sweep_every": -1},
        {"queues": []},
        {"workers": 2**63},  # before: MemoryError, building 2**63 threads
        {"async_workers": 2**70},
        {"workers": 0},
    ],
    ids=lambda options: next(iter(options)),
)
def test_a_refused_option_leaves_no_thread_behind(store: Store, options: dict[str, Any]) -> None:
    """Before: the scheduler and worker threads started before lease, poll, sweep_every
    and queues were checked, and ran on after the InvalidInput."""
    before = _dibs_threads()
    with pytest.raises(InvalidInput) as raised:
        TaskProcessor(store=store, **options)
    assert raised.value.field in options
    assert _dibs_threads() <= before


def test_an_interval_below_a_microsecond_is_refused(client: TaskProcessor) -> None:
    """Before: ``every(1e-320)`` raised OverflowError (its occurrences overflowed)."""
    for bad in (1e-320, 1e-7, timedelta(0)):
        with pytest.raises(InvalidInput) as raised:
            client.every(bad, "t")
        assert raised.value.field == "interval"
    schedule = client.every(1e-6, "t", id="fast")
    assert client.unschedule(schedule.id)


@pytest.mark.parametrize(
    "bad", ["x", [], object(), -1, float("nan")], ids=["x", "list", "object", "-1", "nan"]
)
def test_join_checks_its_timeout(client: TaskProcessor, bad: object) -> None:
    """Before: ``join(timeout="x")`` raised TypeError from a subtraction."""
    with pytest.raises(InvalidInput) as raised:
        client.join(timeout=bad)  # type: ignore[arg-type]
    assert raised.value.field == "timeout"


@pytest.mark.parametrize("store_kind", ["memory", "sqlite", "postgresql", "etcd"])
def test_the_core_refuses_a_huge_int_with_invalid_input(store: Store) -> None:
    """The same bug in the claim path's checks (their messages): a ttl, a span bound or a
    target list holding an int past the digit limit raised ValueError."""
    unit = dibs.Unit("seat", "show")
    for call in (
        lambda: store.claim(unit, holder="h", ttl=HUGE),
        lambda: store.claim(dibs.Span("room", 0, HUGE), holder="h", ttl=10),
        lambda: store.claim([unit, HUGE], holder="h", ttl=10),  # type: ignore[list-item]
        lambda: store.claim(unit, holder=HUGE, ttl=10),  # type: ignore[arg-type]
    ):
        with pytest.raises(InvalidInput):
            call()
    assert store.holder_of(unit) is None


def test_retries_beyond_a_million_are_refused(client: TaskProcessor) -> None:
    """Before: ``retries=2**63`` was accepted, and the first enqueue failed with the driver's
    OverflowError writing ``max_attempts`` to a 64-bit column."""
    for bad in (2**63, 1_000_001, HUGE):
        with pytest.raises(InvalidInput) as raised:
            client.task("many", retries=bad)
        assert raised.value.field == "retries"
    client.task("many", retries=1_000_000)(lambda: None)
    assert client.enqueue("many").startswith("j-")


def test_a_huge_misfire_window_or_max_running_means_no_limit(client: TaskProcessor) -> None:
    """Past any real number, these are comparisons only: accepted, and harmless."""
    schedule = client.every(60, "t", id="w", misfire=Misfire(window=HUGE), max_running=HUGE)
    assert client.unschedule(schedule.id)


@pytest.mark.parametrize("bad", ["1e12", "inf", "-1", "soon"])
def test_dibs_worker_checks_its_drain_timeout_when_it_starts(
    bad: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """Before: ``--timeout 1e12`` was accepted, and shutdown() refused it at SIGTERM, so the
    worker stopped without draining; now it exits 2 at once, with shutdown()'s message."""
    from dibs.cli import main

    with pytest.raises(SystemExit) as exited:
        main(["worker", "--app", "no_such_module:processor", "--timeout", bad])
    assert exited.value.code == 2
    assert "argument --timeout: expected seconds from 0 to" in capsys.readouterr().err
