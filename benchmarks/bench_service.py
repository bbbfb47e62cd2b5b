"""Claims per second over HTTP on loopback against the same store called in-process, interleaved.

Starts ``python -m dibs.service serve`` on a fresh store (and, with
``--old-ref``, a second one running the service code of that git revision, for
the threaded service before ``dibs serve`` moved onto :mod:`dibs.aio`). Each
round then runs, one after the other, N claims per side:

- ``in-process``: N client threads calling ``store.claim`` on a sync store;
- ``in-process async``: N tasks awaiting ``store.claim`` on ``dibs.aio.open``;
- ``HTTP``: N client threads, each on a keep-alive connection, each
  ``POST /v1/claims`` distinct seats with an Idempotency-Key and a TTL. The
  load generator is a raw socket writing each request from a byte template and
  reading just the status line and Content-Length (``--http-client raw``, the
  default): about a third of ``http.client``'s client CPU per request
  (``--http-client httplib``), which competes with the server for the same
  cores. Both send the same requests;
- ``HTTP old``: the same against the old revision's server.

``--path park`` measures the lot path instead: each operation parks a vehicle
of its own (``POST /v1/lots/bench/vehicles``, length 2, in a 64-slot lot) and
removes it (``DELETE``), two requests; in-process, :class:`dibs.Lot` and
:class:`dibs.aio.Lot` park and remove the same way. With ``--old-ref`` that
compares the lot awaited on the async store against the sync lot on worker
threads of an older service.

``--path permit`` measures a semaphore: each operation takes a permit of a
semaphore with four permits per client (``POST /v1/semaphores/bench/permits``,
waiting up to 5 s for one: two acquirers may race for the same free slot) and
releases it (``DELETE /v1/claims/{id}?fence=``), two requests;
in-process, ``sem.lease()`` enters and exits on :class:`dibs.Semaphore` and
:class:`dibs.aio.Semaphore` (a lease, which also starts and stops its
renewal). ``--path rate`` measures rate-limit decisions: each operation is one
``POST /v1/rate-limits/bench/acquire`` at ``--rate`` (default 10000/s; a 200 or
a 429 are both a decision), in-process one ``limit.acquire()``.

Prints, per side, the median claims/s and its range over the rounds, p50/p99
latency over all rounds, the CPU per claim of this (the client's) process and
of the server's (from /proc); then the ratio of each HTTP side to in-process claims/s, per round
(median and range). The clients share the machine's cores with the server, as
a sidecar's caller would.

    python benchmarks/bench_service.py [--store postgresql|sqlite|memory] [--clients 8]
                                       [--claims 2000] [--rounds 5] [--old-ref REV]
                                       [--url postgresql://...] [--http-client raw|httplib]
                                       [--path claim|park|permit|rate] [--rate 1000/s]
                                       [--pin 0:1] [--log-level warning|info]

``--pin SERVER:CLIENTS`` runs each ``dibs serve`` on the first CPU list and this
process (the load generator and both in-process sides) on the second, so that
the clients do not take the server's core; the private PostgreSQL stays on
every CPU. ``--log-level info`` has the servers write their access log
(``dibs serve``'s default), to /dev/null.

``--store postgresql`` (the default) starts a private server (fsync off) unless
``--url`` names one; each side gets a schema of its own in it.
"""

from __future__ import annotations

import argparse
import asyncio
import http.client
import json
import os
import secrets
import socket
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
from collections.abc import Callable, Coroutine
from contextlib import ExitStack, closing
from io import BytesIO
from pathlib import Path
from statistics import median, quantiles
from typing import Any, TypeVar

import dibs
import dibs.aio
from dibs.service import KeyRing

_T = TypeVar("_T")
ROOT = Path(__file__).resolve().parent.parent


def _free_port() -> int:
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


LOT_SIZE = 64
SEMAPHORE = "dibs.semaphore:bench"  # the service's resource for the semaphore "bench"
RATE_KEY = "dibs.rate-limit:bench"


