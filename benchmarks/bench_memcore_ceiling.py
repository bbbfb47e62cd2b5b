"""Issue #27's ceiling: a hand-written C core of memory:// against seatlock and the pure store.

    PYTHONPATH=src python benchmarks/bench_memcore_ceiling.py [--rounds 9] [--seats 20000]
        [--instructions] [--core PATH_TO_DIR_WITH__memcore]

Three contenders, interleaved round by round in one process (fresh objects every
round, the order rotating, ``gc.collect()`` before each timed part, CPU time by
``time.process_time``): seatlock 0.2.0, dibs's pure ``memory://`` store, and
``_memcore.Core`` (benchmarks/prototypes/memcore, built here with gcc if missing),
which returns the real ``dibs.Claim`` and ``dibs.ClaimResult`` objects. Workloads,
as in benchmarks/bench_peers_memory.py:

* (a) hold then confirm: ``claim(unit, holder="alice", ttl=300)`` then
  ``confirm(c.id, holder="alice", fence=c.fence)``; seatlock ``lock_seat`` then
  ``book_a_seat``;
* (b) confirmed at once: ``claim(unit, holder="alice")``; seatlock, its cheapest
  way to a booked seat, ``lock_seat`` then ``book_a_seat``;
* (c) holds with request IDs: ``claim(unit, holder="alice", request_id=rid, ttl=300)``;
  seatlock's plain ``lock_seat``, for scale only;
* (d) racing: 8 threads each try every one of 1,000 seats, in an order of their
  own, 10 times over (fresh seats each time); dibs a confirmed claim per attempt,
  seatlock ``lock_seat`` and then ``book_a_seat`` when the lock was won. Each seat
  goes to exactly one thread (checked). Timed only, not counted.

Prints per workload the median operations per second of each, and the median
[range] of the per-round ratios C core ÷ seatlock and pure ÷ seatlock (times:
above 1 is slower than seatlock; issue #27's goal is at most 1.5) and pure ÷ C
core. ``--facade`` adds a fourth contender: the same core called from a Python
method (a closed check and the call), as a ``MemoryStore`` that kept its Python
class around a C core would pay. ``--instructions`` also counts instructions per operation under
``valgrind --tool=cachegrind`` (each run less a run that sets up the same and
does nothing): exact where CPU time on a shared machine moves by ±15 %.
"""

from __future__ import annotations

import argparse
import gc
import os
import random
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import seatlock

import dibs

PROTOTYPE = Path(__file__).resolve().parent / "prototypes" / "memcore"
sys.path.insert(0, str(PROTOTYPE))
from check_memcore import load  # noqa: E402  (builds the core into a directory if missing)

SIDES = ("seatlock", "pure", "core")
COUNTED = ("hold then confirm", "confirmed at once", "holds with request IDs")
WORKLOADS = (*COUNTED, "racing, 8 threads")
RACE_THREADS, RACE_SEATS, RACES = 8, 1_000, 10


class Facade:
    """The C core behind Python methods: what a Python MemoryStore class around it would cost."""

    def __init__(self, core: Any) -> None:
        self._core = core
        self._closed = False
        self._fast_claim = True

    def claim(
        self,
        targets: Any,
        *,
        holder: Any,
        request_id: Any = None,
        ttl: Any = None,
        mode: Any = "exclusive",
    ) -> Any:
        if self._closed or not self._fast_claim or mode != "exclusive":
            raise NotImplementedError("the general path")
        return self._core.claim(targets, holder=holder, request_id=request_id, ttl=ttl)

    def confirm(self, claim_id: Any, *, holder: Any, fence: Any) -> Any:
        if self._closed:
            raise NotImplementedError("the general path")
        return self._core.confirm(claim_id, holder=holder, fence=fence)


def _timed(body: Callable[[], None]) -> float:
    gc.collect()
    began = time.process_time()
    body()
    return time.process_time() - began


