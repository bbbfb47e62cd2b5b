"""scripts/unasync.py checks every generated part in src/dibs, and only the real ones."""

from __future__ import annotations

import importlib.util
from types import ModuleType

from layout import ROOT


def _unasync() -> ModuleType:
    spec = importlib.util.spec_from_file_location("unasync", ROOT / "scripts" / "unasync.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_module_with_a_generated_part_is_one_the_script_checks() -> None:
    unasync = _unasync()
    src = ROOT / "src" / "dibs"
    marked = {
        path.relative_to(src).as_posix()
        for path in src.rglob("*.py")
        if unasync.GENERATED in path.read_text()
    }
    assert marked == {target for _, target in unasync.FILES}
    for source, _ in unasync.FILES:
        assert unasync.SHARED in (src / source).read_text(), source


def test_the_faces_that_hold_both_in_one_module_are_generated_and_current() -> None:
    unasync = _unasync()
    src = ROOT / "src" / "dibs"
    for name in ("observe.py", "lease.py", "stores/etcd/_wire.py"):
        assert (name, name) in unasync.FILES
        assert unasync.generated(src / name, src / name) == (src / name).read_text(), name
