"""The shared-hold contract: readers together, a writer alone, as pytest tests.

Run by subclassing, like :class:`~dibs.testing.StoreContract`, on a store whose
``shared_holds`` is true; the fixtures are the same (``store``, a fresh store on
a :class:`~dibs.FakeClock`). A store without shared holds must refuse
``mode="shared"`` with :class:`~dibs.InvalidInput`; :func:`check_refused` says so.
"""

from __future__ import annotations

import functools
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

from dibs._extras import needs

with needs("testing", "dibs.testing.SharedHoldContract"):
    import pytest

from dibs import (
    ClaimState,
    FakeClock,
    HoldLost,
    HoldLostReason,
    InvalidInput,
    RequestConflict,
    Span,
    Store,
    Target,
    Unit,
)

__all__ = ["SharedHoldContract", "check_refused", "check_rw_history"]

DOC = Unit("doc-7", "page-1")
DOC_B = Unit("doc-7", "page-2")
T0 = datetime(2026, 12, 3, 15, 0, tzinfo=UTC)


def check_refused(store: Store) -> None:
    """Assert that a store without shared holds refuses them, naming the mode."""
    with pytest.raises(InvalidInput) as raised:
        store.claim(DOC, holder="reader", mode="shared")
    assert raised.value.field == "mode"
    assert store.claim(DOC, holder="writer")  # the refusal wrote nothing


def check_rw_history(events: list[tuple[int, str, str, Target]]) -> None:
    """Assert that no live writer ever overlapped another claim on a target it excludes.

    ``events`` are ``(step, "in"|"out", mode, target)`` recorded by the holders
    themselves under one lock: "in" after a grant returned, "out" before the
    release was sent, so each interval lies within the claim's real life.
    """
    live: dict[int, tuple[str, Target]] = {}
    for step, what, mode, target in events:
        if what == "out":
            live.pop(step, None)
            continue
        for other_mode, other in live.values():
            if "exclusive" not in (mode, other_mode):
                continue
            if isinstance(target, Unit) or isinstance(other, Unit):
                clash = target == other
            else:
                clash = target.overlaps(other)
            assert not clash, f"{mode} {target!r} granted beside live {other_mode} {other!r}"
        live[step] = (mode, target)


def _clock(store: Store) -> FakeClock:
    clock = store.clock
    assert isinstance(clock, FakeClock)
    return clock


