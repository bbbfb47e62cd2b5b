"""The README's and docs' Python examples run as written."""

from __future__ import annotations

import re
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
    (example,) = _blocks("docs/stores.md")
    exec(compile(example, "docs/stores.md", "exec"), {})
