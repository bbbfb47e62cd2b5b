"""The in-process task processor: ordering, timing, cancellation, retries, timeouts, shutdown.

Time-dependent tests run on a FakeClock and move time by hand; nothing here
asserts on elapsed real time. Real-time waits (``join``, ``result``) carry a
generous timeout only so that a bug fails the test instead of hanging it.
"""

from __future__ import annotations

import asyncio
import pickle
import random
import threading
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pytest

import dibs
from dibs import FakeClock
from dibs.tasks import (
    Backoff,
    CancelReason,
    NotInTask,
    ProcessorClosed,
    TaskCancelled,
    TaskHandle,
    TaskProcessor,
    TaskStatus,
    TaskTimeout,
    WaitTimeout,
    current,
)

QUICK = True  # in `pytest -m quick` (conftest.is_quick: not slow, no server)

T0 = 1_800_000_000.0
WAIT = 10.0  # real seconds; only a hang guard


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(T0)


@pytest.fixture
def tasks(clock: FakeClock) -> Iterator[TaskProcessor]:
    processor = TaskProcessor(workers=2, clock=clock, rng=random.Random(7))
    yield processor
    processor.shutdown(wait=True, timeout=0)


def settle(processor: TaskProcessor) -> None:
    assert processor.join(timeout=WAIT), "processor did not go idle"


def wait_until_cancelled() -> str:
    """A cooperative task: block until told to stop, then stop the documented way."""
    context = current()
    context.token.sleep(WAIT * 10)
    context.raise_if_cancelled()
    return "ignored the token"


# --- running ------------------------------------------------------------------------------


def test_submit_runs_with_args_and_kwargs(tasks: TaskProcessor) -> None:
    handle = tasks.submit(lambda a, b=0: a + b, 2, b=3)
    assert handle.result(timeout=WAIT) == 5
    assert handle.status is TaskStatus.DONE
    assert handle.attempts == 1
    assert handle.exception() is None


def test_coroutine_functions_run_on_the_workers_loop(tasks: TaskProcessor) -> None:
    async def double(x: int) -> tuple[int, str]:
        await asyncio.sleep(0)
        return 2 * x, current().task_id

    handle = tasks.submit(double, 21)
    assert handle.result(timeout=WAIT) == (42, handle.id)


def test_current_outside_a_task_raises() -> None:
    with pytest.raises(NotInTask):
        current()


def test_default_processor_runs_on_the_system_clock() -> None:
    with TaskProcessor(workers=1) as processor:
        assert processor.submit(sum, [1, 2]).result(timeout=WAIT) == 3
        assert processor.submit(sum, [3], delay=0.001).result(timeout=WAIT) == 3


# --- timing and heap order ------------------------------------------------------------------


def test_due_tasks_run_in_due_order_then_submission_order(clock: FakeClock) -> None:
    order: list[int] = []
    dues = [random.Random(1).choice([5, 1, 3, 3, 9, 1]) for _ in range(60)]
    with TaskProcessor(workers=1, clock=clock) as processor:
        for i, due in enumerate(dues):
            processor.submit(order.append, i, at=T0 + due)
        settle(processor)
        assert order == []
        clock.advance(10)
        settle(processor)
    expected = sorted(range(len(dues)), key=lambda i: (dues[i], i))
    assert order == expected


def test_at_and_delay_wait_for_their_time(tasks: TaskProcessor, clock: FakeClock) -> None:
    by_datetime = tasks.submit(str, "dt", at=datetime.fromtimestamp(T0 + 10, UTC))
    by_epoch = tasks.submit(str, "epoch", at=T0 + 10)
    by_delay = tasks.submit(str, "delay", delay=timedelta(seconds=10))
    handles = [by_datetime, by_epoch, by_delay]
    clock.advance(9.999)
    settle(tasks)
    assert [h.status for h in handles] == [TaskStatus.SCHEDULED] * 3
    clock.advance(0.001)
    assert [h.result(timeout=WAIT) for h in handles] == ["dt", "epoch", "delay"]


def test_a_time_in_the_past_runs_at_once(tasks: TaskProcessor) -> None:
    assert tasks.submit(str, "late", at=T0 - 3600).result(timeout=WAIT) == "late"
    assert tasks.submit(str, "now", delay=0).result(timeout=WAIT) == "now"


