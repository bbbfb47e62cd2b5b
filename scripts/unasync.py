"""Generate the sync face of a part from its async face, or check that it is current.

A part between ``# --- shared with the sync face`` and ``# --- end of the
shared part`` is the one implementation of both faces. The matching part
between ``# --- generated from`` and ``# --- end of the generated part`` (the
first generated part from the first shared part, and so on) is the same text
without ``async`` and ``await`` (as psycopg generates its sync classes),
with the async names in ``NAMES`` replaced by their sync ones, formatted with
ruff. The names it calls (``_check``, ``_call``...) resolve in each face's own
module or class.

The patterns keep their async face in ``src/dibs/aio/`` and the generated one
in ``src/dibs/``; ``observe.py`` and ``lease.py`` hold both faces in one module,
the shared part in the async class and the generated part in the sync one.

    python scripts/unasync.py           # regenerate
    python scripts/unasync.py --check   # exit 1 if a generated part is stale
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SRC = ROOT / "src" / "dibs"

SHARED = "# --- shared with the sync face:"
SHARED_END = "# --- end of the shared part ---"
GENERATED = "# --- generated from"
GENERATED_END = "# --- end of the generated part ---"

# Async name -> sync name, where the two faces differ by more than async and await.
NAMES = {
    "dibs.aio.AsyncStore": "dibs.Store",
    "AsyncStore": "Store",
    "AsyncIterator": "Iterator",
    "traced_async": "traced",
    "_abandon_async": "_abandon",
    "_call_async": "_call",
    "_AsyncWatch": "_Watch",
    "AsyncChangeFeed": "ChangeFeed",
    "adrive": "drive",
    "alisten": "listen",
    "_asend_request": "_send_request",
}

RULES = [
    *((re.compile(rf"(?<![\w.]){re.escape(a)}\b"), s) for a, s in NAMES.items()),
    (re.compile(r"\basync def "), "def "),
    (re.compile(r"\basync (with|for) "), r"\1 "),
    (re.compile(r"@asynccontextmanager\b"), "@contextmanager"),
    (re.compile(r"\bAwaitable\[(\w+)\]"), r"\1"),
    # Only a cancelled task needs its clean-up shielded; a sync caller just runs it.
    (re.compile(r"await asyncio\.shield\((.*)\)$", re.MULTILINE), r"\1"),
    (re.compile(r"await asyncio\.sleep\("), "time.sleep("),
    (re.compile(r"\bawait "), ""),
]

# (async source, sync target) under src/dibs/; a module may be both.
FILES = [
    ("aio/lot.py", "lot.py"),
    ("aio/matching.py", "matching.py"),
    ("aio/booking.py", "booking.py"),
    ("aio/ratelimit.py", "ratelimit.py"),
    ("aio/waitlist.py", "waitlist.py"),
    ("aio/renewal.py", "renewal.py"),
    ("observe.py", "observe.py"),
    ("lease.py", "lease.py"),
    ("stores/etcd/_wire.py", "stores/etcd/_wire.py"),
]


def _parts(text: str, begin: str, end: str, where: Path) -> list[tuple[int, int]]:
    """Offsets of the lines strictly between each pair of marker lines, in order."""
    found = []
    start = text.find(begin)
    while start >= 0:
        stop = text.find(end, start)
        if stop < 0:
            sys.exit(f"{where}: {begin!r} at offset {start} has no {end!r}")
        found.append((text.index("\n", start) + 1, text.rindex("\n", 0, stop) + 1))
        start = text.find(begin, stop)
    if not found:
        sys.exit(f"{where}: the markers {begin!r} ... {end!r} are missing")
    return found


def _format(code: str) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "ruff", "format", "--stdin-filename", "generated.py", "-"],
        input=code,
        capture_output=True,
        text=True,
        check=True,
        cwd=ROOT,
    )
    return done.stdout


def generated(source: Path, target: Path) -> str:
    """``target``'s text with its generated parts made from ``source``'s shared parts."""
    text = source.read_text()
    bodies = []
    for a, b in _parts(text, SHARED, SHARED_END, source):
        body = text[a:b]
        for pattern, replacement in RULES:
            body = pattern.sub(replacement, body)
        bodies.append(body)
    out = target.read_text()
    places = _parts(out, GENERATED, GENERATED_END, target)
    if len(places) != len(bodies):
        sys.exit(f"{target}: {len(places)} generated parts for {len(bodies)} shared ones")
    for (c, d), body in reversed(list(zip(places, bodies, strict=True))):
        out = out[:c] + body + out[d:]
    return _format(out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="fail if a generated part is stale")
    args = parser.parse_args(argv)
    stale = []
    for source, name in FILES:
        target = SRC / name
        new = generated(SRC / source, target)
        if new != target.read_text():
            stale.append(str(target))
            if not args.check:
                target.write_text(new)
    if args.check and stale:
        print("stale, run scripts/unasync.py:", *stale, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
