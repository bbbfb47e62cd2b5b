"""Print dibs's import graph by layer: modules, imports, circles and upward arrows.

    python scripts/layers.py

The layers and the checks are tests/project/test_layers.py's own (the test fails on
any circle or upward import); this prints what it sees, package by package.
"""

from __future__ import annotations

import sys
from pathlib import Path

import grimp

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "project"))
from test_layers import LAYERS, _cycles, _layer


def main() -> None:
    graph = grimp.build_graph("dibs", exclude_type_checking_imports=True)
    edges = [(a, b) for a in graph.modules for b in graph.find_modules_directly_imported_by(a)]
    upward = [(a, b) for a, b in edges if _layer(b) < _layer(a)]
    print(
        f"modules {len(graph.modules)}, imports {len(edges)}, "
        f"circles {len(_cycles(graph))}, upward {len(upward)}"
    )

    def package(module: str) -> str:
        return ".".join(module.split(".")[:2])

    arrows = {(package(a), package(b)) for a, b in edges if package(a) != package(b)}
    for index, layer in enumerate(LAYERS):
        below = sorted({b for a, b in arrows if a in layer})
        print(f"{index} {' '.join(sorted(layer))}\n    -> {' '.join(below)}")


if __name__ == "__main__":
    main()
