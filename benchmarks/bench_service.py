"""Claims per second over HTTP on loopback against the same store called in-process, same run.

Starts ``python -m dibs.service serve`` on a fresh store, then N client threads
(keep-alive ``http.client`` connections, the cheapest Python client) each
``POST /v1/claims`` distinct seats with an Idempotency-Key and a TTL. The
baseline is the same number of threads calling ``store.claim`` with the same
arguments on a fresh store of the same kind in this process. Prints claims/s,
p50/p99 latency and the service's overhead ratio (in-process rate / HTTP rate).
The client shares the machine's cores with the server, as a sidecar's caller would.

    python benchmarks/bench_service.py [--store sqlite|memory|postgresql] [--claims 4000]
                                       [--clients 8] [--url postgresql://...]

``--store postgresql`` starts a private server (fsync off) unless ``--url``
names one; each side gets a fresh schema in it.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import secrets
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from contextlib import ExitStack
from pathlib import Path
from statistics import quantiles

import dibs
from dibs.service import KeyRing


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _run_threads(
    clients: int, per_client: int, work: Callable[[int, int], None]
) -> tuple[float, list[float]]:
    """Run ``work(client, i)`` per_client times in each of ``clients`` threads.

    Returns (claims per second, every latency in seconds).
    """
    latencies: list[list[float]] = [[] for _ in range(clients)]
    barrier = threading.Barrier(clients + 1)

    def client(c: int) -> None:
        barrier.wait()
        mine = latencies[c]
        for i in range(per_client):
            t0 = time.perf_counter()
            work(c, i)
            mine.append(time.perf_counter() - t0)

    threads = [threading.Thread(target=client, args=(c,)) for c in range(clients)]
    for t in threads:
        t.start()
    barrier.wait()
    started = time.perf_counter()
    for t in threads:
        t.join()
    elapsed = time.perf_counter() - started
    flat = [x for xs in latencies for x in xs]
    return len(flat) / elapsed, flat


def in_process(url: str, clients: int, per_client: int) -> tuple[float, list[float]]:
    store = dibs.open(url)
    try:

        def work(c: int, i: int) -> None:
            r = store.claim(
                dibs.Unit(f"seat-{c}-{i}", "bench"),
                holder=f"h{c}",
                request_id=f"{c}-{i}",
                ttl=300,
            )
            assert r

        return _run_threads(clients, per_client, work)
    finally:
        store.close()


def over_http(url: str, clients: int, per_client: int, tmp: Path) -> tuple[float, list[float]]:
    keys = KeyRing(tmp / "keys.json")
    tokens = [keys.create(f"h{c}")[0] for c in range(clients)]
    port = _free_port()
    server = subprocess.Popen(
        [sys.executable, "-m", "dibs.service", "serve", "--store", url, "--keys",
         str(tmp / "keys.json"), "--port", str(port), "--rate", "1e9", "--burst", "1000000000",
         "--log-level", "warning", "--sweep-interval", "3600"],
        stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
                conn.request("GET", "/readyz")
                if conn.getresponse().status == 200:
                    conn.close()
                    break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)
        conns = [http.client.HTTPConnection("127.0.0.1", port, timeout=60) for _ in range(clients)]

        def work(c: int, i: int) -> None:
            body = json.dumps(
                {"targets": [{"resource": f"seat-{c}-{i}", "slot": "bench"}], "ttl": 300}
            )
            conns[c].request(
                "POST",
                "/v1/claims",
                body=body,
                headers={
                    "Authorization": f"Bearer {tokens[c]}",
                    "Content-Type": "application/json",
                    "Idempotency-Key": f'"{c}-{i}"',
                },
            )
            response = conns[c].getresponse()
            response.read()
            assert response.status == 201, response.status

        return _run_threads(clients, per_client, work)
    finally:
        server.terminate()
        server.wait(30)


def _ms(latencies: list[float]) -> tuple[float, float]:
    cuts = quantiles(latencies, n=100, method="inclusive")
    return cuts[49] * 1000, cuts[98] * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--store", choices=["sqlite", "memory", "postgresql"], default="sqlite")
    parser.add_argument("--url", help="a PostgreSQL URL to use instead of a private server")
    parser.add_argument("--claims", type=int, default=4000, help="claims per side")
    parser.add_argument("--clients", type=int, default=8, help="concurrent clients per side")
    args = parser.parse_args()
    per_client = max(1, args.claims // args.clients)
    with tempfile.TemporaryDirectory() as tmp_name, ExitStack() as stack:
        tmp = Path(tmp_name)
        pg = args.url
        if args.store == "postgresql" and pg is None:
            # The throwaway server lives with the tests (it is not part of the package).
            sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
            from pgserver import PostgresServer

            server = stack.enter_context(PostgresServer(settings={"max_connections": "100"}))
            pg = server.create_database("dibs_bench")

        def url(name: str) -> str:
            if args.store == "memory":
                return "memory://"
            if args.store == "postgresql":
                schema = "b_" + name.removesuffix(".db") + "_" + secrets.token_hex(3)
                return f"{pg}{'&' if '?' in pg else '?'}schema={schema}&pool_max={args.clients}"
            return f"sqlite:///{tmp / name}"

        # Warm both paths (imports, connections, page cache), then measure.
        in_process(url("warm.db"), args.clients, 20)
        direct_rate, direct = in_process(url("direct.db"), args.clients, per_client)
        http_rate, remote = over_http(url("http.db"), args.clients, per_client, tmp)
    d50, d99 = _ms(direct)
    h50, h99 = _ms(remote)
    print(f"store={args.store} clients={args.clients} claims/side={per_client * args.clients} "
          f"cpus={os.cpu_count()}")  # fmt: skip
    print(f"{'':12} {'claims/s':>10} {'p50 ms':>8} {'p99 ms':>8}")
    print(f"{'in-process':12} {direct_rate:10.0f} {d50:8.3f} {d99:8.3f}")
    print(f"{'HTTP':12} {http_rate:10.0f} {h50:8.3f} {h99:8.3f}")
    print(f"overhead ratio (in-process / HTTP): {direct_rate / http_rate:.1f}x")


if __name__ == "__main__":
    main()
