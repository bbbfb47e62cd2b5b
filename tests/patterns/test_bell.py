"""The release bell never misses a ring: a waiter that took ``rung()`` before a ring wakes.

``ring`` takes no lock when nobody waits, so the order of a waiter's
registration and its check of the count is what keeps a ring from falling
between them. Each round races one ring against one waiter's registration, in
threads and in tasks; a missed ring would sleep out the 60 s pause and read False.
"""

from __future__ import annotations

import asyncio
import random
import threading

from dibs import _bell

QUICK = True
ROUNDS = 400
PAUSE = 60.0  # a hang detector: a woken waiter returns at once


def _wait(start: threading.Barrier, since: int, results: list[bool]) -> None:
    start.wait()
    results.append(_bell.listen(since, PAUSE))


def test_a_thread_waiter_never_misses_a_ring_racing_its_wait() -> None:
    rng = random.Random(7)
    for round_ in range(ROUNDS):
        since = _bell.rung()
        start = threading.Barrier(2)
        results: list[bool] = []
        waiter = threading.Thread(target=_wait, args=(start, since, results))
        waiter.start()
        start.wait()
        for _ in range(rng.randrange(50)):
            pass  # a spread of moments for the ring
        _bell.ring(f"c{round_}")
        waiter.join(PAUSE + 10)
        assert results == [True], round_


def test_a_task_waiter_never_misses_a_ring_from_another_thread() -> None:
    rng = random.Random(11)

    async def main() -> None:
        loop = asyncio.get_running_loop()
        for round_ in range(ROUNDS):
            since = _bell.rung()
            delay = rng.random() / 2000
            ringer = threading.Timer(delay, _bell.ring, args=(f"t{round_}",))
            ringer.start()
            woke = await _bell.alisten(since, PAUSE)
            ringer.join()
            assert woke, round_
            await asyncio.sleep(0)
        assert loop.is_running()

    asyncio.run(main())


def test_a_waiter_for_given_claims_wakes_once_all_of_them_are_released() -> None:
    since = _bell.rung()
    _bell.ring("a")
    assert not _bell.listen(since, 0.0, ids=["a", "b"])  # b not yet: no news
    _bell.ring("b")
    assert _bell.listen(since, PAUSE, ids=["a", "b"])
