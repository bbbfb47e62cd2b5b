"""``dibs.compiled`` and ``dibs doctor``'s core line: which build of the claim path runs.

The compiled build itself (``DIBS_COMPILE=1``, docs/design.md "Compiled core")
is tested by scripts/test-compiled, which runs the memory store's suites on it.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import sys
from types import SimpleNamespace

import pytest

import dibs
from dibs import _compiled
from dibs.doctor import examine, render_text

QUICK = True  # in `pytest -m quick` (conftest.is_quick: not slow, no server)


def test_compiled_says_whether_any_compilable_module_loaded_from_an_extension() -> None:
    assert isinstance(dibs.compiled, bool)
    assert dibs.compiled == bool(_compiled.compiled_modules())
    module = sys.modules["dibs.stores.memory"]
    is_extension = module.__file__ is not None and module.__file__.endswith(
        tuple(importlib.machinery.EXTENSION_SUFFIXES)
    )
    assert dibs.compiled == is_extension


def test_an_extension_origin_counts_as_compiled_and_a_source_one_does_not(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    suffix = importlib.machinery.EXTENSION_SUFFIXES[0]
    origins = {"dibs.stores.memory": f"/x/dibs/stores/memory{suffix}"}
    monkeypatch.setattr(
        _compiled, "find_spec", lambda name: SimpleNamespace(origin=origins.get(name))
    )
    assert _compiled.compiled_modules() == ("dibs.stores.memory",)
    assert _compiled.describe() == "compiled (mypyc): dibs.stores.memory"
    origins["dibs.stores.memory"] = "/x/dibs/stores/memory.py"
    assert _compiled.compiled_modules() == ()
    assert _compiled.describe() == "pure Python"


def test_every_compilable_module_exists() -> None:
    for name in _compiled.COMPILABLE:
        assert importlib.util.find_spec(name) is not None, name


def test_doctor_prints_the_core() -> None:
    report = examine("memory://")
    assert report.core == _compiled.describe()
    assert f"  core: {report.core}" in render_text(report).splitlines()
    assert report.to_dict()["core"] == report.core
