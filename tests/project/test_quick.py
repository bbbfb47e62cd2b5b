"""``pytest -m quick`` selects the day-to-day subset that the README offers."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from layout import ROOT


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


def _quick_modules() -> set[str]:
    """The test modules that opt in with ``QUICK = True`` (read, not imported)."""
    return {
        path.relative_to(ROOT).as_posix()
        for path in (ROOT / "tests").rglob("test_*.py")
        if "\nQUICK = True" in path.read_text(encoding="utf-8")
    }


@pytest.mark.timeout(300)
def test_quick_subset_is_the_opted_in_modules_without_slow_or_server_tests(
    quick: list[str],
) -> None:
    not_slow = _collect("-m", "not slow and not postgresql and not etcd and not processes")
    modules = {t.split("::")[0] for t in quick}
    assert modules == _quick_modules()
    assert set(quick) == {t for t in not_slow if t.split("::")[0] in modules}
    assert len(quick) < len(not_slow) * 0.75  # a subset worth the name


@pytest.mark.timeout(300)
def test_quick_subset_runs_the_contract_on_both_in_process_stores_and_faces(
    quick: list[str],
) -> None:
    contract = [t for t in quick if "/test_contract.py::" in t]
    for kind in ("memory", "sqlite", "aio-memory", "aio-sqlite"):
        assert any(f"[{kind}" in t for t in contract), kind
    # No server: nothing to start, nothing to install from apt.
    params = [set(t.partition("[")[2].rstrip("]").split("-")) for t in quick]
    assert not any(p & {"postgresql", "etcd"} for p in params)
    assert not any("processes" in t for t in quick)  # process races are slow-marked


@pytest.mark.timeout(300)
def test_backend_markers_follow_the_store_parametrization() -> None:
    etcd = _collect("-m", "etcd", "tests/stores/test_contract.py")
    no_etcd = _collect("-m", "not etcd", "tests/stores/test_contract.py")
    assert etcd and all("etcd" in t for t in etcd)
    assert no_etcd and not any("etcd" in t for t in no_etcd)
    for kind in ("memory", "sqlite", "postgresql"):
        chosen = _collect("-m", kind, "tests/stores/test_contract.py")
        assert chosen and all(f"{kind}]" in t or f"{kind}-" in t for t in chosen), kind


def test_readme_offers_the_quick_subset_next_to_the_full_suite() -> None:
    readme = (ROOT / "README.md").read_text()
    assert "scripts/test" in readme and "pytest -m quick" in readme


def _stated(pattern: str) -> int:
    """A count the README states (``about 4,300 tests``), as a number."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    found = re.search(pattern, readme)
    assert found, f"README.md no longer says {pattern!r}: state the figure, this test checks it"
    return int(found.group(1).replace(",", ""))


def _near(stated: int, actual: int) -> bool:
    """A rounded figure is true while the real one stays within 5 % of it."""
    return abs(actual - stated) <= 0.05 * stated


@pytest.mark.timeout(300)
def test_readme_states_the_true_size_of_the_suite_and_of_quick(quick: list[str]) -> None:
    everything = _collect()
    suite = _stated(r"about ([\d,]+) tests, the PostgreSQL")
    assert _near(suite, len(everything)), (
        f"README says {suite:,}, the suite has {len(everything):,}"
    )
    subset = _stated(r"in-process tasks \(about ([\d,]+) tests\)")
    assert _near(subset, len(quick)), (
        f"README says {subset:,} quick tests, there are {len(quick):,}"
    )
