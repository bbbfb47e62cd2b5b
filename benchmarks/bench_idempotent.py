"""Calls per second: ``@dibs.idempotent`` on a store vs AWS Lambda Powertools' idempotency on Redis.

Both decorate the same function (it returns a small dict), one thread each.
Each round makes N *first* calls (new keys: the function runs and its result
is stored) and then N *replays* of the same keys (the stored result comes
back), every contender in a fresh process of its own (imports and connections
are warmed up before the clock starts), the contenders interleaved round by
round. Powertools keeps its records in a local ``redis-server`` that this
script starts and stops (its own Redis layer, the peer Powertools users run
outside DynamoDB). dibs always validates the payload; Powertools runs without
payload validation (see ``CHILD``), so it does a little less work. The figures
are calls per second and, per contender, the median and range of the per-round
ratios to Powertools; with ``--base``, also this checkout's dibs ÷ the other
checkout's, per store, round by round (an A/B of a change in one command).

    python benchmarks/bench_idempotent.py                  # memory:// and sqlite://
    python benchmarks/bench_idempotent.py --postgres       # also a private PostgreSQL (fsync off)
    python benchmarks/bench_idempotent.py --postgres URL   # also an existing PostgreSQL
    mkdir /tmp/base && git archive main src | tar -x -C /tmp/base   # main's dibs
    python benchmarks/bench_idempotent.py --postgres --base /tmp/base/src
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

import dibs


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


CHILD = """
import sys, time, warnings
kind, where, scope, calls = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
if kind == "powertools":
    import redis
    from aws_lambda_powertools.utilities.idempotency import IdempotencyConfig, idempotent_function
    from aws_lambda_powertools.utilities.idempotency.persistence.cache import (
        CachePersistenceLayer,
    )

    # Outside Lambda it warns once per call that it cannot see the remaining time.
    warnings.filterwarnings("ignore", message="Couldn't determine the remaining time")
    layer = CachePersistenceLayer(client=redis.Redis(host="127.0.0.1", port=int(where)))
    # Without payload validation: with it on, this cache layer (3.37.0) answers
    # IdempotencyValidationError to every replay (it drops the hash when the
    # record completes, as its TypeScript twin did in powertools-lambda-typescript#5705).
    config = IdempotencyConfig(event_key_jmespath="id", expires_after_seconds=3600)

    @idempotent_function(data_keyword_argument="order", persistence_store=layer, config=config)
    def charge(order):
        return {"order": order["id"], "charged": order["cents"]}

    call = lambda key: charge(order={"id": f"{scope}-{key}", "cents": 1250})
else:
    import dibs

    store = dibs.open(where)

    @dibs.idempotent(store, key="order_id", name=f"bench.{scope}")
    def charge(order_id, cents):
        return {"order": order_id, "charged": cents}

    call = lambda key: charge(key, 1250)

for i in range(50):  # warm up: imports, connections, prepared statements
    call(f"warm-{i}")
    call(f"warm-{i}")
keys = [f"order-{i}" for i in range(calls)]
started = time.perf_counter()
for key in keys:
    call(key)
first = calls / (time.perf_counter() - started)
started = time.perf_counter()
for key in keys:
    call(key)
print(first, calls / (time.perf_counter() - started))
"""


def measure(kind: str, where: str, src: str | None, scope: str, calls: int) -> tuple[float, float]:
    """(first calls per second, replays per second) of one contender, in a fresh process."""
    env = dict(os.environ)
    if src is not None:
        env["PYTHONPATH"] = src
    done = subprocess.run(
        [sys.executable, "-c", CHILD, kind, where, scope, str(calls)],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    first, replay = done.stdout.split()
    return float(first), float(replay)


def _line(name: str, values: list[float], ratios: list[float], width: int) -> str:
    return (
        f"  {name:<{width}} median {statistics.median(values):>8,.0f}/s  range "
        f"{min(values):>8,.0f}-{max(values):<8,.0f}  ratio {statistics.median(ratios):5.2f} "
        f"({min(ratios):.2f}-{max(ratios):.2f})"
    )


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
    parser.add_argument("--base", metavar="SRC", help="also run the dibs in this src directory")
    parser.add_argument(
        "--stores", nargs="*", default=["memory", "sqlite"], help="stores besides --postgres"
    )
    args = parser.parse_args(argv)
    this = str(Path(__file__).resolve().parent.parent / "src")
    sides = {"": this} if args.base is None else {"": this, " (base)": args.base}

    with ExitStack() as cleanup:
        port = cleanup.enter_context(redis_server())
        tmp = Path(cleanup.enter_context(tempfile.TemporaryDirectory()))
        known = {"memory": "memory://", "sqlite": f"sqlite:///{tmp / 'bench.db'}"}
        stores = {f"{kind}://": known[kind] for kind in args.stores}
        if args.postgres:
            url = args.postgres
            if url == "private":
                # The throwaway server lives with the tests (it is not part of the package).
                from dibs.verify.harness import PostgresServer

                url = cleanup.enter_context(PostgresServer()).create_database("dibs_bench")
            stores["postgresql://"] = url
        for where in stores.values():
            dibs.open(where).close()  # each store's schema, before any timed round
        contenders: dict[str, tuple[str, str, str | None]] = {
            "Powertools on Redis": ("powertools", str(port), None)
        }
        for label, where in stores.items():
            for side, src in sides.items():
                contenders[f"dibs{side} on {label}"] = ("dibs", where, src)

        print(
            f"idempotent calls, {args.calls} first calls then {args.calls} replays per round, "
            f"{args.repeat} interleaved rounds, one thread, a process per contender per round "
            f"(Python {sys.version.split()[0]})"
        )
        firsts: dict[str, list[float]] = {name: [] for name in contenders}
        replays: dict[str, list[float]] = {name: [] for name in contenders}
        # Interleave round by round so a noisy neighbour slows every contender alike.
        for r in range(args.repeat):
            for i, (name, (kind, where, src)) in enumerate(contenders.items()):
                first, replay = measure(kind, where, src, f"r{r}c{i}", args.calls)
                firsts[name].append(first)
                replays[name].append(replay)

    width = max(len(name) for name in contenders)
    for title, rates in (("first calls", firsts), ("replays", replays)):
        peer = rates["Powertools on Redis"]
        print(f"{title} (ratio: median of the rounds' ratios to Powertools, and their range):")
        for name, values in rates.items():
            ratios = [v / p for v, p in zip(values, peer, strict=True)]
            print(_line(name, values, ratios, width))
        if args.base is not None:
            print(f"{title}, this ÷ base (median of the rounds' ratios, and their range):")
            for label in stores:
                ours, base = rates[f"dibs on {label}"], rates[f"dibs (base) on {label}"]
                ratios = [o / b for o, b in zip(ours, base, strict=True)]
                print(_line(label, ours, ratios, width))


if __name__ == "__main__":
    main()
