"""``pytest -m quick`` selects the day-to-day subset that the README offers."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import QUICK_MODULES

ROOT = Path(__file__).resolve().parent.parent


def _collect(*args: str) -> list[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", *args],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=240, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    return [line for line in done.stdout.splitlines() if "::" in line]


@pytest.fixture(scope="module")
def quick() -> list[str]:
    return _collect("-m", "quick")


@pytest.mark.timeout(300)
def test_quick_subset_is_the_named_modules_without_the_slow_tests(quick: list[str]) -> None:
    not_slow = _collect("-m", "not slow")
    modules = {t.split("::")[0].removeprefix("tests/") for t in quick}
    assert modules == QUICK_MODULES
    assert set(quick) == {t for t in not_slow if t.split("::")[0].removeprefix("tests/") in modules}
    assert len(quick) < len(not_slow) * 0.75  # a subset worth the name


@pytest.mark.timeout(300)
def test_quick_subset_runs_the_contract_on_every_store(quick: list[str]) -> None:
    contract = [t for t in quick if t.startswith("tests/test_contract.py::")]
    for kind in ("memory", "sqlite", "postgresql"):
        assert any(f"[{kind}" in t for t in contract), kind
    assert not any("processes" in t for t in quick)  # process races are slow-marked


def test_readme_offers_the_quick_subset_next_to_the_full_suite() -> None:
    readme = (ROOT / "README.md").read_text()
    assert "scripts/test" in readme and "pytest -m quick" in readme
