"""What the paths with two faces cost: this tree against an earlier one, interleaved.

The sync and async faces of ``dibs.observe`` (instrumented store calls), of
``dibs.singleflight`` (uncontended flights) and of ``dibs.lease`` (entering
and leaving a lease) on ``memory://``, each in a fresh interpreter, for
``before`` (the source of ``--baseline``, a git ref; default: where this branch
left ``main``) and ``now`` (this tree), the order rotated round by round.

    python benchmarks/bench_faces.py [--repeat 7] [--scale 1.0] [--baseline REF] [--cases a,b]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tarfile
import tempfile
from io import BytesIO
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

SETUP = """
import asyncio, sys, time
import dibs, dibs.aio
n = int(float(sys.argv[1]))
def otel():
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SpanProcessor
    tp = TracerProvider()
    tp.add_span_processor(SpanProcessor())
    return {"tracer_provider": tp, "meter_provider": MeterProvider()}
"""

# Each case prints operations per second.
CASES = {
    "observe sync": (
        20_000,
        """
from dibs.observe import instrument
store = instrument(dibs.open("memory://"), **otel())
units = [dibs.Unit("seat", str(i)) for i in range(n)]
started = time.perf_counter()
for i, unit in enumerate(units):
    claim = store.claim(unit, holder="alice", request_id=f"r{i}", ttl=300).claim
    store.confirm(claim.id, holder="alice", fence=claim.fence)
    store.get(claim.id)
    store.release(claim.id, holder="alice", fence=claim.fence)
print(4 * n / (time.perf_counter() - started))
""",
    ),
    "observe async": (
        20_000,
        """
from dibs.observe import instrument
async def main():
    store = instrument(dibs.aio.open("memory://"), **otel())
    units = [dibs.Unit("seat", str(i)) for i in range(n)]
    started = time.perf_counter()
    for i, unit in enumerate(units):
        claim = (await store.claim(unit, holder="alice", request_id=f"r{i}", ttl=300)).claim
        await store.confirm(claim.id, holder="alice", fence=claim.fence)
        await store.get(claim.id)
        await store.release(claim.id, holder="alice", fence=claim.fence)
    return 4 * n / (time.perf_counter() - started)
print(asyncio.run(main()))
""",
    ),
    "flight sync": (
        200_000,
        """
from dibs.singleflight import SingleFlight
flight = SingleFlight(copy=None)
fn = lambda i: i
started = time.perf_counter()
for i in range(n):
    flight.do(i, fn, i)
print(n / (time.perf_counter() - started))
""",
    ),
    "flight async": (
        50_000,
        """
from dibs.singleflight import AsyncSingleFlight
async def fn(i):
    return i
async def main():
    flight = AsyncSingleFlight(copy=None)
    started = time.perf_counter()
    for i in range(n):
        await flight.do(i, fn, i)
    return n / (time.perf_counter() - started)
print(asyncio.run(main()))
""",
    ),
    "lease sync": (
        2_000,
        """
store = dibs.open("memory://")
unit = dibs.Unit("job", "1")
started = time.perf_counter()
for i in range(n):
    with store.lease(unit, holder="w", ttl=30) as lease:
        lease.check()
print(n / (time.perf_counter() - started))
""",
    ),
    "lease async": (
        5_000,
        """
async def main():
    store = dibs.aio.open("memory://")
    unit = dibs.Unit("job", "1")
    started = time.perf_counter()
    for i in range(n):
        async with store.lease(unit, holder="w", ttl=30) as lease:
            lease.check()
    return n / (time.perf_counter() - started)
print(asyncio.run(main()))
""",
    ),
}


def _baseline_source(ref: str, into: Path) -> Path:
    archive = subprocess.run(
        ["git", "-C", str(ROOT), "archive", "--format=tar", ref, "src"],
        check=True,
        capture_output=True,
    ).stdout
    with tarfile.open(fileobj=BytesIO(archive)) as tar:
        tar.extractall(into, filter="data")
    return into / "src"


def _default_baseline() -> str:
    found = subprocess.run(
        ["git", "-C", str(ROOT), "merge-base", "HEAD", "main"],
        check=False,
        capture_output=True,
        text=True,
    )
    return found.stdout.strip() or "HEAD"


def _run(src: Path, case: str, scale: float) -> float:
    count, body = CASES[case]
    env = {**os.environ, "PYTHONPATH": str(src)}
    out = subprocess.run(
        [sys.executable, "-c", SETUP + body, str(count * scale)],
        check=True,
        capture_output=True,
        text=True,
        env=env,
    ).stdout
    return float(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--scale", type=float, default=1.0, help="multiplies each case's count")
    parser.add_argument("--baseline", default=None, help="git ref to compare with")
    parser.add_argument("--cases", default=",".join(CASES), help="comma-separated cases")
    args = parser.parse_args()
    ref = args.baseline or _default_baseline()
    cases = [c.strip() for c in args.cases.split(",")]
    with tempfile.TemporaryDirectory() as scratch:
        trees = {"before": _baseline_source(ref, Path(scratch)), "now": ROOT / "src"}
        rates: dict[tuple[str, str], list[float]] = {}
        for round_ in range(args.repeat):
            order = [(case, tree) for case in cases for tree in trees]
            shift = round_ % len(order)
            for case, tree in order[shift:] + order[:shift]:
                rates.setdefault((case, tree), []).append(_run(trees[tree], case, args.scale))
    print(f"ops/s, {args.repeat} interleaved rounds, memory://; baseline {ref[:12]}")
    print(f"{'case':<15}{'before median':>15}{'now median':>13}{'now range':>24}  before ÷ now")
    for case in cases:
        before, now = rates[(case, "before")], rates[(case, "now")]
        ratios = [b / n for b, n in zip(before, now, strict=True)]
        print(
            f"{case:<15}{statistics.median(before):>15,.0f}{statistics.median(now):>13,.0f}"
            f"{f'{min(now):,.0f}..{max(now):,.0f}':>24}"
            f"  {statistics.median(ratios):.3f} ({min(ratios):.3f}..{max(ratios):.3f})"
        )


if __name__ == "__main__":
    main()
