"""The service's own CPU per claim: ``POST /v1/claims`` into the ASGI app, no server, interleaved.

``dibs serve``'s CPU per claim (``bench_service.py``) includes uvicorn, h11
and the event loop, and on a loaded machine swings by ±10 % between runs. This
calls the app built by :func:`dibs.service.create_app` (memory://, an API key,
an Idempotency-Key per request, the benchmark's own request bytes) straight
from one event loop, so what it times is the service's part alone: the
middleware, routing, the handler and its JSON and claim ID, the store call.

Each side runs in a subprocess of its own (``--old-ref REV`` runs the service
code of that git revision, unpacked from ``git archive``), alternating round
by round; each round is ``--claims`` claims after a warm-up, timed with
``time.process_time``. Prints per side the median and range of CPU µs per
claim, and new ÷ old per round.

    python benchmarks/bench_service_app.py --old-ref main --claims 4000 --rounds 9
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from statistics import median

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_service import ROOT, _old_source

CHILD = r"""
import asyncio, json, sys, time
import dibs
from dibs.service import KeyRing, ServiceConfig, create_app

claims, warm = int(sys.argv[1]), int(sys.argv[2])
keys = KeyRing(None)
token = keys.create("h0")[0].encode()
config = ServiceConfig(store_url="memory://", keys_file=None, id_secret=b"s" * 32, rate=1e9,
                       burst=1_000_000_000)
store = dibs.open("memory://")
app = create_app(config, store=store, keys=keys)


async def one(i):
    target = {"resource": f"seat-{i}", "slot": "bench"}
    body = json.dumps({"targets": [target], "ttl": 300}).encode()
    scope = {
        "type": "http", "asgi": {"version": "3.0", "spec_version": "2.3"}, "http_version": "1.1",
        "server": ("127.0.0.1", 8000), "client": ("127.0.0.1", 50000), "scheme": "http",
        "method": "POST", "root_path": "", "path": "/v1/claims", "raw_path": b"/v1/claims",
        "query_string": b"", "state": {},
        "headers": [
            (b"host", b"127.0.0.1:8000"), (b"authorization", b"Bearer " + token),
            (b"content-type", b"application/json"), (b"idempotency-key", b'"k-%d"' % i),
            (b"content-length", str(len(body)).encode()),
        ],
    }
    sent = []

    async def receive():
        return {"type": "http.request", "body": body, "more_body": False}

    async def send(message):
        sent.append(message)

    await app(scope, receive, send)
    assert sent[0]["status"] == 201, sent


async def main():
    await app.state.service.api.load_ids()
    for i in range(warm):
        await one(-1 - i)
    started = time.process_time()
    for i in range(claims):
        await one(i)
    print(json.dumps((time.process_time() - started) / claims))


asyncio.run(main())
"""


def _round(src: Path, claims: int) -> float:
    env = dict(os.environ, PYTHONPATH=str(src))
    out = subprocess.run(
        [sys.executable, "-c", CHILD, str(claims), "500"],
        env=env,
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    return float(json.loads(out))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--old-ref", default="main", help="the git revision to compare with")
    parser.add_argument("--claims", type=int, default=4000)
    parser.add_argument("--rounds", type=int, default=9)
    args = parser.parse_args()
    new_src = ROOT / "src"
    with tempfile.TemporaryDirectory() as tmp:
        old_src = _old_source(args.old_ref, Path(tmp))
        new: list[float] = []
        old: list[float] = []
        for r in range(args.rounds):
            # Alternate which side goes first, so a drift in the machine's load is shared.
            order = [(new, new_src), (old, old_src)]
            for side, src in order if r % 2 == 0 else order[::-1]:
                side.append(_round(src, args.claims) * 1e6)
    print(f"claims per round {args.claims}, rounds {args.rounds}, old = {args.old_ref}")
    for name, side in (("new", new), ("old", old)):
        print(f"{name}: {median(side):6.1f} us per claim (range {min(side):.1f}-{max(side):.1f})")
    ratios = sorted(n / o for n, o in zip(new, old, strict=True))
    low, high = ratios[0], ratios[-1]
    print(f"new / old per round: median {median(ratios):.3f} (range {low:.3f}-{high:.3f})")


if __name__ == "__main__":
    main()
