"""The compiled build: with ``DIBS_COMPILE=1``, mypyc compiles dibs's claim path.

Everything else about the package lives in pyproject.toml; this file exists
only because setuptools takes extension modules from ``setup()``. Without
``DIBS_COMPILE=1`` it adds nothing and the build is pure Python. With it, the
modules named in ``dibs._compiled.COMPILABLE`` are compiled by mypyc (which
ships with mypy); their ``.py`` sources stay in the package beside the
extensions, and ``dibs.compiled`` tells which one a process loaded
(docs/design.md, "Compiled core").

    DIBS_COMPILE=1 python -m pip wheel --no-deps -w dist .
"""

from __future__ import annotations

import os
import runpy
import sys
from typing import Any

from setuptools import setup

# The build's only extra requirement: an isolated build (pip, build) installs
# it through setup_requires before compiling.
MYPY = "mypy>=1.11"


def _extensions() -> tuple[list[Any], list[str]]:
    if os.environ.get("DIBS_COMPILE", "") != "1":
        return [], []
    try:
        from mypyc.build import mypycify  # noqa: PLC0415 (only for the compiled build)
    except ImportError:
        if "egg_info" in sys.argv:  # an isolated build asking what to install: mypy
            return [], [MYPY]
        raise SystemExit(f"DIBS_COMPILE=1 needs mypyc: pip install '{MYPY}'") from None
    modules = runpy.run_path("src/dibs/_compiled.py")["COMPILABLE"]
    paths = ["src/" + name.replace(".", "/") + ".py" for name in modules]
    return mypycify(paths, opt_level="3", debug_level="0"), [MYPY]


ext_modules, setup_requires = _extensions()
setup(ext_modules=ext_modules, setup_requires=setup_requires)
