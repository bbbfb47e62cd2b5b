"""dibs.RateLimit and dibs.aio.RateLimit on every store: the limit, the refusals, the edges.

The race tests hammer one key from many processes, threads and tasks, sync and
async faces together, and record every admission's time on the store's clock
(its claim's ``created_at``). :func:`over_limit` then checks the recorded
decisions exactly, with no reading of wall time: no half-open window of the
rate's length holds more than the limit. Every worker runs until it has been
refused at cost 1, so the limit was full at least once; an off-by-one in the
limit then leaves ``limit + 1`` admissions inside one window, and the check
fails on every run.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import math
import os
import subprocess
import sys
from collections.abc import Sequence

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import dibs
import dibs.aio
from _race import race
from conftest import SHARED_STORE_KINDS, StoreMaker
from dibs import FakeClock, InvalidInput, Rate, RateLimit, Store
from dibs.limits import NAME_MAX_BYTES, RATE_LIMIT_MAX
from dibs.ratelimit import _micros
from layout import SUPPORT
from windows import over_limit

QUICK = True  # in `pytest -m quick` (conftest.is_quick: not slow, no server)

WORKER = SUPPORT / "ratelimit_worker.py"


def test_the_checker_sees_one_unit_too_many() -> None:
    assert over_limit([(0, 1), (999, 1)], 2, 1000) == []
    assert over_limit([(0, 1), (999, 1)], 1, 1000) != []
    assert over_limit([(0, 1), (1000, 1)], 1, 1000) == []  # the window is half-open
    assert over_limit([(0, 2), (500, 1), (1500, 2)], 3, 1000) == []
    assert over_limit([(0, 2), (500, 2)], 3, 1000) != []


# --- the rate text ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "limit", "window"),
    [
        ("10/s", 10, 1.0),
        ("10/second", 10, 1.0),
        ("100/minute", 100, 60.0),
        ("100/m", 100, 60.0),
        ("5/2s", 5, 2.0),
        ("5 / 2 s", 5, 2.0),
        ("1/500ms", 1, 0.5),
        ("3 per hour", 3, 3600.0),
        ("2 per 1.5 s", 2, 1.5),
        ("7/d", 7, 86400.0),
        (" 10/S ", 10, 1.0),
        (f"{RATE_LIMIT_MAX}/1ms", RATE_LIMIT_MAX, 0.001),
        ("1/366d", 1, 366 * 86400.0),
    ],
)
def test_rates_parse(text: str, limit: int, window: float) -> None:
    assert Rate.parse(text) == Rate(limit, window)
    assert Rate.parse(Rate.parse(text)) == Rate(limit, window)
    assert Rate.parse(str(Rate(limit, window))) == Rate(limit, window)


@pytest.mark.parametrize(
    "text",
    [
        "", "10", "/s", "10/", "10/x", "10/sx", "-1/s", "0/s", "1.5/s", "10/0s", "10/0.0001s",
        "10/367d", f"{RATE_LIMIT_MAX + 1}/s", "9" * 40 + "/s", "10/" + "9" * 40 + "s",
        "\u0661\u0660/s", "10/\u0661s", "10/s\x00", "10//s", "10 per", 10, 1.5, None, b"10/s",
        "10/1.0000001s", "inf/s", "nan/s",
    ],
)  # fmt: skip
def test_bad_rates_are_refused_by_name(text: object) -> None:
    with pytest.raises(InvalidInput) as caught:
        Rate.parse(text)
    assert caught.value.field == "rate"
    assert caught.value.value == text


@pytest.mark.parametrize(
    ("limit", "window", "field"),
    [
        (0, 1.0, "limit"), (RATE_LIMIT_MAX + 1, 1.0, "limit"), (True, 1.0, "limit"),
        (1.0, 1.0, "limit"), (2**100, 1.0, "limit"), (1, 0.0, "window"), (1, -1.0, "window"),
        (1, math.nan, "window"), (1, math.inf, "window"), (1, 1e-7, "window"),
        (1, 1.0000001, "window"), (1, 367 * 86400.0, "window"), (1, "1", "window"),
        (1, True, "window"),
    ],
)  # fmt: skip
def test_bad_rate_fields_are_refused_by_name(limit: object, window: object, field: str) -> None:
    with pytest.raises(InvalidInput) as caught:
        Rate(limit, window)  # type: ignore[arg-type]
    assert caught.value.field == field


@given(
    limit=st.integers(1, RATE_LIMIT_MAX),
    window_ms=st.integers(1, 366 * 86_400_000),
)
def test_any_rate_in_the_domain_round_trips(limit: int, window_ms: int) -> None:
    rate = Rate.parse(f"{limit}/{window_ms}ms")
    assert (rate.limit, rate.window_us) == (limit, window_ms * 1000)
    assert Rate.parse(str(rate)) == rate


# --- the limit on every store ----------------------------------------------------------------


def test_a_full_limit_refuses_until_the_oldest_admission_ends(
    store: Store, clock: FakeClock
) -> None:
    limit = RateLimit(store, "api:alice", rate="10/s")
    first = [limit.acquire() for _ in range(10)]
    assert all(first) and all(d.retry_after == 0.0 for d in first)
    refused = limit.acquire()
    assert not refused and refused.claim is None and refused.at is None
    assert refused.retry_after == pytest.approx(1.0, abs=1e-6)
    clock.advance(0.4)
    assert limit.acquire().retry_after == pytest.approx(0.6, abs=1e-6)
    clock.advance(0.6)
    again = limit.acquire()
    assert again and again.at == store.now()
    assert not limit.acquire(cost=10)  # one unit is still inside the window
    assert limit.acquire(cost=9)


def test_costs_add_up_and_a_refusal_says_when_enough_ends(store: Store, clock: FakeClock) -> None:
    limit = RateLimit(store, "bytes", rate="10/10s")
    assert limit.acquire(cost=4)
    clock.advance(3)
    assert limit.acquire(cost=4)
    refused = limit.acquire(cost=5)
    assert not refused and refused.retry_after == pytest.approx(7.0, abs=1e-6)
    assert limit.acquire(cost=2)
    assert limit.acquire(cost=1).retry_after == pytest.approx(7.0, abs=1e-6)
    clock.advance(7)
    assert limit.acquire(cost=4)
    assert not limit.acquire(cost=3)  # 4 + 2 + 4 in the window


def test_a_refusal_whose_slots_came_free_meanwhile_says_retry_now(
    store: Store, clock: FakeClock
) -> None:
    # Another thread of the process can learn between this call's pick and its refusal
    # that slots came free (it replaces the shared hint): the refusal must still answer.
    # Here the pick refuses while every slot is free, as it would in that race.
    limit = RateLimit(store, "api:bob", rate="4/s")
    assert limit.acquire(cost=4)
    clock.advance(1)  # all four ended
    picked_too_early = limit._pick
    limit._pick = lambda cost, now: None  # type: ignore[method-assign]
    refused = limit.acquire(cost=2)
    assert not refused and refused.retry_after == 0.0
    limit._pick = picked_too_early  # type: ignore[method-assign]
    assert limit.acquire(cost=4)


def test_instances_and_stores_share_one_limit(make_store: StoreMaker, clock: FakeClock) -> None:
    one, two = make_store(clock), make_store(clock)
    a, b = RateLimit(one, "shared", "3/s"), RateLimit(two, "shared", "3/s")
    assert a.acquire() and b.acquire() and a.acquire()
    assert not b.acquire() and not a.acquire()
    # Another key, or another rate on the same key, is another limit.
    assert RateLimit(one, "other", "3/s").acquire()
    assert RateLimit(two, "shared", "4/s").acquire()


def test_the_limit_leaves_other_claims_on_the_key_alone(store: Store, clock: FakeClock) -> None:
    assert store.claim(dibs.Unit("room", "night-1"), holder="alice")
    limit = RateLimit(store, "room", "1/s")
    assert limit.acquire() and not limit.acquire()
    assert store.holder_of(dibs.Unit("room", "night-1")) == "alice"


KEYS_AT_THE_EDGES = [
    "k",
    "\u00e9" * (NAME_MAX_BYTES // 2),
    "\U0001f600" * (NAME_MAX_BYTES // 4),
    "a" * NAME_MAX_BYTES,
    " ",
    "\u200b\ufeff",
    "dibs.rate/10/1000000/0",
]


@pytest.mark.parametrize("key", KEYS_AT_THE_EDGES)
def test_keys_at_the_edges_work(store: Store, clock: FakeClock, key: str) -> None:
    limit = RateLimit(store, key, "2/s")
    assert limit.acquire(2) and not limit.acquire()
    clock.advance(1)
    assert limit.acquire()


@pytest.mark.parametrize(
    "key",
    ["", "a" * (NAME_MAX_BYTES + 1), "\u00e9" * (NAME_MAX_BYTES // 2) + "a", "a\x00b",
     "\ud800", 7, None, b"key"],
)  # fmt: skip
def test_bad_keys_are_refused_by_name(store: Store, key: object) -> None:
    with pytest.raises(InvalidInput) as caught:
        RateLimit(store, key, "1/s")  # type: ignore[arg-type]
    assert caught.value.field == "key"


@pytest.mark.parametrize(
    "cost", [0, -1, 11, 2**64, 10**400, 1.0, math.nan, math.inf, True, "1", None]
)
def test_bad_costs_are_refused_by_name(store: Store, cost: object) -> None:
    limit = RateLimit(store, "k", "10/s")
    with pytest.raises(InvalidInput) as caught:
        limit.acquire(cost)  # type: ignore[arg-type]
    assert caught.value.field == "cost"
    assert limit.acquire(10)  # nothing was taken


# A program of steps on a FakeClock: (advance in ticks, cost) pairs. A tick is 1/64 s
# (15,625 µs), and windows are whole eighths of a second: every time and every
# expiry is then exact in a float and in whole microseconds, so a step that lands
# exactly on a window's end is judged by the rule, not by rounding.
TICK = 1 / 64
PROGRAMS = st.lists(st.tuples(st.integers(0, 96), st.integers(1, 5)), min_size=1, max_size=25)


def _model(steps: list[tuple[int, int]], limit: int, window_ticks: int) -> list[bool]:
    """A sliding-window log: admit if the costs admitted in (now - window, now] leave room."""
    log: list[tuple[int, int]] = []
    now, out = 0, []
    for advance, cost in steps:
        now += advance
        used = sum(c for t, c in log if t > now - window_ticks)
        ok = cost <= limit and used + cost <= limit
        if ok:
            log.append((now, cost))
        out.append(ok)
    return out


KEYS = st.text(min_size=1, max_size=8).filter(lambda k: "\x00" not in k)
FRESH = itertools.count()


@given(
    steps=PROGRAMS,
    limit=st.integers(1, 6),
    eighths=st.integers(1, 16),
    key=KEYS,
)
@settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
def test_decisions_match_a_sliding_window_log(
    store: Store,
    clock: FakeClock,
    steps: list[tuple[int, int]],
    limit: int,
    eighths: int,
    key: str,
) -> None:
    # One store for every example: a fresh key (and the clock only moving on) keeps
    # each example's limit apart from the others'.
    key = f"{key}/{next(FRESH)}"
    steps = [(a, min(c, limit)) for a, c in steps]
    rl = RateLimit(store, key, f"{limit}/{125 * eighths}ms")
    got = []
    for advance, cost in steps:
        clock.advance(advance * TICK)
        got.append(bool(rl.acquire(cost)))
    assert got == _model(steps, limit, 8 * eighths)


# --- the async face --------------------------------------------------------------------------


def test_the_async_face_answers_as_the_sync_one(aio_url: str) -> None:
    async def main() -> list[tuple[bool, float]]:
        clock = FakeClock()
        async with dibs.aio.open(aio_url, clock=clock) as store:
            limit = dibs.aio.RateLimit(store, "api", "3/2s")
            out = []
            for advance, cost in [(0, 1), (0, 2), (0, 1), (1, 1), (1, 1), (0, 3), (2, 3)]:
                clock.advance(advance)
                d = await limit.acquire(cost)
                out.append((bool(d), round(d.retry_after, 6)))
            with pytest.raises(InvalidInput):
                await limit.acquire(0)
            return out

    assert asyncio.run(main()) == [
        (True, 0.0), (True, 0.0), (False, 2.0), (False, 1.0), (True, 0.0), (False, 2.0),
        (True, 0.0),
    ]  # fmt: skip


def test_an_async_refusal_whose_slots_came_free_meanwhile_says_retry_now(aio_url: str) -> None:
    async def main() -> tuple[bool, float, bool]:
        clock = FakeClock()
        async with dibs.aio.open(aio_url, clock=clock) as store:
            limit = dibs.aio.RateLimit(store, "api:bob", "4/s")
            assert await limit.acquire(cost=4)
            clock.advance(1)
            picked_too_early = limit._pick
            limit._pick = lambda cost, now: None  # type: ignore[method-assign]
            refused = await limit.acquire(cost=2)
            limit._pick = picked_too_early  # type: ignore[method-assign]
            return bool(refused), refused.retry_after, bool(await limit.acquire(cost=4))

    assert asyncio.run(main()) == (False, 0.0, True)


def test_async_tasks_never_pass_the_limit(aio_url: str) -> None:
    async def main() -> list[bool]:
        async with dibs.aio.open(aio_url, clock=FakeClock()) as store:
            limit = dibs.aio.RateLimit(store, "burst", "25/s")
            return [bool(d) for d in await asyncio.gather(*(limit.acquire() for _ in range(60)))]

    assert sum(asyncio.run(main())) == 25


# Rounds of the thread races per store: the in-process stores answer so fast that a
# read-then-write bug is caught in about half the rounds; many rounds catch it every run.
ROUNDS = {"memory": 16, "sqlite": 12, "postgresql": 4, "etcd": 3}


def test_threads_never_pass_the_limit(store: Store, store_kind: str, fine_switching: None) -> None:
    for round_ in range(ROUNDS[store_kind]):
        limit = RateLimit(store, f"burst-{round_}", "25/s")
        got = race(32, lambda _, limit=limit: sum(bool(limit.acquire()) for _ in range(10)))
        assert sum(got) == 25  # the clock is a FakeClock that never moves


# --- many processes, real clocks -------------------------------------------------------------


def _hammer(url: str, key: str, rate: str, faces: Sequence[str], refusals: int) -> list[list[int]]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    procs = [
        subprocess.Popen(
            [sys.executable, str(WORKER), url, key, rate, face, "4", str(refusals), "3"],
            stdout=subprocess.PIPE,
            env=env,
            text=True,
        )
        for face in faces
    ]
    admitted: list[list[int]] = []
    for proc in procs:
        out, _ = proc.communicate(timeout=100)
        assert proc.returncode == 0
        report = json.loads(out)
        assert report["refused"] >= 1
        admitted += report["admitted"]
    return admitted


@pytest.mark.processes
@pytest.mark.parametrize("store_kind", SHARED_STORE_KINDS, indirect=True)
def test_processes_never_pass_the_limit_in_any_window(make_store: StoreMaker) -> None:
    make_store().close()  # create the schema once, before the workers race to
    rate = Rate.parse("12/300ms")
    faces = ["sync", "aio", "sync", "aio"]
    admitted = _hammer(make_store.url, "api:tenant-1", str(rate), faces, refusals=6)
    assert admitted
    # etcd's leases are whole seconds, at least 2: its holds, and so its windows, are longer.
    window_us = min(ends - start for start, ends, _ in admitted)
    assert window_us >= rate.window_us
    assert over_limit(admitted, rate.limit, window_us) == []


def test_threads_with_a_real_clock_never_pass_the_limit(fine_switching: None) -> None:
    rate = Rate.parse("8/50ms")
    with dibs.open("memory://") as store:
        for round_ in range(ROUNDS["memory"] // 2):
            limit = RateLimit(store, f"api-{round_}", rate)
            admitted: list[list[int]] = []

            def hammer(
                i: int, limit: RateLimit = limit, admitted: list[list[int]] = admitted
            ) -> int:
                refused = 0
                while refused < 40:
                    cost = 1 if i % 2 == 0 else 1 + i % 3
                    d = limit.acquire(cost)
                    if d and d.claim is not None:
                        admitted.append([_micros(d.claim.created_at), cost])
                    else:
                        refused += cost == 1 or i % 2 == 1
                return refused

            race(16, hammer)
            assert over_limit(admitted, rate.limit, rate.window_us) == []