class InProcess:
    """Client threads calling the sync store's ``claim`` (or a sync lot's park and remove)."""

    def __init__(self, url: str, path: str = "claim", clients: int = 8, rate: str = "") -> None:
        self.store = dibs.open(url)
        self.path = path
        self.lot = dibs.Lot(self.store, "bench", LOT_SIZE)
        self.sem = dibs.Semaphore(self.store, SEMAPHORE, permits=4 * clients)
        self.limit = dibs.RateLimit(self.store, RATE_KEY, rate or "10000/s")

    def run(self, tag: str, clients: int, per_client: int) -> tuple[float, list[float]]:
        store = self.store
        lot = self.lot

        def park(c: int, i: int) -> None:
            vehicle = f"v-{tag}-{c}-{i}"
            assert lot.park(vehicle, 2) is not None
            lot.remove(vehicle)

        def work(c: int, i: int) -> None:
            r = store.claim(
                dibs.Unit(f"seat-{tag}-{c}-{i}", "bench"),
                holder=f"h{c}",
                request_id=f"{tag}-{c}-{i}",
                ttl=300,
            )
            assert r

        def permit(c: int, i: int) -> None:
            with self.sem.lease(holder=f"h{c}", ttl=300, wait=5):
                pass

        def rate(c: int, i: int) -> None:
            self.limit.acquire()

        chosen = {"park": park, "permit": permit, "rate": rate}.get(self.path, work)
        return _run_threads(clients, per_client, chosen)

    def close(self) -> None:
        self.store.close()


class InProcessAsync:
    """Tasks on one event loop (in a thread of its own) awaiting ``dibs.aio``'s ``claim``."""

    def __init__(self, url: str, path: str = "claim", clients: int = 8, rate: str = "") -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.store = self._do(dibs.aio.open(url).open())
        self.path = path
        self.lot = dibs.aio.Lot(self.store, "bench", LOT_SIZE)
        self.sem = dibs.aio.Semaphore(self.store, SEMAPHORE, permits=4 * clients)
        self.limit = dibs.aio.RateLimit(self.store, RATE_KEY, rate or "10000/s")

    def _do(self, coro: Coroutine[Any, Any, _T]) -> _T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result()

    def run(self, tag: str, clients: int, per_client: int) -> tuple[float, list[float]]:
        store = self.store

        lot = self.lot

        async def client(c: int, lat: list[float]) -> None:
            for i in range(per_client):
                t0 = time.perf_counter()
                if self.path == "permit":
                    async with self.sem.lease(holder=f"h{c}", ttl=300, wait=5):
                        pass
                    lat.append(time.perf_counter() - t0)
                    continue
                if self.path == "rate":
                    await self.limit.acquire()
                    lat.append(time.perf_counter() - t0)
                    continue
                if self.path == "park":
                    vehicle = f"v-{tag}-{c}-{i}"
                    assert await lot.park(vehicle, 2) is not None
                    await lot.remove(vehicle)
                    lat.append(time.perf_counter() - t0)
                    continue
                r = await store.claim(
                    dibs.Unit(f"seat-{tag}-{c}-{i}", "bench"),
                    holder=f"h{c}",
                    request_id=f"{tag}-{c}-{i}",
                    ttl=300,
                )
                lat.append(time.perf_counter() - t0)
                assert r

        async def all_clients() -> tuple[float, list[float]]:
            lats: list[list[float]] = [[] for _ in range(clients)]
            started = time.perf_counter()
            await asyncio.gather(*(client(c, lats[c]) for c in range(clients)))
            elapsed = time.perf_counter() - started
            flat = [x for xs in lats for x in xs]
            return len(flat) / elapsed, flat

        result: tuple[float, list[float]] = self._do(all_clients())
        return result

    def close(self) -> None:
        self._do(self.store.close())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)