def test_an_earlier_task_wakes_a_scheduler_sleeping_toward_a_later_one() -> None:
    # Real clock: the scheduler is asleep until the far task is due; only the
    # notify on a new earliest entry can run the near one (else this hangs).
    with TaskProcessor(workers=1) as processor:
        far = processor.submit(str, "far", delay=3600)
        assert processor.submit(str, "near", delay=0.01).result(timeout=WAIT) == "near"
        far.cancel()


# --- cancellation ---------------------------------------------------------------------------


def test_cancelled_scheduled_task_never_runs(tasks: TaskProcessor, clock: FakeClock) -> None:
    ran: list[str] = []
    handle = tasks.submit(ran.append, "x", delay=5)
    assert handle.cancel() is True
    assert handle.cancel() is True or handle.status is TaskStatus.CANCELLED
    clock.advance(10)
    settle(tasks)
    assert ran == []
    assert handle.status is TaskStatus.CANCELLED
    with pytest.raises(TaskCancelled) as info:
        handle.result(timeout=WAIT)
    assert info.value.reason is CancelReason.CANCELLED
    assert info.value.task_id == handle.id


def test_cancelled_queued_task_never_runs(clock: FakeClock) -> None:
    ran: list[str] = []
    release = threading.Event()
    with TaskProcessor(workers=1, clock=clock) as processor:
        blocker = processor.submit(release.wait, WAIT)
        queued = processor.submit(ran.append, "queued")
        assert queued.status is TaskStatus.QUEUED
        assert queued.cancel()
        release.set()
        assert blocker.result(timeout=WAIT) is True
        settle(processor)
    assert ran == []
    assert queued.status is TaskStatus.CANCELLED


def test_cancel_running_sync_task_is_cooperative(tasks: TaskProcessor) -> None:
    started = threading.Event()

    def job() -> str:
        started.set()
        return wait_until_cancelled()

    handle = tasks.submit(job)
    assert started.wait(WAIT)
    assert handle.status is TaskStatus.RUNNING
    assert handle.cancel() is True
    with pytest.raises(TaskCancelled):
        handle.result(timeout=WAIT)
    assert handle.status is TaskStatus.CANCELLED
    assert handle.cancel() is False


def test_cancel_running_coroutine_cancels_it(tasks: TaskProcessor) -> None:
    started = threading.Event()
    cleaned_up = threading.Event()

    async def job() -> None:
        started.set()
        try:
            await asyncio.sleep(WAIT * 10)
        finally:
            cleaned_up.set()

    handle = tasks.submit(job)
    assert started.wait(WAIT)
    handle.cancel()
    with pytest.raises(TaskCancelled):
        handle.result(timeout=WAIT)
    assert cleaned_up.is_set()


def test_running_task_that_finishes_despite_cancel_is_done(tasks: TaskProcessor) -> None:
    started, go_on = threading.Event(), threading.Event()

    def stubborn() -> str:
        started.set()
        go_on.wait(WAIT)
        return "finished anyway"

    handle = tasks.submit(stubborn)
    assert started.wait(WAIT)
    assert handle.cancel()
    go_on.set()
    assert handle.result(timeout=WAIT) == "finished anyway"


def test_cancelled_running_task_is_not_retried(tasks: TaskProcessor) -> None:
    started = threading.Event()

    def fails_when_cancelled() -> None:
        started.set()
        current().token.sleep(WAIT * 10)
        raise RuntimeError("gave up")

    handle = tasks.submit(fails_when_cancelled, retries=5)
    assert started.wait(WAIT)
    handle.cancel()
    assert isinstance(handle.exception(timeout=WAIT), RuntimeError)
    assert handle.attempts == 1


# --- failure, retries, timeouts ------------------------------------------------------------


def test_failed_record_keeps_exception_and_traceback(tasks: TaskProcessor) -> None:
    def broken() -> None:
        raise KeyError("missing")

    handle = tasks.submit(broken)
    error = handle.exception(timeout=WAIT)
    assert isinstance(error, KeyError)
    with pytest.raises(KeyError):
        handle.result()
    assert handle.status is TaskStatus.FAILED
    assert handle.traceback is not None
    assert "broken" in handle.traceback
    assert "KeyError: 'missing'" in handle.traceback


