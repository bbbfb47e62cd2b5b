"""memory:// claim paths before and after a change, interleaved: the four rows of issue #27.

    python benchmarks/bench_memory_ab.py --old main [--new src] [--rounds 9]

``--old`` is a git ref (its ``src/`` is exported to a scratch directory) or a
source directory; ``--new`` likewise (default: this tree's ``src``). Each round
runs one fresh process per tree, in an order that alternates every round, and
times on the process's CPU clock (the machine is shared): hold then confirm
(pairs/s), confirmed at once, 8 threads racing over 1,000 units (a confirmed
claim per attempt, exactly 1,000 granted) and holds with a request ID each. The
workloads are the ones benchmarks/bench_peers_memory.py runs against seatlock.
Prints per workload both medians and the median and range of the per-round
ratio new ÷ old (above 1: the change is faster).

``--instructions`` counts instead of timing: each one-thread workload runs once
per tree under ``valgrind --tool=cachegrind``, and the instructions per
operation are the run's total less a run that sets up the same and does
nothing. Exact and repeatable, where CPU time on a loaded machine moves by
±15 % between rounds; it weighs every instruction alike (a cache miss costs
more than it counts).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

_CHILD = r"""
import gc, json, random, sys, threading, time
import dibs
n = int(sys.argv[1])
units = [dibs.Unit("hall", str(i)) for i in range(n)]
ids = [f"req-{i}" for i in range(n)]
out = {}

def timed(body):
    gc.collect()
    store = dibs.open("memory://")
    t = time.process_time()
    body(store)
    took = time.process_time() - t
    store.close()
    return took

def pairs(store):
    claim, confirm = store.claim, store.confirm
    for unit in units:
        c = claim(unit, holder="alice", ttl=300).claim
        confirm(c.id, holder="alice", fence=c.fence)

def confirmed(store):
    claim = store.claim
    for unit in units:
        claim(unit, holder="alice")

def request_ids(store):
    claim = store.claim
    for unit, rid in zip(units, ids):
        claim(unit, holder="alice", request_id=rid, ttl=300)

out["hold then confirm"] = n / timed(pairs)
out["confirmed at once"] = n / timed(confirmed)
out["holds with request IDs"] = n / timed(request_ids)

seats, threads, repeats = 1000, 8, 10
race_units = units[:seats]
orders = [random.Random(t).sample(range(seats), seats) for t in range(threads)]
took = 0.0
for _ in range(repeats):
    store = dibs.open("memory://")
    claim = store.claim
    barrier = threading.Barrier(threads + 1)
    won = [0] * threads

    def work(t):
        holder = f"t{t}"
        barrier.wait()
        k = 0
        for i in orders[t]:
            k += claim(race_units[i], holder=holder).granted
        won[t] = k

    pool = [threading.Thread(target=work, args=(t,)) for t in range(threads)]
    for p in pool:
        p.start()
    barrier.wait()
    t0 = time.process_time()
    for p in pool:
        p.join()
    took += time.process_time() - t0
    assert sum(won) == seats, won
    store.close()
out["8 threads racing"] = threads * seats * repeats / took
print(json.dumps(out))
"""


_COUNTED = r"""
import sys
import dibs
kind, n = sys.argv[1], int(sys.argv[2])
units = [dibs.Unit("hall", str(i)) for i in range(n)]
ids = [f"req-{i}" for i in range(n)]
store = dibs.open("memory://")
claim, confirm = store.claim, store.confirm
if kind.startswith("lost"):  # "lost": another holder has every unit, confirmed
    for unit in units:
        claim(unit, holder="bob")
if kind == "hold then confirm":
    for unit in units:
        c = claim(unit, holder="alice", ttl=300).claim
        confirm(c.id, holder="alice", fence=c.fence)
elif kind == "confirmed at once":
    for unit in units:
        claim(unit, holder="alice")
elif kind == "holds with request IDs":
    for unit, rid in zip(units, ids):
        claim(unit, holder="alice", request_id=rid, ttl=300)
elif kind == "lost":
    for unit in units:
        claim(unit, holder="alice")
