"""Fair waiting against the old unordered backoff: N waiters contend for one unit.

Each waiter loops: ``with store.lease(unit, wait=None)``, hold it ``--hold`` ms,
release, and ask again at once (the case that starves someone under plain
backoff: whoever just released is the first to ask again). Both modes run in
one command, interleaved round by round, on threads of one process and on
processes (memory:// runs threads only), on each store of ``--stores``:

* ``unordered``: the lease's old wait (jittered backoff, no queue);
* ``fcfs``: ``wait=`` as built, first come, first served per key.

Per run: the acquisitions, the hand-off (ms from a holder's block ending to
the next holder's grant: the release and the next waiter's learning of it),
the longest wait and the 99th percentile of waits (ms), the ratio of the
longest wait to the mean wait, and Jain's fairness index over the waiters'
acquisition counts (1.0: all got the unit equally often). Printed as the
median and [min, max] over the rounds, then the hand-off ratios fcfs ÷
unordered (and, with ``--old SRC``, new ÷ old: every run is a child process
on ``PYTHONPATH`` ``--new`` or ``--old``, alternating).

    python benchmarks/bench_fair.py --waiters 6 --seconds 3 --rounds 3
    python benchmarks/bench_fair.py --stores memory,sqlite,postgresql,etcd --old /tmp/old/src
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import multiprocessing
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

_Events = list[tuple[float, float, float]]  # (asked, granted, block ended), monotonic


def _waiter(store: Any, me: int, hold: float, until: float) -> tuple[int, _Events]:
    """Acquire and release until ``until`` (wall clock); each acquisition's times."""
    import dibs

    unit = dibs.Unit("bench-fair", "the-one")
    events = []
    while time.time() < until:
        asked = time.monotonic()
        with store.lease(unit, holder=f"w{me}", ttl=10, wait=None):
            granted = time.monotonic()
            time.sleep(hold)
            events.append((asked, granted, time.monotonic()))
    return me, events


def _mode(mode: str) -> None:
    """Make this process's leases wait the ``mode`` way."""
    import dibs.lease
    from dibs._lease import _claim_policy

    if mode == "unordered":
        dibs.lease.fair_claim_policy = _claim_policy  # type: ignore[assignment]


def _process(url: str, me: int, hold: float, until: float, mode: str, out: Any) -> None:
    import dibs

    _mode(mode)
    with dibs.open(url) as store:
        out.put(_waiter(store, me, hold, until))


def _child(spec: dict[str, Any]) -> list[_Events]:
    """One run, in this process (threads) or its forks (processes); every waiter's events."""
    import dibs  # before forking: the waiters start together, not after their imports

    url, kind, mode, waiters = spec["url"], spec["kind"], spec["mode"], spec["waiters"]
    hold, seconds = spec["hold"], spec["seconds"]
    until = time.time() + seconds + (2.0 if kind == "processes" else 0.2)
    results: list[_Events] = [[] for _ in range(waiters)]
    if kind == "threads":
        _mode(mode)
        store = dibs.open(url)  # one store, shared by the threads (one for memory://)

        def run(me: int) -> None:
            results[me] = _waiter(store, me, hold, until)[1]

        threads = [threading.Thread(target=run, args=(me,)) for me in range(waiters)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        store.close()
        return results
    context = multiprocessing.get_context("fork")
    out = context.Queue()
    procs = [
        context.Process(target=_process, args=(url, me, hold, until, mode, out))
        for me in range(waiters)
    ]
    for proc in procs:
        proc.start()
    for _ in procs:
        me, events = out.get()
        results[me] = events
    for proc in procs:
        proc.join()
    return results


def _run(src: str, spec: dict[str, Any]) -> list[_Events]:
    env = {**os.environ, "PYTHONPATH": os.path.abspath(src)}
    out = subprocess.run(
        [sys.executable, __file__, "--child", json.dumps(spec)],
        env=env, capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    return [[tuple(e) for e in mine] for mine in json.loads(out)]  # type: ignore[misc]


def _figures(results: list[_Events]) -> dict[str, float]:
    waits = sorted(granted - asked for mine in results for asked, granted, _ in mine)
    counts = [len(mine) for mine in results]
    jain = sum(counts) ** 2 / (len(counts) * sum(c * c for c in counts)) if any(counts) else 0.0
    p99 = waits[min(len(waits) - 1, int(0.99 * len(waits)))] if waits else 0.0
    mean = statistics.fmean(waits) if waits else 0.0
    # Hand-offs: from one block's end to the next grant, when the next waiter was asking.
    held = sorted(event for mine in results for event in mine)
    held.sort(key=lambda event: event[1])
    handoffs = [nxt[1] - prev[2] for prev, nxt in itertools.pairwise(held) if nxt[0] < prev[2]]
    return {
        "acquires": float(len(waits)),
        "handoff_ms": 1000 * statistics.median(handoffs) if handoffs else 0.0,
        "max_ms": 1000 * waits[-1] if waits else 0.0,
        "p99_ms": 1000 * p99,
        "max/mean": waits[-1] / mean if mean else 0.0,
        "jain": jain,
    }


def _cell(values: list[float]) -> str:
    if not values:
        return "-"
    return f"{statistics.median(values):.3g} [{min(values):.3g}, {max(values):.3g}]"


def _ratios(tops: list[float], bottoms: list[float]) -> list[float]:
    """Round by round; a round in which either side saw no hand-off is left out."""
    return [t / b for t, b in zip(tops, bottoms, strict=True) if t and b]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--waiters", type=int, default=6)
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--hold", type=float, default=5.0, help="ms each waiter holds the unit")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--kinds", default="threads,processes")
    parser.add_argument("--stores", default="sqlite", help="of memory,sqlite,postgresql,etcd")
    parser.add_argument("--new", default=str(Path(__file__).parent.parent / "src"))
    parser.add_argument("--old", help="a baseline's src directory, run interleaved with --new")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(_child(json.loads(args.child))))
        return 0
    sides = [("new", args.new)] + ([("old", args.old)] if args.old else [])
    figures: dict[tuple[str, str, str, str], list[dict[str, float]]] = {}
    with contextlib.ExitStack() as stack:
        scratch = stack.enter_context(tempfile.TemporaryDirectory())
        urls = _servers(stack, args.stores.split(","), scratch)
        for round_ in range(args.rounds):
            for store, make_url in urls.items():
                for kind in args.kinds.split(","):
                    if store == "memory" and kind == "processes":
                        continue  # a memory store lives in one process
                    runs = [
                        (side, src, mode) for side, src in sides for mode in ("unordered", "fcfs")
                    ]
                    if round_ % 2:
                        runs.reverse()
                    for side, src, mode in runs:
                        spec = {
                            "url": make_url(f"{kind}-{mode}-{side}-{round_}"),
                            "kind": kind,
                            "mode": mode,
                            "waiters": args.waiters,
                            "hold": args.hold / 1000,
                            "seconds": args.seconds,
                        }
                        found = _figures(_run(src, spec))
                        figures.setdefault((store, kind, mode, side), []).append(found)
                        print(
                            f"round {round_} {store} {kind} {mode} {side} {found}", file=sys.stderr
                        )
    _report(args, figures, [side for side, _ in sides])
    return 0