def test_retries_back_off_then_succeed(tasks: TaskProcessor, clock: FakeClock) -> None:
    calls: list[int] = []

    def flaky() -> str:
        calls.append(current().attempt)
        if len(calls) < 3:
            raise ConnectionError("try again")
        return "ok"

    backoff = Backoff(base=4, factor=2, cap=100)
    handle = tasks.submit(flaky, retries=3, backoff=backoff)
    settle(tasks)
    assert calls == [1]
    assert handle.status is TaskStatus.SCHEDULED
    clock.advance(backoff.ceiling(1))  # the longest the first retry can wait
    settle(tasks)
    assert calls == [1, 2]
    clock.advance(backoff.ceiling(2))
    assert handle.result(timeout=WAIT) == "ok"
    assert calls == [1, 2, 3]
    assert handle.attempts == 3


def test_retries_run_out_into_a_failed_record(tasks: TaskProcessor, clock: FakeClock) -> None:
    def always() -> None:
        raise ValueError(f"attempt {current().attempt}")

    handle = tasks.submit(always, retries=2, backoff=Backoff(base=1, jitter=False))
    for _ in range(3):
        settle(tasks)
        clock.advance(10)
    error = handle.exception(timeout=WAIT)
    assert isinstance(error, ValueError)
    assert str(error) == "attempt 3"
    assert handle.attempts == 3


def test_backoff_is_full_jitter_within_exponential_bounds() -> None:
    backoff = Backoff(base=0.5, factor=3, cap=20)
    rng = random.Random(3)
    for retry in range(1, 12):
        ceiling = min(20, 0.5 * 3 ** (retry - 1))
        assert backoff.ceiling(retry) == ceiling
        samples = [backoff.delay(retry, rng) for _ in range(400)]
        assert all(0 <= s <= ceiling for s in samples)
        # Full jitter: spread over the whole range, not bunched near the top.
        assert min(samples) < ceiling * 0.1
        assert max(samples) > ceiling * 0.9
    assert Backoff(cap=7).ceiling(10_000) == 7
    assert Backoff(base=2, jitter=False).delay(3, rng) == 8


def test_timeout_fails_the_attempt(tasks: TaskProcessor, clock: FakeClock) -> None:
    started = threading.Event()

    def job() -> str:
        started.set()
        return wait_until_cancelled()

    handle = tasks.submit(job, timeout=5)
    assert started.wait(WAIT)
    clock.advance(4.9)
    settle_running = handle.wait(timeout=0.05)
    assert not settle_running
    clock.advance(0.1)
    with pytest.raises(TaskTimeout) as info:
        handle.result(timeout=WAIT)
    assert info.value.timeout == 5
    assert handle.status is TaskStatus.FAILED


def test_timeout_is_retried_without_overlapping_attempts(
    tasks: TaskProcessor, clock: FakeClock
) -> None:
    started = threading.Semaphore(0)
    running = [0]
    overlap: list[int] = []

    def job() -> str:
        running[0] += 1
        overlap.append(running[0])
        started.release()
        try:
            if current().attempt == 1:
                current().token.sleep(WAIT * 10)  # cooperative: wakes on timeout
            return f"attempt {current().attempt}"
        finally:
            running[0] -= 1

    handle = tasks.submit(job, timeout=5, retries=1, backoff=Backoff(base=1, jitter=False))
    assert started.acquire(timeout=WAIT)
    clock.advance(5)
    settle(tasks)
    clock.advance(1)
    assert handle.result(timeout=WAIT) == "attempt 2"
    assert overlap == [1, 1]


def test_coroutine_timeout_cancels_it(tasks: TaskProcessor, clock: FakeClock) -> None:
    started = threading.Event()

    async def job() -> None:
        started.set()
        await asyncio.sleep(WAIT * 10)

    handle = tasks.submit(job, timeout=1)
    assert started.wait(WAIT)
    clock.advance(1)
    assert isinstance(handle.exception(timeout=WAIT), TaskTimeout)


