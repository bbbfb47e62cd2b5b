"""What the replication check costs a replay on PostgreSQL: replays per second, with and without.

A claim that replays a request checks, on a server with synchronous
standbys, that they have the commit it replays (see docs/postgres.md,
"Pitfalls"), as one more condition of the statement that reads it. On a
server without synchronous standbys the check writes nothing. This script replays
one single-unit request ID on one connection, in rounds that alternate the
real store with the same store whose check is taken out (the code before
it), and prints the medians, ranges and the median per-round ratio. The
server is a private one without standbys: what every user pays.

    python benchmarks/bench_replay_sync.py
    python benchmarks/bench_replay_sync.py --replays 3000 --rounds 11
"""

from __future__ import annotations

import argparse
import statistics
import time

import dibs
from dibs.stores.postgres._sql import REPLICATED
from dibs.verify.harness import PostgresServer


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--replays", type=int, default=2000, help="replays per round")
    parser.add_argument("--rounds", type=int, default=10, help="rounds of each, interleaved")
    args = parser.parse_args()
    rates: dict[str, list[float]] = {"checked": [], "skipped": []}
    ratios: list[float] = []
    with PostgresServer() as server:
        store = dibs.open(server.create_database(), pool_max=1)
        unit = dibs.Unit("seat", "1")
        store.claim(unit, holder="h", request_id="r", ttl=600)
        statements = store._ops.sql
        with_check = statements.claim_unit
        without = with_check.replace(REPLICATED.encode(), b"true")
        assert without != with_check
        for n in range(args.rounds):
            order = [("checked", with_check), ("skipped", without)]
            for name, statement in order if n % 2 else order[::-1]:
                statements.claim_unit = statement
                start = time.perf_counter()
                for _ in range(args.replays):
                    store.claim(unit, holder="h", request_id="r", ttl=600)
                rates[name].append(args.replays / (time.perf_counter() - start))
            ratios.append(rates["checked"][-1] / rates["skipped"][-1])
        statements.claim_unit = with_check
        store.close()
    for name, values in rates.items():
        print(
            f"{name:8} replays/s median {statistics.median(values):7.0f} "
            f"range {min(values):.0f}-{max(values):.0f}"
        )
    print(
        f"checked/skipped: median {statistics.median(ratios):.2f}, "
        f"range {min(ratios):.2f}-{max(ratios):.2f} ({args.rounds} rounds)"
    )


if __name__ == "__main__":
    main()
