"""``python -m dibs.service serve|keys ...``: the same as ``dibs serve`` and ``dibs keys``."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence

from dibs.exceptions import DibsError
from dibs.service._cli import add_commands


def main(argv: Sequence[str] | None = None) -> int:
    """Parse ``argv`` and run the chosen command; return its exit code."""
    parser = argparse.ArgumentParser(prog="python -m dibs.service")
    add_commands(parser.add_subparsers(title="commands", metavar="COMMAND"))
    args = parser.parse_args(argv)
    run: Callable[[argparse.Namespace], int] | None = getattr(args, "run", None)
    if run is None:
        parser.print_help(sys.stderr)
        return 2
    try:
        return run(args)
    except DibsError as exc:
        print(f"dibs: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
