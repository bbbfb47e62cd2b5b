"""Which of dibs's modules this process runs compiled (mypyc), and which as Python.

A build with ``DIBS_COMPILE=1`` (setup.py) compiles the modules named in
:data:`COMPILABLE` with mypyc; every other build, and every platform without
a compiled wheel, runs them as the Python they are compiled from, which passes
the same suites (docs/design.md, "Compiled core"). This module imports
nothing from dibs: it asks the import system where each module came from.
"""

from __future__ import annotations

from importlib.machinery import EXTENSION_SUFFIXES
from importlib.util import find_spec

__all__ = ["COMPILABLE", "compiled_modules", "describe"]

COMPILABLE: tuple[str, ...] = ("dibs.stores.memory",)
"""The modules a compiled build compiles; setup.py reads this tuple."""


def compiled_modules() -> tuple[str, ...]:
    """The modules of :data:`COMPILABLE` that load from a compiled extension here."""
    found = []
    for name in COMPILABLE:
        spec = find_spec(name)
        origin = spec.origin if spec is not None else None
        if origin is not None and origin.endswith(tuple(EXTENSION_SUFFIXES)):
            found.append(name)
    return tuple(found)


def describe() -> str:
    """One line for ``dibs doctor``: which modules run compiled, or "pure Python"."""
    names = compiled_modules()
    return f"compiled (mypyc): {', '.join(names)}" if names else "pure Python"
