"""What observability costs a store call: this tree against an earlier one, and instrumented.

Four variants run the same store calls (a claim with a request ID and a hold,
a confirm, a get, a release) in fresh interpreters, interleaved round by round:

* ``before``: the source of ``--baseline`` (a git ref; default: where this
  branch left ``main``), extracted to a temporary directory;
* ``now``: this tree, not instrumented (OpenTelemetry never imported);
* ``otel no-op``: this tree, ``dibs.observe.instrument(store)`` with the
  API's default no-op providers (the ``otel`` extra installed, no SDK set up);
* ``otel sdk``: instrumented with the SDK's tracer and meter providers, spans
  sampled and dropped by a processor that does nothing (the SDK's own cost,
  not an exporter's).

    python benchmarks/bench_observe.py [--store memory|sqlite] [--calls 20000] [--repeat 7]
        [--variants before,now,"otel no-op","otel sdk"] [--baseline REF]
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

WORK = """
import sys, tempfile, time
import dibs
store_kind, calls, variant = sys.argv[1], int(sys.argv[2]), sys.argv[3]
url = "memory://" if store_kind == "memory" else f"sqlite:///{tempfile.mkdtemp()}/b.db"
store = dibs.open(url)
if variant == "otel no-op":
    from dibs.observe import instrument
    store = instrument(store)
elif variant == "otel sdk":
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SpanProcessor
    from dibs.observe import instrument
    tp = TracerProvider()
    tp.add_span_processor(SpanProcessor())
    store = instrument(store, tracer_provider=tp, meter_provider=MeterProvider())
units = [dibs.Unit("seat", str(i)) for i in range(calls)]
started = time.perf_counter()
for i, unit in enumerate(units):
    claim = store.claim(unit, holder="alice", request_id=f"r{i}", ttl=300).claim
    store.confirm(claim.id, holder="alice", fence=claim.fence)
    store.get(claim.id)
    store.release(claim.id, holder="alice", fence=claim.fence)
print(4 * calls / (time.perf_counter() - started))
"""


def _baseline_source(ref: str, into: Path) -> Path:
    """Extract ``ref``'s ``src/`` into ``into`` and return the directory to put on sys.path."""
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


def _run(src: Path, store: str, calls: int, variant: str) -> float:
    env = {**os.environ, "PYTHONPATH": str(src)}
    out = subprocess.run(
        [sys.executable, "-c", WORK, store, str(calls), variant],
        check=True,
        capture_output=True,
        text=True,
        env=env,
    ).stdout
    return float(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--store", choices=["memory", "sqlite"], default="memory")
    parser.add_argument("--calls", type=int, default=20_000, help="claims per run (x4 calls)")
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--baseline", default=None, help="git ref to compare with")
    parser.add_argument(
        "--variants",
        default="before,now,otel no-op,otel sdk",
        help="comma-separated variants to run (before is always run)",
    )
    args = parser.parse_args()
    ref = args.baseline or _default_baseline()
    with tempfile.TemporaryDirectory() as scratch:
        before = _baseline_source(ref, Path(scratch))
        now = ROOT / "src"
        wanted = {"before", *(v.strip() for v in args.variants.split(","))}
        variants = {
            name: src
            for name, src in {
                "before": before,
                "now": now,
                "otel no-op": now,
                "otel sdk": now,
            }.items()
            if name in wanted
        }
        rates: dict[str, list[float]] = {name: [] for name in variants}
        for round_ in range(args.repeat):
            names = list(variants)
            names = names[round_ % len(names) :] + names[: round_ % len(names)]  # rotate order
            for name in names:
                rates[name].append(_run(variants[name], args.store, args.calls, name))
    print(
        f"{args.store}:// store calls/s, {4 * args.calls:,} calls per run, {args.repeat} "
        f"interleaved rounds; baseline {ref[:12]}"
    )
    print(f"{'variant':<12}{'median/s':>12}{'range/s':>24}{'before ÷ variant':>20}")
    for name, values in rates.items():
        ratios = [b / v for b, v in zip(rates["before"], values, strict=True)]
        print(
            f"{name:<12}{statistics.median(values):>12,.0f}"
            f"{f'{min(values):,.0f}..{max(values):,.0f}':>24}"
            f"{statistics.median(ratios):>12.3f} ({min(ratios):.3f}..{max(ratios):.3f})"
        )


if __name__ == "__main__":
    main()
