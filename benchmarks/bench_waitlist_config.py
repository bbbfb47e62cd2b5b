"""What reading a waiting list's stored configuration adds to each of its operations, interleaved.

The service reads a list's configuration (``dibs.service._listconfig``) before
every operation that makes an offer (decline, release, a watch round) and
``GET``, so a PUT on another instance counts at once. When nothing changed that
read is one ``holder_of``. This script times, on one async
store, rounds of three things in turn: the read alone (``read_config`` with
the last version known), ``Waitlist.offers(holder)`` (what ``GET .../offers``
does: one ``claims_of``) and ``Waitlist.entries()`` with three people waiting
(what ``GET /v1/waitlists/{key}`` does), and prints the median and range of
each in microseconds, and the read's share of an operation that includes it.
Stores: sqlite:// (a file, WAL) and PostgreSQL (a private server, fsync on).

    python benchmarks/bench_waitlist_config.py
    python benchmarks/bench_waitlist_config.py --ops 300 --repeat 7
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from collections.abc import Awaitable, Callable
from contextlib import ExitStack

import dibs.aio
from dibs import Unit
from dibs.service._listconfig import read_config, write_config
from dibs.verify.harness import PostgresServer


async def _time(ops: int, step: Callable[[], Awaitable[object]]) -> float:
    started = time.perf_counter()
    for _ in range(ops):
        await step()
    return (time.perf_counter() - started) / ops * 1e6


async def _bench(url: str, ops: int, repeat: int) -> dict[str, list[float]]:
    async with dibs.aio.open(url) as store:
        known = await write_config(store, "bench", (Unit("seat-1", "s"),), 600.0)
        wl = dibs.aio.Waitlist(store, "dibs.waitlist:bench", offer_ttl=600.0)
        for holder in ("ann", "bob", "cy"):
            await wl.join(holder)
        steps: dict[str, Callable[[], Awaitable[object]]] = {
            "config read": lambda: read_config(store, "bench", known),
            "offers (claims_of)": lambda: wl.offers("ann"),
            "entries (3 waiting)": wl.entries,
        }
        times: dict[str, list[float]] = {name: [] for name in steps}
        for _ in range(repeat):  # interleaved: each round runs every step once
            for name, step in steps.items():
                times[name].append(await _time(ops, step))
        return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ops", type=int, default=200)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    with ExitStack() as stack, tempfile.TemporaryDirectory() as tmp:
        server = stack.enter_context(PostgresServer(durable=True))
        for label, url in (
            ("sqlite://", f"sqlite:///{tmp}/bench.db"),
            ("postgresql", server.create_database("dibs_wlconfig")),
        ):
            times = asyncio.run(_bench(url, args.ops, args.repeat))
            read = statistics.median(times["config read"])
            print(f"{label}")
            for name, runs in times.items():
                share = (
                    ""
                    if name == "config read"
                    else f"  read adds {read / statistics.median(runs):.0%}"
                )
                print(
                    f"  {name:22} median {statistics.median(runs):8.0f} µs"
                    f"  range {min(runs):.0f}-{max(runs):.0f}{share}"
                )


if __name__ == "__main__":
    main()
