"""dibs.aio.Lot, dibs.aio.match and dibs.aio.booking on every store: the sync outcomes, awaited.

Each equivalence test runs one program of calls through the sync pattern on a
sync store and through the async pattern on an async store of the same kind
(``dibs.aio.open(url)``), both fresh, and compares every result and every
error. The race tests push many tasks through one async store and check the
invariants the sync tests check: no double parking, one driver per dispatch,
no lost update under ``exclusive``.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import itertools
import secrets
import subprocess
import sys
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import dibs
import dibs.aio
from conftest import SHARED_STORE_KINDS, drop_etcd_prefix
from dibs import FakeClock, InvalidInput, Store, Unit, booking
from dibs.aio import AsyncStore
from dibs.testing import strategies as ds
from etcd_fixtures import fresh_prefix
from layout import ROOT
from pg_fixtures import drop_schema, schema_url

QUICK = True  # in `pytest -m quick` (conftest.is_quick: not slow, no server)

# Tasks x rounds of the race tests per store: the SQL stores commit every call.
ROUNDS = {"memory": 400, "sqlite": 40, "postgresql": 25, "etcd": 8}  # etcd: CI time


class Faces:
    """Fresh stores of one kind, sync and async, each on a place of its own."""

    def __init__(
        self, kind: str, tmp_path: Path, pg_url: str | None, etcd_url: str | None = None
    ) -> None:
        self.kind = kind
        self.tmp_path = tmp_path
        self.pg_url = pg_url
        self.etcd_url = etcd_url
        self.schemas: list[str] = []
        self.prefixes: list[str] = []
        self.synced: list[Store] = []
        self._n = itertools.count()

    def url(self) -> str:
        if self.kind == "memory":
            return "memory://"
        if self.kind == "sqlite":
            return f"sqlite:///{self.tmp_path / f'dibs-{next(self._n)}.db'}"
        if self.kind == "etcd":
            assert self.etcd_url is not None
            self.prefixes.append(fresh_prefix())
            return f"{self.etcd_url}/{self.prefixes[-1]}"
        assert self.pg_url is not None
        schema = f"t_{secrets.token_hex(6)}"
        self.schemas.append(schema)
        return schema_url(self.pg_url, schema)

    def sync(self, clock: FakeClock | None = None) -> Store:
        store = dibs.open(self.url(), clock=clock)
        self.synced.append(store)
        return store

    def aio(self, clock: FakeClock | None = None) -> AsyncStore:
        """An async store; the test closes it on its own loop (``async with``)."""
        return dibs.aio.open(self.url(), clock=clock)

    def close(self) -> None:
        for store in self.synced:
            store.close()
        for schema in self.schemas:
            assert self.pg_url is not None
            drop_schema(self.pg_url, schema)
        for prefix in self.prefixes:
            assert self.etcd_url is not None
            drop_etcd_prefix(self.etcd_url, prefix)


@pytest.fixture
def faces(store_kind: str, tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Faces]:
    pg_url = request.getfixturevalue("pg_url") if store_kind == "postgresql" else None
    etcd_url = request.getfixturevalue("etcd_url") if store_kind == "etcd" else None
    made = Faces(store_kind, tmp_path, pg_url, etcd_url)
    yield made
    made.close()


@pytest.fixture
def loop() -> Iterator[asyncio.Runner]:
    """One event loop for a whole test, so an async store outlives a Hypothesis example."""
    with asyncio.Runner() as runner:
        yield runner


@pytest.fixture
def clocks() -> tuple[FakeClock, FakeClock]:
    """The pair's clocks, sync and async: a test moves both alike."""
    return FakeClock(), FakeClock()


@pytest.fixture
def pair(
    faces: Faces, loop: asyncio.Runner, clocks: tuple[FakeClock, FakeClock]
) -> Iterator[tuple[Store, AsyncStore]]:
    """A sync and an async store of one kind, fresh; the async one opened on ``loop``.

    A Hypothesis test gives both faces the same calls in the same order in every
    example, so their states stay equal and nothing needs to be fresh per example.
    """
    sync_store = faces.sync(clocks[0])
    async_store = loop.run(faces.aio(clocks[1]).open())
    yield sync_store, async_store
    loop.run(async_store.close())


