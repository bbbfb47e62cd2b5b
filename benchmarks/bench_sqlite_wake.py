"""How a SQLite worker learns that another process added a job: the options, measured.

A writer process commits one row every ``--gap`` seconds (jittered) into a
WAL-mode file and, for the socket option, sends a datagram to the watcher's
Unix socket right after the commit. The watcher (this process) notices by:

* ``poll 0.5 s``: re-reading the table every 0.5 s (dibs before issue #16);
* ``data_version 1-8 ms``: ``PRAGMA data_version`` read every 1 ms after a
  change, backing off to 8 ms (what dibs does now, :mod:`dibs.stores.sqlite._jobs`);
* ``data_version 1 ms``: the same at a fixed 1 ms;
* ``socket``: blocking ``recv`` on a Unix datagram socket the writer sends to.

Printed per option: notice latency p50/p99 (commit → noticed, wall clock of one
machine) and the watching process's CPU seconds per wall second while it runs
(the watcher thread; the main thread only waits), idle gaps included. Options
run interleaved, ``--rounds`` times.

    python benchmarks/bench_sqlite_wake.py [--samples 100] [--gap 0.05] [--rounds 3]
"""

from __future__ import annotations

import argparse
import socket
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

WRITER = r"""
import random, socket, sqlite3, sys, time
path, sock, samples, gap = sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4])
conn = sqlite3.connect(path, isolation_level=None)
out = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
time.sleep(0.3)
for i in range(samples):
    time.sleep(gap * random.uniform(0.5, 1.5))
    conn.execute("INSERT INTO t VALUES (?, ?)", (i, time.time()))
    if sock != "-":
        try:
            out.sendto(b"x", sock)
        except OSError:
            pass
"""


def watch_poll(path: str, interval: float, stop: threading.Event, seen: list[float]) -> None:
    conn = sqlite3.connect(path)
    last = -1
    while not stop.wait(interval):
        for n, at in conn.execute("SELECT n, at FROM t WHERE n > ?", (last,)):
            seen.append(time.time() - at)
            last = max(last, n)


def watch_version(
    path: str, low: float, high: float, stop: threading.Event, seen: list[float]
) -> None:
    conn = sqlite3.connect(path)
    (version,) = conn.execute("PRAGMA data_version").fetchone()
    last, pause = -1, low
    while not stop.wait(pause):
        (now,) = conn.execute("PRAGMA data_version").fetchone()
        if now == version:
            pause = min(pause * 2, high)
            continue
        version, pause = now, low
        for n, at in conn.execute("SELECT n, at FROM t WHERE n > ?", (last,)):
            seen.append(time.time() - at)
            last = max(last, n)


def run(option: str, tmp: Path, samples: int, gap: float) -> list[float]:
    path = str(tmp / f"{option.replace(' ', '_')}-{time.monotonic_ns()}.db")
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA journal_mode = WAL")
    conn.execute("CREATE TABLE t (n INTEGER, at REAL)")
    conn.close()
    seen: list[float] = []
    stop = threading.Event()
    sock_path = "-"
    target: Callable[[], None]
    if option == "socket":
        sock_path = path + ".sock"
        server = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        server.bind(sock_path)
        server.settimeout(0.2)
        reader = sqlite3.connect(path, check_same_thread=False)

        def target() -> None:
            last = -1
            while not stop.is_set():
                try:
                    server.recv(16)
                except TimeoutError:
                    continue
                for n, at in reader.execute("SELECT n, at FROM t WHERE n > ?", (last,)):
                    seen.append(time.time() - at)
                    last = max(last, n)
    elif option == "poll 0.5 s":

        def target() -> None:
            watch_poll(path, 0.5, stop, seen)
    elif option == "data_version 1 ms":

        def target() -> None:
            watch_version(path, 0.001, 0.001, stop, seen)
    else:

        def target() -> None:
            watch_version(path, 0.001, 0.008, stop, seen)

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    writer = subprocess.run(
        [sys.executable, "-c", WRITER, path, sock_path, str(samples), str(gap)], check=True
    )
    assert writer.returncode == 0
    deadline = time.monotonic() + 5
    while len(seen) < samples and time.monotonic() < deadline:
        time.sleep(0.01)
    stop.set()
    thread.join()
    return seen


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--samples", type=int, default=100)
    parser.add_argument("--gap", type=float, default=0.05)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    options = ["poll 0.5 s", "data_version 1-8 ms", "data_version 1 ms", "socket"]
    results: dict[str, list[float]] = {o: [] for o in options}
    cpu: dict[str, list[float]] = {o: [] for o in options}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.rounds):
            order = options[:] if r % 2 == 0 else options[::-1]
            for option in order:
                before = time.process_time()
                began = time.monotonic()
                seen = run(option, Path(tmp), args.samples, args.gap)
                results[option] += seen
                cpu[option].append((time.process_time() - before) / (time.monotonic() - began))
    print(f"notice latency, {args.rounds} rounds x {args.samples} commits ~{args.gap:g} s apart:")
    for option in options:
        lat = sorted(x * 1000 for x in results[option])
        p50, p99 = lat[len(lat) // 2], lat[int(len(lat) * 0.99)]
        print(
            f"  {option:<22} p50 {p50:7.2f} ms  p99 {p99:7.2f} ms  "
            f"watcher process CPU {statistics.median(cpu[option]) * 100:5.1f} %"
        )


if __name__ == "__main__":
    main()
