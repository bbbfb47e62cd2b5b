"""dibs.aio natively: opening forms, lazy open, closing, open errors, input errors, races.

The rules themselves run on the async face through tests/support/aio_face.py (the
contract suite, the input domain, the state machine); these tests use what only
the async face has: ``await``, ``async with``, tasks racing on one loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import math
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import dibs
import dibs.aio
from dibs import FakeClock, InvalidInput, StoreClosed, Unit
from dibs.aio import AsyncStore, ThreadedStore
from dibs.testing import strategies
from pg_fixtures import drop_schema, schema_url

KINDS = ["memory", "sqlite", "postgresql"]


@pytest.fixture(params=KINDS)
def url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A fresh store URL of each kind (memory:// is fresh per open)."""
    kind = request.param
    if kind == "memory":
        yield "memory://"
    elif kind == "sqlite":
        yield f"sqlite:///{tmp_path / 'aio.db'}"
    else:
        pg = request.getfixturevalue("pg_url")
        schema = f"a_{next(_schemas)}_{id(request)}"
        yield schema_url(pg, schema)
        drop_schema(pg, schema)


_schemas = itertools.count()


def run(coroutine: Awaitable[Any]) -> Any:
    async def main() -> Any:
        return await coroutine

    return asyncio.run(main())


# --- opening and closing -------------------------------------------------------------------------


def test_async_with_opens_claims_and_closes(url: str) -> None:
    async def main() -> None:
        async with dibs.aio.open(url) as store:
            assert isinstance(store, AsyncStore)
            won = await store.claim(Unit("show", "A1"), holder="alice", request_id="r", ttl=60)
            assert won and won.claim is not None
            again = await store.claim(Unit("show", "A1"), holder="alice", request_id="r", ttl=60)
            assert again.replayed and again.claim == won.claim
            assert not await store.claim(Unit("show", "A1"), holder="bob", ttl=60)
            assert await store.holder_of(Unit("show", "A1")) == "alice"
            confirmed = await store.confirm(won.claim.id, holder="alice", fence=won.claim.fence)
            assert confirmed.state is dibs.ClaimState.CONFIRMED
            assert await store.get(won.claim.id) == confirmed
            assert await store.claims_of("alice") == [confirmed]
            assert await store.release(won.claim.id, holder="alice", fence=won.claim.fence)
            assert (await store.sweep()).expired == 0
            assert (await store.now()).tzinfo is not None
        assert store.closed

    run(main())


def test_await_opens_and_close_closes(url: str) -> None:
    async def main() -> None:
        store = await dibs.aio.open(url)
        try:
            assert await store.claim(Unit("show", "B2"), holder="bob")
            assert await store.open() is store  # opening again does nothing
        finally:
            await store.close()
        await store.close()  # closing twice is fine
        assert store.closed

    run(main())


def test_open_does_no_io_until_the_first_await(tmp_path: Path) -> None:
    path = tmp_path / "lazy.db"
    store = dibs.aio.open(f"sqlite:///{path}")  # no loop needed, nothing touched
    assert not path.exists()

    async def main() -> None:
        assert await store.holder_of(Unit("x")) is None  # any method opens it
        assert path.exists()
        await store.close()

    run(main())


def test_a_store_closed_before_it_opened_refuses_every_call(tmp_path: Path) -> None:
    path = tmp_path / "never.db"
    store = dibs.aio.open(f"sqlite:///{path}")
    run(store.close())
    with pytest.raises(StoreClosed):
        run(store.claim(Unit("x"), holder="a"))
    with pytest.raises(StoreClosed):
        run(store.open())
    assert not path.exists()


def test_a_closed_store_refuses_every_call(url: str) -> None:
    async def main() -> None:
        store = await dibs.aio.open(url)
        claim = (await store.claim(Unit("x"), holder="a", ttl=10)).claim
        assert claim is not None
        await store.close()
        calls: list[Callable[[], Awaitable[object]]] = [
            lambda: store.claim(Unit("x"), holder="a"),
            lambda: store.confirm(claim.id, holder="a", fence=claim.fence),
            lambda: store.extend(claim.id, holder="a", fence=claim.fence, ttl=5),
            lambda: store.release(claim.id, holder="a", fence=claim.fence),
            lambda: store.get(claim.id),
            lambda: store.holder_of(Unit("x")),
            lambda: store.claims_of("a"),
            store.sweep,
            store.now,
            store.open,
            lambda: store,  # type: ignore[return-value,arg-type]
        ]
        for call in calls:
            with pytest.raises(StoreClosed):
                await call()
        # Bad input on a closed store is StoreClosed too, as on the sync store.
        with pytest.raises(StoreClosed):
            await store.claim("not a target", holder="")  # type: ignore[arg-type]

    run(main())


