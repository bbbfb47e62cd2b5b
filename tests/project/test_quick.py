"""``pytest -m quick`` selects the day-to-day subset that the README offers."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from layout import ROOT

# Loaded into the one collection (``-m quick``) the tests below read: writes every test's ID
# with the names of its markers (conftest's included), the names `pytest -m` matches an
# expression against, and a mark on the tests that `-m quick` kept. It wraps the selection:
# it sees every test before `-m` deselects, and the survivors after.
MARKS_PLUGIN = """\
import os

import pytest


@pytest.hookimpl(wrapper=True)
def pytest_collection_modifyitems(session, config, items):
    every = list(items)
    result = yield
    kept = set(map(id, items))
    with open(os.environ["COLLECTED_MARKS"], "w", encoding="utf-8") as out:
        for item in every:
            names = sorted({mark.name for mark in item.iter_markers()})
            out.write(item.nodeid + "\\t" + ("+" if id(item) in kept else "-") + "\\t")
            out.write(" ".join(names) + "\\n")
    return result
"""


def _collect(*args: str, env: dict[str, str] | None = None) -> list[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), **(env or {})}
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", *args],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=240, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    return [line for line in done.stdout.splitlines() if "::" in line]


@pytest.fixture(scope="module")
def collection(
    tmp_path_factory: pytest.TempPathFactory,
) -> tuple[list[str], dict[str, frozenset[str]]]:
    """One collection of the whole suite with ``-m quick``: the tests it selected, and every
    test with its markers. The selections by marker below are read from it instead of
    collecting the suite again for each (a collection imports every test module, about a
    minute on a loaded machine)."""
    here = tmp_path_factory.mktemp("marks")
    (here / "collected_marks.py").write_text(MARKS_PLUGIN)
    out = here / "marks.tsv"
    pythonpath = os.pathsep.join([str(here), str(ROOT / "src")])
    ids = _collect(
        "-m", "quick", "-p", "collected_marks",
        env={"PYTHONPATH": pythonpath, "COLLECTED_MARKS": str(out)},
    )  # fmt: skip
    rows = [line.split("\t") for line in out.read_text(encoding="utf-8").splitlines()]
    marks = {nodeid: frozenset(names.split()) for nodeid, _, names in rows}
    kept = [nodeid for nodeid, sign, _ in rows if sign == "+"]
    assert kept == ids  # the plug-in saw what pytest selected
    return ids, marks


@pytest.fixture(scope="module")
def quick(collection: tuple[list[str], dict[str, frozenset[str]]]) -> list[str]:
    """What ``pytest -m quick`` runs."""
    return collection[0]


@pytest.fixture(scope="module")
def everything(
    collection: tuple[list[str], dict[str, frozenset[str]]],
) -> dict[str, frozenset[str]]:
    """Every test of the suite with its markers."""
    return collection[1]


def _quick_modules() -> set[str]:
    """The test modules that opt in with ``QUICK = True`` (read, not imported)."""
    return {
        path.relative_to(ROOT).as_posix()
        for path in (ROOT / "tests").rglob("test_*.py")
        if "\nQUICK = True" in path.read_text(encoding="utf-8")
    }


@pytest.mark.timeout(300)
def test_quick_subset_is_the_opted_in_modules_without_slow_or_server_tests(
    quick: list[str], everything: dict[str, frozenset[str]]
) -> None:
    # The markers read from the collection are those `-m` selects by: `-m quick` agrees.
    assert {t for t, marks in everything.items() if "quick" in marks} == set(quick)
    # -m "not slow and not postgresql and not etcd and not processes"
    not_slow = [
        t for t, m in everything.items() if not m & {"slow", "postgresql", "etcd", "processes"}
    ]
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
def test_backend_markers_follow_the_store_parametrization(
    everything: dict[str, frozenset[str]],
) -> None:
    contract = {
        t: m for t, m in everything.items() if t.startswith("tests/stores/test_contract.py::")
    }
    etcd = [t for t, m in contract.items() if "etcd" in m]  # -m etcd
    no_etcd = [t for t, m in contract.items() if "etcd" not in m]  # -m "not etcd"
    assert etcd and all("etcd" in t for t in etcd)
    assert no_etcd and not any("etcd" in t for t in no_etcd)
    for kind in ("memory", "sqlite", "postgresql"):
        chosen = [t for t, m in contract.items() if kind in m]  # -m {kind}
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
def test_readme_states_the_true_size_of_the_suite_and_of_quick(
    quick: list[str], everything: dict[str, frozenset[str]]
) -> None:
    suite = _stated(r"about ([\d,]+) tests, the PostgreSQL")
    assert _near(suite, len(everything)), (
        f"README says {suite:,}, the suite has {len(everything):,}"
    )
    subset = _stated(r"in-process tasks \(about ([\d,]+) tests\)")
    assert _near(subset, len(quick)), (
        f"README says {subset:,} quick tests, there are {len(quick):,}"
    )