class SharedHoldContract:
    """``claim(..., mode="shared")``: many readers at once, a writer alone, on units and spans."""

    # --- units ----------------------------------------------------------------------------------

    def test_readers_share_a_unit(self, store: Store) -> None:
        first = store.claim(DOC, holder="ann", mode="shared")
        second = store.claim(DOC, holder="bob", mode="shared", ttl=30)
        assert first and second
        assert first.claim is not None and second.claim is not None
        assert first.claim.mode == second.claim.mode == "shared"
        assert first.claim.id != second.claim.id
        assert second.claim.fence > first.claim.fence  # each reader its own fence
        assert second.claim.state is ClaimState.HELD
        stored = store.get(first.claim.id)
        assert stored is not None and stored.mode == "shared"

    def test_an_exclusive_claim_says_so(self, store: Store) -> None:
        claim = store.claim(DOC, holder="ann").claim
        assert claim is not None and claim.mode == "exclusive"
        assert store.claim(DOC_B, holder="ann", mode="exclusive").claim.mode == "exclusive"  # type: ignore[union-attr]

    def test_a_writer_is_refused_beside_a_live_reader(self, store: Store) -> None:
        assert store.claim(DOC, holder="ann", mode="shared", ttl=30)
        lost = store.claim(DOC, holder="wes")
        assert not lost and lost.taken == (DOC,)
        group = store.claim([DOC_B, DOC], holder="wes", ttl=30)
        assert not group and group.taken == (DOC,)
        assert store.claim(DOC_B, holder="wes")  # the group took nothing

    def test_a_reader_is_refused_beside_a_live_writer(self, store: Store) -> None:
        assert store.claim(DOC, holder="wes", ttl=30)
        lost = store.claim(DOC, holder="ann", mode="shared")
        assert not lost and lost.taken == (DOC,)
        group = store.claim([DOC, DOC_B], holder="ann", mode="shared")
        assert not group and group.taken == (DOC,)
        assert store.claim(DOC_B, holder="wes")  # the readers' group took nothing

    def test_the_writer_waits_for_the_last_reader(self, store: Store) -> None:
        ann = store.claim(DOC, holder="ann", mode="shared").claim
        bob = store.claim(DOC, holder="bob", mode="shared", ttl=30).claim
        assert ann is not None and bob is not None
        assert store.release(ann.id, holder="ann", fence=ann.fence) is True
        assert not store.claim(DOC, holder="wes")
        store.confirm(bob.id, holder="bob", fence=bob.fence)
        assert not store.claim(DOC, holder="wes")
        assert store.release(bob.id, holder="bob", fence=bob.fence) is True
        wes = store.claim(DOC, holder="wes").claim
        assert wes is not None and wes.fence > bob.fence
        assert store.release(wes.id, holder="wes", fence=wes.fence)
        assert store.claim(DOC, holder="cy", mode="shared")  # and readers after the writer

    def test_each_reader_confirms_extends_and_releases_its_own_claim(self, store: Store) -> None:
        ann = store.claim(DOC, holder="ann", mode="shared", ttl=10).claim
        bob = store.claim(DOC, holder="bob", mode="shared", ttl=10).claim
        assert ann is not None and bob is not None
        _clock(store).advance(5)
        extended = store.extend(ann.id, holder="ann", fence=ann.fence, ttl=20)
        assert extended.mode == "shared" and extended.expires_at is not None
        assert extended.expires_at > bob.expires_at  # type: ignore[operator]
        with pytest.raises(HoldLost) as raised:
            store.confirm(bob.id, holder="bob", fence=ann.fence)
        assert raised.value.reason is HoldLostReason.FENCE
        _clock(store).advance(6)  # bob's hold is dead, ann's is not
        with pytest.raises(HoldLost) as raised:
            store.confirm(bob.id, holder="bob", fence=bob.fence)
        assert raised.value.reason is HoldLostReason.EXPIRED
        assert store.confirm(ann.id, holder="ann", fence=ann.fence).state is ClaimState.CONFIRMED
        assert not store.claim(DOC, holder="wes")

    def test_a_dead_reader_is_taken_over_by_a_writer(self, store: Store) -> None:
        ann = store.claim([DOC, DOC_B], holder="ann", mode="shared", ttl=10).claim
        assert ann is not None
        _clock(store).advance(10)
        wes = store.claim(DOC, holder="wes", ttl=10).claim
        assert wes is not None and wes.fence > ann.fence
        with pytest.raises(HoldLost) as raised:
            store.extend(ann.id, holder="ann", fence=ann.fence, ttl=10)
        assert raised.value.reason is HoldLostReason.TAKEN_OVER
        old = store.get(ann.id)
        assert old is not None and old.state is ClaimState.EXPIRED and old.taken_over
        assert old.mode == "shared"  # marking it dead keeps its mode
        assert store.claim(DOC_B, holder="cy")  # its other unit is free too

    def test_a_dead_reader_is_not_taken_over_by_a_reader(self, store: Store) -> None:
        ann = store.claim(DOC, holder="ann", mode="shared", ttl=10).claim
        assert ann is not None
        _clock(store).advance(10)
        assert store.claim(DOC, holder="bob", mode="shared")
        old = store.get(ann.id)
        assert old is not None and old.state is ClaimState.EXPIRED and not old.taken_over
        with pytest.raises(HoldLost) as raised:
            store.confirm(ann.id, holder="ann", fence=ann.fence)
        assert raised.value.reason is HoldLostReason.EXPIRED

    def test_a_dead_writer_is_taken_over_by_a_reader(self, store: Store) -> None:
        wes = store.claim(DOC, holder="wes", ttl=10).claim
        assert wes is not None
        _clock(store).advance(11)
        ann = store.claim(DOC, holder="ann", mode="shared").claim
        assert ann is not None and ann.fence > wes.fence
        old = store.get(wes.id)
        assert old is not None and old.taken_over
        assert store.claim(DOC, holder="bob", mode="shared")
        assert not store.claim(DOC, holder="wes")

    def test_swept_and_purged_readers_free_the_unit(self, store: Store) -> None:
        ann = store.claim(DOC, holder="ann", mode="shared", ttl=10).claim
        bob = store.claim(DOC, holder="bob", mode="shared").claim
        assert ann is not None and bob is not None
        assert store.release(bob.id, holder="bob", fence=bob.fence)
        _clock(store).advance(store.request_retention + 20)
        assert store.sweep().expired == 1
        _clock(store).advance(store.request_retention + 1)
        store.sweep()
        store.claim(DOC_B, holder="last")  # the newest claim is never purged: make it another
        store.sweep()
        assert store.get(ann.id) is None and store.get(bob.id) is None
        assert store.claim(DOC, holder="wes")

    def test_holder_of_and_claims_of_see_readers(self, store: Store) -> None:
        assert store.holder_of(DOC) is None
        ann = store.claim(DOC, holder="ann", mode="shared").claim
        assert store.claim(DOC, holder="bob", mode="shared")
        assert store.holder_of(DOC) in ("ann", "bob")
        assert [c.mode for c in store.claims_of("ann")] == ["shared"]
        assert ann is not None
        assert store.claims_of("ann")[0].id == ann.id

    # --- natural key and request IDs ------------------------------------------------------------

    def test_a_reader_claiming_again_is_another_reader(self, store: Store) -> None:
        first = store.claim(DOC, holder="ann", mode="shared")
        again = store.claim(DOC, holder="ann", mode="shared")
        assert first and again and not again.replayed
        assert first.claim is not None and again.claim is not None
        assert again.claim.id != first.claim.id

    def test_holding_one_mode_is_no_natural_replay_of_the_other(self, store: Store) -> None:
        assert store.claim(DOC, holder="ann", mode="shared")
        upgrade = store.claim(DOC, holder="ann")
        assert not upgrade and upgrade.taken == (DOC,)  # no upgrade in place
        assert store.claim(DOC_B, holder="ann")
        downgrade = store.claim(DOC_B, holder="ann", mode="shared")
        assert not downgrade and downgrade.taken == (DOC_B,)
        assert store.claim(DOC_B, holder="ann").replayed  # the writer's natural key still replays

    def test_the_request_id_fingerprint_includes_the_mode(self, store: Store) -> None:
        first = store.claim(DOC, holder="ann", mode="shared", request_id="r-1")
        replay = store.claim(DOC, holder="ann", mode="shared", request_id="r-1")
        assert replay.replayed and replay.claim is not None and first.claim is not None
        assert replay.claim.id == first.claim.id and replay.claim.mode == "shared"
        with pytest.raises(RequestConflict):
            store.claim(DOC, holder="ann", request_id="r-1")
        assert store.claim(DOC_B, holder="ann", request_id="r-2")
        with pytest.raises(RequestConflict):
            store.claim(DOC_B, holder="ann", mode="shared", request_id="r-2")

    def test_a_readers_recorded_loss_replays(self, store: Store) -> None:
        assert store.claim(DOC, holder="wes")
        lost = store.claim(DOC, holder="ann", mode="shared", request_id="r-3")
        again = store.claim(DOC, holder="ann", mode="shared", request_id="r-3")
        assert not lost and not again and again.replayed and again.taken == (DOC,)

    @pytest.mark.parametrize("mode", ["read", "SHARED", "", None, 1, b"shared", ["shared"]])
    def test_a_bad_mode_names_the_value(self, store: Store, mode: Any) -> None:
        with pytest.raises(InvalidInput) as raised:
            store.claim(DOC, holder="ann", mode=mode)
        assert raised.value.field == "mode" and raised.value.value == mode
        assert store.claim(DOC, holder="ann")  # nothing was written

    # --- spans ----------------------------------------------------------------------------------

    def test_overlapping_shared_spans_coexist_and_exclude_a_writer(self, store: Store) -> None:
        assert store.claim(Span("room", 0, 10), holder="ann", mode="shared", ttl=30)
        assert store.claim(Span("room", 5, 15), holder="bob", mode="shared")
        lost = store.claim(Span("room", 9, 12), holder="wes")
        assert not lost and lost.taken == (Span("room", 9, 12),)
        assert store.claim(Span("room", 15, 20), holder="wes")  # adjacent: half-open
        refused = store.claim(Span("room", 19, 30), holder="cy", mode="shared")
        assert not refused and refused.taken == (Span("room", 19, 30),)
        assert store.claim(Span("room", -5, 0), holder="cy", mode="shared")

    def test_shared_spans_at_the_edges_of_the_domain(self, store: Store) -> None:
        big = 2**63 - 1
        assert store.claim(Span("n", 2**53, 2**53 + 1), holder="a", mode="shared")
        assert store.claim(Span("n", 2**53 + 1, 2**53 + 2), holder="w")
        assert not store.claim(Span("n", 2**53, 2**53 + 2), holder="w")
        assert store.claim(Span("n", 2**53, big), holder="b", mode="shared") is not None
        assert store.claim(Span("m", -(2**63), big), holder="a", mode="shared")
        assert store.claim(Span("m", -(2**63), big), holder="b", mode="shared")
        assert not store.claim(Span("m", big - 1, big), holder="w")

    def test_shared_datetime_spans_across_a_fold(self, store: Store) -> None:
        # 01:30 happens twice on 2026-11-01 in New York: the fold picks the later one.
        ny = timezone(timedelta(hours=-4))
        first = datetime(2026, 11, 1, 1, 0, tzinfo=ny)
        second = first + timedelta(hours=2)  # 01:00 EST, one hour past the repeat
        assert store.claim(Span("hall", first, second), holder="a", mode="shared")
        assert store.claim(Span("hall", first + timedelta(minutes=30), second), holder="b",
                           mode="shared")  # fmt: skip
        lost = store.claim(Span("hall", second - timedelta(microseconds=1), second), holder="w")
        assert not lost
        assert store.claim(Span("hall", second, second + timedelta(hours=1)), holder="w")

    def test_a_mixed_claim_is_shared_on_every_target(self, store: Store) -> None:
        both = store.claim([DOC, Span("room", 0, 10)], holder="ann", mode="shared").claim
        assert both is not None and both.mode == "shared"
        assert store.claim([DOC, Span("room", 5, 6)], holder="bob", mode="shared")
        assert not store.claim(DOC, holder="wes")
        assert not store.claim(Span("room", 9, 10), holder="wes")
        assert store.release(both.id, holder="ann", fence=both.fence)
        assert not store.claim(DOC, holder="wes")  # bob still reads

    # --- pressure -------------------------------------------------------------------------------

    def test_readers_and_writers_under_thread_pressure(self, store: Store) -> None:
        check_rw_history(_contend(store, threads=8, rounds=200))