class RawConnection:
    """A keep-alive HTTP/1.1 connection on a bare socket: the cheapest load generator.

    Sends a request already encoded; reads the status line and Content-Length
    and skips the body unparsed. Enough for ``dibs serve``'s fixed-length JSON.
    """

    def __init__(self, port: int) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=60)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.buffer = b""

    def exchange(self, request: bytes) -> int:
        """Send ``request``; return the response's status once its body is read."""
        return self.exchange_body(request)[0]

    def exchange_body(self, request: bytes) -> tuple[int, bytes]:
        """Send ``request``; return the response's status and body."""
        self.sock.sendall(request)
        data = self.buffer
        while (end := data.find(b"\r\n\r\n")) < 0:
            data += self._recv()
        head = data[:end].lower()
        at = head.find(b"\r\ncontent-length:")
        if at < 0:
            raise RuntimeError(f"no Content-Length in {data[:end]!r}")
        length = int(head[at + 17 : head.find(b"\r\n", at + 17) % (len(head) + 1)])
        total = end + 4 + length
        while len(data) < total:
            data += self._recv()
        self.buffer = data[total:]
        return int(data[9:12]), data[end + 4 : total]

    def _recv(self) -> bytes:
        chunk = self.sock.recv(65536)
        if not chunk:
            raise ConnectionError("the server closed the connection")
        return chunk

    def close(self) -> None:
        self.sock.close()


