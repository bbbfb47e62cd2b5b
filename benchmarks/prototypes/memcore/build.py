"""Build ``_memcore`` in place with gcc (no setuptools, no third-party dependencies).

    python benchmarks/prototypes/memcore/build.py [--no-lock] [--public-only] [--out DIR]

Prints the path of the built module. ``--no-lock`` builds with ``-DMEMCORE_NO_LOCK``
(the GIL alone, to measure what the Core's own lock costs; not safe, see the C file).
``--public-only`` builds with ``-DMEMCORE_PUBLIC_ONLY``: snapshots filled through
``PyDict_SetItem`` instead of CPython 3.11's internal dict layout.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import sysconfig
from pathlib import Path

HERE = Path(__file__).resolve().parent


def build(
    out: Path = HERE, *, no_lock: bool = False, public_only: bool = False, name: str = "_memcore"
) -> Path:
    """Compile _memcore.c into ``out`` and return the module's path."""
    suffix = sysconfig.get_config_var("EXT_SUFFIX")
    target = out / f"{name}{suffix}"
    cmd = [
        "gcc", "-shared", "-fPIC", "-O2", "-g", "-Wall", "-Wno-unused-result",
        f"-I{sysconfig.get_paths()['include']}",
        str(HERE / "_memcore.c"), "-o", str(target),
    ]  # fmt: skip
    if no_lock:
        cmd.insert(1, "-DMEMCORE_NO_LOCK")
    if public_only:
        cmd.insert(1, "-DMEMCORE_PUBLIC_ONLY")
    subprocess.run(cmd, check=True)
    return target


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--no-lock", action="store_true", help="build with -DMEMCORE_NO_LOCK")
    parser.add_argument("--public-only", action="store_true", help="no internal headers")
    parser.add_argument("--out", type=Path, default=HERE, help="where to put the module")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    print(build(args.out, no_lock=args.no_lock, public_only=args.public_only))
    sys.stdout.flush()


if __name__ == "__main__":
    main()