def _contend(store: Store, *, threads: int, rounds: int) -> list[tuple[int, str, str, Target]]:
    """Readers and writers racing on one unit and overlapping spans; the events they saw."""
    lock = threading.Lock()
    events: list[tuple[int, str, str, Target]] = []
    targets: list[Target] = [DOC, Span("room", 0, 10), Span("room", 5, 15), Span("room", 9, 20)]
    start = threading.Barrier(threads)
    counter = iter(range(10**9))

    def work(n: int) -> None:
        start.wait()
        for i in range(rounds):
            mode = "exclusive" if (n + i) % 3 == 0 else "shared"
            target = targets[(n * 7 + i) % len(targets)]
            with lock:
                step = next(counter)
            result = store.claim(target, holder=f"h{n}", mode=mode)
            if not result:
                continue
            assert result.claim is not None
            with lock:
                events.append((step, "in", mode, target))
            # A writer holds a while, a reader barely and then rests: readers that
            # come back at once keep every writer out (nothing here is fair), and
            # then no reader meets a writer.
            time.sleep(0.0005 if mode == "exclusive" else 0)
            with lock:
                events.append((step, "out", mode, target))
            store.release(result.claim.id, holder=f"h{n}", fence=result.claim.fence)
            if mode == "shared":
                time.sleep(0.0005)

    _join([functools.partial(work, n) for n in range(threads)])
    return events


def _join(run: list[Callable[[], None]]) -> None:
    errors: list[BaseException] = []

    def guarded(fn: Callable[[], None]) -> None:
        try:
            fn()
        except BaseException as exc:  # re-raised in the main thread
            errors.append(exc)

    workers = [threading.Thread(target=guarded, args=(fn,)) for fn in run]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    if errors:
        raise errors[0]
