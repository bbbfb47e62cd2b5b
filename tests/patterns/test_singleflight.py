"""SingleFlight and AsyncSingleFlight: one execution per key per flight, outcomes shared."""

from __future__ import annotations

import asyncio
import copy
import random
import threading
import time
import traceback
from collections import Counter
from typing import Any

import pytest

from dibs import AsyncSingleFlight, DibsError, FlightResult, InvalidInput, SingleFlight
from eventually import eventually

QUICK = True  # in `pytest -m quick` (conftest.is_quick: not slow, no server)


class Ticker:
    """A hand-moved monotonic clock for cache TTLs."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


# --- threads -------------------------------------------------------------------------------------


def test_concurrent_callers_share_one_execution() -> None:
    flight = SingleFlight()
    release = threading.Event()
    runs: list[int] = []

    def work() -> dict[str, int]:
        runs.append(1)
        release.wait()
        return {"answer": 42}

    results: list[FlightResult[dict[str, int]]] = []
    threads = [
        threading.Thread(target=lambda: results.append(flight.call("k", work))) for _ in range(32)
    ]
    for t in threads:
        t.start()
    # Every caller has joined the flight before the leader is allowed to finish.
    eventually(lambda: flight.in_flight("k") == 32, "callers joined the flight")
    release.set()
    for t in threads:
        t.join()
    assert len(runs) == 1
    assert [r.shared for r in results].count(False) == 1
    assert all(r.value == {"answer": 42} for r in results)
    assert flight.in_flight("k") == 0


def test_many_keys_many_rounds_never_overlap_a_key() -> None:
    flight = SingleFlight(copy=None)
    guard = threading.Lock()
    active: Counter[str] = Counter()
    executions: Counter[str] = Counter()
    tokens: dict[str, set[int]] = {}
    overlaps: list[str] = []
    counter = iter(range(10**9))
    keys = [f"k{i}" for i in range(6)]

    def work(key: str) -> tuple[str, int]:
        with guard:
            active[key] += 1
            if active[key] > 1:
                overlaps.append(key)
            executions[key] += 1
            token = next(counter)
            tokens.setdefault(key, set()).add(token)
        time.sleep(0)  # let other callers pile onto the flight
        with guard:
            active[key] -= 1
        return key, token

    leads: Counter[str] = Counter()
    bad: list[Any] = []

    def caller(seed: int) -> None:
        rng = random.Random(seed)
        for _ in range(400):
            key = rng.choice(keys)
            result = flight.call(key, work, key)
            got_key, token = result.value
            if got_key != key:
                bad.append((key, result))
            with guard:
                if not result.shared:
                    leads[key] += 1
                if token not in tokens[key]:
                    bad.append((key, result))

    threads = [threading.Thread(target=caller, args=(i,)) for i in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not overlaps, "two executions of one key ran at once"
    assert not bad
    # One leader per execution: every other caller shared a flight's result.
    assert leads == executions
    assert sum(executions.values()) < 16 * 400


def test_leader_exception_is_raised_in_every_caller_and_not_cached() -> None:
    flight = SingleFlight(ttl=60)
    release = threading.Event()
    runs: list[int] = []

    def fail() -> int:
        runs.append(1)
        release.wait()
        raise KeyError("boom")

    errors: list[BaseException] = []

    def caller() -> None:
        try:
            flight.do("k", fail)
        except KeyError as exc:
            errors.append(exc)

    threads = [threading.Thread(target=caller) for _ in range(8)]
    for t in threads:
        t.start()
    eventually(lambda: flight.in_flight("k") == 8, "callers joined the flight")
    release.set()
    for t in threads:
        t.join()
    assert len(runs) == 1 and len(errors) == 8
    assert flight.do("k", lambda: 7) == 7  # the failure was not remembered


class Refused(ValueError):
    """What the shared work raises in the traceback tests."""


def _depth(tb: Any) -> int:
    return len(traceback.extract_tb(tb))


def _nest(depth: int, fn: Any) -> Any:
    # Each caller goes through its own number of frames, so frames another
    # caller's re-raise added to a shared traceback show up in the count.
    return fn() if depth == 0 else _nest(depth - 1, fn)


def test_every_waiter_raises_its_own_copy_with_its_own_traceback() -> None:
    flight = SingleFlight()
    release = threading.Event()

    def fail() -> int:
        release.wait()
        try:
            raise KeyError("cause")
        except KeyError as cause:
            raise Refused("no", 7) from cause

    errors: dict[int, BaseException] = {}

    def caller(i: int) -> None:
        try:
            _nest(i, lambda: flight.do("k", fail))
        except ValueError as exc:  # the type is kept: except clauses work as without sharing
            errors[i] = exc

    threads = [threading.Thread(target=caller, args=(i,)) for i in range(16)]
    for t in threads:
        t.start()
    eventually(lambda: flight.in_flight("k") == 16, "callers joined the flight")
    release.set()
    for t in threads:
        t.join()
    assert len({id(e) for e in errors.values()}) == 16  # no object shared by two callers
    # caller, i + 1 _nest frames, the lambda, do, call, fail: the leader's own raise.
    leader = [i for i, e in errors.items() if _depth(e.__traceback__) == i + 6]
    assert len(leader) == 1
    for i, exc in errors.items():
        assert type(exc) is Refused and exc.args == ("no", 7)
        assert isinstance(exc.__cause__, KeyError) and exc.__suppress_context__
        frames = [f.name for f in traceback.extract_tb(exc.__traceback__)]
        assert frames.count("_nest") == i + 1, frames  # only this caller's own frames
        assert frames[-1] == "fail"  # and where the work failed
        if i not in leader:  # its own path to _wait, then the leader's from its call down
            assert _depth(exc.__traceback__) == i + 8, frames
        text = traceback.format_exception(exc)
        assert text == traceback.format_exception(exc)  # stable: nothing else re-raises it


def test_an_exception_that_cannot_be_copied_is_still_raised_in_every_waiter() -> None:
    class Odd(Exception):
        def __init__(self, a: int, b: int) -> None:  # copy.copy calls Odd("a+b"): fails
            super().__init__(f"{a}+{b}")

    flight = SingleFlight()
    release = threading.Event()

    def fail() -> int:
        release.wait()
        raise Odd(1, 2)

    seen: list[BaseException] = []

    def caller() -> None:
        try:
            flight.do("k", fail)
        except Odd as exc:
            seen.append(exc)

    threads = [threading.Thread(target=caller) for _ in range(4)]
    for t in threads:
        t.start()
    eventually(lambda: flight.in_flight("k") == 4, "callers joined the flight")
    release.set()
    for t in threads:
        t.join()
    assert len(seen) == 4 and all(e.args == ("1+2",) for e in seen)


def test_base_exception_in_leader_does_not_strand_waiters() -> None:
    flight = SingleFlight()
    release = threading.Event()

    class Interrupted(BaseException):
        pass

    def interrupted() -> int:
        release.wait()
        raise Interrupted

    seen: list[str] = []

    def caller() -> None:
        try:
            flight.do("k", interrupted)
        except Interrupted:
            seen.append("raised")

    threads = [threading.Thread(target=caller) for _ in range(4)]
    for t in threads:
        t.start()
    eventually(lambda: flight.in_flight("k") == 4, "callers joined the flight")
    release.set()
    for t in threads:
        t.join()
    assert seen == ["raised"] * 4


def test_waiters_and_cache_hits_get_copies_leader_gets_original() -> None:
    clock = Ticker()
    flight = SingleFlight(ttl=10, clock=clock)
    original = {"rows": [1, 2]}
    first = flight.call("k", lambda: original)
    assert first.value is original and not first.shared
    hit = flight.call("k", lambda: {"rows": ["not run"]})
    assert hit.shared and hit.cached and hit.value == {"rows": [1, 2]}
    hit.value["rows"].append(99)
    original["rows"].append(100)
    assert flight.do("k", lambda: {}) == {"rows": [1, 2]}
    clock.now += 10
    assert flight.call("k", lambda: {"rows": []}).value == {"rows": []}


def test_copy_none_shares_one_object() -> None:
    flight = SingleFlight(ttl=10, copy=None)
    value = [1]
    assert flight.do("k", lambda: value) is value
    assert flight.do("k", lambda: [2]) is value


def test_forget_detaches_the_flight_and_drops_the_cache() -> None:
    flight = SingleFlight(ttl=60, copy=None)
    release = threading.Event()
    old: list[str] = []

    def slow() -> str:
        release.wait()
        return "old"

    waiter = threading.Thread(target=lambda: old.append(flight.do("k", slow)))
    waiter.start()
    eventually(lambda: flight.in_flight("k") == 1, "callers joined the flight")
    flight.forget("k")
    assert flight.in_flight("k") == 0
    assert flight.do("k", lambda: "new") == "new"  # a new flight, not a wait on the old one
    release.set()
    waiter.join()
    assert old == ["old"]
    # The detached flight's result did not replace the newer cached one.
    assert flight.do("k", lambda: "never") == "new"
    flight.forget("k")
    assert flight.do("k", lambda: "fresh") == "fresh"


def test_publish_is_idempotent() -> None:
    flight = SingleFlight(copy=None)
    from dibs.singleflight import _ThreadFlight

    entry = _ThreadFlight()
    entry.callers = 2
    flight._flights["k"] = entry
    assert flight._publish("k", entry, "value", None) is True
    # A safety net publishing a failure afterwards must not overwrite the value.
    assert flight._publish("k", entry, "ignored", RuntimeError("late")) is False
    assert entry.stored == "value" and entry.error is None


def test_failing_copy_publishes_the_failure_not_a_half_result() -> None:
    def refuse(value: object) -> object:
        raise TypeError("cannot copy")

    flight = SingleFlight(copy=refuse)
    with pytest.raises(TypeError):
        flight.do("k", lambda: 1)
    assert flight.in_flight("k") == 0


@pytest.mark.parametrize("ttl", [0, -1, float("inf"), float("nan"), True, "5"])
def test_bad_ttl_is_refused(ttl: Any) -> None:
    with pytest.raises(InvalidInput) as info:
        SingleFlight(ttl=ttl)
    assert isinstance(info.value, DibsError) and info.value.field == "ttl"


def test_args_and_kwargs_are_passed() -> None:
    flight = SingleFlight()
    assert flight.do("k", lambda a, *, b: a + b, 1, b=2) == 3


# --- asyncio -------------------------------------------------------------------------------------


def test_async_tasks_share_one_execution_per_key() -> None:
    async def main() -> None:
        flight: AsyncSingleFlight = AsyncSingleFlight(copy=None)
        runs: Counter[str] = Counter()
        gate = asyncio.Event()

        async def work(key: str) -> str:
            runs[key] += 1
            await gate.wait()
            return key.upper()

        keys = [f"k{i % 5}" for i in range(500)]
        tasks = [asyncio.create_task(flight.call(k, work, k)) for k in keys]
        while sum(flight.in_flight(f"k{i}") for i in range(5)) < 500:
            await asyncio.sleep(0)
        gate.set()
        results = await asyncio.gather(*tasks)
        assert runs == Counter({f"k{i}": 1 for i in range(5)})
        assert [r.value for r in results] == [k.upper() for k in keys]
        assert sum(not r.shared for r in results) == 5

    asyncio.run(main())


def test_async_rounds_never_overlap_a_key() -> None:
    async def main() -> None:
        flight: AsyncSingleFlight = AsyncSingleFlight()
        active: Counter[str] = Counter()
        runs: Counter[str] = Counter()
        leads: Counter[str] = Counter()

        async def work(key: str) -> int:
            active[key] += 1
            assert active[key] == 1
            runs[key] += 1
            await asyncio.sleep(0)
            await asyncio.sleep(0)
            active[key] -= 1
            return runs[key]

        async def caller(seed: int) -> None:
            rng = random.Random(seed)
            for _ in range(200):
                key = f"k{rng.randrange(4)}"
                result = await flight.call(key, work, key)
                if not result.shared:
                    leads[key] += 1
                await asyncio.sleep(0)

        await asyncio.gather(*(caller(i) for i in range(50)))
        assert leads == runs

    asyncio.run(main())


def test_async_cancelled_waiter_does_not_cancel_the_work() -> None:
    async def main() -> None:
        flight: AsyncSingleFlight = AsyncSingleFlight()
        gate = asyncio.Event()
        runs: list[int] = []

        async def work() -> str:
            runs.append(1)
            await gate.wait()
            return "done"

        leader = asyncio.create_task(flight.do("k", work))
        waiter = asyncio.create_task(flight.do("k", work))
        while flight.in_flight("k") < 2:
            await asyncio.sleep(0)
        waiter.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiter
        gate.set()
        assert await leader == "done"
        assert runs == [1]

    asyncio.run(main())


def test_async_cancelled_leader_does_not_strand_waiters() -> None:
    async def main() -> None:
        flight: AsyncSingleFlight = AsyncSingleFlight()
        gate = asyncio.Event()
        runs: list[int] = []

        async def work() -> list[str]:
            runs.append(1)
            await gate.wait()
            return ["done"]

        leader = asyncio.create_task(flight.call("k", work))
        waiters = [asyncio.create_task(flight.call("k", work)) for _ in range(10)]
        while flight.in_flight("k") < 11:
            await asyncio.sleep(0)
        leader.cancel()
        with pytest.raises(asyncio.CancelledError):
            await leader
        gate.set()
        results = await asyncio.gather(*waiters)
        assert runs == [1]
        assert all(r.value == ["done"] and r.shared for r in results)

    asyncio.run(main())


def test_async_work_is_cancelled_when_every_caller_is() -> None:
    async def main() -> None:
        flight: AsyncSingleFlight = AsyncSingleFlight()
        started = asyncio.Event()
        cancelled: list[bool] = []

        async def work() -> str:
            started.set()
            try:
                await asyncio.Event().wait()
            except asyncio.CancelledError:
                cancelled.append(True)
                raise
            return "never"

        callers = [asyncio.create_task(flight.do("k", work)) for _ in range(3)]
        await started.wait()
        for c in callers:
            c.cancel()
        await asyncio.gather(*callers, return_exceptions=True)
        while not cancelled:
            await asyncio.sleep(0)
        # The abandoned flight is gone: a new caller runs fresh work.

        async def again() -> str:
            return "fresh"

        assert await flight.do("k", again) == "fresh"

    asyncio.run(main())


def test_async_exception_reaches_every_caller() -> None:
    async def main() -> None:
        flight: AsyncSingleFlight = AsyncSingleFlight(ttl=60)
        gate = asyncio.Event()

        async def fail() -> int:
            await gate.wait()
            raise ValueError("no")

        tasks = [asyncio.create_task(flight.do("k", fail)) for _ in range(5)]
        while flight.in_flight("k") < 5:
            await asyncio.sleep(0)
        gate.set()
        outcomes = await asyncio.gather(*tasks, return_exceptions=True)
        assert all(isinstance(o, ValueError) for o in outcomes)

        async def fine() -> int:
            return 1

        assert await flight.do("k", fine) == 1

    asyncio.run(main())


def test_async_every_caller_raises_its_own_copy_with_its_own_traceback() -> None:
    async def anest(depth: int, fn: Any) -> Any:
        return await fn() if depth == 0 else await anest(depth - 1, fn)

    async def main() -> None:
        flight: AsyncSingleFlight = AsyncSingleFlight()
        gate = asyncio.Event()

        async def fail() -> int:
            await gate.wait()
            raise Refused("no", 7)

        async def caller(i: int) -> BaseException:
            try:
                await anest(i, lambda: flight.do("k", fail))
            except ValueError as exc:
                return exc
            raise AssertionError("no exception")

        tasks = [asyncio.create_task(caller(i)) for i in range(8)]
        while flight.in_flight("k") < 8:
            await asyncio.sleep(0)
        gate.set()
        errors = await asyncio.gather(*tasks)
        assert len({id(e) for e in errors}) == 8
        for i, exc in enumerate(errors):
            assert type(exc) is Refused and exc.args == ("no", 7)
            frames = [f.name for f in traceback.extract_tb(exc.__traceback__)]
            assert frames.count("anest") == i + 1, frames
            assert frames[-1] == "fail"
            assert exc.__context__ is None  # not chained to another caller's exception

    asyncio.run(main())


def test_async_cache_hands_out_copies() -> None:
    async def main() -> None:
        clock = Ticker()
        flight: AsyncSingleFlight = AsyncSingleFlight(ttl=5, clock=clock, copy=copy.deepcopy)

        async def make() -> list[int]:
            return [1]

        first = await flight.call("k", make)
        first.value.append(2)
        hit = await flight.call("k", make)
        assert hit.cached and hit.value == [1]
        clock.now += 5
        assert not (await flight.call("k", make)).cached

    asyncio.run(main())


def test_async_synchronous_failure_to_start_leaves_no_flight() -> None:
    async def main() -> None:
        flight: AsyncSingleFlight = AsyncSingleFlight()

        def broken() -> Any:
            raise RuntimeError("before any await")

        with pytest.raises(RuntimeError):
            await flight.do("k", broken)
        assert flight.in_flight("k") == 0

    asyncio.run(main())
