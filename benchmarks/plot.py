"""Plot benchmark JSON as PNGs: throughput and p99 latency against clients.

Every benchmark that takes ``--json FILE`` writes one JSON object of this shape
(extra keys are allowed and ignored here)::

    {
      "benchmark": "memory:// vs seatlock",        # the title of the plots
      "series": [
        {
          "name": "dibs memory:// - racing",       # one line per name
          "clients": 8,                            # threads, processes or connections
          "throughput": 312000.0,                  # operations per second (say which in name)
          "p99_ms": 0.004                          # 99th percentile latency, milliseconds
        }
      ]
    }

Points with the same ``name`` make one line, ordered by ``clients``; a name with
one point is drawn as a marker. Names of the form ``"<contender> - <workload>"``
share a colour per workload; names starting with ``dibs`` are drawn solid, the
others (peers, baselines) dashed. ``p99_ms`` may be null when a benchmark does not
measure latency; that point is left out of the latency plot.

    python benchmarks/plot.py out.json [more.json ...] [--out docs/img] [--prefix NAME]

writes ``<prefix>-throughput.png`` and ``<prefix>-p99.png`` (prefix: from the
first file's name unless given). Needs matplotlib (the ``bench`` extra).
"""

from __future__ import annotations

import argparse
import json
import re
from collections import defaultdict
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # files only, no display
import matplotlib.pyplot as plt


def load(paths: list[Path]) -> tuple[str, dict[str, list[dict[str, Any]]]]:
    """The title and the points of each series, from one or more JSON files."""
    titles: list[str] = []
    lines: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for path in paths:
        doc = json.loads(path.read_text())
        if not isinstance(doc, dict) or not isinstance(doc.get("series"), list):
            raise SystemExit(f"{path}: not a benchmark JSON (no 'series' list)")
        titles.append(str(doc.get("benchmark", path.stem)))
        for point in doc["series"]:
            missing = {"name", "clients", "throughput"} - point.keys()
            if missing:
                raise SystemExit(f"{path}: a series point lacks {sorted(missing)}: {point}")
            lines[str(point["name"])].append(point)
    for points in lines.values():
        points.sort(key=lambda p: p["clients"])
    return " + ".join(dict.fromkeys(titles)), lines


def plot(
    title: str, lines: dict[str, list[dict[str, Any]]], key: str, ylabel: str, out: Path
) -> None:
    """One PNG: ``key`` of every series against clients."""
    fig, ax = plt.subplots(figsize=(8, 4.8), dpi=110)
    # One colour per workload (the part of a name after " - "), so that dibs and
    # its baseline on one workload match: dibs solid, the baseline dashed.
    workloads = list(dict.fromkeys(name.rpartition(" - ")[2] for name in lines))
    palette = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    drawn = 0
    for name, points in lines.items():
        xs = [p["clients"] for p in points if p.get(key) is not None]
        ys = [p[key] for p in points if p.get(key) is not None]
        if not xs:
            continue
        color = palette[workloads.index(name.rpartition(" - ")[2]) % len(palette)]
        dashed = not name.lower().startswith("dibs")  # peers and baselines dashed
        ax.plot(
            xs, ys, marker="o" if not dashed else "s", color=color,
            linestyle="--" if dashed else "-", label=name,
        )  # fmt: skip
        drawn += 1
    clients = sorted({p["clients"] for points in lines.values() for p in points})
    ax.set_xscale("log", base=2)
    ax.set_xticks(clients, [str(c) for c in clients])
    ax.set_yscale("log")
    ax.set_xlabel("clients (threads / processes)")
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(True, which="both", alpha=0.3)
    if drawn:
        ax.legend(fontsize=7, loc="best")
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out)
    plt.close(fig)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("files", type=Path, nargs="+", help="benchmark JSON files")
    parser.add_argument("--out", type=Path, default=Path("docs/img"), help="output directory")
    parser.add_argument("--prefix", help="file name prefix (default: the first file's stem)")
    args = parser.parse_args(argv)
    title, lines = load(args.files)
    prefix = args.prefix or re.sub(r"[^a-z0-9]+", "-", args.files[0].stem.lower()).strip("-")
    throughput = args.out / f"{prefix}-throughput.png"
    p99 = args.out / f"{prefix}-p99.png"
    plot(title, lines, "throughput", "throughput (operations/s, log)", throughput)
    plot(title, lines, "p99_ms", "p99 latency (ms, log)", p99)
    print(f"wrote {throughput} and {p99}")


if __name__ == "__main__":
    main()