def _servers(stack: contextlib.ExitStack, stores: list[str], scratch: str) -> dict[str, Any]:
    """Per store, a function from a run's name to a fresh store URL (servers started here)."""
    urls: dict[str, Any] = {}
    for store in stores:
        if store == "memory":
            urls[store] = lambda name: "memory://"
        elif store == "sqlite":
            urls[store] = lambda name: f"sqlite:///{Path(scratch) / name}.db"
        elif store == "postgresql":
            from dibs.verify.harness import PostgresServer

            server = stack.enter_context(PostgresServer())
            base = server.create_database("bench_fair")
            sep = "&" if "?" in base else "?"
            urls[store] = lambda name, base=base, sep=sep: (
                f"{base}{sep}schema={name.replace('-', '_')}"
            )
        elif store == "etcd":
            from dibs.verify.harness import EtcdCluster

            cluster = stack.enter_context(EtcdCluster(1))
            urls[store] = lambda name, cluster=cluster: cluster.url(name)
        else:
            raise SystemExit(f"unknown store {store!r}")
    return urls


def _report(
    args: argparse.Namespace,
    figures: dict[tuple[str, str, str, str], list[dict[str, float]]],
    sides: list[str],
) -> None:
    names = ["acquires", "handoff_ms", "max_ms", "p99_ms", "max/mean", "jain"]
    print(
        f"{args.waiters} waiters, {args.seconds:g} s per run, hold {args.hold:g} ms, "
        f"{args.rounds} rounds: median [min, max]"
    )
    print(f"{'':36}" + "".join(f"{name:>22}" for name in names))
    for (store, kind, mode, side), runs in sorted(figures.items()):
        cells = [_cell([run[name] for run in runs]) for name in names]
        print(f"{store:10} {kind:9} {mode:9} {side:4} " + "".join(f"{c:>22}" for c in cells))
    done = sorted({(store, kind) for store, kind, _, _ in figures})
    for name in ("handoff_ms", "acquires"):
        print(f"{name} ratios, round by round, median [min, max]:")
        for store, kind in done:

            def of(
                mode: str, side: str, store: str = store, kind: str = kind, name: str = name
            ) -> list[float]:
                return [run[name] for run in figures[(store, kind, mode, side)]]

            line = f"  {store:10} {kind:9}"
            for side in sides:
                ratios = _ratios(of("fcfs", side), of("unordered", side))
                line += f"  fcfs/unordered ({side}) {_cell(ratios)}"
            if "old" in sides:
                for mode in ("fcfs", "unordered"):
                    line += f"  {mode} new/old {_cell(_ratios(of(mode, 'new'), of(mode, 'old')))}"
            print(line)


if __name__ == "__main__":
    sys.exit(main())
