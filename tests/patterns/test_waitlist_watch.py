"""``Waitlist.watch``: a freed unit is offered to the head with no caller action, on every store.

The rules checked, on both faces: a unit freed by a plain ``store.release``, or by a
hold that lapses, or an offer that lapses, is offered to the head by the watcher
alone; a watcher survives store errors; it stops on close and on cancellation; and
watchers in several processes make one offer per freed unit (one entry, one offer).
"""

from __future__ import annotations

import asyncio
import logging
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import dibs
import dibs.aio
from conftest import SHARED_STORE_KINDS, fresh_url
from dibs import InvalidInput, Store, StoreUnavailable, Unit
from eventually import aeventually, eventually

SEATS = [Unit(f"seat-{n}", "show-7") for n in range(3)]
EVERY = 0.05  # memory:// has no feed, and a lapse moves none: rounds come this often


@pytest.fixture
def url(store_kind: str, tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[str]:
    yield from fresh_url(store_kind, tmp_path, request)


def _sell(store: Store, units: list[Unit], holder: str = "buyer", ttl: float | None = None) -> Any:
    claim = store.claim(units, holder=holder, ttl=ttl).claim
    assert claim is not None
    return claim


def test_a_unit_freed_by_a_plain_release_is_offered_to_the_head(url: str) -> None:
    with dibs.open(url) as store:
        wl = dibs.Waitlist(store, "show-7")
        sold = [_sell(store, [seat]) for seat in SEATS]
        wl.join("alice")
        wl.join("bob")
        with wl.watch(SEATS, every=EVERY) as watcher:
            eventually(lambda: watcher.rounds >= 1, "a first round")
            assert wl.offers("alice") == []  # nothing was free
            store.release(sold[1].id, holder="buyer", fence=sold[1].fence)
            [offer] = eventually(lambda: wl.offers("alice"), "an offer to alice")
            assert offer.unit == SEATS[1]
            assert wl.entries()[0].holder == "bob"
            assert not store.claim(SEATS[1], holder="mallory")
            assert wl.accept(offer).holder == "alice"
        assert not watcher.running


def test_a_lapsed_hold_and_a_lapsed_offer_are_offered_on(url: str) -> None:
    with dibs.open(url) as store:
        wl = dibs.Waitlist(store, "show-7", offer_ttl=0.3)
        _sell(store, SEATS[1:])
        _sell(store, SEATS[:1], holder="cart", ttl=0.3)  # a cart that will lapse
        for person in ["alice", "bob"]:
            wl.join(person)
        with wl.watch(SEATS, every=EVERY):
            [first] = eventually(lambda: wl.offers("alice"), "the lapsed cart's seat offered")
            assert first.unit == SEATS[0]
            # Alice lets her offer lapse too: bob gets it, and nobody called sweep().
            [second] = eventually(lambda: wl.offers("bob"), "the lapsed offer passed on")
            assert second.unit == SEATS[0]
            assert wl.accept(second).holder == "bob"
            with pytest.raises(dibs.HoldLost):
                wl.accept(first)


def test_the_watcher_survives_store_errors(url: str, caplog: pytest.LogCaptureFixture) -> None:
    class Flaky:
        """The store, but its first few reads of a list fail as an outage would."""

        def __init__(self, store: Store) -> None:
            self.store, self.failures = store, 3

        def __getattr__(self, name: str) -> Any:
            real = getattr(self.store, name)
            if name != "claims_of":
                return real

            def claims_of(holder: str) -> Any:
                if self.failures > 0:
                    self.failures -= 1
                    raise StoreUnavailable("planned outage")
                return real(holder)

            return claims_of

    with dibs.open(url) as store:
        sold = _sell(store, SEATS)
        wl = dibs.Waitlist(Flaky(store), "show-7")  # type: ignore[arg-type]
        store.release(sold.id, holder="buyer", fence=sold.fence)
        wl.store.failures = 0  # type: ignore[attr-defined]
        wl.join("alice")
        wl.store.failures = 3  # type: ignore[attr-defined]
        with caplog.at_level(logging.WARNING, "dibs.waitlist"), wl.watch(SEATS, every=EVERY):
            check = dibs.Waitlist(store, "show-7")  # reads past the flaky store
            [offer] = eventually(lambda: check.offers("alice"), "an offer after the outage")
        assert offer.unit in SEATS
        assert "planned outage" in caplog.text


def test_the_watcher_stops_when_closed_and_when_its_store_closes(url: str) -> None:
    store = dibs.open(url)
    wl = dibs.Waitlist(store, "show-7")
    watcher = wl.watch(SEATS, every=EVERY)
    watcher.start()
    with pytest.raises(RuntimeError):
        watcher.start()
    eventually(lambda: watcher.rounds >= 2, "two rounds")
    watcher.close()
    assert not watcher.running
    rounds = watcher.rounds
    watcher.close()  # again: nothing to do
    assert watcher.rounds == rounds  # its thread ended: no round after close

    other = wl.watch(SEATS, every=EVERY)
    other.start()
    eventually(lambda: other.rounds >= 1, "a round")
    store.close()
    eventually(lambda: not other.running, "the watcher stopped with its store")
    other.close()


@pytest.mark.parametrize(
    ("units", "every", "field"),
    [
        ("seat-1", 1.0, "units"),
        ([SEATS[0], ("seat", "1")], 1.0, "units"),
        (42, 1.0, "units"),
        (SEATS, 0, "every"),
        (SEATS, float("nan"), "every"),
        (SEATS, True, "every"),
        (SEATS, 10**30, "every"),
    ],
)
def test_bad_input_is_invalid_input_naming_it(
    store: Store, units: object, every: object, field: str
) -> None:
    wl = dibs.Waitlist(store, "show-7")
    with pytest.raises(InvalidInput) as caught:
        wl.watch(units, every=every)  # type: ignore[arg-type]
    assert caught.value.field == field
    with pytest.raises(InvalidInput) as caught:
        dibs.aio.Waitlist(dibs.aio.open("memory://"), "k").watch(units, every=every)  # type: ignore[arg-type]
    assert caught.value.field == field
    if field == "units":
        with pytest.raises(InvalidInput):
            wl.sweep(units)  # type: ignore[arg-type]


def test_one_unit_and_repeats_are_accepted(store: Store) -> None:
    wl = dibs.Waitlist(store, "show-7")
    assert wl.watch(SEATS[0]).units == (SEATS[0],)
    assert wl.watch([SEATS[1], SEATS[0], SEATS[1]]).units == (SEATS[1], SEATS[0])


# --- the async face -------------------------------------------------------------------------------


async def _async_watch(url: str) -> None:
    async with dibs.aio.open(url) as store:
        wl = dibs.aio.Waitlist(store, "show-7")
        sold = (await store.claim(SEATS, holder="buyer")).claim
        assert sold is not None
        await wl.join("alice")
        await wl.join("bob")
        async with wl.watch(SEATS, every=EVERY) as watcher:
            await aeventually(lambda: watcher.rounds >= 1, "a first round")
            assert await wl.offers("alice") == []
            await store.release(sold.id, holder="buyer", fence=sold.fence)
            # Three seats free, two waiting: one offer each, and one seat stays free.
            [a] = await aeventually(lambda: wl.offers("alice"), "an offer to alice")
            [b] = await aeventually(lambda: wl.offers("bob"), "an offer to bob")
            assert a.unit != b.unit
            assert (await wl.accept(b)).holder == "bob"
        assert not watcher.running
        rounds = watcher.rounds
        await asyncio.sleep(0)  # its task is gone: nothing more can run
        assert watcher.rounds == rounds

        # Cancelling the task that runs it stops it, and the feed is closed.
        other = wl.watch(SEATS, every=EVERY)
        task = asyncio.create_task(other.run())
        await aeventually(lambda: other.rounds >= 1, "a round")
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

        # So does cancelling the task inside whose `async with` it runs.
        third = wl.watch(SEATS, every=EVERY)

        async def body() -> None:
            async with third:
                await asyncio.Event().wait()

        owner = asyncio.create_task(body())
        await aeventually(lambda: third.rounds >= 1, "a round")
        owner.cancel()
        with pytest.raises(asyncio.CancelledError):
            await owner
        assert not third.running


def test_async_face(url: str) -> None:
    asyncio.run(_async_watch(url))


async def _async_lapse(url: str) -> None:
    async with dibs.aio.open(url) as store:
        wl = dibs.aio.Waitlist(store, "show-7")
        assert (await store.claim(SEATS[1:], holder="buyer")).claim is not None
        assert (await store.claim(SEATS[0], holder="cart", ttl=0.3)).claim is not None
        await wl.join("alice")
        watcher = wl.watch(SEATS, every=EVERY)
        watcher.start()
        try:
            [offer] = await aeventually(lambda: wl.offers("alice"), "the lapsed seat offered")
            assert offer.unit == SEATS[0]
        finally:
            await watcher.close()
        assert not watcher.running


def test_async_face_offers_a_lapsed_hold(url: str) -> None:
    asyncio.run(_async_lapse(url))


# --- watchers in several processes ----------------------------------------------------------------

_WATCHER = """
import sys
import dibs
url, key = sys.argv[1], sys.argv[2]
units = [dibs.Unit(f"pseat-{n}", "s") for n in range(int(sys.argv[3]))]
with dibs.open(url) as store:
    wl = dibs.Waitlist(store, key, offer_ttl=600)
    with wl.watch(units, every=0.05) as watcher:
        print("watching", flush=True)
        sys.stdin.read()  # until the test closes our stdin
    print(watcher.offered, flush=True)
"""

UNITS = 6
ROUNDS = 4
WATCHERS = 3


@pytest.mark.processes
@pytest.mark.parametrize("store_kind", SHARED_STORE_KINDS)
def test_watchers_in_processes_make_one_offer_per_freed_unit(url: str) -> None:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    units = [Unit(f"pseat-{n}", "s") for n in range(UNITS)]
    with dibs.open(url) as store:
        wl = dibs.Waitlist(store, "procs", offer_ttl=600)
        sold = [_sell(store, [unit]) for unit in units]
        watchers = [
            subprocess.Popen(
                [sys.executable, "-c", _WATCHER, url, "procs", str(UNITS)],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                text=True,
                env=env,
            )
            for _ in range(WATCHERS)
        ]
        try:
            for watcher in watchers:
                assert watcher.stdout is not None
                assert watcher.stdout.readline().strip() == "watching"
            for r in range(ROUNDS):
                people = [f"r{r}-p{n}" for n in range(UNITS + 2)]
                for person in people:
                    wl.join(person)
                holders = [claim.holder for claim in sold]
                for claim, holder in zip(sold, holders, strict=True):
                    store.release(claim.id, holder=holder, fence=claim.fence)

                def offered(people: list[str] = people) -> list[Any]:
                    found = [offer for person in people for offer in wl.offers(person)]
                    return found if len(found) >= UNITS else []

                offers = eventually(offered, f"round {r}: every freed unit offered")
                # One entry, one offer: the first UNITS people in line get one unit each.
                assert sorted(offer.holder for offer in offers) == sorted(people[:UNITS])
                assert sorted(offer.unit.resource for offer in offers) == sorted(
                    unit.resource for unit in units
                )
                assert [entry.holder for entry in wl.entries()] == people[UNITS:]
                for person in people[UNITS:]:
                    wl.leave(person)
                sold = [wl.accept(offer) for offer in offers]
        finally:
            made = []
            for watcher in watchers:
                out, _ = watcher.communicate("", timeout=100)
                assert watcher.returncode == 0
                made.append(int(out.split()[-1]))
        assert sum(made) == UNITS * ROUNDS  # one offer per freed unit, whoever made it