def test_closing_waits_for_calls_in_flight_and_stops_the_workers(tmp_path: Path) -> None:
    """Calls already running when close() comes finish; the worker threads are gone after."""
    import threading

    async def main() -> list[object]:
        store = await dibs.aio.open(f"sqlite:///{tmp_path / 'c.db'}", threads=4)
        calls = [
            asyncio.ensure_future(store.claim(Unit("c", str(i)), holder="a", request_id=str(i)))
            for i in range(40)
        ]
        await asyncio.sleep(0)
        await store.close()
        return await asyncio.gather(*calls, return_exceptions=True)

    before = {t.ident for t in threading.enumerate()}
    outcomes = run(main())
    for outcome in outcomes:  # each either ran to its end or was refused as closed
        assert isinstance(outcome, dibs.ClaimResult | StoreClosed), outcome
    left = [t for t in threading.enumerate() if t.ident not in before and t.is_alive()]
    for thread in left:  # the closing thread may still be finishing its last line
        thread.join(timeout=60)
    assert not [t for t in left if t.is_alive()]


# --- errors at open -------------------------------------------------------------------------------


def test_a_missing_sqlite_directory_is_misconfigured_at_the_first_await(tmp_path: Path) -> None:
    store = dibs.aio.open(f"sqlite:///{tmp_path / 'no' / 'such' / 'dir.db'}")
    with pytest.raises(dibs.StoreMisconfigured) as raised:
        run(store.open())
    assert "does not exist" in str(raised.value)
    with pytest.raises(dibs.StoreMisconfigured):  # still refused, and still not a driver error
        run(store.claim(Unit("x"), holder="a"))
    run(store.close())


@pytest.mark.parametrize("url", [5, b"memory://", "", "memory", "://x"])
def test_a_malformed_url_is_invalid_input_at_once(url: Any) -> None:
    with pytest.raises(InvalidInput) as raised:
        dibs.aio.open(url)
    assert raised.value.field == "url"


def test_an_unknown_scheme_is_refused_at_once() -> None:
    with pytest.raises(dibs.UnknownScheme, match="'redis'"):
        dibs.aio.open("redis://localhost/0")


@pytest.mark.parametrize(
    ("options", "error", "field"),
    [
        ({"colour": "blue"}, TypeError, None),
        ({"request_retention": -1}, InvalidInput, "request_retention"),
        ({"synchronous": "sometimes"}, InvalidInput, "synchronous"),
    ],
)
def test_a_bad_option_raises_what_the_sync_store_raises(
    tmp_path: Path, options: dict[str, Any], error: type[Exception], field: str | None
) -> None:
    url = f"sqlite:///{tmp_path / 'o.db'}"
    with pytest.raises(error) as sync:
        dibs.open(url, **options)
    store = dibs.aio.open(url, **options)
    with pytest.raises(error) as aio:
        run(store.open())
    assert str(aio.value) == str(sync.value)
    if field is not None:
        assert getattr(aio.value, "field", None) == field
    run(store.close())


@pytest.mark.parametrize("threads", [0, -1, 1.5, True, "4"])
def test_a_bad_thread_count_is_invalid_input(tmp_path: Path, threads: Any) -> None:
    with pytest.raises(InvalidInput) as raised:
        dibs.aio.open(f"sqlite:///{tmp_path / 't.db'}", threads=threads)
    assert raised.value.field == "threads"


def test_sqlite_and_plug_in_stores_run_threaded_and_memory_inline() -> None:
    store = dibs.aio.open("memory://")
    assert isinstance(store, ThreadedStore) and store.scheme == "memory"
    run(store.close())


# --- bad input: the same errors as the sync store -----------------------------------------------

junk = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=5),
    st.binary(max_size=3),
    st.lists(st.text(max_size=2), max_size=2),
    st.tuples(st.text(max_size=2), st.text(max_size=2)),
)
"""Values of the wrong kind for any argument."""

calls = st.one_of(
    st.tuples(
        st.just("claim"),
        st.fixed_dictionaries(
            {
                "targets": st.one_of(
                    strategies.targets(), strategies.target_lists(strategies.targets()), junk
                ),
                "holder": st.one_of(strategies.names(allow_empty=True), junk),
                "request_id": st.one_of(strategies.names(allow_empty=True), junk),
                "ttl": st.one_of(strategies.ttls(), junk),
            }
        ),
    ),
    st.tuples(
        st.sampled_from(["confirm", "release", "extend"]),
        st.fixed_dictionaries(
            {
                "claim_id": st.one_of(strategies.names(allow_empty=True), junk),
                "holder": st.one_of(strategies.names(allow_empty=True), junk),
                "fence": st.one_of(st.integers(), junk),
            },
            optional={"ttl": st.one_of(strategies.ttls(), junk)},
        ),
    ),
    st.tuples(st.just("get"), st.fixed_dictionaries({"claim_id": junk})),
    st.tuples(st.just("holder_of"), st.fixed_dictionaries({"target": junk})),
    st.tuples(st.just("claims_of"), st.fixed_dictionaries({"holder": junk})),
)


