"""dibs.booking on every store: discretized stays and slots, spans, and materialized conflict."""

from __future__ import annotations

import random
import time
from datetime import UTC, date, datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo

import pytest

from _race import race
from dibs import (
    FakeClock,
    HoldLost,
    HoldLostReason,
    InvalidInput,
    ResourceBusy,
    Span,
    Store,
    Unit,
    booking,
)

QUICK = True  # in `pytest -m quick` (conftest.is_quick: not slow, no server)

PARIS = ZoneInfo("Europe/Paris")


# --- discretize: nights ------------------------------------------------------------------------


def test_nights_exclude_the_check_out_night() -> None:
    assert booking.nights("room-7", date(2026, 12, 30), date(2027, 1, 2)) == [
        Unit("room-7", "2026-12-30"),
        Unit("room-7", "2026-12-31"),
        Unit("room-7", "2027-01-01"),
    ]
    assert booking.night_of(Unit("room-7", "2027-01-01")) == date(2027, 1, 1)


@pytest.mark.parametrize(
    ("check_in", "check_out"),
    [
        (date(2026, 1, 2), date(2026, 1, 2)),
        (date(2026, 1, 3), date(2026, 1, 2)),
        (datetime(2026, 1, 1, tzinfo=UTC), date(2026, 1, 2)),
        ("2026-01-01", date(2026, 1, 2)),
    ],
)
def test_bad_stays_are_refused(check_in: Any, check_out: Any) -> None:
    with pytest.raises(InvalidInput):
        booking.nights("room-7", check_in, check_out)
    with pytest.raises(InvalidInput):
        booking.night_of(Unit("room-7", "not-a-date"))


def test_overlapping_stays_conflict_all_or_nothing(store: Store) -> None:
    first = store.claim(
        booking.nights("room-7", date(2026, 12, 3), date(2026, 12, 7)), holder="alice", ttl=600
    )
    assert first
    clash = store.claim(
        booking.nights("room-7", date(2026, 12, 5), date(2026, 12, 9)), holder="bob", ttl=600
    )
    assert not clash
    assert sorted(booking.night_of(u) for u in clash.taken if isinstance(u, Unit)) == [
        date(2026, 12, 5),
        date(2026, 12, 6),
    ]
    # Nothing of bob's stay was taken, not even the free nights 7 and 8.
    assert store.holder_of(Unit("room-7", "2026-12-07")) is None
    # Back-to-back stays share no night.
    assert store.claim(
        booking.nights("room-7", date(2026, 12, 7), date(2026, 12, 9)), holder="bob", ttl=600
    )


@pytest.mark.usefixtures("fine_switching")
def test_racing_guests_never_share_a_night(store: Store, store_kind: str) -> None:
    rounds = 200 if store_kind == "memory" else 40
    start = date(2026, 12, 1)

    def guest(i: int) -> list[tuple[str, list[Unit]]]:
        rng = random.Random(i)
        won = []
        for r in range(rounds):
            check_in = start + timedelta(days=rng.randrange(20))
            stay = booking.nights("room-7", check_in, check_in + timedelta(days=rng.randint(1, 4)))
            if store.claim(stay, holder=f"guest-{i}-{r}"):
                won.append((f"guest-{i}-{r}", stay))
        return won

    bookings = [b for won in race(12, guest) for b in won]
    nights_booked = [u for _, stay in bookings for u in stay]
    assert len(nights_booked) == len(set(nights_booked)), "a night was booked twice"
    for holder, stay in bookings:
        assert all(store.holder_of(u) == holder for u in stay)


# --- discretize: time slots --------------------------------------------------------------------


def test_half_hour_slots_in_a_time_zone() -> None:
    units = booking.time_slots(
        "dr-lee",
        datetime(2026, 6, 1, 9, 0),
        datetime(2026, 6, 1, 10, 30),
        every=timedelta(minutes=30),
        tz="Europe/Paris",
    )
    assert [u.slot for u in units] == [
        "2026-06-01T09:00:00+02:00",
        "2026-06-01T09:30:00+02:00",
        "2026-06-01T10:00:00+02:00",
    ]
    # The same instants given in UTC make the same units.
    assert units == booking.time_slots(
        "dr-lee",
        datetime(2026, 6, 1, 7, 0, tzinfo=UTC),
        datetime(2026, 6, 1, 8, 30, tzinfo=UTC),
        every=timedelta(minutes=30),
        tz=PARIS,
    )


def test_slots_across_a_daylight_saving_change_are_distinct_instants() -> None:
    # Paris falls back on 2026-10-25: 02:00-03:00 local happens twice.
    units = booking.time_slots(
        "dr-lee",
        datetime(2026, 10, 25, 0, 0, tzinfo=UTC),
        datetime(2026, 10, 25, 3, 0, tzinfo=UTC),
        every=timedelta(hours=1),
        tz="Europe/Paris",
    )
    assert [u.slot for u in units] == [
        "2026-10-25T02:00:00+02:00",
        "2026-10-25T02:00:00+01:00",
        "2026-10-25T03:00:00+01:00",
    ]