def _race(side: str, memcore: Any) -> float:
    """CPU seconds (every thread's) of RACES races; each seat goes to exactly one thread."""
    took = 0.0
    for r in range(RACES):
        if side == "seatlock":
            manager = seatlock.SeatManager([seatlock.Seat(i) for i in range(RACE_SEATS)])
            lock, book = manager.lock_seat, manager.book_a_seat

            def attempt(name: str, i: int) -> bool:
                if lock(i, name).endswith(f" is locked by {name}"):  # noqa: B023
                    book(i, name)  # noqa: B023
                    return True
                return False
        else:
            if side == "pure":
                store = dibs.open("memory://")
            else:
                store = memcore.Core() if side == "core" else Facade(memcore.Core())
            claim = store.claim
            units = [dibs.Unit("hall", str(i)) for i in range(RACE_SEATS)]

            def attempt(name: str, i: int) -> bool:
                return bool(claim(units[i], holder=name).granted)  # noqa: B023

        won = [0] * RACE_THREADS
        barrier = threading.Barrier(RACE_THREADS + 1)

        def work(t: int, seed: int) -> None:
            order = list(range(RACE_SEATS))
            random.Random(seed).shuffle(order)
            name = f"t{t}"
            barrier.wait()  # noqa: B023
            won[t] = sum(attempt(name, i) for i in order)  # noqa: B023

        pool = [
            threading.Thread(target=work, args=(t, r * RACE_THREADS + t))
            for t in range(RACE_THREADS)
        ]
        for thread in pool:
            thread.start()
        gc.collect()
        began = time.process_time()
        barrier.wait()
        for thread in pool:
            thread.join()
        took += time.process_time() - began
        if sum(won) != RACE_SEATS:
            raise AssertionError(f"{side}: {sum(won)} seats granted, expected {RACE_SEATS}")
        if side == "pure":
            store.close()
    return took


def run_once(side: str, workload: str, seats: int, memcore: Any) -> float:
    """CPU seconds of one round of ``workload`` on ``side``, set-up not counted."""
    if workload == WORKLOADS[3]:
        return _race(side, memcore)
    units = [dibs.Unit("hall", str(i)) for i in range(seats)]
    ids = [f"req-{i}" for i in range(seats)]
    if side == "seatlock":
        manager = seatlock.SeatManager([seatlock.Seat(i) for i in range(seats)], lock_timeout=300)
        lock, book = manager.lock_seat, manager.book_a_seat

        def seat_pairs() -> None:
            for i in range(seats):
                lock(i, "alice")
                book(i, "alice")

        def seat_locks() -> None:
            for i in range(seats):
                lock(i, "alice")

        return _timed(seat_locks if workload == WORKLOADS[2] else seat_pairs)
    if side == "pure":
        store = dibs.open("memory://")
    else:
        store = memcore.Core() if side == "core" else Facade(memcore.Core())
    claim, confirm = store.claim, store.confirm

    def pairs() -> None:
        for unit in units:
            c = claim(unit, holder="alice", ttl=300).claim
            confirm(c.id, holder="alice", fence=c.fence)

    def confirmed() -> None:
        for unit in units:
            claim(unit, holder="alice")

    def request_ids() -> None:
        for unit, rid in zip(units, ids, strict=True):
            claim(unit, holder="alice", request_id=rid, ttl=300)

    took = _timed(
        {WORKLOADS[0]: pairs, WORKLOADS[1]: confirmed, WORKLOADS[2]: request_ids}[workload]
    )
    if side == "pure":
        store.close()
    return took


def _spread(values: list[float]) -> str:
    return f"{statistics.median(values):5.2f}x [{min(values):.2f}-{max(values):.2f}]"


def timing(rounds: int, seats: int, memcore: Any, sides: tuple[str, ...]) -> None:
    took: dict[tuple[str, str], list[float]] = {(w, s): [] for w in WORKLOADS for s in sides}
    for r in range(rounds):
        for workload in WORKLOADS:
            k = r % len(sides)
            order = sides[k:] + sides[:k]
            for side in order:
                took[workload, side].append(run_once(side, workload, seats, memcore))
    print(f"CPU time, {rounds} rounds x {seats:,} seats; load {os.getloadavg()[0]:.1f}")
    print(
        f"{'workload':24} {'seatlock/s':>11} {'pure/s':>9} {'core/s':>9}  "
        f"{'core / seatlock':>21}  {'pure / seatlock':>21}  {'pure / core':>21}"
    )
    for workload in WORKLOADS:
        ops = RACES * RACE_SEATS * RACE_THREADS if workload == WORKLOADS[3] else seats
        rate = {s: statistics.median(ops / t for t in took[workload, s]) for s in sides}
        seat, pure, core = (took[workload, s] for s in SIDES)
        print(
            f"{workload:24} {rate['seatlock']:11,.0f} {rate['pure']:9,.0f} {rate['core']:9,.0f}  "
            f"{_spread([c / s for c, s in zip(core, seat, strict=True)]):>21}  "
            f"{_spread([p / s for p, s in zip(pure, seat, strict=True)]):>21}  "
            f"{_spread([p / c for p, c in zip(pure, core, strict=True)]):>21}"
        )
    if "facade" in sides:
        for workload in WORKLOADS:
            seat, facade = took[workload, "seatlock"], took[workload, "facade"]
            ratios = [f / s for f, s in zip(facade, seat, strict=True)]
            ops = RACES * RACE_SEATS * RACE_THREADS if workload == WORKLOADS[3] else seats
            rate = statistics.median(ops / t for t in facade)
            shown = _spread(ratios)
            print(f"{workload:24} core behind Python methods: {rate:9,.0f}/s, ÷ seatlock {shown}")
    print("(c): seatlock is its plain lock_seat, for scale; the goal is 250,000 claims/s")
    print("(d): attempts/s, every thread's CPU time")


