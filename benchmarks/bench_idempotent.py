"""Calls per second: ``@dibs.idempotent`` on a store vs AWS Lambda Powertools' idempotency on Redis.

Both decorate the same function (it returns a small dict) and run in one
process, one thread, interleaved round by round. Each round makes N *first*
calls (new keys: the function runs and its result is stored) and then N
*replays* of the same keys (the stored result comes back). Powertools keeps
its records in a local ``redis-server`` that this script starts and stops
(its own Redis layer, the peer Powertools users run outside DynamoDB). dibs
always validates the payload; Powertools runs without payload validation (see
``powertools_on``), so it does a little less work. The figures are calls per second
and, per contender, the median and range of the per-round ratios to
Powertools; the machine is shared and noisy, so read the ratios.

    python benchmarks/bench_idempotent.py                  # memory:// and sqlite://
    python benchmarks/bench_idempotent.py --postgres       # also a private PostgreSQL (fsync off)
    python benchmarks/bench_idempotent.py --postgres URL   # also an existing PostgreSQL
"""

from __future__ import annotations

import argparse
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import dibs

Call = Callable[[str], Any]


@contextmanager
def redis_server() -> Iterator[int]:
    """A throwaway redis-server on a free loopback port, stopped on exit."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = int(s.getsockname()[1])
    server = subprocess.Popen(
        ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "",
         "--appendonly", "no"],
        stdout=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        import redis

        client = redis.Redis(host="127.0.0.1", port=port)
        deadline = time.monotonic() + 30
        while True:
            try:
                client.ping()
                break
            except redis.ConnectionError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)
        yield port
    finally:
        server.terminate()
        server.wait()


def powertools_on(port: int) -> Callable[[str], Call]:
    import redis
    from aws_lambda_powertools.utilities.idempotency import IdempotencyConfig, idempotent_function
    from aws_lambda_powertools.utilities.idempotency.persistence.cache import (
        CachePersistenceLayer,
    )

    # Outside Lambda it warns once per call that it cannot see the remaining time.
    warnings.filterwarnings("ignore", message="Couldn't determine the remaining time")
    layer = CachePersistenceLayer(client=redis.Redis(host="127.0.0.1", port=port))

    def make(scope: str) -> Call:
        # Without payload validation: with it on, this cache layer (3.37.0) answers
        # IdempotencyValidationError to every replay (it drops the hash when the
        # record completes, as its TypeScript twin did in powertools-lambda-typescript#5705).
        config = IdempotencyConfig(event_key_jmespath="id", expires_after_seconds=3600)

        @idempotent_function(data_keyword_argument="order", persistence_store=layer, config=config)
        def charge(order: dict[str, Any]) -> dict[str, Any]:
            return {"order": order["id"], "charged": order["cents"]}

        return lambda key: charge(order={"id": f"{scope}-{key}", "cents": 1250})

    return make


def dibs_on(store: dibs.Store) -> Callable[[str], Call]:
    def make(scope: str) -> Call:
        @dibs.idempotent(store, key="order_id", name=f"bench.{scope}")
        def charge(order_id: str, cents: int) -> dict[str, Any]:
            return {"order": order_id, "charged": cents}

        return lambda key: charge(key, 1250)

    return make


def measure(call: Call, keys: list[str]) -> tuple[float, float]:
    """(first calls per second, replays per second) over ``keys``."""
    started = time.perf_counter()
    for key in keys:
        call(key)
    first = len(keys) / (time.perf_counter() - started)
    started = time.perf_counter()
    for key in keys:
        call(key)
    return first, len(keys) / (time.perf_counter() - started)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--calls", type=int, default=1000, help="keys per round")
    parser.add_argument("--repeat", type=int, default=5, help="interleaved rounds")
    parser.add_argument(
        "--postgres",
        metavar="URL",
        nargs="?",
        const="private",
        help="also measure a PostgreSQL store (default: a private server)",
    )
    args = parser.parse_args(argv)
    keys = [f"order-{i}" for i in range(args.calls)]

    with ExitStack() as cleanup:
        port = cleanup.enter_context(redis_server())
        tmp = Path(cleanup.enter_context(tempfile.TemporaryDirectory()))
        contenders: dict[str, Callable[[str], Call]] = {
            "Powertools on Redis": powertools_on(port),
            "dibs on memory://": dibs_on(cleanup.enter_context(dibs.open("memory://"))),
            "dibs on sqlite://": dibs_on(
                cleanup.enter_context(dibs.open(f"sqlite:///{tmp / 'bench.db'}"))
            ),
        }
        if args.postgres:
            url = args.postgres
            if url == "private":
                # The throwaway server lives with the tests (it is not part of the package).
                from dibs.verify.harness import PostgresServer

                url = cleanup.enter_context(PostgresServer()).create_database("dibs_bench")
            store = cleanup.enter_context(dibs.open(url))
            contenders["dibs on postgresql://"] = dibs_on(store)

        print(
            f"idempotent calls, {args.calls} first calls then {args.calls} replays per round, "
            f"{args.repeat} interleaved rounds, one thread (Python {sys.version.split()[0]})"
        )
        firsts: dict[str, list[float]] = {name: [] for name in contenders}
        replays: dict[str, list[float]] = {name: [] for name in contenders}
        # Interleave round by round so a noisy neighbour slows every contender alike.
        for r in range(args.repeat):
            for name, make in contenders.items():
                first, replay = measure(make(f"r{r}"), keys)
                firsts[name].append(first)
                replays[name].append(replay)

    for title, rates in (("first calls", firsts), ("replays", replays)):
        peer = rates["Powertools on Redis"]
        print(f"{title} (ratio: median of the rounds' ratios to Powertools, and their range):")
        for name, values in rates.items():
            median = statistics.median(values)
            ratios = [v / p for v, p in zip(values, peer, strict=True)]
            print(
                f"  {name:<24} median {median:>8,.0f}/s  range {min(values):>8,.0f}-"
                f"{max(values):<8,.0f}  ratio {statistics.median(ratios):5.2f} "
                f"({min(ratios):.2f}-{max(ratios):.2f})"
            )


if __name__ == "__main__":
    main()