def _call(store: Any, operation: str, kwargs: dict[str, Any]) -> Any:
    args = dict(kwargs)
    if operation == "claim":
        return store.claim(args.pop("targets"), **args)
    if operation in ("confirm", "release", "extend"):
        if operation == "extend":
            args.setdefault("ttl", 30)
        else:
            args.pop("ttl", None)
        return getattr(store, operation)(args.pop("claim_id"), **args)
    (value,) = args.values()
    return getattr(store, operation)(value)


def _outcome(call: Callable[[], Any]) -> tuple[str, Any]:
    try:
        return "ok", call()
    except (dibs.DibsError, TypeError) as exc:  # TypeError: a missing or unknown argument
        return type(exc).__name__, (str(exc), getattr(exc, "field", None))


def _errors_agree(kind: str, tmp_path: Path, pg: str | None) -> None:
    url = {
        "memory": "memory://",
        "sqlite": f"sqlite:///{tmp_path / 'i.db'}",
        "postgresql": schema_url(pg) if pg else "",
    }[kind]
    sync = dibs.open(url, clock=FakeClock())
    loop = asyncio.new_event_loop()
    aio = dibs.aio.open(url, clock=FakeClock())
    # Open both before the search: psycopg's pool draws on `random` as it connects, which
    # Hypothesis would take for a strategy using the random module.
    sync.holder_of(Unit("warm-up"))
    loop.run_until_complete(aio.holder_of(Unit("warm-up")))
    seen: list[str] = []

    @settings(max_examples=150, deadline=None)
    @given(call=calls)
    def check(call: tuple[str, dict[str, Any]]) -> None:
        operation, kwargs = call
        expected = _outcome(lambda: _call(sync, operation, kwargs))
        actual = _outcome(lambda: loop.run_until_complete(_call(aio, operation, kwargs)))
        seen.append(expected[0])
        if "InvalidInput" in (expected[0], actual[0]) or "TypeError" in (expected[0], actual[0]):
            assert actual == expected, (operation, kwargs)
        else:
            assert actual[0] != "InvalidInput", (operation, kwargs, actual)

    try:
        check()
    finally:
        loop.run_until_complete(aio.close())
        loop.close()
        sync.close()
    assert "InvalidInput" in seen and "ok" in seen, "the search never met both kinds of input"


