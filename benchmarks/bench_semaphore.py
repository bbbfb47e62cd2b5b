"""dibs.Semaphore acquire/release against redis-py's Lock and kazoo's Semaphore, interleaved.

One process, one holder at a time: acquire a permit (a lock), release it, again.
Each peer runs on a private server on loopback that this script starts and stops:

* **dibs**: ``with sem.lease(holder=..., ttl=30):`` on a ``dibs.Semaphore`` of 4
  permits, on memory://, sqlite:// (a file, WAL) and PostgreSQL (a private
  server, fsync on). A lease is fenced and renewed by a thread; acquiring reads
  the limit's version before and after the claim (2 reads + claim + release).
* **redis Lock**: redis-py's ``Lock`` (one permit: redis has no semaphore),
  ``acquire()`` / ``release()`` on a private ``redis-server`` without persistence.
* **kazoo Semaphore**: kazoo's ``Semaphore(max_leases=4)`` on a private
  ZooKeeper (``apt-get install -y zookeeperd``), skipped with a note if it can't run.

Rounds alternate the contenders; the script prints the median and range of
acquire+release pairs per second, and the ratio of each to redis's Lock.

    python benchmarks/bench_semaphore.py
    python benchmarks/bench_semaphore.py --ops 500 --repeat 5 --json out.json
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import statistics
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

import dibs
from dibs.verify.harness import PostgresServer, free_ports

ZOOKEEPER_JARS = Path("/usr/share/java")


def _wait_port(port: int, proc: subprocess.Popen[bytes], what: str) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"{what} did not start")


@contextmanager
def redis_server() -> Iterator[str]:
    """A throwaway redis-server on loopback, without persistence."""
    binary = shutil.which("redis-server")
    if binary is None:
        raise SystemExit("redis-server not found: apt-get install -y redis-server")
    port = free_ports(1)[0]
    proc = subprocess.Popen(
        [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"],
        stdout=subprocess.DEVNULL,
    )
    try:
        _wait_port(port, proc, "redis-server")
        yield f"redis://127.0.0.1:{port}/0"
    finally:
        proc.terminate()
        proc.wait(10)


@contextmanager
def zookeeper_server() -> Iterator[str]:
    """A throwaway standalone ZooKeeper on loopback (Debian's zookeeper jars)."""
    jars = sorted(str(p) for p in ZOOKEEPER_JARS.glob("*.jar"))
    if not (ZOOKEEPER_JARS / "zookeeper.jar").exists() or shutil.which("java") is None:
        raise RuntimeError("ZooKeeper not installed (apt-get install -y zookeeperd)")
    workdir = tempfile.mkdtemp(prefix="dibs-bench-zk-")
    port = free_ports(1)[0]
    config = Path(workdir, "zoo.cfg")
    config.write_text(
        f"tickTime=2000\ndataDir={workdir}/data\nclientPort={port}\n"
        "clientPortAddress=127.0.0.1\nadmin.enableServer=false\n"
    )
    proc = subprocess.Popen(
        ["java", "-cp", ":".join(jars), "org.apache.zookeeper.server.ZooKeeperServerMain",
         str(config)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        _wait_port(port, proc, "ZooKeeper")
        yield f"127.0.0.1:{port}"
    finally:
        proc.terminate()
        proc.wait(10)
        shutil.rmtree(workdir, ignore_errors=True)


def dibs_pairs(url: str) -> tuple[Callable[[], None], Callable[[], None]]:
    store = dibs.open(url)
    sem = dibs.Semaphore(store, "bench-sem", permits=4)
    sem.current_permits()  # declared outside the timing

    def pair() -> None:
        with sem.lease(holder="bench", ttl=30):
            pass

    return pair, store.close


def redis_pairs(url: str) -> tuple[Callable[[], None], Callable[[], None]]:
    import redis

    client = redis.Redis.from_url(url)
    lock = client.lock("bench-lock", timeout=30)

    def pair() -> None:
        lock.acquire()
        lock.release()

    return pair, client.close


def kazoo_pairs(hosts: str) -> tuple[Callable[[], None], Callable[[], None]]:
    from kazoo.client import KazooClient

    client = KazooClient(hosts=hosts)
    client.start(timeout=15)
    sem = client.Semaphore("/bench-sem", identifier="bench", max_leases=4)

    def pair() -> None:
        sem.acquire()
        sem.release()

    def close() -> None:
        client.stop()
        client.close()

    return pair, close


def measure(pair: Callable[[], None], ops: int) -> float:
    for _ in range(max(5, ops // 20)):
        pair()  # warm up: connections, caches
    began = time.perf_counter()
    for _ in range(ops):
        pair()
    return ops / (time.perf_counter() - began)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--ops", type=int, default=300, help="pairs per contender per round")
    parser.add_argument("--repeat", type=int, default=5, help="rounds, interleaved")
    parser.add_argument("--json", help="write the figures here")
    args = parser.parse_args()
    with ExitStack() as stack:
        tmp = stack.enter_context(tempfile.TemporaryDirectory(prefix="dibs-bench-sem-"))
        server = stack.enter_context(PostgresServer(durable=True))
        contenders: dict[str, tuple[Callable[[], None], Callable[[], None]]] = {
            "redis Lock": redis_pairs(stack.enter_context(redis_server())),
            "dibs memory://": dibs_pairs("memory://"),
            "dibs sqlite://": dibs_pairs(f"sqlite:///{tmp}/bench.db"),
            "dibs postgresql": dibs_pairs(server.create_database("dibs_sem")),
        }
        try:
            contenders["kazoo Semaphore"] = kazoo_pairs(stack.enter_context(zookeeper_server()))
        except Exception as exc:  # reported, not fatal: the other contenders still run
            print(f"kazoo Semaphore skipped: {exc}")
        rates: dict[str, list[float]] = {name: [] for name in contenders}
        for _ in range(args.repeat):
            for name, (pair, _close) in contenders.items():
                rates[name].append(measure(pair, args.ops))
        for _pair, close in contenders.values():
            close()
    base = statistics.median(rates["redis Lock"])
    print(f"acquire+release pairs per second, one holder, {os.cpu_count()} cores,")
    print(f"{args.ops} pairs per round, {args.repeat} rounds interleaved; ratio to redis Lock")
    figures = {}
    for name, values in rates.items():
        median = statistics.median(values)
        figures[name] = {"median": median, "min": min(values), "max": max(values)}
        print(
            f"  {name:18} {median:9.0f}/s  (range {min(values):.0f}-{max(values):.0f})"
            f"  x{median / base:.3f}"
        )
    if args.json:
        Path(args.json).write_text(json.dumps(figures, indent=2))


if __name__ == "__main__":
    main()
