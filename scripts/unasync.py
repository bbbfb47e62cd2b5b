"""Generate the sync face of a pattern from its async face, or check that it is current.

The part of ``src/dibs/aio/lot.py`` between its markers is the one
implementation of :class:`dibs.aio.Lot`'s calls; :class:`dibs.Lot`'s are the
same text without ``async`` and ``await`` (as psycopg generates its sync
classes), written between the markers in ``src/dibs/lot.py`` and formatted
with ruff.

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

# (async source, sync target): the marked part of the source becomes the marked part of the target.
PAIRS = [(ROOT / "src/dibs/aio/lot.py", ROOT / "src/dibs/lot.py")]

SOURCE_BEGIN = "    # --- shared with dibs.Lot: scripts/unasync.py makes it from this part ---\n"
TARGET_BEGIN = (
    "    # --- generated from src/dibs/aio/lot.py by scripts/unasync.py: "
    "edit that file, then run it ---\n"
)
END_SOURCE = "    # --- end of the shared part ---\n"
END_TARGET = "    # --- end of the generated part ---\n"

RULES = [
    (re.compile(r"\basync def "), "def "),
    (re.compile(r"\bawait "), ""),
    (re.compile(r"\basync (with|for) "), r"\1 "),
    (re.compile(r"\bAsyncStore\b"), "Store"),
]


def _between(text: str, begin: str, end: str, path: Path) -> tuple[int, int]:
    start = text.find(begin)
    stop = text.find(end, start)
    if start < 0 or stop < 0:
        sys.exit(f"{path}: the generated part's markers are missing")
    return start + len(begin), stop


def _format(code: str) -> str:
    done = subprocess.run(
        ["ruff", "format", "--stdin-filename", "generated.py", "-"],
        input=code,
        capture_output=True,
        text=True,
        check=True,
        cwd=ROOT,
    )
    return done.stdout


def generated(source: Path, target: Path) -> str:
    """The target's text with its generated part made from the source's shared part."""
    text = source.read_text()
    a, b = _between(text, SOURCE_BEGIN, END_SOURCE, source)
    body = text[a:b]
    for pattern, replacement in RULES:
        body = pattern.sub(replacement, body)
    out = target.read_text()
    c, d = _between(out, TARGET_BEGIN, END_TARGET, target)
    return _format(out[:c] + body + out[d:])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="fail if a generated part is stale")
    args = parser.parse_args(argv)
    stale = []
    for source, target in PAIRS:
        new = generated(source, target)
        if new != target.read_text():
            stale.append(target)
            if not args.check:
                target.write_text(new)
    if args.check and stale:
        print("stale, run scripts/unasync.py:", *map(str, stale), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