@pytest.mark.parametrize("kind", KINDS)
def test_bad_input_raises_the_same_error_as_the_sync_store(
    kind: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """Whatever the input, the async face raises exactly the sync store's InvalidInput."""
    pg = request.getfixturevalue("pg_url") if kind == "postgresql" else None
    _errors_agree(kind, tmp_path, pg)


# --- tasks racing ---------------------------------------------------------------------------------


async def _racer(
    store: AsyncStore, seats: list[Unit], start: asyncio.Event, n: int
) -> list[dibs.ClaimResult]:
    """Visit every seat out of step with the others; every third racer claims pairs."""
    await start.wait()
    results = []
    for i in range(len(seats)):
        k = (i * 7 + n) % len(seats)
        group = seats[k : k + 2] if n % 3 == 0 else [seats[k]]
        results.append(await store.claim(group, holder=f"t{n}", ttl=60))
    return results


def test_tasks_racing_for_seats_get_one_winner_each(url: str) -> None:
    """48 tasks race for 30 seats, alone and in pairs, over 3 rounds; one winner per seat."""

    async def main() -> None:
        async with dibs.aio.open(url) as store:
            for round_ in range(3):
                seats = [Unit(f"race-{round_}", str(i)) for i in range(30)]
                start = asyncio.Event()
                racers = [asyncio.ensure_future(_racer(store, seats, start, n)) for n in range(48)]
                await asyncio.sleep(0)
                start.set()
                per_racer = await asyncio.gather(*racers)
                winners: dict[Unit, list[str]] = {}
                fences: set[int] = set()
                for n, results in enumerate(per_racer):
                    for result in results:
                        if result.granted and not result.replayed:
                            assert result.claim is not None
                            assert result.claim.holder == f"t{n}", "an answer went astray"
                            assert result.claim.fence not in fences
                            fences.add(result.claim.fence)
                            for unit in result.claim.units:
                                winners.setdefault(unit, []).append(f"t{n}")
                        elif not result.granted:
                            assert result.taken, "a loser was not told what was taken"
                doubles = {u: hs for u, hs in winners.items() if len(hs) != 1}
                assert not doubles, f"seats granted more than once: {doubles}"
                assert set(winners) == set(seats)
                for unit, (holder,) in winners.items():
                    assert await store.holder_of(unit) == holder

    run(main())


def test_a_nan_ttl_is_refused_before_any_io() -> None:
    """Input is checked before the store opens: bad input never costs a connection."""
    store = dibs.aio.open("sqlite:////no/such/dir/x.db")
    with pytest.raises(InvalidInput) as raised:
        run(store.claim(Unit("x"), holder="a", ttl=math.nan))
    assert raised.value.field == "ttl"
    run(store.close())


# --- loops, and closing under cancellation ------------------------------------------------------


def test_a_store_belongs_to_its_loop(url: str) -> None:
    # A call from a second loop that runs while the first is still open is refused
    # with StoreClosed saying why, before any work is queued (a claim that ran on a
    # worker anyway would be one nobody knows the ID of). memory:// belongs to none.
    store = dibs.aio.open(url)
    first = asyncio.new_event_loop()
    try:
        assert first.run_until_complete(store.claim(Unit("r", "1"), holder="a")).granted
        second = asyncio.new_event_loop()
        try:
            call = second.run_until_complete
            if url == "memory://":
                assert call(store.claim(Unit("r", "2"), holder="a")).granted
            else:
                with pytest.raises(StoreClosed, match="event loop"):
                    call(store.claim(Unit("r", "2"), holder="a"))
        finally:
            second.close()
        assert first.run_until_complete(store.holder_of(Unit("r", "2"))) in (
            ("a",) if url == "memory://" else (None,)
        )
        first.run_until_complete(store.close())
    finally:
        first.close()


def test_a_threaded_store_moves_to_the_next_loop_once_the_first_has_closed(
    tmp_path: Path,
) -> None:
    # One asyncio.run() after another: the first loop is gone, so the store's worker
    # threads are replaced and the calls go on, on the same sync store.
    store = dibs.aio.open(f"sqlite:///{tmp_path / 'moves.db'}")
    assert run(store.claim(Unit("r", "1"), holder="a")).granted
    assert run(store.holder_of(Unit("r", "1"))) == "a"
    assert not run(store.claim(Unit("r", "1"), holder="b")).granted
    run(store.close())
    with pytest.raises(StoreClosed):
        run(store.get("1"))


def test_a_cancelled_close_still_closes_and_a_second_close_waits_for_it(url: str) -> None:
    async def main() -> None:
        store = await dibs.aio.open(url)
        await store.claim(Unit("r", "1"), holder="a")
        closing = asyncio.ensure_future(store.close())
        await asyncio.sleep(0)
        closing.cancel()
        with pytest.raises(asyncio.CancelledError):
            await closing
        await store.close()  # waits for the first close's end
        if isinstance(store, ThreadedStore):
            assert store.sync is None or store.sync.closed
        pool = getattr(store, "_own_pool", None)
        assert pool is None or pool.closed
        with pytest.raises(StoreClosed):
            await store.get("1")

    run(main())


def test_a_call_that_waited_for_the_open_meets_store_closed_after_close(url: str) -> None:
    # Two first calls race the lazy open; close() comes between the open's end and
    # the second call's turn: that call raises StoreClosed, never an internal error.
    async def main() -> None:
        store = dibs.aio.open(url)
        first = asyncio.ensure_future(store.claim(Unit("r", "1"), holder="a"))
        second = asyncio.ensure_future(store.claim(Unit("r", "2"), holder="b"))
        await first
        await store.close()
        with contextlib.suppress(StoreClosed):
            await second

    run(main())


def test_a_threaded_store_logs_as_its_sync_store(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    async def main() -> None:
        async with dibs.aio.open(f"sqlite:///{tmp_path / 'log.db'}") as store:
            held = (await store.claim(Unit("r", "1"), holder="a", ttl=60.0)).claim
            assert held is not None
            with pytest.raises(dibs.HoldLost):
                await store.confirm(held.id, holder="a", fence=held.fence + 1)

    with caplog.at_level("DEBUG", logger="dibs.stores"):
        run(main())
    assert any(r.name == "dibs.stores.sqlite" and "hold lost" in r.message for r in caplog.records)


@pytest.mark.parametrize("kind", ["memory", "sqlite"])
def test_a_threaded_face_over_an_open_store_leaves_it_to_its_owner(
    kind: str, tmp_path: Path
) -> None:
    url = "memory://" if kind == "memory" else f"sqlite:///{tmp_path / 'over.db'}"
    sync = dibs.open(url)

    async def main() -> None:
        face = ThreadedStore.over(sync, threads=2)
        assert face.sync is sync
        assert (await face.claim(Unit("r", "1"), holder="a")).granted
        await face.close()
        assert not sync.closed and sync.holder_of(Unit("r", "1")) == "a"
        again = await ThreadedStore.over(sync)
        sync.close()  # by its owner: the face's calls now refuse, as the store's own do
        with pytest.raises(StoreClosed):
            await again.get("1")
        await again.close()

    run(main())
