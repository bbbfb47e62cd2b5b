"""memory:// pure Python against the mypyc-compiled build, and both against seatlock 0.2.0.

One command. It builds the compiled core first (``DIBS_COMPILE=1 python
setup.py build_ext --inplace`` in a scratch copy of the tree; ``--compiled
DIR`` uses a tree or site-packages already built), then runs, round by round,
each workload of benchmarks/bench_peers_memory.py once per contender, each in
a fresh subprocess, in an order that rotates every round:

* **pure**: dibs from this tree's src/ (``dibs.compiled`` false, checked);
* **compiled**: dibs from the compiled tree (``dibs.compiled`` true, checked);
* **seatlock**: the peer, as bench_peers_memory.py drives it.

Printed per workload: the median ops/s of each and, per round, the ratios
compiled ÷ pure (the speed-up) and seatlock ÷ dibs for both builds (above 1:
seatlock is faster), as median [range]. Times are CPU seconds of the worker
(process_time: the machine is shared). ``--json FILE`` writes the shape
benchmarks/plot.py reads.

    python benchmarks/bench_compiled.py [--rounds 5] [--seats 20000] [--compiled DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
WORKLOADS = {
    "hold then confirm": "hold_confirm",
    "confirmed at once": "confirmed",
    "racing over 1,000 seats, 8 threads": "racing8",
    "claims with request IDs (hold)": "with_request_ids",
}
CONTENDERS = ("pure", "compiled", "seatlock")


def build(into: Path) -> Path:
    """Copy the tree's build inputs into ``into`` and compile there; return its src/."""
    for name in ("setup.py", "pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, into / name)
    shutil.copytree(ROOT / "src", into / "src", ignore=shutil.ignore_patterns("__pycache__"))
    subprocess.run(
        [sys.executable, "setup.py", "--quiet", "build_ext", "--inplace"],
        cwd=into,
        env={**os.environ, "DIBS_COMPILE": "1"},
        check=True,
        stdout=subprocess.DEVNULL,
    )
    return into / "src"


def worker(workload: str, contender: str, seats: int) -> None:
    """Run one round of one workload in this process and print its ops/s as JSON."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import bench_peers_memory as peers
    import dibs

    if contender != "seatlock" and dibs.compiled != (contender == "compiled"):
        raise SystemExit(f"{contender}: dibs.compiled is {dibs.compiled} ({dibs.__file__})")
    make = peers.racing(8) if workload == "racing8" else getattr(peers, workload)
    run = make(seats, dibs_side=contender != "seatlock", timed=False)
    run()  # warm: the first round of a fresh process pays for imports and caches
    print(json.dumps({"rate": peers._rate(run), "compiled": dibs.compiled}))


def measure(workload: str, contender: str, seats: int, compiled_path: Path) -> float:
    path = compiled_path if contender == "compiled" else ROOT / "src"
    env = {**os.environ, "PYTHONPATH": str(path)}
    out = subprocess.run(
        [sys.executable, __file__, "--worker", workload, contender, "--seats", str(seats)],
        env=env,
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    return float(json.loads(out.splitlines()[-1])["rate"])


def _spread(values: list[float]) -> str:
    values = sorted(values)
    return f"{statistics.median(values):5.2f}x [{values[0]:.2f}-{values[-1]:.2f}]"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5, help="rounds per workload")
    parser.add_argument("--seats", type=int, default=20_000, help="seats per 1-thread round")
    parser.add_argument("--compiled", type=Path, help="a tree with the compiled build on it")
    parser.add_argument("--json", type=Path, help="write the figures here (see plot.py)")
    parser.add_argument("--worker", nargs=2, metavar=("WORKLOAD", "CONTENDER"), help="internal")
    args = parser.parse_args(argv)
    if args.worker:
        worker(args.worker[0], args.worker[1], args.seats)
        return
    with tempfile.TemporaryDirectory(prefix="dibs-compiled-") as scratch:
        compiled_path = args.compiled or build(Path(scratch))
        print(
            f"memory:// pure vs compiled (mypyc) vs seatlock 0.2.0, {args.rounds} rounds, "
            f"{args.seats:,} seats per 1-thread round, CPU time, one subprocess per run "
            f"(Python {sys.version.split()[0]})"
        )
        print("median ops/s; per-round ratios as median [range]")
        print(
            f"{'workload':<36}{'pure':>10}{'compiled':>10}{'seatlock':>10}"
            f"  {'compiled/pure':<21}{'seatlock/pure':<21}{'seatlock/compiled':<21}"
        )
        series: list[dict[str, Any]] = []
        for name, workload in WORKLOADS.items():
            rates: dict[str, list[float]] = {c: [] for c in CONTENDERS}
            for r in range(args.rounds):
                # Rotate the order, so that no contender always runs first or last.
                order = CONTENDERS[r % 3 :] + CONTENDERS[: r % 3]
                for contender in order:
                    rates[contender].append(measure(workload, contender, args.seats, compiled_path))
            pure, comp, peer = rates["pure"], rates["compiled"], rates["seatlock"]
            speedup = [c / p for c, p in zip(comp, pure, strict=True)]
            vs_pure = [s / p for s, p in zip(peer, pure, strict=True)]
            vs_comp = [s / c for s, c in zip(peer, comp, strict=True)]
            print(
                f"{name:<36}{statistics.median(pure):>10,.0f}{statistics.median(comp):>10,.0f}"
                f"{statistics.median(peer):>10,.0f}  {_spread(speedup):<21}"
                f"{_spread(vs_pure):<21}{_spread(vs_comp):<21}"
            )
            threads = 8 if workload == "racing8" else 1
            short = name.replace("1,000", "1000").split(",")[0]
            for contender, values, ratio in (
                ("dibs memory:// pure", pure, vs_pure),
                ("dibs memory:// compiled", comp, vs_comp),
                ("seatlock", peer, None),
            ):
                point: dict[str, Any] = {
                    "name": f"{contender} - {short}",
                    "clients": threads,
                    "throughput": statistics.median(values),
                    "p99_ms": None,
                }
                if ratio is not None:
                    point["ratio_peer_over_dibs"] = statistics.median(ratio)
                series.append(point)
    if args.json:
        args.json.write_text(
            json.dumps(
                {
                    "benchmark": "memory:// pure vs compiled vs seatlock",
                    "command": "python benchmarks/bench_compiled.py "
                    + " ".join(sys.argv[1:] if argv is None else argv),
                    "series": series,
                },
                indent=2,
            )
        )


if __name__ == "__main__":
    main()
