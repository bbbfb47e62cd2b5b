"""Generate the sync face of a pattern from its async face, or check that it is current.

In ``src/dibs/aio/lot.py``, ``matching.py`` and ``booking.py`` the part between
``# --- shared with the sync face`` and ``# --- end of the shared part`` is
the one implementation of both faces. The sync module's part between
``# --- generated from`` and ``# --- end of the generated part`` is the same
text without ``async`` and ``await`` (as psycopg generates its sync classes),
formatted with ruff. The names it calls (``_check``, ``_call``...) resolve in
each face's own module.

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

RULES = [
    (re.compile(r"\basync def "), "def "),
    (re.compile(r"\basync (with|for) "), r"\1 "),
    (re.compile(r"@asynccontextmanager\b"), "@contextmanager"),
    (re.compile(r"\bAsyncIterator\b"), "Iterator"),
    (re.compile(r"\bAsyncStore\b"), "Store"),
    # Only a cancelled task needs its clean-up shielded; a sync caller just runs it.
    (re.compile(r"await asyncio\.shield\((.*)\)$", re.MULTILINE), r"\1"),
    (re.compile(r"await asyncio\.sleep\("), "time.sleep("),
    (re.compile(r"\bawait "), ""),
]

MODULES = ["lot", "matching", "booking", "ratelimit"]


def _part(text: str, begin: str, end: str, where: Path) -> tuple[int, int]:
    """Offsets of the lines strictly between the marker lines."""
    start = text.find(begin)
    stop = text.find(end, start)
    if start < 0 or stop < 0:
        sys.exit(f"{where}: the markers {begin!r} ... {end!r} are missing")
    return text.index("\n", start) + 1, text.rindex("\n", 0, stop) + 1


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


def generated(name: str) -> str:
    """``dibs/<name>.py`` with its generated part made from ``dibs/aio/<name>.py``."""
    source, target = SRC / "aio" / f"{name}.py", SRC / f"{name}.py"
    text = source.read_text()
    a, b = _part(text, SHARED, SHARED_END, source)
    body = text[a:b]
    for pattern, replacement in RULES:
        body = pattern.sub(replacement, body)
    out = target.read_text()
    c, d = _part(out, GENERATED, GENERATED_END, target)
    return _format(out[:c] + body + out[d:])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="fail if a generated part is stale")
    args = parser.parse_args(argv)
    stale = []
    for name in MODULES:
        target = SRC / f"{name}.py"
        new = generated(name)
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
