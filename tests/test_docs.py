"""The README's and docs' Python examples run as written."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
BLOCK = re.compile(r"```python\n(.*?)```", re.S)


def _blocks(name: str) -> list[str]:
    return BLOCK.findall((ROOT / name).read_text())


def test_readme_example_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("DIBS_URL", raising=False)
    (example,) = _blocks("README.md")
    exec(compile(example, "README.md", "exec"), {})
    assert (tmp_path / "dibs.db").exists()


def test_fake_clock_example_runs() -> None:
    first = _blocks("docs/testing.md")[0]
    exec(compile(first, "docs/testing.md", "exec"), {})


def test_reason_rule_example_runs() -> None:
    example = _blocks("docs/stores.md")[0]
    exec(compile(example, "docs/stores.md", "exec"), {})


def test_group_commit_example_runs() -> None:
    (example,) = [b for b in _blocks("docs/stores.md") if "group_commit=1" in b]
    exec(compile(example, "docs/stores.md", "exec"), {})


def test_the_plugin_guide_shows_the_tested_plugin() -> None:
    module = _blocks("docs/stores.md")[-2]
    plugin = ROOT / "tests" / "plugin_store"
    assert module == (plugin / "toy_store.py").read_text()
    (toml,) = re.findall(r"```toml\n(.*?)```", (ROOT / "docs/stores.md").read_text(), re.S)
    entry_point = '[project.entry-points."dibs.stores"]\ntoy = "toy_store:ToyStore"\n'
    assert entry_point in toml and entry_point in (plugin / "pyproject.toml").read_text()


def test_the_plugin_guide_contract_test_passes(tmp_path: Path) -> None:
    contract = _blocks("docs/stores.md")[-1]
    (tmp_path / "test_toy_store.py").write_text(contract)
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(
            [str(ROOT / "tests" / "plugin_store"), *filter(None, [os.environ.get("PYTHONPATH")])]
        ),
    }
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", "--rootdir",
         str(tmp_path), "-c", os.devnull, str(tmp_path / "test_toy_store.py")],
        env=env, capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert " passed" in done.stdout
