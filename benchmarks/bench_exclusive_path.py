"""The exclusive claim path before and after a change, interleaved: CPU time, best of rounds.

    python benchmarks/bench_exclusive_path.py --old /work/main/src --new src

Each round runs one process per source tree (PYTHONPATH), alternating, and
times on the process's CPU clock (a shared, loaded machine moves wall time far
more): single-unit claims with a request ID and a TTL, refusals of a held unit,
and span claims, on memory:// and sqlite://. Prints new/old ratios of the best
rates (1.0: no change; below: slower).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

_CHILD = r"""
import json, os, sys, time, dibs
from dibs import Span, Unit
kind, n, where = sys.argv[1], int(sys.argv[2]), sys.argv[3]
if kind == "memory":
    store = dibs.open("memory://")
else:
    store = dibs.open(f"sqlite:///{where}/b{os.getpid()}.db")
units = [Unit("r", str(i)) for i in range(n)]
t = time.process_time()
for i, u in enumerate(units):
    store.claim(u, holder="h", ttl=30.0, request_id=f"q{i}")
claim = n / (time.process_time() - t)
t = time.process_time()
for u in units:
    store.claim(u, holder="x")
refused = n / (time.process_time() - t)
spans = [Span("s", 2 * i, 2 * i + 1) for i in range(min(n // 4, 1500))]
t = time.process_time()
for s in spans:
    store.claim(s, holder="h")
span = len(spans) / (time.process_time() - t)
print(json.dumps([claim, refused, span]))
"""

_NAMES = ("claim, request ID, hold", "refused (held unit)", "span claim")


def _run(src: str, kind: str, n: int, where: str) -> list[float]:
    env = {**os.environ, "PYTHONPATH": os.path.abspath(src)}
    out = subprocess.run(
        [sys.executable, "-c", _CHILD, kind, str(n), where],
        env=env, capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    return list(json.loads(out))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--old", required=True, help="the baseline's src directory")
    parser.add_argument("--new", default="src", help="the change's src directory")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--memory-claims", type=int, default=30_000)
    parser.add_argument("--sqlite-claims", type=int, default=6_000)
    args = parser.parse_args()
    best: dict[tuple[str, str], list[float]] = {}
    with tempfile.TemporaryDirectory() as where:
        for _ in range(args.rounds):
            for kind, n in (("memory", args.memory_claims), ("sqlite", args.sqlite_claims)):
                for side, src in (("old", args.old), ("new", args.new)):
                    rates = _run(src, kind, n, where)
                    top = best.setdefault((side, kind), [0.0] * 3)
                    best[(side, kind)] = [max(a, b) for a, b in zip(top, rates, strict=True)]
    print(f"{'store':8} {'workload':26} {'old/s':>10} {'new/s':>10} {'new/old':>8}")
    for kind in ("memory", "sqlite"):
        for i, name in enumerate(_NAMES):
            old, new = best[("old", kind)][i], best[("new", kind)][i]
            print(f"{kind:8} {name:26} {old:10,.0f} {new:10,.0f} {new / old:8.3f}")


if __name__ == "__main__":
    main()