"""
_KINDS = ("hold then confirm", "confirmed at once", "holds with request IDs", "lost")
"""The one-thread workloads, and "lost": a claim refused because another holder has the unit."""


def _instructions(src: str, kind: str, n: int) -> int:
    env = {**os.environ, "PYTHONPATH": src}
    err = subprocess.run(
        ["valgrind", "--tool=cachegrind", "--cache-sim=no", "--cachegrind-out-file=/dev/null",
         sys.executable, "-c", _COUNTED, kind, str(n)],
        env=env, capture_output=True, text=True, check=True,
    ).stderr  # fmt: skip
    line = next(x for x in err.splitlines() if "I   refs:" in x)
    return int(line.split(":")[1].replace(",", ""))


def _count(trees: dict[str, str], n: int, kinds: list[str]) -> None:
    print(f"{'workload':26} {'old instr/op':>13} {'new instr/op':>13} {'old/new':>8}")
    for kind in kinds:
        per_op = {}
        for side, src in trees.items():
            # The baseline run sets up the same (for "lost": the other holder's units).
            base = _instructions(src, "lost, setup only" if kind == "lost" else "none", n)
            per_op[side] = (_instructions(src, kind, n) - base) / n
        print(
            f"{kind:26} {per_op['old']:13,.0f} {per_op['new']:13,.0f} "
            f"{per_op['old'] / per_op['new']:8.3f}"
        )


def _tree(ref: str, scratch: str, name: str) -> str:
    """A source directory: ``ref`` itself if it is one, else ``src/`` of that git ref."""
    if Path(ref).is_dir():
        return str(Path(ref).resolve())
    where = Path(scratch) / name
    where.mkdir()
    archive = subprocess.run(
        ["git", "archive", ref, "src"], capture_output=True, check=True
    ).stdout  # fmt: skip
    subprocess.run(["tar", "-x", "-C", str(where)], input=archive, check=True)
    return str(where / "src")


def _run(src: str, n: int) -> dict[str, float]:
    env = {**os.environ, "PYTHONPATH": src}
    out = subprocess.run(
        [sys.executable, "-c", _CHILD, str(n)], env=env, capture_output=True, text=True, check=True
    ).stdout  # fmt: skip
    return dict(json.loads(out))


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--old", required=True, help="git ref or src directory of the baseline")
    parser.add_argument("--new", default="src", help="git ref or src directory of the change")
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--claims", type=int, default=20_000, help="units per 1-thread round")
    parser.add_argument(
        "--instructions", action="store_true", help="count instructions per operation (valgrind)"
    )
    parser.add_argument(
        "--workload", action="append", choices=_KINDS, help="with --instructions: only these"
    )
    args = parser.parse_args()
    runs: dict[str, list[dict[str, float]]] = {"old": [], "new": []}
    with tempfile.TemporaryDirectory() as scratch:
        trees = {"old": _tree(args.old, scratch, "old"), "new": _tree(args.new, scratch, "new")}
        if args.instructions:
            print(f"memory:// {args.old} -> {args.new}, instructions per operation, valgrind")
            _count(trees, args.claims, args.workload or list(_KINDS))
            return
        for r in range(args.rounds):
            for side in ("old", "new") if r % 2 == 0 else ("new", "old"):
                runs[side].append(_run(trees[side], args.claims))
    print(f"memory:// {args.old} -> {args.new}, {args.rounds} interleaved rounds, CPU time")
    print(f"{'workload':26} {'old ops/s':>11} {'new ops/s':>11} {'new/old':>8}  range")
    for name in runs["old"][0]:
        old = [run[name] for run in runs["old"]]
        new = [run[name] for run in runs["new"]]
        ratios = sorted(b / a for a, b in zip(old, new, strict=True))
        print(
            f"{name:26} {statistics.median(old):11,.0f} {statistics.median(new):11,.0f} "
            f"{statistics.median(ratios):8.2f}  {ratios[0]:.2f}-{ratios[-1]:.2f}"
        )


if __name__ == "__main__":
    main()
