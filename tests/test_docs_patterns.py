"""Every ``python`` code block in docs/patterns/*.md runs, in order, one namespace per page."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import dibs

PAGES = sorted((Path(__file__).parent.parent / "docs" / "patterns").glob("*.md"))
BLOCK = re.compile(r"^```python\n(.*?)^```", re.MULTILINE | re.DOTALL)


def test_every_pattern_has_a_page() -> None:
    assert {p.stem for p in PAGES} >= {"booking", "lot", "matching", "paths", "singleflight"}


@pytest.mark.parametrize("page", PAGES, ids=[p.stem for p in PAGES])
def test_examples_run(page: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    blocks = BLOCK.findall(page.read_text(encoding="utf-8"))
    assert blocks, f"{page.name} has no runnable example"
    monkeypatch.chdir(tmp_path)  # examples that write files write them here
    namespace: dict[str, object] = {"__name__": f"docs_{page.stem}"}
    for number, source in enumerate(blocks, 1):
        code = compile(source, f"{page.name}, python block {number}", "exec")
        exec(code, namespace)
    for value in namespace.values():
        if isinstance(value, dibs.Store):
            value.close()
