"""memory:// against seatlock 0.2.0, the in-memory seat engine a user might pick instead.

One command, interleaved round by round, the same seats for both contenders:

* **hold then confirm, 1 thread**: dibs ``claim(unit, ttl=300)`` then
  ``confirm``; seatlock ``lock_seat`` then ``book_a_seat``.
* **confirmed at once, 1 thread**: dibs ``claim(unit)`` (confirmed in one call);
  seatlock has no one-call booking, so its cheapest way to a booked seat,
  ``lock_seat`` then ``book_a_seat``.
* **racing**: T threads (1, 2, 4, 8 by default) each try to take every one of
  1,000 seats, in an order of their own; each seat goes to exactly one (checked).
  dibs: a confirmed claim per attempt; seatlock: ``lock_seat``, then
  ``book_a_seat`` when the lock was won.
* **claims/s with request IDs**: dibs alone, holds with a request ID each
  (issue #15's goal: at least 150,000 a second).

Printed: per workload, the medians of both, the median and range of the
per-round ratio seatlock ÷ dibs (above 1 means seatlock is faster), and the
memory blocks a dibs claim allocates. ``--json FILE`` writes the figures in the
shape benchmarks/plot.py reads. ``--profile`` prints a cProfile of the dibs side.

    python benchmarks/bench_peers_memory.py [--rounds 9] [--seats 20000] [--json out.json]
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import json
import pstats
import random
import statistics
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import seatlock

import dibs

Run = Callable[[], tuple[int, float, list[float]]]
"""A round: returns (operations done, seconds they took, per-operation latencies).

