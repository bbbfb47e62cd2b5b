"""The claim body's parse on the schema objects against the hand-written parsers, interleaved.

Loads ``src/dibs/service/_wire.py`` of a git revision (``--old-ref``, default
``main``: the parsers before the schema objects) beside this tree's, and times
what ``POST /v1/claims`` runs on a decoded body: the old handler's unknown-field
check, ``parse_targets`` and ``parse_ttl``, against ``claim_request(100).parse``.
Each round times every body both ways, in alternating order; prints per body
the best time per parse of each side and the ratio new / old per round
(median and range). CPU only, no I/O: the ratio is what parsing costs more or
less per claim.

    python benchmarks/bench_service_schema.py [--old-ref main] [--rounds 15] [--number 20000]
"""

from __future__ import annotations

import argparse
import functools
import importlib.util
import json
import subprocess
import sys
import tempfile
import timeit
from pathlib import Path
from statistics import median
from typing import Any

from dibs.exceptions import InvalidInput
from dibs.service._wire import claim_request

ROOT = Path(__file__).resolve().parent.parent

BODIES: dict[str, dict[str, Any]] = {
    "1 unit + ttl (the bench claim)": {
        "targets": [{"resource": "seat-r1-3-17", "slot": "bench"}],
        "ttl": 300,
    },
    "10 units": {"targets": [{"resource": f"seat-{i}", "slot": "show-42"} for i in range(10)]},
    "2 spans (numbers, times)": {
        "targets": [
            {"resource": "room-7", "start": 100, "end": 250.5},
            {"resource": "room-8", "start": "2026-12-03T14:00:00Z", "end": "2026-12-04T10:00:00Z"},
        ],
        "ttl": 60,
    },
}


def _old_wire(ref: str, tmp: Path) -> Any:
    source = subprocess.run(
        ["git", "-C", str(ROOT), "show", f"{ref}:src/dibs/service/_wire.py"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    path = tmp / "old_wire.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location("old_wire", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["old_wire"] = module
    spec.loader.exec_module(module)
    return module


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--old-ref", default="main")
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--number", type=int, default=20000, help="parses per timing")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        old = _old_wire(args.old_ref, Path(tmp))

    def old_parse(body: dict[str, Any]) -> Any:
        unknown = sorted(set(body) - {"targets", "ttl"})
        if unknown:
            raise InvalidInput(
                f"unknown field {json.dumps(unknown[0])}", field=unknown[0], value=None
            )
        return old.parse_targets(body, 100), old.parse_ttl(body, required=False)

    schema = claim_request(100)

    def new_parse(body: dict[str, Any]) -> Any:
        parsed = schema.parse(body)
        return parsed["targets"], parsed["ttl"]

    sides = {"old": old_parse, "new": new_parse}
    best: dict[tuple[str, str], float] = {}
    ratios: dict[str, list[float]] = {name: [] for name in BODIES}
    for r in range(args.rounds):
        for name, body in BODIES.items():
            assert old_parse(body) == new_parse(body)
            order = ("old", "new") if r % 2 == 0 else ("new", "old")
            took = {}
            for side in order:
                call = functools.partial(sides[side], body)
                took[side] = timeit.timeit(call, number=args.number) / args.number
                key = (name, side)
                best[key] = min(best.get(key, took[side]), took[side])
            ratios[name].append(took["new"] / took["old"])
    print(f"old={args.old_ref} rounds={args.rounds} parses/timing={args.number}")
    print(f"{'body':34} {'old us':>8} {'new us':>8}   new/old per round: median (range)")
    for name in BODIES:
        rs = ratios[name]
        print(
            f"{name:34} {best[(name, 'old')] * 1e6:8.2f} {best[(name, 'new')] * 1e6:8.2f}   "
            f"{median(rs):.2f} ({min(rs):.2f}-{max(rs):.2f})"
        )


if __name__ == "__main__":
    main()
