"""sqlite:// of this checkout against another dibs source tree (an older schema), same run.

Each round runs every workload once per tree, each in a fresh process and file,
alternating, and prints the median of the per-round ratios (this ÷ other):

    python benchmarks/bench_sqlite_versions.py --other /path/to/old/dibs/src [--repeat 3]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path
from statistics import median

HERE = Path(__file__).resolve().parent.parent / "src"
WORKLOADS = ("confirmed", "hold", "hold + request ID", "hold, confirm, release")

_CHILD = """
import sys, tempfile, time
sys.path.insert(0, sys.argv[1])
import dibs
mode, n = sys.argv[2], int(sys.argv[3])
with tempfile.TemporaryDirectory() as tmp:
    store = dibs.open(f"sqlite:///{tmp}/bench.db")
    units = [dibs.Unit("seat", str(i)) for i in range(n)]
    began = time.perf_counter()
    for i, unit in enumerate(units):
        if mode == "confirmed":
            store.claim(unit, holder="alice")
        elif mode == "hold":
            store.claim(unit, holder="alice", ttl=300.0)
        elif mode == "hold + request ID":
            store.claim(unit, holder="alice", ttl=300.0, request_id=f"r{i}")
        else:
            c = store.claim(unit, holder="alice", ttl=300.0).claim
            store.confirm(c.id, holder="alice", fence=c.fence)
            store.release(c.id, holder="alice", fence=c.fence)
    print(n / (time.perf_counter() - began))
    store.close()
"""


def _rate(src: Path, mode: str, n: int) -> float:
    done = subprocess.run(
        [sys.executable, "-c", _CHILD, str(src), mode, str(n)],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    return float(done.stdout)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--other", type=Path, required=True, help="the other tree's src/")
    parser.add_argument("--claims", type=int, default=5_000)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    ratios: dict[str, list[float]] = {mode: [] for mode in WORKLOADS}
    rates: dict[str, list[float]] = {mode: [] for mode in WORKLOADS}
    for _ in range(args.repeat):
        for mode in WORKLOADS:
            other = _rate(args.other, mode, args.claims)
            this = _rate(HERE, mode, args.claims)
            rates[mode].append(this)
            ratios[mode].append(this / other)
    print(f"this tree ÷ {args.other}, {args.claims:,} claims, {args.repeat} rounds")
    for mode in WORKLOADS:
        rs = ratios[mode]
        print(
            f"{mode:<24}{median(rates[mode]):>10,.0f}/s  {median(rs):.2f}x  "
            f"({min(rs):.2f}-{max(rs):.2f})"
        )


if __name__ == "__main__":
    main()
