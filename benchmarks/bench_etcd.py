"""Single-unit holds per second on etcd: dibs vs the raw gateway doing the same writes.

For each client count C (1, 4, 16 by default), C threads claim distinct units
as fast as they can. The baseline is what a hand-written claim on etcd costs:
a lease grant and one transaction (compare the key absent, put it on the
lease), over one shared ``httpx.Client``. dibs does
``store.claim(Unit(...), holder=..., ttl=300)``, which writes the unit, the
claim record and its live key in that one transaction. Rounds of baseline and
dibs alternate; the script prints medians of throughput and the median of
per-round ratios (this machine is shared and noisy: a single round means
little).

    python benchmarks/bench_etcd.py                        # private cluster, 1 member
    python benchmarks/bench_etcd.py --members 3            # 3 members (Raft across them)
    python benchmarks/bench_etcd.py --clients 1 4 --claims 600 --repeat 5

The private members keep their data on /dev/shm when it exists, so the disk's
fsync is not measured; both sides pay the same Raft round trips.
"""

from __future__ import annotations

import argparse
import base64
import secrets
import statistics
import threading
import time
from collections.abc import Callable

import httpx

import dibs
from dibs.verify.harness import EtcdCluster

Op = Callable[[int, int], None]


def run_round(op: Op, clients: int, claims: int) -> float:
    """Run ``claims`` ops split over ``clients`` threads; return ops per second."""
    per = claims // clients
    barrier = threading.Barrier(clients + 1)

    def client(n: int) -> None:
        barrier.wait()
        for i in range(per):
            op(n, i)

    threads = [threading.Thread(target=client, args=(n,)) for n in range(clients)]
    for t in threads:
        t.start()
    barrier.wait()
    began = time.perf_counter()
    for t in threads:
        t.join()
    return per * clients / (time.perf_counter() - began)


def raw_claim(http: httpx.Client, endpoint: str, prefix: str) -> Op:
    def op(n: int, i: int) -> None:
        key = base64.b64encode(f"{prefix}/{n}/{i}".encode()).decode()
        lease = http.post(f"{endpoint}/v3/lease/grant", json={"TTL": 300}).json()["ID"]
        answer = http.post(
            f"{endpoint}/v3/kv/txn",
            json={
                "compare": [{"key": key, "target": "CREATE", "create_revision": "0"}],
                "success": [{"request_put": {"key": key, "value": "", "lease": lease}}],
            },
        ).json()
        assert answer.get("succeeded")

    return op


def dibs_claim(store: dibs.Store, prefix: str) -> Op:
    def op(n: int, i: int) -> None:
        assert store.claim(dibs.Unit(f"{prefix}-{n}", str(i)), holder=f"c{n}", ttl=300)

    return op


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--members", type=int, default=1)
    parser.add_argument("--clients", type=int, nargs="+", default=[1, 4, 16])
    parser.add_argument("--claims", type=int, default=800)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    with EtcdCluster(args.members) as running, httpx.Client() as http:
        endpoint = f"http://{running.endpoints[0]}"
        store = dibs.open(running.url("bench"))
        print(f"etcd, {args.members} member(s); {args.claims} holds per round")
        for clients in args.clients:
            raw: list[float] = []
            ours: list[float] = []
            for _ in range(args.repeat):
                tag = secrets.token_hex(4)
                raw.append(run_round(raw_claim(http, endpoint, f"raw-{tag}"), clients, args.claims))
                ours.append(run_round(dibs_claim(store, f"d-{tag}"), clients, args.claims))
            ratios = [o / b for o, b in zip(ours, raw, strict=True)]
            print(
                f"{clients:>3} clients: raw gateway {statistics.median(raw):7.0f}/s "
                f"[{min(raw):.0f}-{max(raw):.0f}], dibs {statistics.median(ours):7.0f}/s "
                f"[{min(ours):.0f}-{max(ours):.0f}], dibs/raw median "
                f"{statistics.median(ratios):.2f} [{min(ratios):.2f}-{max(ratios):.2f}]"
            )
        store.close()


if __name__ == "__main__":
    main()
