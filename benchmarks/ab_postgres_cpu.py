"""Client CPU per PostgreSQL claim and confirm: this checkout's dibs against another's.

For a change to the sync store's hot path: runs the same small workload
(one client, one connection, 2,000 single-unit holds, then 500 confirms; see
``--claims``) in
fresh subprocesses that import dibs from ``--base`` and from this checkout's
``src``, alternating, on one private server, and prints the medians of the
client CPU per operation and the median (range) of the per-pair ratios. CPU
time hardly moves with a shared machine's load, unlike claims/s.

    git worktree add --detach /tmp/base <commit>
    python benchmarks/ab_postgres_cpu.py --base /tmp/base/src --pairs 6
    python benchmarks/ab_postgres_cpu.py --base /tmp/base/src --aio --loop uvloop

``--aio`` runs the same workload on the async store (``dibs.aio.open``), one
task awaiting each call, on asyncio's default loop or ``--loop uvloop``.
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
N = int(sys.argv[2])
with dibs.open(f"{sys.argv[1]}?schema=ab_{secrets.token_hex(3)}&pool_min=1&pool_max=1") as s:
    for i in range(300):
        s.claim(dibs.Unit("warm", str(i)), holder="h", ttl=300)
    c0, w0 = time.process_time(), time.perf_counter()
    held = [s.claim(dibs.Unit("m", str(i)), holder="h", ttl=300).claim for i in range(N)]
    c1, w1 = time.process_time(), time.perf_counter()
    for claim in held[: N // 4]:
        s.confirm(claim.id, holder="h", fence=claim.fence)
    c2, w2 = time.process_time(), time.perf_counter()
print((c1 - c0) / N * 1e6, (c2 - c1) / (N // 4) * 1e6,
      (w1 - w0) / N * 1e6, (w2 - w1) / (N // 4) * 1e6)
"""

CHILD_AIO = """
import asyncio, secrets, sys, time
import dibs, dibs.aio
N = int(sys.argv[3])
async def main():
    url = f"{sys.argv[1]}?schema=ab_{secrets.token_hex(3)}&pool_min=1&pool_max=1"
    async with dibs.aio.open(url) as s:
        for i in range(300):
            await s.claim(dibs.Unit("warm", str(i)), holder="h", ttl=300)
        c0, w0 = time.process_time(), time.perf_counter()
        held = [
            (await s.claim(dibs.Unit("m", str(i)), holder="h", ttl=300)).claim
            for i in range(N)
        ]
        c1, w1 = time.process_time(), time.perf_counter()
        for claim in held[: N // 4]:
            await s.confirm(claim.id, holder="h", fence=claim.fence)
        c2, w2 = time.process_time(), time.perf_counter()
    print((c1 - c0) / N * 1e6, (c2 - c1) / (N // 4) * 1e6,
          (w1 - w0) / N * 1e6, (w2 - w1) / (N // 4) * 1e6)
if sys.argv[2] == "uvloop":
    import uvloop
    uvloop.run(main())
else:
    asyncio.run(main())
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--base", required=True, help="the other checkout's src directory")
    parser.add_argument("--pairs", type=int, default=6, help="alternating runs of each")
    parser.add_argument("--aio", action="store_true", help="the async store (dibs.aio)")
    parser.add_argument("--loop", choices=["asyncio", "uvloop"], default="asyncio")
    parser.add_argument("--claims", type=int, default=2000, help="holds per run (confirms: 1/4)")
    parser.add_argument("--durable", action="store_true", help="fsync on (the wall clock then "
                        "includes each commit's WAL flush)")  # fmt: skip
    args = parser.parse_args()
    code, extra = (CHILD_AIO, [args.loop]) if args.aio else (CHILD, [])
    extra.append(str(args.claims))
    sides = {"base": args.base, "this": str(HERE.parent / "src")}
    runs: dict[str, list[tuple[float, ...]]] = {name: [] for name in sides}
    with PostgresServer(durable=args.durable) as server:
        url = server.create_database("ab")
        for _ in range(args.pairs):
            for name, src in sides.items():
                out = subprocess.run(
                    [sys.executable, "-c", code, url, *extra],
                    env={**os.environ, "PYTHONPATH": src},
                    capture_output=True,
                    text=True,
                    check=True,
                ).stdout.split()
                runs[name].append(tuple(float(x) for x in out))
    med = statistics.median
    for name, values in runs.items():
        print(
            f"{name}: client CPU per claim {med(v[0] for v in values):.0f} µs, "
            f"per confirm {med(v[1] for v in values):.0f} µs; wall clock per claim "
            f"{med(v[2] for v in values):.0f} µs, per confirm {med(v[3] for v in values):.0f} µs"
        )
    for i, op in enumerate(("claim", "confirm", "claim (wall)", "confirm (wall)")):
        ratios = [t[i] / b[i] for t, b in zip(runs["this"], runs["base"], strict=True)]
        print(f"this ÷ base, {op}: {med(ratios):.2f} ({min(ratios):.2f}-{max(ratios):.2f})")


if __name__ == "__main__":
    main()
