"""Issue #27's lot row with a compiled core: dibs.Lot on the C core prototype vs the seed's lot.

    PYTHONPATH=src python benchmarks/bench_memcore_lot.py [--threads 1,2,4,8] [--rounds 7]
        [--pairs 5000] [--size 64] [--core DIR] [--split]

Four contenders run benchmarks/bench_lot.py's workload (its ``run`` and its
``ParkingLot``, imported, not copied: T threads each parking a vehicle of length
1, 1, 2 or 3 and removing it, N times, on a lot of S slots), interleaved round by
round in one process (the order rotating, ``gc.collect()`` before each, CPU time
by ``time.process_time``):

* the seed's ``ParkingLot`` (per-slot locks taken in order, an index lock);
* ``dibs.Lot`` on the pure ``memory://`` store;
* ``dibs.Lot`` on :class:`CoreStore`: a ``MemoryStore`` whose calls on the
  lot's path go to ``_memcore.Core`` (benchmarks/prototypes/memcore, built here
  with gcc if missing), its methods bound on the store (the Lot calls C directly);
* ``dibs.Lot`` on :class:`FacadeStore`: the same core behind Python methods, as
  a store class kept in Python around a C core would be (``facade``).

Prints per thread count the median pairs/s of each and the median [range] of the
per-round ratios Lot ÷ seed (above 1 is faster than the seed; issue #27's goal is
at least 0.7). Before timing, every thread count is run once on each store with
a check: no slot is ever given to two vehicles (each park marks its slots, each
remove clears them first; a mark on a marked slot fails), the store names the
vehicle as the holder of each slot it was given, and the row is empty afterwards.
``--split`` also times, on one thread, the core's two calls alone (the same
group claims and releases, units made beforehand) against the Lot's pair on the
core: the difference is the Lot's own Python. ``--instructions`` counts
instructions per pair under ``valgrind --tool=cachegrind`` (one thread, 10,000
pairs, each run less the same run with none) for the seed's lot, the Lot on the
pure store, the Lot on the core, and the core's two calls alone: exact where CPU
time on a shared machine moves by ±15 %, though instructions alone do not
predict time (see prototypes/memcore/README.md).
"""

from __future__ import annotations

import argparse
import gc
import os
import random
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import dibs
from dibs.stores.memory import MemoryStore

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE / "prototypes" / "memcore"))
from check_memcore import load  # noqa: E402

import bench_lot  # noqa: E402  (benchmarks/ is not a package)
from bench_memcore_ceiling import cachegrind_instructions  # noqa: E402

SIDES = ("seed", "pure", "core", "facade")


class CoreStore(MemoryStore):
    """memory:// with the lot's hot path in the C core: every claim and release goes there.

    What dibs.Lot calls: ``_claim_checked`` (a park's group claim), ``release``
    (a remove), ``claim`` (its shape unit, once per Lot object), ``holder_of``
    (only when a row looks full or a vehicle unit is taken: never in this
    workload), all in the core, whose methods are bound on the instance (no
    Python frame between the Lot and the C code). ``claims_of`` (a vehicle
    already parked, or a release that answered False) is never reached here and
    raises, so a run that left the hot path would fail rather than read the
    empty pure store.
    """

    def __init__(self, core_type: Any) -> None:
        super().__init__()
        self.core = core_type(prefix=self._id_prefix)
        self._bind()

    def _bind(self) -> None:
        self._claim_checked = self.core._claim_checked  # type: ignore[method-assign]
        self.claim = self.core.claim  # type: ignore[method-assign]
        self.release = self.core.release  # type: ignore[method-assign]
        self.holder_of = self.core.holder_of  # type: ignore[method-assign]

    def claims_of(self, holder: str) -> list[dibs.Claim]:
        raise NotImplementedError("claims_of is off the C core prototype's path")


class FacadeStore(CoreStore):
    """The same core behind Python methods (a closed check, then the call), as a
    MemoryStore class kept in Python around a C core would pay for each call."""

    def _bind(self) -> None:
        pass

    def _claim_checked(self, units: tuple[dibs.Unit, ...], holder: str) -> dibs.ClaimResult:
        if self._closed or not self._fast_claim:
            raise NotImplementedError("the general path")
        return self.core._claim_checked(units, holder)  # type: ignore[no-any-return]

    def release(self, claim_id: Any, *, holder: Any, fence: Any) -> bool:
        if self._closed or not self._fast_release:
            raise NotImplementedError("the general path")
        return self.core.release(claim_id, holder=holder, fence=fence)  # type: ignore[no-any-return]

    def claim(self, targets: Any, *, holder: Any, **kwargs: Any) -> dibs.ClaimResult:  # type: ignore[override]
        return self.core.claim(targets, holder=holder, **kwargs)  # type: ignore[no-any-return]

    def holder_of(self, target: Any) -> str | None:
        return self.core.holder_of(target)  # type: ignore[no-any-return]


