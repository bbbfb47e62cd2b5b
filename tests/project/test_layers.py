"""The package's import graph: no circles, and every import points down the layers.

The layers, top to bottom. A module may import its own layer and any below it,
never one above; the graph counts imports inside functions too, and leaves out
only those under ``if TYPE_CHECKING:`` (one remains: ``Store.lease()`` names
:class:`dibs.lease.Lease` as its return type, and the lease class reaches the
store through ``Store._lease_class``, set by :mod:`dibs.lease`).
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import grimp
import pytest

import dibs

LAYERS: list[set[str]] = [
    {"dibs.cli"},
    {"dibs.service", "dibs.verify", "dibs.demo", "dibs.testing"},
    {"dibs.tasks", "dibs.observe", "dibs.doctor", "dibs._cli_options"},
    {"dibs"},  # the public facade (__init__): re-exports, for the applications above
    {"dibs.aio"},
    {
        "dibs.lease",
        "dibs._lease",
        "dibs._fair",
        "dibs._queue",
        "dibs.waitlist",
        "dibs.idempotency",
        "dibs.lot",
        "dibs.booking",
        "dibs.matching",
        "dibs.singleflight",
        "dibs.ratelimit",
        "dibs.paths",
        "dibs.semaphore",
        "dibs.renewal",
    },
    {"dibs.stores"},
    {"dibs._request", "dibs._model", "dibs._clock"},
    {
        "dibs.limits",
        "dibs.exceptions",
        "dibs._extras",
        "dibs._compiled",
        "dibs._shield",
        "dibs._drive",
        "dibs._bell",
    },
]


@pytest.fixture(scope="module")
def graph() -> grimp.ImportGraph:
    return grimp.build_graph("dibs", exclude_type_checking_imports=True)


def _layer(module: str) -> int:
    name = ".".join(module.split(".")[:2])  # dibs itself, or the dibs.<module> it is part of
    for index, layer in enumerate(LAYERS):
        if name in layer:
            return index
    raise AssertionError(f"{module} is in no layer: add its package to LAYERS")


def test_every_module_has_a_layer(graph: grimp.ImportGraph) -> None:
    for module in graph.modules:
        _layer(module)


def test_no_import_points_up(graph: grimp.ImportGraph) -> None:
    upward = []
    for importer in sorted(graph.modules):
        for imported in sorted(graph.find_modules_directly_imported_by(importer)):
            if _layer(imported) < _layer(importer):
                lines = graph.get_import_details(importer=importer, imported=imported)
                upward.append(f"{importer} -> {imported} (line {lines[0]['line_number']})")
    assert upward == []


def _cycles(graph: grimp.ImportGraph) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def imported(module: str) -> Iterator[str]:
        return iter(sorted(graph.find_modules_directly_imported_by(module)))

    for root in sorted(graph.modules):
        if root in index:
            continue
        work = [(root, imported(root))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append(
                        (child, iter(sorted(graph.find_modules_directly_imported_by(child))))
                    )
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_no_import_circles(graph: grimp.ImportGraph) -> None:
    assert _cycles(graph) == []


def test_the_circle_check_finds_a_planted_circle() -> None:
    planted = grimp.ImportGraph()
    for module in ("a", "a.b", "a.c", "a.d"):
        planted.add_module(module)
    planted.add_import(importer="a.b", imported="a.c")
    planted.add_import(importer="a.c", imported="a.d")
    planted.add_import(importer="a.d", imported="a.b")
    assert _cycles(planted) == [["a.b", "a.c", "a.d"]]


def _source_graph() -> grimp.ImportGraph:
    """The import graph read from the source, where ``from package import module`` runs the
    package's ``__init__`` (its re-exports count), leaving out ``if TYPE_CHECKING:`` blocks."""
    src = Path(dibs.__file__).parent.parent
    modules: dict[str, Path] = {}
    for path in (src / "dibs").rglob("*.py"):
        name = ".".join(path.relative_to(src).with_suffix("").parts).removesuffix(".__init__")
        modules[name] = path
    found = grimp.ImportGraph()
    for name in modules:
        found.add_module(name)
    for name, path in modules.items():
        for node in _runtime_nodes(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                targets = [node.module] if node.module in modules else []
                targets += [f"{node.module}.{a.name}" for a in node.names]
            elif isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            else:
                continue
            for target in targets:
                if target in modules and target != name:
                    found.add_import(importer=name, imported=target)
    return found


def _runtime_nodes(tree: ast.AST) -> Iterator[ast.AST]:
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, ast.If) and ast.unparse(node.test).endswith("TYPE_CHECKING"):
            yield from (n for orelse in node.orelse for n in ast.walk(orelse))
            continue
        yield node
        yield from _runtime_nodes(node)


def test_no_circles_through_package_reexports() -> None:
    assert _cycles(_source_graph()) == []
