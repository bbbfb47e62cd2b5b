"""Opening a version-1 SQLite file: the upgrade's time per 10k claims, by file size.

A linear upgrade costs the same per claim at every size, so the column
"per 10k" stays flat (ratio ≈ 1 against the smallest file); a step that
scans a table once per claim makes it grow with the size. Each round opens a
fresh copy of every size once, sizes interleaved; the table gives the median
and the range over the rounds:

    python benchmarks/bench_upgrade.py [--sizes 10000,50000,100000,200000] [--repeat 5]
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from pathlib import Path
from statistics import median

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "support"))

from dibs.stores.sqlite import SQLiteStore
from sqlite_v1 import build_v1


def _open_seconds(template: Path, work: Path) -> float:
    """Seconds to open (and so upgrade) a fresh copy of ``template``."""
    for old in work.parent.glob(work.name + "*"):
        old.unlink()
    shutil.copyfile(template, work)
    began = time.perf_counter()
    SQLiteStore(work).close()
    return time.perf_counter() - began


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="10000,25000,50000,100000,200000")
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    with tempfile.TemporaryDirectory() as tmp:
        templates = {}
        for n in sizes:
            templates[n] = Path(tmp, f"v1-{n}.db")
            build_v1(templates[n], n)
            conn_files = list(Path(tmp).glob(f"v1-{n}.db-*"))
            assert not conn_files, conn_files  # closed cleanly: the file alone is the database
        per_10k: dict[int, list[float]] = {n: [] for n in sizes}
        for _ in range(args.repeat):
            for n in sizes:  # interleaved: a slow moment of the machine hits every size
                per_10k[n].append(_open_seconds(templates[n], Path(tmp, "work.db")) * 1e4 / n)
    base = median(per_10k[sizes[0]])
    print(f"{'claims':>8}  {'per 10k (median)':>16}  {'range':>17}  {'ratio':>5}")
    for n in sizes:
        runs = per_10k[n]
        print(
            f"{n:>8}  {median(runs) * 1e3:>13.1f} ms  "
            f"{min(runs) * 1e3:>7.1f}-{max(runs) * 1e3:<7.1f}ms  {median(runs) / base:>5.2f}"
        )


if __name__ == "__main__":
    main()