class Checked:
    """A lot under the check: marks its slots after a park, clears them before a remove."""

    def __init__(self, lot: dibs.Lot, owner: list[str | None], errors: list[str]) -> None:
        self.lot = lot
        self.owner = owner
        self.errors = errors
        self.where: dict[str, tuple[int, int]] = {}

    def park(self, vehicle_id: str, length: int) -> int | None:
        start = self.lot.park(vehicle_id, length)
        if start is None:
            return None
        for i in range(start, start + length):
            if self.owner[i] is not None:
                self.errors.append(f"slot {i}: {self.owner[i]} and {vehicle_id}")
            self.owner[i] = vehicle_id
            holder = self.lot.store.holder_of(self.lot._slots[i])
            if holder != vehicle_id:
                self.errors.append(f"slot {i}: the store says {holder}, the lot {vehicle_id}")
        self.where[vehicle_id] = (start, length)
        return start

    def remove(self, vehicle_id: str) -> int:
        start, length = self.where.pop(vehicle_id)
        for i in range(start, start + length):
            if self.owner[i] != vehicle_id:
                self.errors.append(f"slot {i}: {self.owner[i]} while {vehicle_id} is parked")
            self.owner[i] = None
        got = self.lot.remove(vehicle_id)
        if got != start:
            self.errors.append(f"{vehicle_id}: removed from {got}, parked at {start}")
        return got


def check(make: Callable[[], dibs.Lot], threads: int, pairs: int, size: int) -> int:
    """The workload on a Checked lot; returns pairs done, raises on any broken invariant."""
    lot = make()
    owner: list[str | None] = [None] * size
    errors: list[str] = []
    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-5)  # switch threads often: more interleavings
    try:
        _, done = bench_lot.run(Checked(lot, owner, errors), threads, pairs)  # type: ignore[arg-type]
    finally:
        sys.setswitchinterval(old)
    left = [v for v in lot.occupancy().slots if v is not None]
    if errors or left or any(owner):
        raise AssertionError(f"{threads} threads: {errors[:5]}; left parked {left[:5]}")
    return done


def split(core_type: Any, pairs: int, size: int, rounds: int) -> None:
    """One thread: the Lot's pair on the core against the core's two calls alone."""
    rng = random.Random(0)
    lengths = [rng.choice((1, 1, 2, 3)) for _ in range(pairs)]
    lot_rates: list[float] = []
    bare_rates: list[float] = []
    for r in range(rounds):
        store = CoreStore(core_type)
        lot = dibs.Lot(store, f"split-{r}", size)
        vehicles = [f"v0-{i}" for i in range(pairs)]
        gc.collect()
        started = time.process_time()
        for vehicle, length in zip(vehicles, lengths, strict=True):
            lot.park(vehicle, length)
            lot.remove(vehicle)
        lot_rates.append(pairs / (time.process_time() - started))
        core = core_type()
        slots = [dibs.Unit("lot:bare", f"slot:{i}") for i in range(size)]
        groups = [
            tuple(sorted((*slots[:length], dibs.Unit("lot:bare", f"vehicle:{v}"))))
            for v, length in zip(vehicles, lengths, strict=True)
        ]
        claim, release = core._claim_checked, core.release
        gc.collect()
        started = time.process_time()
        for vehicle, units in zip(vehicles, groups, strict=True):
            c = claim(units, vehicle).claim
            release(c.id, holder=vehicle, fence=c.fence)
        bare_rates.append(pairs / (time.process_time() - started))
    lot_us = 1e6 / statistics.median(lot_rates)
    bare_us = 1e6 / statistics.median(bare_rates)
    print(
        f"split, 1 thread, {rounds} rounds: Lot pair on the core {lot_us:.2f} µs, the core's "
        f"claim+release alone {bare_us:.2f} µs ({bare_us / lot_us:.0%}), the Lot's own Python "
        f"{lot_us - bare_us:.2f} µs ({1 - bare_us / lot_us:.0%})"
    )


COUNTED_PAIRS = 10_000


def counted(side: str, pairs: int, core_type: Any) -> None:
    """What valgrind counts: one thread, ``pairs`` of COUNTED_PAIRS pairs (all made either way)."""
    rng = random.Random(0)
    lengths = [rng.choice((1, 1, 2, 3)) for _ in range(COUNTED_PAIRS)]
    vehicles = [f"v0-{i}" for i in range(COUNTED_PAIRS)]
    if side == "bare":
        core = core_type()
        slots = [dibs.Unit("lot:bare", f"slot:{i}") for i in range(64)]
        groups = [
            tuple(sorted((*slots[:length], dibs.Unit("lot:bare", f"vehicle:{v}"))))
            for v, length in zip(vehicles, lengths, strict=True)
        ]
        for vehicle, units in zip(vehicles[:pairs], groups, strict=False):
            c = core._claim_checked(units, vehicle).claim
            core.release(c.id, holder=vehicle, fence=c.fence)
        return
    lot: Any = {
        "seed": lambda: bench_lot.ParkingLot(64),
        "pure": lambda: dibs.Lot(MemoryStore(), "counted", 64),
        "core": lambda: dibs.Lot(CoreStore(core_type), "counted", 64),
    }[side]()
    for vehicle, length in zip(vehicles[:pairs], lengths, strict=False):
        lot.park(vehicle, length)
        lot.remove(vehicle)