_COUNTED = r"""
import gc, os, sys
sys.path.insert(0, sys.argv[4])
import dibs, seatlock, _memcore
side, workload, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
units = [dibs.Unit("hall", str(i)) for i in range(n)]
ids = [f"req-{i}" for i in range(n)]
if side == "seatlock":
    manager = seatlock.SeatManager([seatlock.Seat(i) for i in range(n)], lock_timeout=300)
    lock, book = manager.lock_seat, manager.book_a_seat
else:
    store = dibs.open("memory://") if side == "pure" else _memcore.Core()
    claim, confirm = store.claim, store.confirm
gc.collect()
if workload == "none":
    pass
elif side == "seatlock" and workload == "holds with request IDs":
    for i in range(n):
        lock(i, "alice")
elif side == "seatlock":
    for i in range(n):
        lock(i, "alice")
        book(i, "alice")
elif workload == "hold then confirm":
    for unit in units:
        c = claim(unit, holder="alice", ttl=300).claim
        confirm(c.id, holder="alice", fence=c.fence)
elif workload == "confirmed at once":
    for unit in units:
        claim(unit, holder="alice")
else:
    for unit, rid in zip(units, ids):
        claim(unit, holder="alice", request_id=rid, ttl=300)
os._exit(0)  # no teardown counted
"""


def cachegrind_instructions(*argv: str) -> int:
    """Instructions ``python argv...`` runs, counted by valgrind's cachegrind."""
    err = subprocess.run(
        ["valgrind", "--tool=cachegrind", "--cache-sim=no", "--cachegrind-out-file=/dev/null",
         sys.executable, *argv],
        capture_output=True, text=True, check=True,
    ).stderr  # fmt: skip
    line = next(x for x in err.splitlines() if "I   refs:" in x)
    return int(line.split(":")[1].replace(",", ""))


def _instructions(side: str, workload: str, n: int, where: Path) -> int:
    return cachegrind_instructions("-c", _COUNTED, side, workload, str(n), str(where))


def instructions(seats: int, where: Path) -> None:
    print(f"instructions per operation (valgrind), {seats:,} operations, less set-up")
    print(
        f"{'workload':24} {'seatlock':>9} {'pure':>9} {'core':>9}  "
        f"{'core/seat':>9}  {'pure/core':>9}"
    )
    for workload in COUNTED:
        per = {}
        for side in SIDES:
            base = _instructions(side, "none", seats, where)
            per[side] = (_instructions(side, workload, seats, where) - base) / seats
        print(
            f"{workload:24} {per['seatlock']:9,.0f} {per['pure']:9,.0f} {per['core']:9,.0f}  "
            f"{per['core'] / per['seatlock']:9.2f}  {per['pure'] / per['core']:9.2f}"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--seats", type=int, default=20_000)
    parser.add_argument("--core", type=Path, default=PROTOTYPE, help="directory of _memcore")
    parser.add_argument("--instructions", action="store_true", help="count under valgrind too")
    parser.add_argument("--facade", action="store_true", help="time the core behind Python too")
    parser.add_argument("--no-timing", action="store_true", help="with --instructions: only count")
    args = parser.parse_args()
    memcore = load(args.core)
    print(f"core: {memcore.__file__}")
    if not args.no_timing:
        timing(args.rounds, args.seats, memcore, (*SIDES, "facade") if args.facade else SIDES)
    if args.instructions:
        instructions(args.seats, args.core)


if __name__ == "__main__":
    main()
