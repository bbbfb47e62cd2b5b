"""Client CPU and wall time per ``@dibs.idempotent`` call on PostgreSQL: this checkout vs another.

Runs the same small workload (one thread: 400 first calls, then three replays
of each) in fresh subprocesses that import dibs from ``--base`` and from this
checkout's ``src``, alternating which goes first, on one private server (fsync
off), and prints the medians per call and the median (range) of the per-pair
ratios this ÷ base. CPU time moves far less with a shared machine's load than
calls per second do.

    mkdir /tmp/base && git archive main src | tar -x -C /tmp/base
    python benchmarks/ab_idempotent_cpu.py --base /tmp/base/src --pairs 6
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
from pathlib import Path

from dibs.verify.harness import PostgresServer

HERE = Path(__file__).resolve().parent

CHILD = """
import secrets, sys, time
import dibs
store = dibs.open(sys.argv[1])
N = int(sys.argv[2])

@dibs.idempotent(store, key="k", name="cpu." + secrets.token_hex(4))
def charge(k, cents):
    return {"k": k, "cents": cents}

for i in range(50):  # warm up: connections, prepared statements
    charge(f"warm-{i}", 1)
    charge(f"warm-{i}", 1)
c0, w0 = time.process_time(), time.perf_counter()
for i in range(N):
    charge(f"o-{i}", 1)
c1, w1 = time.process_time(), time.perf_counter()
for _ in range(3):
    for i in range(N):
        charge(f"o-{i}", 1)
c2, w2 = time.process_time(), time.perf_counter()
print((c1 - c0) / N * 1e6, (c2 - c1) / N / 3 * 1e6, (w1 - w0) / N * 1e6, (w2 - w1) / N / 3 * 1e6)
"""

MEASURES = ["client CPU per first call", "client CPU per replay", "wall per first call",
            "wall per replay"]  # fmt: skip


def run(src: str, url: str, calls: int) -> list[float]:
    env = {**os.environ, "PYTHONPATH": src}
    out = subprocess.run(
        [sys.executable, "-c", CHILD, url, str(calls)],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return [float(x) for x in out.split()]


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--base", required=True, help="the other checkout's src directory")
    parser.add_argument("--pairs", type=int, default=6, help="runs of each, alternating")
    parser.add_argument("--calls", type=int, default=400, help="first calls per run")
    args = parser.parse_args()
    sides = {"base": args.base, "this": str(HERE.parent / "src")}
    with PostgresServer() as server:
        url = server.create_database("ab")
        # A schema per side: the two checkouts may write different schema versions.
        urls = {side: f"{url}?schema=ab_{side}" for side in sides}
        for side, src in sides.items():
            run(src, urls[side], 1)  # the schema, before any timed run
        runs: dict[str, list[list[float]]] = {side: [] for side in sides}
        for r in range(args.pairs):
            order = list(sides.items()) if r % 2 else list(reversed(sides.items()))
            for side, src in order:
                runs[side].append(run(src, urls[side], args.calls))
    med = statistics.median
    for i, what in enumerate(MEASURES):
        this, base = [x[i] for x in runs["this"]], [x[i] for x in runs["base"]]
        ratios = [t / b for t, b in zip(this, base, strict=True)]
        print(
            f"{what}: this {med(this):,.0f} µs, base {med(base):,.0f} µs; "
            f"this ÷ base {med(ratios):.2f} ({min(ratios):.2f}-{max(ratios):.2f})"
        )


if __name__ == "__main__":
    main()