class OverHttp:
    """``dibs serve`` in a subprocess (from ``src`` if given) and keep-alive client threads."""

    def __init__(
        self,
        url: str,
        clients: int,
        tmp: Path,
        src: Path | None = None,
        *,
        raw: bool = True,
        path: str = "claim",
        rate: str = "",
        cpus: set[int] | None = None,
        log_level: str = "warning",
    ) -> None:
        self.raw = raw
        self.path = path
        self.rate = rate or "10000/s"
        keys_file = tmp / f"keys-{secrets.token_hex(3)}.json"
        keys = KeyRing(keys_file)
        self.tokens = [keys.create(f"h{c}")[0] for c in range(clients)]
        self.port = _free_port()
        env = dict(os.environ)
        if src is not None:
            env["PYTHONPATH"] = str(src)
        mine = os.sched_getaffinity(0) if cpus else None
        if cpus:  # the child inherits this thread's CPUs; its own threads inherit its
            os.sched_setaffinity(0, cpus)
        self.server = subprocess.Popen(
            [sys.executable, "-m", "dibs.service", "serve", "--store", url, "--keys",
             str(keys_file), "--port", str(self.port), "--rate", "1e9", "--burst", "1000000000",
             "--log-level", log_level, "--sweep-interval", "3600", "--lot", f"bench:{LOT_SIZE}"],
            stderr=subprocess.DEVNULL,
            env=env,
        )  # fmt: skip
        if mine:
            os.sched_setaffinity(0, mine)
        deadline = time.monotonic() + 60
        while True:
            try:
                conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=5)
                conn.request("GET", "/readyz")
                if conn.getresponse().status == 200:
                    conn.close()
                    break
            except OSError:
                if time.monotonic() > deadline or self.server.poll() is not None:
                    raise
                time.sleep(0.05)
        self.conns = [
            http.client.HTTPConnection("127.0.0.1", self.port, timeout=60) for _ in range(clients)
        ]
        self.raw_conns = [RawConnection(self.port) for _ in range(clients)] if raw else []
        if path == "permit":
            self.conns[0].request(
                "PUT",
                "/v1/semaphores/bench",
                body=json.dumps({"permits": 4 * clients}),
                headers={
                    "Authorization": f"Bearer {self.tokens[0]}",
                    "Content-Type": "application/json",
                },
            )
            answer = self.conns[0].getresponse()
            answer.read()
            assert answer.status == 200, answer.status
        self.cpu_per_claim: list[float] = []

    def _cpu(self) -> float | None:
        """The server process's CPU seconds so far (Linux), else None."""
        try:
            fields = Path(f"/proc/{self.server.pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            return None
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def run(self, tag: str, clients: int, per_client: int) -> tuple[float, list[float]]:
        conns, tokens = self.conns, self.tokens
        raw_conns = self.raw_conns
        # The same request as http.client's below, headers and body byte for byte
        # the same but for http.client's own Host and Accept-Encoding lines.
        template = (
            "POST /v1/claims HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
            "Authorization: Bearer {token}\r\nContent-Type: application/json\r\n"
            'Idempotency-Key: "{key}"\r\nContent-Length: {length}\r\n\r\n{body}'
        )

        park_template = (
            "POST /v1/lots/bench/vehicles HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
            "Authorization: Bearer {token}\r\nContent-Type: application/json\r\n"
            "Content-Length: {length}\r\n\r\n{body}"
        )
        remove_template = (
            "DELETE /v1/lots/bench/vehicles/{vehicle} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
            "Authorization: Bearer {token}\r\nContent-Length: 0\r\n\r\n"
        )

        def park(c: int, i: int) -> None:
            vehicle = f"v-{tag}-{c}-{i}"
            body = json.dumps({"vehicle": vehicle, "length": 2})
            request = park_template.format(
                port=self.port, token=tokens[c], length=len(body), body=body
            )
            status = raw_conns[c].exchange(request.encode())
            assert status == 201, status
            request = remove_template.format(port=self.port, token=tokens[c], vehicle=vehicle)
            status = raw_conns[c].exchange(request.encode())
            assert status == 200, status

        permit_template = (
            "POST /v1/semaphores/bench/permits HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
            "Authorization: Bearer {token}\r\nContent-Type: application/json\r\n"
            'Content-Length: 25\r\n\r\n{{"ttl": 300, "wait": 5.0}}'
        )
        release_template = (
            "DELETE /v1/claims/{id}?fence={fence} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
            "Authorization: Bearer {token}\r\nContent-Length: 0\r\n\r\n"
        )
        rate_body = json.dumps({"rate": self.rate})
        rate_request = [
            (
                f"POST /v1/rate-limits/bench/acquire HTTP/1.1\r\nHost: 127.0.0.1:{self.port}\r\n"
                f"Authorization: Bearer {token}\r\nContent-Type: application/json\r\n"
                f"Content-Length: {len(rate_body)}\r\n\r\n{rate_body}"
            ).encode()
            for token in tokens
        ]

        def permit(c: int, i: int) -> None:
            request = permit_template.format(port=self.port, token=tokens[c])
            status, body = raw_conns[c].exchange_body(request.encode())
            assert status == 201, (status, body)
            claim = json.loads(body)["claim"]
            request = release_template.format(
                port=self.port, token=tokens[c], id=claim["id"], fence=claim["fence"]
            )
            status = raw_conns[c].exchange(request.encode())
            assert status == 200, status

        def rate(c: int, i: int) -> None:
            status = raw_conns[c].exchange(rate_request[c])
            assert status in (200, 429), status

        def raw_work(c: int, i: int) -> None:
            body = json.dumps(
                {"targets": [{"resource": f"seat-{tag}-{c}-{i}", "slot": "bench"}], "ttl": 300}
            )
            request = template.format(
                port=self.port, token=tokens[c], key=f"{tag}-{c}-{i}", length=len(body), body=body
            )
            status = raw_conns[c].exchange(request.encode())
            assert status == 201, status

        def work(c: int, i: int) -> None:
            body = json.dumps(
                {"targets": [{"resource": f"seat-{tag}-{c}-{i}", "slot": "bench"}], "ttl": 300}
            )
            conns[c].request(
                "POST",
                "/v1/claims",
                body=body,
                headers={
                    "Authorization": f"Bearer {tokens[c]}",
                    "Content-Type": "application/json",
                    "Idempotency-Key": f'"{tag}-{c}-{i}"',
                },
            )
            response = conns[c].getresponse()
            response.read()
            assert response.status == 201, response.status

        before = self._cpu()
        if self.path in ("park", "permit", "rate"):
            assert self.raw, f"--path {self.path} runs on the raw client"
            chosen = {"park": park, "permit": permit, "rate": rate}[self.path]
        else:
            chosen = raw_work if self.raw else work
        result = _run_threads(clients, per_client, chosen)
        after = self._cpu()
        if before is not None and after is not None:
            self.cpu_per_claim.append((after - before) / (clients * per_client))
        return result

    def close(self) -> None:
        for conn in self.conns:
            conn.close()
        for raw in self.raw_conns:
            raw.close()
        self.server.terminate()
        self.server.wait(30)


def _old_source(ref: str, tmp: Path) -> Path:
    """The ``src`` tree of git revision ``ref``, unpacked under ``tmp``."""
    archive = subprocess.run(
        ["git", "-C", str(ROOT), "archive", "--format=tar", ref, "src"],
        check=True,
        capture_output=True,
    ).stdout
    where = tmp / f"old-{ref.replace('/', '_')}"
    with tarfile.open(fileobj=BytesIO(archive)) as tar:
        tar.extractall(where, filter="data")
    return where / "src"


def _pct(latencies: list[float], p: int) -> float:
    return quantiles(latencies, n=100, method="inclusive")[p - 1] * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--store", choices=["postgresql", "sqlite", "memory"], default="postgresql")
    parser.add_argument("--url", help="a PostgreSQL URL to use instead of a private server")
    parser.add_argument("--claims", type=int, default=2000, help="claims per side per round")
    parser.add_argument("--clients", type=int, default=8, help="concurrent clients per side")
    parser.add_argument("--rounds", type=int, default=5, help="rounds (sides interleaved)")
    parser.add_argument(
        "--old-ref", help="also serve the service of this git revision (e.g. 505362a)"
    )
    parser.add_argument(
        "--http-client",
        choices=["raw", "httplib"],
        default="raw",
        help="the load generator: a bare socket (default) or http.client",
    )
    parser.add_argument(
        "--path",
        choices=["claim", "park", "permit", "rate"],
        default="claim",
        help="what each operation does: a claim (default), park and remove in a lot, "
        "take and release a semaphore's permit, or one rate-limit decision",
    )
    parser.add_argument("--rate", default="10000/s", help="the rate of --path rate")
    parser.add_argument(
        "--pin",
        metavar="SERVER:CLIENTS",
        help="CPU lists, e.g. 0:1: each service on the first, this process (load generator "
        "and in-process sides) on the second; PostgreSQL stays on every CPU",
    )
    parser.add_argument(
        "--log-level",
        default="warning",
        choices=["info", "warning"],
        help="the servers' --log-level: info writes an access-log line per request",
    )
    args = parser.parse_args()
    server_cpus: set[int] | None = None
    client_cpus: set[int] | None = None
    if args.pin:
        server_part, _, client_part = args.pin.partition(":")
        server_cpus = {int(c) for c in server_part.split(",")}
        client_cpus = {int(c) for c in client_part.split(",")}
    raw = args.http_client == "raw"
    per_client = max(1, args.claims // args.clients)
    with tempfile.TemporaryDirectory() as tmp_name, ExitStack() as stack:
        tmp = Path(tmp_name)
        pg = args.url
        if args.store == "postgresql" and pg is None:
            # The throwaway server lives with the tests (it is not part of the package).
            from dibs.verify.harness import PostgresServer

            server = stack.enter_context(PostgresServer(settings={"max_connections": "200"}))
            pg = server.create_database("dibs_bench")

        def url(name: str) -> str:
            if args.store == "memory":
                return "memory://"
            if args.store == "postgresql":
                assert pg is not None
                schema = f"b_{name}_{secrets.token_hex(3)}"
                return f"{pg}{'&' if '?' in pg else '?'}schema={schema}&pool_max={args.clients}"
            return f"sqlite:///{tmp / name}.db"

        if client_cpus:  # after PostgreSQL started, before any thread: all inherit it
            os.sched_setaffinity(0, client_cpus)
        sides: dict[str, InProcess | InProcessAsync | OverHttp] = {}
        path = args.path
        clients, rate = args.clients, args.rate
        sides["in-process"] = stack.enter_context(
            closing(InProcess(url("direct"), path, clients, rate))
        )
        sides["in-process async"] = stack.enter_context(
            closing(InProcessAsync(url("aio"), path, clients, rate))
        )
        sides["HTTP"] = stack.enter_context(
            closing(
                OverHttp(
                    url("http"),
                    clients,
                    tmp,
                    raw=raw,
                    path=path,
                    rate=rate,
                    cpus=server_cpus,
                    log_level=args.log_level,
                )
            )
        )
        if args.old_ref:
            old = _old_source(args.old_ref, tmp)
            sides["HTTP old"] = stack.enter_context(
                closing(
                    OverHttp(
                        url("old"),
                        args.clients,
                        tmp,
                        old,
                        raw=raw,
                        path=path,
                        cpus=server_cpus,
                        log_level=args.log_level,
                    )
                )
            )
        rates: dict[str, list[float]] = {name: [] for name in sides}
        lats: dict[str, list[float]] = {name: [] for name in sides}
        for side in sides.values():  # warm: imports, connections, caches
            side.run("warm", args.clients, 20)
        own_cpu: dict[str, list[float]] = {name: [] for name in sides}
        for r in range(args.rounds):
            for name, side in sides.items():
                cpu0 = time.process_time()
                rate, latencies = side.run(f"r{r}", args.clients, per_client)
                own_cpu[name].append((time.process_time() - cpu0) / (args.clients * per_client))
                rates[name].append(rate)
                lats[name].extend(latencies)
    total = per_client * args.clients
    unit = {"claim": "claims", "park": "parks", "permit": "permits", "rate": "decisions"}[args.path]
    print(
        f"store={args.store} clients={args.clients} {unit}/side/round={total} "
        f"rounds={args.rounds} cpus={os.cpu_count()} http-client={args.http_client} "
        f"path={args.path} pin={args.pin or 'none'} log-level={args.log_level}"
    )
    print(
        f"{'':18} {unit + '/s':>9} {'range':>13} {'p50 ms':>7} {'p99 ms':>7} "
        f"{'client CPU':>10} {'server CPU':>10}"
    )
    for name, side in sides.items():
        server = (
            f"{median(side.cpu_per_claim) * 1e6:7.0f} us"
            if isinstance(side, OverHttp) and side.cpu_per_claim
            else ""
        )
        client = f"{median(own_cpu[name]) * 1e6:7.0f} us"
        rs = rates[name]
        print(
            f"{name:18} {median(rs):9.0f} {min(rs):6.0f}-{max(rs):<6.0f} "
            f"{_pct(lats[name], 50):7.2f} {_pct(lats[name], 99):7.2f} {client:>10} {server:>10}"
        )
    base = rates["in-process"]
    for name in sides:
        if name.startswith("HTTP"):
            ratios = [h / b for h, b in zip(rates[name], base, strict=True)]
            print(
                f"{name} / in-process {unit}/s: median {median(ratios):.2f} "
                f"(range {min(ratios):.2f}-{max(ratios):.2f})"
            )
    if "HTTP old" in sides:
        ratios = [n / o for n, o in zip(rates["HTTP"], rates["HTTP old"], strict=True)]
        print(
            f"HTTP / HTTP old {unit}/s: median {median(ratios):.2f} "
            f"(range {min(ratios):.2f}-{max(ratios):.2f})"
        )


if __name__ == "__main__":
    main()