def outcome(fn: Callable[[], Any]) -> Any:
    try:
        return ("ok", fn())
    except dibs.DibsError as exc:
        return ("raised", type(exc), str(exc), getattr(exc, "field", None))


async def aoutcome(fn: Callable[[], Awaitable[Any]]) -> Any:
    try:
        return ("ok", await fn())
    except dibs.DibsError as exc:
        return ("raised", type(exc), str(exc), getattr(exc, "field", None))


# --- the same outcomes on both faces -------------------------------------------------------------

vehicle_ids = st.one_of(ds.names(), st.sampled_from(["", 7, None]))

LotCall = tuple[Any, ...]

# psycopg_pool's threads open connections in the background, and they call
# random() (to jitter a connection's lifetime) while Hypothesis draws an example.
pool_uses_random = pytest.mark.filterwarnings(
    "ignore:Do not use the `random` module inside strategies"
)


@st.composite
def lot_programs(draw: st.DrawFn) -> tuple[str, int, str, list[LotCall]]:
    name = draw(ds.names())
    size = draw(st.integers(1, 8))
    fit = draw(st.sampled_from(["first", "best"]))
    fleet = draw(st.lists(vehicle_ids, min_size=1, max_size=5))
    vehicle = st.sampled_from(fleet)
    calls = st.one_of(
        st.tuples(
            st.just("park"),
            vehicle,
            st.one_of(st.integers(1, size), st.integers(-1, size + 1), st.just(True)),
        ),
        st.tuples(st.just("park"), vehicle, st.integers(1, max(1, size // 2))),
        st.tuples(st.just("remove"), vehicle),
        st.tuples(st.just("position_of"), vehicle),
        st.tuples(st.just("is_free"), st.integers(-1, size + 1), st.integers(0, 3)),
        st.tuples(st.just("occupancy")),
    )
    return name, size, fit, draw(st.lists(calls, max_size=20))


LOT_ROWS = itertools.count()


@pool_uses_random
@pytest.mark.timeout(600)
@settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
@given(program=lot_programs())
def test_lot_outcomes_match_the_sync_lot(
    pair: tuple[Store, AsyncStore],
    loop: asyncio.Runner,
    program: tuple[str, int, str, list[LotCall]],
) -> None:
    sync_store, async_store = pair
    name, size, fit, calls = program
    # The pair outlives the examples: a row of its own for each one, or an example
    # would meet the last one's vehicles (or its lot of another size) under one name.
    row = {"resource": f"lot-{next(LOT_ROWS)}"}
    try:
        lot = dibs.Lot(sync_store, name, size, fit=fit, **row)  # type: ignore[arg-type]
    except InvalidInput as exc:
        with pytest.raises(InvalidInput) as info:
            dibs.aio.Lot(async_store, name, size, fit=fit, **row)  # type: ignore[arg-type]
        assert str(info.value) == str(exc)
        return
    alot = dibs.aio.Lot(async_store, name, size, fit=fit, **row)  # type: ignore[arg-type]
    expected = [outcome(lambda c=c: getattr(lot, c[0])(*c[1:])) for c in calls]

    async def run() -> list[Any]:
        return [await aoutcome(lambda c=c: getattr(alot, c[0])(*c[1:])) for c in calls]

    assert loop.run(run()) == expected


MatchCall = tuple[Any, ...]


@st.composite
def match_programs(draw: st.DrawFn) -> list[MatchCall]:
    pool = draw(st.lists(ds.units(), min_size=1, max_size=6, unique=True))
    holders = draw(st.lists(ds.names(), min_size=1, max_size=3, unique=True))
    requests = draw(st.lists(ds.names(), min_size=1, max_size=4, unique=True))
    calls = st.one_of(
        st.tuples(
            st.just("match"),
            st.lists(st.sampled_from(pool), max_size=4),
            st.sampled_from(holders),
            st.one_of(st.sampled_from(requests), st.just("")),
            st.integers(0, 3),
            ds.ttls(),
        ),
        st.tuples(st.just("advance"), st.floats(0, 120)),
        st.tuples(st.just("busy"), st.sampled_from(pool)),
        st.tuples(st.just("release"), st.sampled_from(holders)),
    )
    return draw(st.lists(calls, min_size=1, max_size=12))


def _match_view(m: dibs.Match) -> Any:
    claim = m.claim
    held = None if claim is None else (sorted(claim.units, key=repr), claim.state, claim.expires_at)
    return (bool(m), m.candidate, m.replayed, m.attempts, m.rounds, held)


@pool_uses_random
@pytest.mark.timeout(600)
@settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
@given(program=match_programs())
def test_match_outcomes_match_the_sync_match(
    pair: tuple[Store, AsyncStore],
    clocks: tuple[FakeClock, FakeClock],
    loop: asyncio.Runner,
    program: list[MatchCall],
) -> None:
    sync_store, async_store = pair

    def sync_call(call: MatchCall) -> Any:
        if call[0] == "advance":
            return clocks[0].advance(call[1])
        if call[0] == "busy":
            return sync_store.claim(call[1], holder="someone-else").granted
        if call[0] == "release":
            return [
                sync_store.release(c.id, holder=c.holder, fence=c.fence)
                for c in sync_store.claims_of(call[1])
            ]
        _, candidates, holder, request_id, attempts, ttl = call
        return _match_view(
            dibs.match(
                sync_store, candidates, holder=holder, request_id=request_id, ttl=ttl,
                attempts=attempts, jitter=False, backoff=0, sleep=lambda _: None,
            )
        )  # fmt: skip

    async def nap(_: float) -> None:
        pass

    async def async_call(call: MatchCall) -> Any:
        if call[0] == "advance":
            return clocks[1].advance(call[1])
        if call[0] == "busy":
            return (await async_store.claim(call[1], holder="someone-else")).granted
        if call[0] == "release":
            return [
                await async_store.release(c.id, holder=c.holder, fence=c.fence)
                for c in await async_store.claims_of(call[1])
            ]
        _, candidates, holder, request_id, attempts, ttl = call
        return _match_view(
            await dibs.aio.match(
                async_store, candidates, holder=holder, request_id=request_id, ttl=ttl,
                attempts=attempts, jitter=False, backoff=0, sleep=nap,
            )
        )  # fmt: skip

    expected = [outcome(lambda c=c: sync_call(c)) for c in program]

    async def run() -> list[Any]:
        return [await aoutcome(lambda c=c: async_call(c)) for c in program]

    assert loop.run(run()) == expected


async def _exclusive_scenarios(
    store: Any, clock: FakeClock, enter: Callable[..., Any], is_async: bool
) -> list[Any]:
    """Run the exclusive scenarios on one face; ``enter`` is that face's exclusive."""

    async def call(fn: Callable[[], Any]) -> Any:
        value = fn()
        return await value if inspect.isawaitable(value) else value

    async def block(resource: str, body: Callable[[dibs.Claim], Any], **kwargs: Any) -> Any:
        try:
            if is_async:
                async with enter(store, resource, **kwargs) as hold:
                    return ("ok", await call(lambda: body(hold)))
            with enter(store, resource, **kwargs) as hold:
                return ("ok", await call(lambda: body(hold)))
        except (dibs.DibsError, RuntimeError) as exc:
            fields = {
                k: getattr(exc, k) for k in ("resource", "reason", "field") if hasattr(exc, k)
            }
            return ("raised", type(exc), fields)

    def nothing(hold: dibs.Claim) -> Any:
        return hold.state.value, hold.units

    def takeover(hold: dibs.Claim) -> Any:
        clock.advance(31)
        return store.claim(hold.units[0], holder="thief")

    def expire(hold: dibs.Claim) -> Any:
        clock.advance(31)
        return store.sweep()

    def release_itself(hold: dibs.Claim) -> Any:
        return store.release(hold.id, holder=hold.holder, fence=hold.fence)

    def fail(hold: dibs.Claim) -> Any:
        raise RuntimeError("the block failed")

    out = [
        await block("room-1", nothing),
        await block("room-2", takeover, ttl=30),
        await block("room-3", expire, ttl=30),
        await block("room-4", release_itself),
        await block("room-5", fail),
        await call(lambda: store.holder_of(Unit("room-5", booking.EXCLUSIVE_SLOT))),
        await block("room-6", nothing, wait=-1),
        await block("room-6", nothing, wait=float("nan")),
    ]
    await call(lambda: store.claim(Unit("room-7", booking.EXCLUSIVE_SLOT), holder="squatter"))
    out.append(await block("room-7", nothing, wait=0))
    out.append(await block("room-7", nothing, wait=0.01))
    return [
        (o[0], o[1], o[2] if o[0] == "raised" else None) if isinstance(o, tuple) else o for o in out
    ]


def test_exclusive_outcomes_match_the_sync_exclusive(faces: Faces, loop: asyncio.Runner) -> None:
    clock = FakeClock()
    with faces.sync(clock) as sync_store:
        expected = loop.run(_exclusive_scenarios(sync_store, clock, booking.exclusive, False))

    async def run() -> list[Any]:
        aclock = FakeClock()
        async with faces.aio(aclock) as store:
            return await _exclusive_scenarios(store, aclock, dibs.aio.booking.exclusive, True)

    got = loop.run(run())
    assert got == expected
    kinds = [o[0] if isinstance(o, tuple) else o for o in got]
    assert kinds == ["ok", "raised", "raised", "ok", "raised", None] + ["raised"] * 4
    assert got[1][2]["reason"] is dibs.HoldLostReason.TAKEN_OVER
    assert got[2][2]["reason"] is dibs.HoldLostReason.EXPIRED
    assert got[8][1] is booking.ResourceBusy and got[9][1] is booking.ResourceBusy


def test_unit_makers_are_the_sync_ones() -> None:
    assert dibs.aio.booking.nights is booking.nights
    assert dibs.aio.booking.time_slots is booking.time_slots
    assert dibs.aio.booking.night_of is booking.night_of
    assert dibs.aio.booking.ResourceBusy is booking.ResourceBusy


# --- races among many tasks ----------------------------------------------------------------------


def test_tasks_churn_without_double_parking_or_leaks(
    faces: Faces, store_kind: str, loop: asyncio.Runner
) -> None:
    lots_n, tasks_per_lot, rounds = 4, 8, ROUNDS[store_kind] // 4
    shadow: list[str | None] = [None] * 10
    clashes: list[str] = []

    async def churn(lot: dibs.aio.Lot, worker: int) -> tuple[int, int]:
        parked = refused = 0
        for i in range(rounds):
            length = (1, 1, 2, 3)[(worker + i) % 4]
            vehicle = f"v{worker}-{i}"
            start = await lot.park(vehicle, length)
            if start is None:
                refused += 1
                continue
            parked += 1
            # No await between the park's answer and the shadow's check: the
            # shadow sees exactly the grants, in the order the tasks got them.
            clash = [s for s in shadow[start : start + length] if s is not None]
            if clash:
                clashes.append(f"{vehicle} parked at {start} over {clash}")
            shadow[start : start + length] = [vehicle] * length
            await asyncio.sleep(0)  # others run while it is parked
            shadow[:] = [None if s == vehicle else s for s in shadow]
            assert await lot.remove(vehicle) == start
        return parked, refused

    async def run() -> list[tuple[int, int]]:
        async with faces.aio() as store:
            # Several lots of one row (each with its own hint), many tasks on each.
            lots = [dibs.aio.Lot(store, "row", len(shadow)) for _ in range(lots_n)]
            results = await asyncio.gather(
                *(churn(lots[w % lots_n], w) for w in range(lots_n * tasks_per_lot))
            )
            occupancy = await lots[0].occupancy()
            assert occupancy.free == len(shadow), str(occupancy)
            vehicles = [f"v{w}-{i}" for w in range(lots_n * tasks_per_lot) for i in range(rounds)]
            leaked = [v for v in vehicles if await store.claims_of(v)]
            assert not leaked, leaked[:5]
            return results

    results = loop.run(run())
    assert not clashes, clashes[:5]
    assert sum(p for p, _ in results) >= rounds  # real parking happened, not only refusals


def test_racing_parks_of_one_vehicle_park_it_once(
    faces: Faces, store_kind: str, loop: asyncio.Runner
) -> None:
    # First-fit and best-fit lots pick different positions in a fragmented row
    # (free runs of 3 and 2), so racing parks of one truck claim different slots:
    # only the truck's own unit in each group claim keeps it from parking twice.
    vehicles = max(4, ROUNDS[store_kind] // 8)

    async def run() -> list[list[int | None]]:
        async with faces.aio() as store:
            setup = dibs.aio.Lot(store, "yard", 6)
            for blocker in ("a", "b", "c", "d", "e", "f"):
                await setup.park(blocker)
            for blocker in ("a", "b", "c", "e", "f"):
                await setup.remove(blocker)  # the row is now ...#..
            outcomes = []
            for v in range(vehicles):
                truck = f"truck-{v}"
                lots = [dibs.aio.Lot(store, "yard", 6, fit=fit) for fit in ("first", "best") * 8]
                for lot in lots:  # a refused probe makes each lot read the row: ...#..
                    assert await lot.park("probe", 4) is None
                positions = await asyncio.gather(*(lot.park(truck, 2) for lot in lots))
                parkings = await store.claims_of(truck)
                assert len(parkings) == 1, (truck, positions, parkings)
                outcomes.append(list(positions))
                await lots[0].remove(truck)
            return outcomes

    for positions in loop.run(run()):
        assert len(set(positions)) == 1 and positions[0] in (0, 4), positions


def test_concurrent_tries_of_many_dispatches_hold_one_driver_each(
    faces: Faces, store_kind: str, loop: asyncio.Runner
) -> None:
    rides, tries = max(8, ROUNDS[store_kind] // 10), 4
    pool = [f"driver-{i}" for i in range(rides * tries)]  # enough for every try to win one

    async def dispatch(ride: int, attempt: int, store: AsyncStore) -> dibs.Match:
        nearest = (
            pool[(ride * 3 + attempt) % len(pool) :] + pool[: (ride * 3 + attempt) % len(pool)]
        )
        return await dibs.aio.match(
            store, nearest[:6], holder="dispatch", request_id=f"ride-{ride}", ttl=60
        )

    async def run() -> list[list[dibs.Match]]:
        async with faces.aio() as store:
            got = await asyncio.gather(
                *(dispatch(r, t, store) for r in range(rides) for t in range(tries))
            )
            live = await store.claims_of("dispatch")
            per_ride: dict[str, int] = {}
            for claim in live:
                for unit in claim.units:
                    if unit.resource == dibs.matching.REQUEST_RESOURCE:
                        per_ride[unit.slot] = per_ride.get(unit.slot, 0) + 1
            assert all(n == 1 for n in per_ride.values()), per_ride
            assert len(per_ride) == rides
            return [got[r * tries : (r + 1) * tries] for r in range(rides)]

    for ride in loop.run(run()):
        assert all(ride), ride
        assert len({m.candidate for m in ride}) == 1, [m.candidate for m in ride]
        assert len({m.claim.id for m in ride if m.claim}) == 1
        assert sum(not m.replayed for m in ride) == 1


# 16 tasks on etcd: 8 s at a load of 8, 83 s at a load of 28 (a hand-off is three etcd writes).
@pytest.mark.timeout(300)
def test_exclusive_loses_no_update_among_many_tasks(
    faces: Faces, store_kind: str, loop: asyncio.Runner
) -> None:
    tasks_n = 16
    rounds = max(4, ROUNDS[store_kind] // 20)
    counter = [0]

    async def writer(store: AsyncStore) -> None:
        for _ in range(rounds):
            async with dibs.aio.booking.exclusive(store, "counter", ttl=60, wait=None):
                seen = counter[0]  # read
                await asyncio.sleep(0)  # others run between the read and the write
                counter[0] = seen + 1  # write

    async def run() -> None:
        async with faces.aio() as store:
            await asyncio.gather(*(writer(store) for _ in range(tasks_n)))
            assert await store.holder_of(Unit("counter", booking.EXCLUSIVE_SLOT)) is None

    loop.run(run())
    assert counter[0] == tasks_n * rounds


def test_cancelled_parks_leave_the_row_consistent(
    faces: Faces, store_kind: str, loop: asyncio.Runner
) -> None:
    # Cancel parks at every await of their lives: each park either finished
    # (a retry finds the vehicle at the same place) or, cancelled, took nothing,
    # and it took nothing later either: its claim, which a worker thread or a
    # background statement may still be running when the await is cancelled,
    # was settled before the cancellation reached the caller. (A claim that
    # landed after the park was over broke this row: after the retry had parked
    # and removed the truck, the truck was parked again and nobody knew.)
    async def run() -> None:
        async with faces.aio() as store:
            lot = dibs.aio.Lot(store, "gate", 8)
            for v in range(4):
                await lot.park(f"car-{v}")
            for v in range(4):
                if v % 2:
                    await lot.remove(f"car-{v}")  # the row is #.#.....
            for steps in range(1, 12):
                truck = f"truck-{steps}"
                task = asyncio.ensure_future(lot.park(truck, 3))
                for _ in range(steps):
                    await asyncio.sleep(0)
                task.cancel()
                try:
                    first = await task
                except asyncio.CancelledError:
                    first = None
                parkings = await store.claims_of(truck)
                assert len(parkings) == (first is not None), parkings
                again = await lot.park(truck, 3)
                assert again is not None and (first is None or again == first)
                assert len(await store.claims_of(truck)) == 1
                assert await lot.remove(truck) == again
            assert str(await lot.occupancy()) == "#.#....."

    loop.run(run())


def test_a_park_cancelled_again_and_again_still_takes_nothing(
    faces: Faces, store_kind: str, loop: asyncio.Runner
) -> None:
    # A park cancelled once waits for its claim and gives it back; cancelling it
    # again at every step of that wait (a timeout, then its task group) changes
    # nothing: when the cancellation reaches the caller, the truck holds nothing.
    async def run() -> None:
        async with faces.aio() as store:
            lot = dibs.aio.Lot(store, "gate", 8)
            for steps in range(1, 12):
                truck = f"truck-{steps}"
                task = asyncio.ensure_future(lot.park(truck, 3))
                for _ in range(steps):
                    await asyncio.sleep(0)
                while not task.done():
                    task.cancel()
                    await asyncio.sleep(0)
                if task.cancelled():
                    assert await store.claims_of(truck) == []
                    assert str(await lot.occupancy()) == "........"
                else:
                    assert task.result() == 0
                    assert await lot.remove(truck) == 0

    loop.run(run())


def test_a_cancelled_exclusive_entry_leaves_the_resource_free(
    faces: Faces, store_kind: str, loop: asyncio.Runner
) -> None:
    # An entry cancelled at any step of its claim holds nothing once the
    # cancellation reaches the caller, so the next entry gets in at once
    # (wait=0) instead of waiting out the stranded hold's TTL.
    async def run() -> None:
        async with faces.aio() as store:
            for steps in range(1, 12):

                async def enter() -> None:
                    async with dibs.aio.booking.exclusive(store, "ledger", ttl=60.0, wait=0):
                        await asyncio.sleep(3600)  # held until cancelled

                task = asyncio.ensure_future(enter())
                for _ in range(steps):
                    await asyncio.sleep(0)
                while not task.done():
                    task.cancel()
                    await asyncio.sleep(0)
                unit = dibs.Unit("ledger", dibs.booking.EXCLUSIVE_SLOT)
                assert await store.holder_of(unit) is None, steps
                async with dibs.aio.booking.exclusive(store, "ledger", wait=0):
                    pass

    loop.run(run())


# memory:// calls run inline, so no call can outlive its await there; the sync lot
# that looks at once needs a file or a database the two faces share.
@pytest.mark.parametrize("store_kind", SHARED_STORE_KINDS)
def test_a_cancelled_remove_is_over_when_the_caller_hears_of_it(
    faces: Faces, loop: asyncio.Runner
) -> None:
    # A remove cancelled at any step either freed the car or did not, before the
    # cancellation reached the caller. A sync lot on the same row parks the car
    # the moment the caller hears of it (while a release the cancelled remove
    # left on a worker would still be running): it finds the car where it is or
    # parks it anew, and once the async store is closed (which waits for every
    # call it accepted) the car is still parked there: no late release freed it.
    url = faces.url()
    with dibs.open(url) as sync_store:
        look = dibs.Lot(sync_store, "gate", 8)

        async def cancelled_remove(car: str, steps: int) -> int:
            async with dibs.aio.open(url) as store:
                lot = dibs.aio.Lot(store, "gate", 8)
                parked = await lot.park(car)
                task = asyncio.ensure_future(lot.remove(car))
                for _ in range(steps):
                    await asyncio.sleep(0)
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    assert await task == parked
                at = look.park(car)  # on this thread, blocking the loop: at once
                assert at is not None
                return at

        for round_, steps in enumerate([*range(1, 12)] * 3):
            car = f"car-{round_}"
            at = loop.run(cancelled_remove(car, steps))
            assert look.position_of(car) == at, (car, steps)
            assert look.remove(car) == at
            assert str(look.occupancy()) == "........"


# --- AsyncSingleFlight over an async store -------------------------------------------------------


def test_single_flight_coalesces_identical_store_calls(faces: Faces, loop: asyncio.Runner) -> None:
    flight = dibs.aio.AsyncSingleFlight()
    calls: list[str] = []

    async def holder_of(store: AsyncStore, unit: Unit) -> str | None:
        calls.append("holder_of")
        return await store.holder_of(unit)

    async def book(store: AsyncStore, request_id: str) -> dibs.ClaimResult:
        calls.append("claim")
        return await store.claim(Unit("show", "A1"), holder="web", request_id=request_id)

    async def run() -> None:
        async with faces.aio() as store:
            looks = await asyncio.gather(
                *(flight.call("A1?", holder_of, store, Unit("show", "A1")) for _ in range(50))
            )
            assert [r.value for r in looks] == [None] * 50
            assert sum(not r.shared for r in looks) == 1 and calls == ["holder_of"]
            # Fifty identical submits of one booking (a double-clicking crowd of
            # one client) make one claim; each gets its own copy of the result.
            booked = await asyncio.gather(
                *(flight.do("rq-1", book, store, "rq-1") for _ in range(50))
            )
            assert calls == ["holder_of", "claim"]
            assert len({r.claim.id for r in booked if r.claim}) == 1 and all(booked)
            assert len({id(r) for r in booked}) == 50  # copies: nobody shares a mutable result
            assert await store.holder_of(Unit("show", "A1")) == "web"
            # After the flight lands a new call runs again: the request ID makes it a replay.
            again = await flight.do("rq-1", book, store, "rq-1")
            assert again.replayed and again.claim and again.claim.id == booked[0].claim.id  # type: ignore[union-attr]

    loop.run(run())


def test_the_sync_patterns_are_generated_from_the_async_ones() -> None:
    root = ROOT
    done = subprocess.run(
        [sys.executable, str(root / "scripts" / "unasync.py"), "--check"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr


BAD_MATCHES: list[tuple[Any, dict[str, Any], str]] = [
    ([], {}, "candidates"),
    ("driver-1", {}, "candidates"),
    ([Unit("dibs.match", "x")], {}, "candidates"),
    ([7], {}, "candidates"),
    (["d"], {"request_id": ""}, "request_id"),
    (["d"], {"attempts": 0}, "attempts"),
    (["d"], {"attempts": True}, "attempts"),
    (["d"], {"backoff": -1}, "backoff"),
    (["d"], {"max_backoff": float("inf")}, "max_backoff"),
    (["d"], {"holder": ""}, "holder"),
]


@pytest.mark.parametrize(("candidates", "changes", "field"), BAD_MATCHES)
def test_bad_arguments_raise_the_same_errors_on_both_faces(
    pair: tuple[Store, AsyncStore],
    loop: asyncio.Runner,
    candidates: Any,
    changes: dict[str, Any],
    field: str,
) -> None:
    sync_store, async_store = pair
    kwargs = {"holder": "h", "request_id": "r", **changes}
    with pytest.raises(InvalidInput) as sync_error:
        dibs.match(sync_store, candidates, **kwargs)
    with pytest.raises(InvalidInput) as async_error:
        loop.run(dibs.aio.match(async_store, candidates, **kwargs))
    assert sync_error.value.field == async_error.value.field == field
    assert str(sync_error.value) == str(async_error.value)


@pytest.mark.parametrize(
    ("args", "kwargs"),
    [(("", 4), {}), (("row", 0), {}), (("row", True), {}), (("row", 4), {"fit": "worst"}),
     (("row", 4), {"resource": ""})],
)  # fmt: skip
def test_bad_lots_raise_the_same_errors_on_both_faces(
    pair: tuple[Store, AsyncStore], args: tuple[Any, ...], kwargs: dict[str, Any]
) -> None:
    sync_store, async_store = pair
    with pytest.raises(InvalidInput) as sync_error:
        dibs.Lot(sync_store, *args, **kwargs)
    with pytest.raises(InvalidInput) as async_error:
        dibs.aio.Lot(async_store, *args, **kwargs)
    assert str(sync_error.value) == str(async_error.value)


def test_a_lot_of_another_size_is_refused_the_same_on_both_faces(
    pair: tuple[Store, AsyncStore], loop: asyncio.Runner
) -> None:
    sync_store, async_store = pair
    calls = [
        ("park", "car"),
        ("remove", "bus"),
        ("position_of", "bus"),
        ("is_free", 0),
        ("occupancy",),
    ]
    assert dibs.Lot(sync_store, "yard", 8).park("bus", 5) == 0
    small = dibs.Lot(sync_store, "yard", 2)
    expected = [outcome(lambda c=c: getattr(small, c[0])(*c[1:])) for c in calls]
    assert {e[:2] for e in expected} == {("raised", InvalidInput)}
    assert all(e[3] == "size" and "size 8 in this store, not 2" in e[2] for e in expected)

    async def run() -> list[Any]:
        assert await dibs.aio.Lot(async_store, "yard", 8).park("bus", 5) == 0
        asmall = dibs.aio.Lot(async_store, "yard", 2)
        return [await aoutcome(lambda c=c: getattr(asmall, c[0])(*c[1:])) for c in calls]

    assert loop.run(run()) == expected


# Each memory:// store is a world of its own: only a file or a database is shared.
@pytest.mark.parametrize("store_kind", SHARED_STORE_KINDS)
def test_sync_and_async_lots_share_one_row(faces: Faces, loop: asyncio.Runner) -> None:
    url = faces.url()
    with dibs.open(url) as sync_store:
        lot = dibs.Lot(sync_store, "yard", 6)
        assert lot.park("truck-1", 2) == 0

        async def run() -> None:
            async with dibs.aio.open(url) as store:
                alot = dibs.aio.Lot(store, "yard", 6)
                assert await alot.position_of("truck-1") == 0
                assert await alot.park("truck-1", 2) == 0  # the same truck, seen async
                assert await alot.park("car-1") == 2
                with pytest.raises(dibs.AlreadyParked):
                    await alot.park("truck-1", 3)
                assert await alot.remove("truck-1") == 0

        loop.run(run())
        assert lot.position_of("truck-1") is None
        assert str(lot.occupancy()) == "..#..."
        assert lot.park("bus-1", 3) == 3