Each round sets up its store or manager first, outside the timed part: seatlock
needs its seats made up front, dibs does not, and only the operations count.
"""

_timer = time.process_time  # --clock: CPU seconds by default (the machine is shared)
_setup_timed = False  # --setup-timed: count making the store or the seats too


# --- single-thread workloads ------------------------------------------------------------------


def hold_confirm(seats: int, *, dibs_side: bool, timed: bool) -> Run:
    units = [dibs.Unit("hall", str(i)) for i in range(seats)]

    def run_dibs() -> tuple[int, float, list[float]]:
        setup = _timer()
        store = dibs.open("memory://")
        claim, confirm = store.claim, store.confirm
        lat: list[float] = []
        clock = time.perf_counter
        began = setup if _setup_timed else _timer()
        if timed:
            for unit in units:
                t0 = clock()
                c = claim(unit, holder="alice", ttl=300).claim
                confirm(c.id, holder="alice", fence=c.fence)  # type: ignore[union-attr]
                lat.append(clock() - t0)
        else:
            for unit in units:
                c = claim(unit, holder="alice", ttl=300).claim
                confirm(c.id, holder="alice", fence=c.fence)  # type: ignore[union-attr]
        took = _timer() - began
        store.close()
        return seats, took, lat

    def run_seatlock() -> tuple[int, float, list[float]]:
        setup = _timer()
        manager = seatlock.SeatManager([seatlock.Seat(i) for i in range(seats)], lock_timeout=300)
        lock, book = manager.lock_seat, manager.book_a_seat
        lat: list[float] = []
        clock = time.perf_counter
        began = setup if _setup_timed else _timer()
        if timed:
            for i in range(seats):
                t0 = clock()
                lock(i, "alice")
                book(i, "alice")
                lat.append(clock() - t0)
        else:
            for i in range(seats):
                lock(i, "alice")
                book(i, "alice")
        return seats, _timer() - began, lat

    return run_dibs if dibs_side else run_seatlock


def confirmed(seats: int, *, dibs_side: bool, timed: bool) -> Run:
    units = [dibs.Unit("hall", str(i)) for i in range(seats)]

    def run_dibs() -> tuple[int, float, list[float]]:
        setup = _timer()
        store = dibs.open("memory://")
        claim = store.claim
        lat: list[float] = []
        clock = time.perf_counter
        began = setup if _setup_timed else _timer()
        if timed:
            for unit in units:
                t0 = clock()
                claim(unit, holder="alice")
                lat.append(clock() - t0)
        else:
            for unit in units:
                claim(unit, holder="alice")
        took = _timer() - began
        store.close()
        return seats, took, lat

    if dibs_side:
        return run_dibs
    return hold_confirm(seats, dibs_side=False, timed=timed)


def with_request_ids(seats: int, *, dibs_side: bool, timed: bool) -> Run:
    units = [dibs.Unit("hall", str(i)) for i in range(seats)]
    ids = [f"req-{i}" for i in range(seats)]

    def run_dibs() -> tuple[int, float, list[float]]:
        setup = _timer()
        store = dibs.open("memory://")
        claim = store.claim
        lat: list[float] = []
        clock = time.perf_counter
        began = setup if _setup_timed else _timer()
        if timed:
            for unit, rid in zip(units, ids, strict=True):
                t0 = clock()
                claim(unit, holder="alice", request_id=rid, ttl=300)
                lat.append(clock() - t0)
        else:
            for unit, rid in zip(units, ids, strict=True):
                claim(unit, holder="alice", request_id=rid, ttl=300)
        took = _timer() - began
        store.close()
        return seats, took, lat

    def run_seatlock() -> tuple[int, float, list[float]]:
        setup = _timer()
        # seatlock has no request IDs: its plain lock_seat, for scale only.
        manager = seatlock.SeatManager([seatlock.Seat(i) for i in range(seats)], lock_timeout=300)
        lock = manager.lock_seat
        lat: list[float] = []
        clock = time.perf_counter
        began = setup if _setup_timed else _timer()
        if timed:
            for i in range(seats):
                t0 = clock()
                lock(i, "alice")
                lat.append(clock() - t0)
        else:
            for i in range(seats):
                lock(i, "alice")
        return seats, _timer() - began, lat

    return run_dibs if dibs_side else run_seatlock


# --- racing threads ----------------------------------------------------------------------------


def racing(threads: int, seats: int = 1000, repeats: int = 10) -> Callable[..., Run]:
    """``threads`` threads each try every seat; ``repeats`` fresh stores per round."""

    def make(_seats: int, *, dibs_side: bool, timed: bool) -> Run:
        units = [dibs.Unit("hall", str(i)) for i in range(seats)]
        orders = [random.Random(t).sample(range(seats), seats) for t in range(threads)]

        def in_threads(attempt: Callable[[int, int], bool]) -> tuple[int, float, list[float]]:
            barrier = threading.Barrier(threads + 1)
            won = [0] * threads
            lats: list[list[float]] = [[] for _ in range(threads)]

            def work(t: int) -> None:
                order = orders[t]
                lat = lats[t]
                clock = time.perf_counter
                barrier.wait()
                n = 0
                if timed:
                    for i in order:
                        t0 = clock()
                        n += attempt(t, i)
                        lat.append(clock() - t0)
                else:
                    for i in order:
                        n += attempt(t, i)
                won[t] = n

            pool = [threading.Thread(target=work, args=(t,)) for t in range(threads)]
            for p in pool:
                p.start()
            barrier.wait()
            began = _timer()
            for p in pool:
                p.join()
            took = _timer() - began
            if sum(won) != seats:
                raise AssertionError(f"{sum(won)} seats granted, expected {seats}")
            return threads * seats, took, [x for lat in lats for x in lat]

        def run_dibs() -> tuple[int, float, list[float]]:
            done, took, lat = 0, 0.0, []
            for _ in range(repeats):
                store = dibs.open("memory://")
                claim = store.claim
                holders = [f"t{t}" for t in range(threads)]

                def attempt(t: int, i: int) -> bool:
                    return claim(units[i], holder=holders[t]).granted  # noqa: B023

                n, seconds, more = in_threads(attempt)
                done += n
                took += seconds
                lat += more
                store.close()
            return done, took, lat

        def run_seatlock() -> tuple[int, float, list[float]]:
            done, took, lat = 0, 0.0, []
            for _ in range(repeats):
                manager = seatlock.SeatManager([seatlock.Seat(i) for i in range(seats)])
                lock, book = manager.lock_seat, manager.book_a_seat
                users = [f"t{t}" for t in range(threads)]

                def attempt(t: int, i: int) -> bool:
                    user = users[t]  # noqa: B023
                    if lock(i, user).endswith(f" is locked by {user}"):  # noqa: B023
                        book(i, user)  # noqa: B023
                        return True
                    return False

                n, seconds, more = in_threads(attempt)
                done += n
                took += seconds
                lat += more
            return done, took, lat

        return run_dibs if dibs_side else run_seatlock

    return make


# --- measurement ------------------------------------------------------------------------------


def _rate(run: Run) -> float:
    gc.collect()
    done, seconds, _ = run()
    return done / seconds


def _p99_ms(run: Run) -> float:
    gc.collect()
    _, _, lat = run()
    lat.sort()
    return lat[min(len(lat) - 1, int(len(lat) * 0.99))] * 1000


def blocks_per_claim(n: int = 20_000) -> tuple[float, float, float]:
    """Memory blocks a confirmed claim allocates: kept by the store, with its result, tracked.

    ``sys.getallocatedblocks`` deltas with the collector off: the blocks the
    store keeps per claim, those plus the returned result held by the caller,
    and the objects among them the cyclic collector tracks.
    """
    units = [dibs.Unit("hall", str(i)) for i in range(n)]
    store = dibs.open("memory://")
    claim = store.claim
    claim(dibs.Unit("warm", "up"), holder="alice")
    kept: list[Any] = []
    gc.collect()
    gc.disable()
    try:
        blocks, objects = sys.getallocatedblocks(), len(gc.get_objects())
        for unit in units:
            claim(unit, holder="alice")
        stored = (sys.getallocatedblocks() - blocks) / n
        blocks = sys.getallocatedblocks()
        store2 = dibs.open("memory://")
        claim2 = store2.claim
        blocks, objects = sys.getallocatedblocks(), len(gc.get_objects())
        for unit in units:
            kept.append(claim2(unit, holder="alice"))
        with_result = (sys.getallocatedblocks() - blocks - 1) / n  # -1: the list grows
        tracked = (len(gc.get_objects()) - objects) / n
    finally:
        gc.enable()
    store.close()
    store2.close()
    return stored, with_result, tracked


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--rounds", type=int, default=9, help="interleaved rounds per workload")
    parser.add_argument("--seats", type=int, default=20_000, help="seats per 1-thread round")
    parser.add_argument(
        "--threads", default="1,2,4,8", help="thread counts for the racing workload"
    )
    parser.add_argument("--json", type=Path, help="write the figures here (see plot.py)")
    parser.add_argument("--profile", action="store_true", help="cProfile the dibs side")
    parser.add_argument(
        "--clock",
        choices=["cpu", "wall"],
        default="cpu",
        help="time rounds in CPU seconds of this process (default) or wall-clock seconds",
    )
    parser.add_argument(
        "--setup-timed",
        action="store_true",
        help="also time making the store (dibs) or the seats (seatlock), 1-thread workloads",
    )
    args = parser.parse_args(argv)
    global _timer, _setup_timed  # one setting for the whole run
    _timer = time.process_time if args.clock == "cpu" else time.perf_counter
    _setup_timed = args.setup_timed
    thread_counts = [int(t) for t in args.threads.split(",")]

    workloads: list[tuple[str, int, Callable[..., Run]]] = [
        ("hold then confirm", 1, hold_confirm),
        ("confirmed at once", 1, confirmed),
        *((f"racing over 1,000 seats, {t} threads", t, racing(t)) for t in thread_counts),
        ("claims with request IDs (hold)", 1, with_request_ids),
    ]
    print(
        f"memory:// vs seatlock 0.2.0, {args.rounds} interleaved rounds, "
        f"{args.seats:,} seats per 1-thread round, {args.clock} time, "
        f"setup {'timed' if args.setup_timed else 'untimed'} "
        f"(Python {sys.version.split()[0]})"
    )
    print("ratio = seatlock ÷ dibs per round (above 1: seatlock faster); median [range]")
    print(f"{'workload':<40}{'dibs ops/s':>12}{'seatlock/s':>12}{'ratio':>8}  range")
    series: list[dict[str, Any]] = []
    for name, threads, make in workloads:
        ours_run = make(args.seats, dibs_side=True, timed=False)
        peer_run = make(args.seats, dibs_side=False, timed=False)
        ours, peer = [], []
        for r in range(args.rounds):
            # Alternate which goes first, so neither always runs on a warmer cache.
            if r % 2:
                ours.append(_rate(ours_run))
                peer.append(_rate(peer_run))
            else:
                peer.append(_rate(peer_run))
                ours.append(_rate(ours_run))
        ratios = sorted(p / o for p, o in zip(peer, ours, strict=True))
        p99_ours = _p99_ms(make(args.seats, dibs_side=True, timed=True))
        p99_peer = _p99_ms(make(args.seats, dibs_side=False, timed=True))
        label = "seatlock lock_seat" if "request" in name else "seatlock"
        print(
            f"{name:<40}{statistics.median(ours):>12,.0f}{statistics.median(peer):>12,.0f}"
            f"{statistics.median(ratios):>7.2f}x  {ratios[0]:.2f}-{ratios[-1]:.2f}"
        )
        workload = name.replace("1,000", "1000").split(",")[0]
        series += [
            {
                "name": f"dibs memory:// - {workload}",
                "clients": threads,
                "throughput": statistics.median(ours),
                "p99_ms": p99_ours,
                "ratio_peer_over_dibs": statistics.median(ratios),
                "ratio_range": [ratios[0], ratios[-1]],
            },
            {
                "name": f"{label} - {workload}",
                "clients": threads,
                "throughput": statistics.median(peer),
                "p99_ms": p99_peer,
            },
        ]
    stored, with_result, tracked = blocks_per_claim()
    print(
        f"memory blocks per confirmed claim: {stored:.1f} kept by the store, "
        f"{with_result:.1f} with the returned result held; {tracked:.1f} tracked by the GC"
    )
    if args.profile:
        profiler = cProfile.Profile()
        profiler.runcall(with_request_ids(args.seats, dibs_side=True, timed=False))
        profiler.runcall(hold_confirm(args.seats, dibs_side=True, timed=False))
        pstats.Stats(profiler).sort_stats("tottime").print_stats(15)
    if args.json:
        args.json.write_text(
            json.dumps(
                {
                    "benchmark": "memory:// vs seatlock",
                    "command": "python benchmarks/bench_peers_memory.py "
                    + " ".join(sys.argv[1:] if argv is None else argv),
                    "series": series,
                    "blocks_per_claim": {
                        "kept": stored,
                        "with_result": with_result,
                        "gc_tracked": tracked,
                    },
                },
                indent=2,
            )
        )


if __name__ == "__main__":
    main()