def instructions(core_dir: Path) -> None:
    def count(side: str, pairs: int) -> int:
        return cachegrind_instructions(
            __file__, "--core", str(core_dir), "--counted", side, str(pairs)
        )

    n = COUNTED_PAIRS
    per = {side: (count(side, n) - count(side, 0)) / n for side in ("seed", "pure", "core", "bare")}
    print(
        f"instructions per pair (valgrind, 1 thread, {n:,} pairs, less set-up): "
        + "  ".join(f"{side} {v:,.0f}" for side, v in per.items())
    )
    print(
        f"  core ÷ seed {per['core'] / per['seed']:.2f}"
        f"  pure ÷ seed {per['pure'] / per['seed']:.2f}"
        f"  the core's two calls alone {per['bare'] / per['core']:.0%} of the Lot's pair on it,"
        f" the Lot's own Python {1 - per['bare'] / per['core']:.0%}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--threads", default="1,2,4,8")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--pairs", type=int, default=5000, help="park attempts per thread")
    parser.add_argument("--size", type=int, default=64)
    parser.add_argument("--core", type=Path, default=HERE / "prototypes" / "memcore")
    parser.add_argument("--split", action="store_true", help="the Lot's Python vs the core")
    parser.add_argument("--instructions", action="store_true", help="count under valgrind too")
    parser.add_argument("--counted", nargs=2, help=argparse.SUPPRESS)  # valgrind's child
    args = parser.parse_args()
    core_type = load(args.core).Core
    if args.counted:
        counted(args.counted[0], int(args.counted[1]), core_type)
        return
    thread_counts = [int(t) for t in args.threads.split(",")]
    counter = iter(range(10**9))

    makers: dict[str, Callable[[], Any]] = {
        "seed": lambda: bench_lot.ParkingLot(args.size),
        "pure": lambda: dibs.Lot(MemoryStore(), f"bench-{next(counter)}", args.size),
        "core": lambda: dibs.Lot(CoreStore(core_type), f"bench-{next(counter)}", args.size),
        "facade": lambda: dibs.Lot(FacadeStore(core_type), f"bench-{next(counter)}", args.size),
    }
    print(f"load: {os.getloadavg()}  (Python {sys.version.split()[0]})")
    for threads in thread_counts:
        for side in ("pure", "core", "facade"):
            done = check(makers[side], threads, args.pairs, args.size)
            print(f"check: Lot on {side}, {threads} threads, {done} pairs, no slot in two")
    print(
        f"park+remove, {args.pairs} attempts per thread, lot of {args.size}, lengths 1/1/2/3, "
        f"{args.rounds} interleaved rounds (order rotating), CPU time"
    )
    for threads in thread_counts:
        rates: dict[str, list[float]] = {side: [] for side in SIDES}
        cpu: dict[str, list[float]] = {side: [] for side in SIDES}
        for r in range(args.rounds):
            order = SIDES[r % len(SIDES) :] + SIDES[: r % len(SIDES)]
            for side in order:
                lot = makers[side]()
                gc.collect()
                seconds, done = bench_lot.run(lot, threads, args.pairs)
                rates[side].append(done / seconds)
                cpu[side].append(seconds)
        seed = rates["seed"]
        line = [f"{threads} threads:"]
        for side in SIDES:
            line.append(f"{side} {statistics.median(rates[side]):,.0f}/s")
        for side in ("pure", "core", "facade"):
            ratios = [a / b for a, b in zip(rates[side], seed, strict=True)]
            line.append(
                f"{side} ÷ seed {statistics.median(ratios):.2f} "
                f"[{min(ratios):.2f}-{max(ratios):.2f}]"
            )
        ratios = [a / b for a, b in zip(rates["core"], rates["pure"], strict=True)]
        line.append(
            f"core ÷ pure {statistics.median(ratios):.2f} [{min(ratios):.2f}-{max(ratios):.2f}]"
        )
        line.append(
            "CPU s/round " + " ".join(f"{s} {statistics.median(cpu[s]):.3f}" for s in SIDES)
        )
        print("  ".join(line), flush=True)
    if args.split:
        split(core_type, args.pairs * 4, args.size, args.rounds)
    if args.instructions:
        instructions(args.core)
    print(f"load: {os.getloadavg()}")


if __name__ == "__main__":
    main()