def test_slots_align_to_local_midnight() -> None:
    kolkata = "Asia/Kolkata"  # UTC+05:30: hourly local slots start at :30 UTC
    units = booking.time_slots(
        "desk",
        datetime(2026, 6, 1, 9),
        datetime(2026, 6, 1, 11),
        every=timedelta(hours=1),
        tz=kolkata,
    )
    assert [u.slot for u in units] == ["2026-06-01T09:00:00+05:30", "2026-06-01T10:00:00+05:30"]
    with pytest.raises(InvalidInput) as info:
        booking.time_slots(
            "desk",
            datetime(2026, 6, 1, 9, 0, tzinfo=UTC),
            datetime(2026, 6, 1, 10, 0, tzinfo=UTC),
            every=timedelta(hours=1),
            tz=kolkata,
        )
    assert info.value.field == "start"


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"every": timedelta(minutes=7)}, "every"),
        ({"every": timedelta(0)}, "every"),
        ({"every": 30}, "every"),
        ({"every": timedelta(minutes=30), "tz": "Mars/Olympus"}, "tz"),
        ({"every": timedelta(minutes=30), "end": datetime(2026, 6, 1, 9, 45)}, "end"),
        ({"every": timedelta(minutes=30), "end": datetime(2026, 6, 1, 8)}, "end"),
        ({"every": timedelta(minutes=30), "start": date(2026, 6, 1)}, "start"),
    ],
)
def test_bad_slot_grids_are_refused(kwargs: dict[str, Any], field: str) -> None:
    args: dict[str, Any] = {
        "start": datetime(2026, 6, 1, 9),
        "end": datetime(2026, 6, 1, 10),
        "tz": "UTC",
    }
    args.update(kwargs)
    with pytest.raises(InvalidInput) as info:
        booking.time_slots("desk", **args)
    assert info.value.field == field


# --- exclusion over ranges: spans --------------------------------------------------------------


def test_spans_exclude_overlap_but_not_adjacency(store: Store) -> None:
    t0 = datetime(2026, 12, 3, 15, tzinfo=UTC)
    stay = Span("room-9", t0, t0 + timedelta(days=2, hours=-4))  # 15:00 to 11:00
    assert store.claim(stay, holder="alice", ttl=600)
    later = Span("room-9", stay.end - timedelta(hours=1), stay.end + timedelta(days=1))
    assert store.claim(later, holder="bob", ttl=600).taken == (later,)
    assert store.claim(Span("room-9", stay.end, stay.end + timedelta(days=1)), holder="bob")


# --- materialized conflict: exclusive ----------------------------------------------------------


@pytest.mark.usefixtures("fine_switching")
def test_exclusive_serializes_read_check_write(store: Store, store_kind: str) -> None:
    rounds = 100 if store_kind == "memory" else 30
    ledger: dict[str, int] = {"booked_minutes": 0}
    inside: list[int] = []
    overlaps: list[int] = []

    def writer(i: int) -> int:
        done = 0
        for _ in range(rounds):
            with booking.exclusive(store, "dr-lee/2026-06-01", wait=None):
                inside.append(i)
                if len(inside) > 1:
                    overlaps.append(i)
                # Read, check, write: a lost update unless the unit serializes writers.
                seen = ledger["booked_minutes"]
                time.sleep(0)  # stands for the I/O between a real read and write
                if seen < 10_000:
                    ledger["booked_minutes"] = seen + 1
                    done += 1
                inside.remove(i)
        return done

    total = sum(race(8, writer))
    assert not overlaps
    assert ledger["booked_minutes"] == total == 8 * rounds
    assert store.holder_of(Unit("dr-lee/2026-06-01", booking.EXCLUSIVE_SLOT)) is None


def test_exclusive_gives_up_after_wait(store: Store) -> None:
    with booking.exclusive(store, "room-1") as claim:
        assert claim.holder.startswith("exclusive:")
        with pytest.raises(ResourceBusy) as info, booking.exclusive(store, "room-1", wait=0):
            pass  # pragma: no cover
        assert isinstance(info.value, TimeoutError) and info.value.resource == "room-1"
    with booking.exclusive(store, "room-1", wait=0):
        pass


def test_exclusive_reports_a_hold_lost_under_the_block(store: Store, clock: FakeClock) -> None:
    with pytest.raises(HoldLost) as info, booking.exclusive(store, "room-1", ttl=5):
        clock.advance(6)
        with booking.exclusive(store, "room-1", wait=0):
            pass
    assert info.value.reason in (HoldLostReason.TAKEN_OVER, HoldLostReason.EXPIRED)


def test_exclusive_releases_when_the_block_fails_or_releases_itself(store: Store) -> None:
    with pytest.raises(KeyError), booking.exclusive(store, "room-1"):
        raise KeyError("boom")
    with booking.exclusive(store, "room-1", wait=0) as claim:
        store.release(claim.id, holder=claim.holder, fence=claim.fence)
    with booking.exclusive(store, "room-1", wait=0):
        pass


def test_exclusive_validates_wait(store: Store) -> None:
    with pytest.raises(InvalidInput), booking.exclusive(store, "room-1", wait=-1):
        pass  # pragma: no cover