def test_a_failing_task_never_kills_a_worker(clock: FakeClock) -> None:
    def raises(kind: type[BaseException]) -> None:
        raise kind("boom")

    with TaskProcessor(workers=1, clock=clock) as processor:
        kinds = (ValueError, SystemExit, KeyboardInterrupt)
        failures = [processor.submit(raises, kind) for kind in kinds]
        assert processor.submit(str, "alive").result(timeout=WAIT) == "alive"
    assert [type(h.exception()) for h in failures] == list(kinds)


def test_result_wait_timeout_is_typed(tasks: TaskProcessor) -> None:
    handle = tasks.submit(str, "later", delay=60)
    with pytest.raises(WaitTimeout) as info:
        handle.result(timeout=0.01)
    assert isinstance(info.value, TimeoutError)
    assert info.value.task_id == handle.id


# --- keys ------------------------------------------------------------------------------------


def test_key_returns_the_live_task(tasks: TaskProcessor, clock: FakeClock) -> None:
    first = tasks.submit(str, "first", key="report", delay=5)
    second = tasks.submit(str, "second", key="report")
    assert second is first
    clock.advance(5)
    assert first.result(timeout=WAIT) == "first"
    third = tasks.submit(str, "third", key="report")
    assert third is not first
    assert third.result(timeout=WAIT) == "third"


def test_key_is_free_again_after_cancel(tasks: TaskProcessor) -> None:
    first = tasks.submit(str, "first", key="k", delay=5)
    first.cancel()
    again = tasks.submit(str, "again", key="k")
    assert again is not first
    assert again.result(timeout=WAIT) == "again"


# --- shutdown --------------------------------------------------------------------------------


def test_shutdown_drains_submitted_work() -> None:
    done: list[int] = []
    processor = TaskProcessor(workers=2)
    for i in range(50):
        processor.submit(done.append, i)
    processor.shutdown(wait=True)
    assert sorted(done) == list(range(50))
    with pytest.raises(ProcessorClosed):
        processor.submit(done.append, 99)
    assert processor.join(timeout=WAIT)


def test_shutdown_drains_timed_tasks_and_retries_until_the_deadline(clock: FakeClock) -> None:
    processor = TaskProcessor(workers=1, clock=clock)
    soon = processor.submit(str, "soon", delay=5)
    late = processor.submit(str, "late", delay=50)
    stopper = threading.Thread(target=processor.shutdown, kwargs={"timeout": 20})
    stopper.start()
    settle(processor)
    clock.advance(5)
    assert soon.result(timeout=WAIT) == "soon"
    clock.advance(15)
    stopper.join(WAIT)
    assert not stopper.is_alive()
    with pytest.raises(TaskCancelled) as info:
        late.result(timeout=WAIT)
    assert info.value.reason is CancelReason.SHUTDOWN


def test_shutdown_deadline_cancels_running_and_queued(clock: FakeClock) -> None:
    started = threading.Event()

    def job() -> str:
        started.set()
        return wait_until_cancelled()

    processor = TaskProcessor(workers=1, clock=clock)
    running = processor.submit(job)
    assert started.wait(WAIT)
    queued = processor.submit(str, "never")
    processor.every(1, str, "tick")
    processor.shutdown(wait=False, timeout=10)
    assert processor.schedules() == []
    with pytest.raises(ProcessorClosed):
        processor.every(1, str)
    clock.advance(10)
    processor.shutdown(wait=True)
    for handle in (running, queued):
        with pytest.raises(TaskCancelled) as info:
            handle.result(timeout=WAIT)
        assert info.value.reason is CancelReason.SHUTDOWN
    assert queued.attempts == 0


def test_shutdown_inside_a_task_does_not_wait_for_itself() -> None:
    processor = TaskProcessor(workers=1)
    handle = processor.submit(lambda: processor.shutdown(wait=True))
    assert handle.result(timeout=WAIT) is None
    processor.shutdown(wait=True)


# --- heap hygiene and stress ------------------------------------------------------------------


def test_cancelled_entries_are_compacted_away(tasks: TaskProcessor, clock: FakeClock) -> None:
    handles = [tasks.submit(str, i, delay=1000 + i) for i in range(2000)]
    for handle in handles[:1900]:
        handle.cancel()
    assert len(tasks._engine._heap) <= 1000
    clock.advance(3000)
    assert [h.result(timeout=WAIT) for h in handles[1900:]] == [str(i) for i in range(1900, 2000)]


