"""``dibs serve`` on uvicorn's h11 parser against the same service on httptools, interleaved.

Starts two ``dibs serve`` processes on fresh stores of one kind, identical but
for uvicorn's HTTP/1.1 parser (``dibs.service._cli.HTTP_PARSER``): h11, what
``dibs serve`` runs since the framing fixes of issue 24, and httptools, what it
ran before. Each round runs, one after the other, N claims against each: N
keep-alive client threads each ``POST /v1/claims`` distinct seats with an
Idempotency-Key and a TTL, from a byte template on a bare socket (the load
generator of ``bench_service.py``). Then the same for ``GET /healthz``, the
floor of any request, where the parser's share is largest.

Prints, per parser and request, the median requests/s and its range over the
rounds, p50/p99 latency, and the server's CPU per request (from /proc); then
the ratio h11 / httptools of requests/s and of server CPU per request, per
round (median and range).

    python benchmarks/bench_service_parsers.py [--store memory|sqlite|postgresql]
        [--clients 8] [--requests 2000] [--rounds 7]
"""

from __future__ import annotations

import argparse
import os
import secrets
import subprocess
import sys
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path
from statistics import median

from bench_service import RawConnection, _free_port, _pct, _run_threads
from dibs.service import KeyRing

ROOT = Path(__file__).resolve().parent.parent
PARSERS = ("h11", "httptools")
# dibs serve exactly, with only uvicorn's parser swapped.
SERVE = (
    "import sys; import dibs.service._cli as c; c.HTTP_PARSER = sys.argv[1]; "
    "from dibs.cli import main; sys.exit(main(sys.argv[2:]))"
)


class Server:
    """``dibs serve`` on one parser in a subprocess, and a keep-alive raw connection per client."""

    def __init__(self, parser: str, url: str, clients: int, tmp: Path) -> None:
        keys_file = tmp / f"keys-{parser}.json"
        keys = KeyRing(keys_file)
        self.tokens = [keys.create(f"h{c}")[0] for c in range(clients)]
        self.port = _free_port()
        self.proc = subprocess.Popen(
            [sys.executable, "-c", SERVE, parser, "serve", "--store", url, "--keys",
             str(keys_file), "--port", str(self.port), "--rate", "1e9", "--burst", "1000000000",
             "--log-level", "warning", "--sweep-interval", "3600"],
            stderr=subprocess.DEVNULL,
        )  # fmt: skip
        deadline = time.monotonic() + 60
        while True:
            try:
                probe = RawConnection(self.port)
                ok = probe.exchange(self._healthz()) == 200
                probe.close()
                if ok:
                    break
            except OSError:
                if time.monotonic() > deadline or self.proc.poll() is not None:
                    raise
                time.sleep(0.05)
        self.conns = [RawConnection(self.port) for _ in range(clients)]
        self.cpu: dict[str, list[float]] = {"claim": [], "healthz": []}

    def _healthz(self) -> bytes:
        return f"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1:{self.port}\r\n\r\n".encode()

    def _server_cpu(self) -> float:
        fields = Path(f"/proc/{self.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def run(self, kind: str, tag: str, per_client: int) -> tuple[float, list[float]]:
        template = (
            "POST /v1/claims HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
            "Authorization: Bearer {token}\r\nContent-Type: application/json\r\n"
            'Idempotency-Key: "{key}"\r\nContent-Length: {length}\r\n\r\n{body}'
        )
        healthz = self._healthz()

        def claim(c: int, i: int) -> None:
            body = (
                f'{{"targets": [{{"resource": "seat-{tag}-{c}-{i}", "slot": "bench"}}], '
                '"ttl": 300}'
            )
            request = template.format(
                port=self.port, token=self.tokens[c], key=f"{tag}-{c}-{i}", length=len(body),
                body=body,
            )  # fmt: skip
            status = self.conns[c].exchange(request.encode())
            assert status == 201, status

        def health(c: int, i: int) -> None:
            status = self.conns[c].exchange(healthz)
            assert status == 200, status

        before = self._server_cpu()
        result = _run_threads(len(self.conns), per_client, claim if kind == "claim" else health)
        self.cpu[kind].append((self._server_cpu() - before) / (len(self.conns) * per_client))
        return result

    def close(self) -> None:
        for conn in self.conns:
            conn.close()
        self.proc.terminate()
        self.proc.wait(30)


def _spread(xs: list[float], scale: float = 1.0, fmt: str = ".2f") -> str:
    return f"{median(xs) * scale:{fmt}} ({min(xs) * scale:{fmt}}-{max(xs) * scale:{fmt}})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--store", choices=["memory", "sqlite", "postgresql"], default="memory")
    parser.add_argument("--requests", type=int, default=2000, help="requests per side per round")
    parser.add_argument("--clients", type=int, default=8, help="concurrent clients per side")
    parser.add_argument("--rounds", type=int, default=7, help="rounds (sides interleaved)")
    args = parser.parse_args()
    per_client = max(1, args.requests // args.clients)
    with tempfile.TemporaryDirectory() as tmp_name, ExitStack() as stack:
        tmp = Path(tmp_name)
        pg = None
        if args.store == "postgresql":
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

        servers = {p: Server(p, url(p), args.clients, tmp) for p in PARSERS}
        for s in servers.values():
            stack.callback(s.close)
        rates = {(p, k): [] for p in PARSERS for k in ("claim", "healthz")}
        lats: dict[tuple[str, str], list[float]] = {key: [] for key in rates}
        for s in servers.values():  # warm: imports, connections, caches
            s.run("claim", "warm", 20)
            s.run("healthz", "warm", 20)
            s.cpu = {"claim": [], "healthz": []}
        for r in range(args.rounds):
            # Alternate which parser goes first, so neither always runs on a warmer machine.
            order = PARSERS if r % 2 == 0 else PARSERS[::-1]
            for kind in ("claim", "healthz"):
                for p in order:
                    rate, latencies = servers[p].run(kind, f"r{r}", per_client)
                    rates[(p, kind)].append(rate)
                    lats[(p, kind)].extend(latencies)
        cpus = {(p, k): servers[p].cpu[k] for p in PARSERS for k in ("claim", "healthz")}
    total = per_client * args.clients
    print(
        f"store={args.store} clients={args.clients} requests/side/round={total} "
        f"rounds={args.rounds} cpus={os.cpu_count()} load={os.getloadavg()[0]:.1f}"
    )
    print(
        f"{'':20} {'req/s median (range)':>24} {'p50 ms':>7} {'p99 ms':>7} {'server CPU/req':>18}"
    )
    for (p, kind), rs in rates.items():
        print(
            f"{p + ' ' + kind:20} {_spread(rs, fmt='.0f'):>24} {_pct(lats[(p, kind)], 50):7.2f} "
            f"{_pct(lats[(p, kind)], 99):7.2f} {_spread(cpus[(p, kind)], 1e6, '.0f') + ' us':>18}"
        )
    for kind in ("claim", "healthz"):
        ratio = [
            a / b for a, b in zip(rates[("h11", kind)], rates[("httptools", kind)], strict=True)
        ]
        cpu = [a / b for a, b in zip(cpus[("h11", kind)], cpus[("httptools", kind)], strict=True)]
        print(
            f"{kind}: h11 / httptools req/s {_spread(ratio)}, "
            f"server CPU per request {_spread(cpu)}  (median (range) over rounds)"
        )


if __name__ == "__main__":
    main()
