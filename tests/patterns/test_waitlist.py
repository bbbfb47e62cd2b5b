"""dibs.Waitlist: a freed unit is offered to the head of the list as a hold, on every store.

The rules checked: entries are served in the order they joined; an offer is a hold
for the head that nobody outside the list can take; the head gets the unit exactly
once (a fenced confirm) or it goes to the next in line when declined or lapsed; one
freed unit is one offer, and one entry gets at most one offer, under races.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import dibs
import dibs.aio
from conftest import fresh_url
from dibs import ClaimState, HoldLost, HoldLostReason, InvalidInput, NotHolder, Store, Unit
from dibs.waitlist import Entry, Offer
from eventually import eventually

QUICK = True

SEATS = [Unit(f"seat-{n}", "show-42") for n in range(4)]


@pytest.fixture
def url(store_kind: str, tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[str]:
    yield from fresh_url(store_kind, tmp_path, request)


def _sold(store: Store, unit: Unit, holder: str = "buyer") -> dibs.Claim:
    claim = store.claim(unit, holder=holder).claim
    assert claim is not None
    return claim


def test_a_freed_unit_is_offered_to_the_head_and_taken_once(store: Store) -> None:
    wl = dibs.Waitlist(store, "show-42", offer_ttl=600)
    sold = _sold(store, SEATS[0])
    for holder in ["alice", "bob", "carol"]:
        wl.join(holder)
    assert [entry.holder for entry in wl.entries()] == ["alice", "bob", "carol"]
    assert wl.position("bob") == 2 and wl.position("zed") is None
    assert wl.join("alice").position == 1  # in the list once

    [offer] = wl.release(sold.id, holder="buyer", fence=sold.fence)
    assert (offer.holder, offer.unit) == ("alice", SEATS[0])
    assert wl.position("alice") is None  # the offer used her entry up
    assert wl.position("bob") == 1
    assert wl.offers("alice") == [offer] and wl.offers("bob") == []
    assert not store.claim(SEATS[0], holder="mallory")  # nobody outside the list takes it
    claim = wl.accept(offer)
    assert claim.state is ClaimState.CONFIRMED and store.holder_of(SEATS[0]) == "alice"
    assert wl.offers("alice") == []
    assert wl.sweep() == []  # an accepted offer is not passed on
    assert store.holder_of(SEATS[0]) == "alice"


def test_a_declined_offer_goes_to_the_next_and_an_empty_list_leaves_the_unit_free(
    store: Store,
) -> None:
    wl = dibs.Waitlist(store, "show-42")
    sold = _sold(store, SEATS[0])
    wl.join("alice")
    wl.join("bob")
    assert wl.leave("bob") and not wl.leave("bob")
    wl.join("carol")
    [offer] = wl.release(sold.id, holder="buyer", fence=sold.fence)
    following = wl.decline(offer)
    assert following is not None and following.holder == "carol"
    with pytest.raises(HoldLost):
        wl.accept(offer)  # declined: not hers any more
    again = wl.decline(following)
    assert again is None and store.holder_of(SEATS[0]) is None  # no one left: free
    assert wl.offer(SEATS[0]) is None


def _forgeries(offer: Offer) -> list[tuple[Offer, type[Exception]]]:
    """The offer with a wrong fence, and with a holder it was not made to."""
    return [
        (
            dataclasses.replace(
                offer, claim=dataclasses.replace(offer.claim, fence=offer.fence + 1)
            ),
            HoldLost,
        ),
        (dataclasses.replace(offer, holder="mallory"), NotHolder),
    ]


def test_a_forged_offer_declines_nothing(store: Store) -> None:
    wl = dibs.Waitlist(store, "show-42", offer_ttl=600)
    sold = _sold(store, SEATS[0])
    wl.join("alice")
    wl.join("bob")
    [offer] = wl.release(sold.id, holder="buyer", fence=sold.fence)
    for forged, error in _forgeries(offer):
        with pytest.raises(error) as raised:
            wl.decline(forged)
        if isinstance(raised.value, HoldLost):
            assert raised.value.reason is HoldLostReason.FENCE
        # Nothing moved: her hold, its record and bob's place are as they were.
        assert wl.offers("alice") == [offer] and wl.position("bob") == 1
        assert wl.sweep() == []
    assert wl.accept(offer).state is ClaimState.CONFIRMED


async def _async_forgeries(url: str) -> None:
    async with dibs.aio.open(url) as store:
        wl = dibs.aio.Waitlist(store, "show-42", offer_ttl=600)
        sold = (await store.claim(SEATS[0], holder="buyer")).claim
        assert sold is not None
        await wl.join("alice")
        await wl.join("bob")
        [offer] = await wl.release(sold.id, holder="buyer", fence=sold.fence)
        for forged, error in _forgeries(offer):
            with pytest.raises(error):
                await wl.decline(forged)
            assert await wl.offers("alice") == [offer] and await wl.position("bob") == 1
            assert await wl.sweep() == []
        assert (await wl.accept(offer)).state is ClaimState.CONFIRMED


def test_a_forged_offer_declines_nothing_async(url: str) -> None:
    asyncio.run(_async_forgeries(url))


def test_a_lapsed_offer_is_passed_on_by_a_sweep(url: str) -> None:
    with dibs.open(url) as store:
        wl = dibs.Waitlist(store, "show-42", offer_ttl=0.2)
        sold = _sold(store, SEATS[0])
        wl.join("alice")
        wl.join("bob")
        [offer] = wl.release(sold.id, holder="buyer", fence=sold.fence)
        assert offer.holder == "alice"
        passed = eventually(wl.sweep, "the lapsed offer passed on")
        assert [o.holder for o in passed] == ["bob"]
        with pytest.raises(HoldLost):
            wl.accept(offer)
        [bobs] = wl.offers("bob")
        assert wl.accept(bobs).holder == "bob"


def test_a_unit_not_free_is_not_offered(store: Store) -> None:
    wl = dibs.Waitlist(store, "show-42")
    _sold(store, SEATS[0])
    wl.join("alice")
    assert wl.offer(SEATS[0]) is None
    assert wl.position("alice") == 1  # her entry is not used up


async def _async_flow(url: str) -> None:
    async with dibs.aio.open(url) as store:
        wl = dibs.aio.Waitlist(store, "show-42")
        sold = (await store.claim(SEATS[0], holder="buyer")).claim
        assert sold is not None
        await wl.join("alice")
        await wl.join("bob")
        assert await wl.position("bob") == 2
        [offer] = await wl.release(sold.id, holder="buyer", fence=sold.fence)
        assert offer.holder == "alice"
        following = await wl.decline(offer)
        assert following is not None and following.holder == "bob"
        assert (await wl.accept(following)).state is ClaimState.CONFIRMED
        assert await wl.entries() == [] and await wl.sweep() == []


def test_async_face(url: str) -> None:
    asyncio.run(_async_flow(url))


@pytest.mark.parametrize("store_kind", ["sqlite", "postgresql", "etcd"])
def test_sync_and_async_lists_of_one_key_are_one_list(url: str) -> None:
    async def join_async() -> None:
        async with dibs.aio.open(url) as store:
            await dibs.aio.Waitlist(store, "k").join("async-one")

    with dibs.open(url) as store:
        wl = dibs.Waitlist(store, "k")
        wl.join("sync-one")
        asyncio.run(join_async())
        assert [entry.holder for entry in wl.entries()] == ["sync-one", "async-one"]


CROWD = {"memory": 40, "sqlite": 16, "postgresql": 16, "etcd": 8}
EARLY = [f"early-{n}" for n in range(6)]


def _crowd_of(size: int) -> tuple[list[str], list[str]]:
    """The crowd's joins (two of its holders twice) and the early entries that leave.

    Joiners collide on numbers, a holder's second join meets its first, and the
    numbers the leavers free lie below the crowd's.
    """
    crowd = [f"crowd-{n}" for n in range(size)]
    return [*crowd, *crowd[:2]], EARLY[::2]


def _check_crowd(joined: list[Entry], entries: list[Entry], late: Entry, size: int) -> None:
    # A holder's second join meets its first: both answer that holder's entry. A join
    # that took a number freed meanwhile joins again, behind; the other join may have
    # read the entry before that move, so the list keeps the higher of the two numbers
    # (a rehearsal under no load once saw 11 and 16). Numbers only grow in a move.
    numbers = {entry.holder: entry.number for entry in entries}
    for first, second in zip(joined[:2], joined[size : size + 2], strict=True):
        assert first.holder == second.holder
        assert numbers[first.holder] == max(first.number, second.number), (first, second)
    holders = [entry.holder for entry in entries]
    crowd = [f"crowd-{n}" for n in range(size)]
    assert sorted(holders) == sorted([*EARLY[1::2], *crowd, "late"])  # one place each
    assert [entry.position for entry in entries] == list(range(1, len(entries) + 1))
    assert len({entry.number for entry in entries}) == len(entries)
    # Whoever had joined before the crowd stays ahead of it; "late" is behind it.
    assert holders[:3] == EARLY[1::2] and holders[-1] == "late" == late.holder
    assert late.position == len(entries)


async def _crowd(url: str, size: int) -> None:
    async with dibs.aio.open(url) as store:
        wl = dibs.aio.Waitlist(store, "crowd")
        for holder in EARLY:
            await wl.join(holder)
        joins, leavers = _crowd_of(size)
        done = await asyncio.gather(
            *(wl.join(holder) for holder in joins), *(wl.leave(holder) for holder in leavers)
        )
        late = await wl.join("late")  # joined after the whole crowd had
        _check_crowd(list(done[: len(joins)]), await wl.entries(), late, size)


@pytest.mark.timeout(300)
def test_a_crowd_joining_at_once_gets_one_place_each_in_order(url: str, store_kind: str) -> None:
    asyncio.run(_crowd(url, CROWD[store_kind]))


@pytest.mark.timeout(300)
def test_a_crowd_of_threads_joining_at_once_gets_one_place_each_in_order(
    store: Store, store_kind: str
) -> None:
    size = CROWD[store_kind]
    wl = dibs.Waitlist(store, "crowd")
    for holder in EARLY:
        wl.join(holder)
    joins, leavers = _crowd_of(size)
    start = threading.Barrier(len(joins) + len(leavers))
    joined: list[Entry | None] = [None] * len(joins)

    def join(i: int) -> None:
        start.wait()
        joined[i] = wl.join(joins[i])

    def leave(holder: str) -> None:
        start.wait()
        wl.leave(holder)

    threads = [threading.Thread(target=join, args=(i,)) for i in range(len(joins))]
    threads += [threading.Thread(target=leave, args=(holder,)) for holder in leavers]
    for t in threads:
        t.start()
    for t in threads:
        t.join(240)
    assert all(entry is not None for entry in joined)
    late = wl.join("late")
    _check_crowd([e for e in joined if e is not None], wl.entries(), late, size)


ROUNDS = {"memory": 30, "sqlite": 8, "postgresql": 6, "etcd": 4}


def test_racing_releases_offer_each_unit_once_to_the_heads_in_order(
    store: Store, store_kind: str
) -> None:
    """Units freed at once by racing threads: each goes to one of the list's heads, and each
    of the heads gets exactly one, so no one further back is offered anything."""
    for rounds in range(ROUNDS[store_kind]):
        _race_round(store, rounds)


def _race_round(store: Store, rounds: int) -> None:
    wl = dibs.Waitlist(store, f"race-{rounds}")
    units = [Unit(f"race-{rounds}-{n}", "s") for n in range(len(SEATS))]
    sold = [_sold(store, unit) for unit in units]
    people = [f"p{n}" for n in range(2 * len(units))]
    for person in people:
        wl.join(person)
    offers: list[Offer] = []
    barrier = threading.Barrier(len(units))

    def free(claim: dibs.Claim) -> None:
        barrier.wait()
        offers.extend(wl.release(claim.id, holder="buyer", fence=claim.fence))

    threads = [threading.Thread(target=free, args=(claim,)) for claim in sold]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert sorted(o.holder for o in offers) == people[: len(units)]
    assert sorted(o.unit for o in offers) == sorted(units)
    assert [entry.holder for entry in wl.entries()] == people[len(units) :]


names = st.text(
    st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"),
    min_size=1,
    max_size=40,
)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    key=names,
    holders=st.lists(names, min_size=1, max_size=6, unique=True),
    order=st.randoms(use_true_random=False),
)
def test_entries_keep_the_order_joined_for_any_names(
    key: str, holders: list[str], order: object
) -> None:
    shuffled = list(holders)
    order.shuffle(shuffled)  # type: ignore[attr-defined]
    with dibs.open("memory://") as store:
        wl = dibs.Waitlist(store, key)
        for holder in shuffled:
            wl.join(holder)
        assert [entry.holder for entry in wl.entries()] == shuffled
        assert [wl.position(holder) for holder in shuffled] == list(range(1, len(shuffled) + 1))
        unit = Unit(key, shuffled[0])
        offer = wl.offer(unit)
        assert offer is not None and offer.holder == shuffled[0]
        assert wl.accept(offer).holder == shuffled[0]


@pytest.mark.parametrize(
    ("call", "field"),
    [
        (lambda s: dibs.Waitlist(s, ""), "key"),
        (lambda s: dibs.Waitlist(s, 7), "key"),
        (lambda s: dibs.Waitlist(s, "a\x00b"), "key"),
        (lambda s: dibs.Waitlist(s, "k", offer_ttl=0), "ttl"),
        (lambda s: dibs.Waitlist(s, "k", offer_ttl=None), "ttl"),
        (lambda s: dibs.Waitlist(s, "k").join(""), "holder"),
        (lambda s: dibs.Waitlist(s, "k").join("\ud800"), "holder"),
        (lambda s: dibs.Waitlist(s, "k").offer(("seat", "1")), "unit"),
        (lambda s: dibs.Waitlist(s, "k").accept("offer-1"), "offer"),
        (lambda s: dibs.Waitlist(s, "k").offers(""), "holder"),
    ],
)
def test_bad_input_is_invalid_input_naming_it(store: Store, call: object, field: str) -> None:
    with pytest.raises(InvalidInput) as bad:
        call(store)  # type: ignore[operator]
    assert bad.value.field == field


_FREER = """
import sys, dibs
store = dibs.open(sys.argv[1])
wl = dibs.Waitlist(store, "procs")
claim = store.get(sys.argv[2])
for offer in wl.release(claim.id, holder="buyer", fence=claim.fence):
    print(offer.holder, offer.unit.resource, flush=True)
"""


@pytest.mark.processes
@pytest.mark.parametrize("store_kind", ["sqlite", "postgresql", "etcd"])
def test_processes_freeing_at_once_offer_each_unit_once_to_the_heads(url: str) -> None:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    units = [Unit(f"proc-seat-{n}", "s") for n in range(4)]
    with dibs.open(url) as store:
        wl = dibs.Waitlist(store, "procs")
        sold = [_sold(store, unit) for unit in units]
        people = [f"p{n}" for n in range(6)]
        for person in people:
            wl.join(person)
        freers = [
            subprocess.Popen(
                [sys.executable, "-c", _FREER, url, claim.id],
                stdout=subprocess.PIPE,
                text=True,
                env=env,
            )
            for claim in sold
        ]
        lines = []
        for freer in freers:
            out, _ = freer.communicate(timeout=100)
            assert freer.returncode == 0
            lines += out.split("\n")
        offers = [line.split() for line in lines if line]
        assert sorted(holder for holder, _ in offers) == people[:4]
        assert sorted(unit for _, unit in offers) == sorted(u.resource for u in units)
        assert [entry.holder for entry in wl.entries()] == people[4:]