def test_concurrent_submit_and_cancel_keep_every_promise() -> None:
    ran: dict[str, int] = {}
    lock = threading.Lock()

    def job() -> None:
        context = current()
        with lock:
            ran[context.task_id] = ran.get(context.task_id, 0) + 1

    handles: list[TaskHandle[None]] = []
    seen_cancelled: list[TaskHandle[None]] = []
    handles_lock = threading.Lock()

    def client(seed: int) -> None:
        rng = random.Random(seed)
        for _ in range(400):
            handle = processor.submit(job, delay=rng.choice([0, 0, 0.001, 0.002]))
            if rng.random() < 0.5 and handle.cancel() and handle.status is TaskStatus.CANCELLED:
                with handles_lock:
                    seen_cancelled.append(handle)
            with handles_lock:
                handles.append(handle)

    with TaskProcessor(workers=4) as processor:
        clients = [threading.Thread(target=client, args=(i,)) for i in range(6)]
        for thread in clients:
            thread.start()
        for thread in clients:
            thread.join()
    assert seen_cancelled
    for handle in seen_cancelled:
        # Finished is final: a task once seen cancelled never runs afterwards.
        assert handle.status is TaskStatus.CANCELLED
        assert handle.id not in ran
    for handle in handles:
        assert handle.done()
        assert ran.get(handle.id, 0) == handle.attempts == (handle.status is TaskStatus.DONE)
    engine = processor._engine
    assert engine.live == {} and engine.keys == {}


# --- input checks -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("call", "field"),
    [
        (lambda p: p.submit(42), "fn"),
        (lambda p: p.submit(str, retries=-1), "retries"),
        (lambda p: p.submit(str, timeout=0), "timeout"),
        (lambda p: p.submit(str, backoff="fast"), "backoff"),
        (lambda p: p.submit(str, key=""), "key"),
        (lambda p: p.submit(str, at=datetime(2030, 1, 1)), "at"),
        (lambda p: p.submit(str, at=T0, delay=1), "delay"),
        (lambda p: p.submit(str, delay=-1), "delay"),
        (lambda p: p.every(0, str), "interval"),
        (lambda p: p.every(1, str, max_running=0), "max_running"),
        (lambda p: p.cron("not cron", str), "expr"),
        (lambda p: p.cron("0 0 30 2 *", str), "expr"),
        (lambda p: p.cron("0 3 * * *", str, tz="Mars/Olympus"), "tz"),
        (lambda p: p.shutdown(timeout=-1), "timeout"),
    ],
)
def test_bad_input_is_invalid_input(tasks: TaskProcessor, call: object, field: str) -> None:
    with pytest.raises(dibs.InvalidInput) as info:
        call(tasks)  # type: ignore[operator]
    assert info.value.field == field


def test_bad_processor_arguments() -> None:
    with pytest.raises(dibs.InvalidInput) as info:
        TaskProcessor(workers=0)
    assert info.value.field == "workers"


def test_fake_clock_calls_subscribers_after_every_advance() -> None:
    clock = FakeClock(T0)
    seen: list[float] = []
    lock = threading.Lock()

    def heard() -> None:
        with lock:
            seen.append(clock.now())

    unsubscribe = clock.subscribe(heard)
    threads = [
        threading.Thread(target=lambda: [clock.advance(1) for _ in range(100)]) for _ in range(4)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert clock.now() == T0 + 400 and len(seen) == 400  # one call per advance, none lost
    assert all(t > T0 for t in seen)  # called after the move, never before
    unsubscribe()
    clock.advance(1)
    assert len(seen) == 400


def test_task_errors_pickle_with_their_facts() -> None:
    for error in (
        TaskCancelled("c", task_id="t-1", reason=CancelReason.SHUTDOWN),
        TaskTimeout("t", task_id="t-2", timeout=1.5),
        WaitTimeout("w", task_id="t-3", timeout=0.1),
    ):
        copy = pickle.loads(pickle.dumps(error))
        assert type(copy) is type(error)
        assert copy.task_id == error.task_id  # type: ignore[attr-defined]
        assert isinstance(copy, dibs.DibsError)
