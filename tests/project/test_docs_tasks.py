"""docs/tasks.md: the examples print what their comments say they print.

tests/project/test_docs_blocks.py runs every block as pasted; this checks what the
task examples show. Each runs alone in a fresh directory, in a subprocess, on
SQLite (the PostgreSQL-only block is left to the docs-block runner).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from layout import ROOT

DOC = ROOT / "docs" / "tasks.md"
BLOCK = re.compile(r"```python\n(.*?)```", re.S)
SECTION = "## Durable jobs: queues, priorities"


def _blocks() -> list[tuple[str, str]]:
    """Every python block of the page, named: the first, the durable one, the features', others."""
    text = DOC.read_text()
    named = {BLOCK.findall(text)[0]: "first"}
    named[BLOCK.findall(text[text.index("## Durable mode:") :])[0]] = "durable"
    start = text.index(SECTION)
    section = text[start : text.index("\n## ", start + 1)]
    for i, block in enumerate(BLOCK.findall(section)):
        named[block] = f"features-{i}"
    return [(named.get(block, f"block-{i}"), block) for i, block in enumerate(BLOCK.findall(text))]


BLOCKS = _blocks()


# Fresh interpreters one after another: 17 s alone, 62 s in a full run at a load of 22.
@pytest.mark.timeout(600)
def test_the_feature_examples_print_what_their_comments_say(tmp_path: Path) -> None:
    outputs = {}
    for name, block in BLOCKS:
        if 'os.environ["DIBS_URL"]' in block:
            continue
        env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
        env.pop("DIBS_URL", None)
        place = tmp_path / name
        place.mkdir()
        done = subprocess.run(
            [sys.executable, "-c", block], cwd=place, env=env, capture_output=True, text=True,
            timeout=120, check=True,
        )  # fmt: skip
        outputs[name] = done.stdout.splitlines()
    assert outputs["first"] == ["report for 2026-12-03", "scheduled"]
    assert outputs["durable"] == ["invoice 42 sent", "done", "True"]
    assert "pending" in outputs["features-0"][1]
    assert outputs["features-1"] == ["['a.png@128', 'b.png@64']"]
    assert (
        outputs["features-2"][0].startswith("shipped order") and outputs["features-2"][1] == "None"
    )
    assert outputs["features-4"] == ["1"]
    assert outputs["features-5"] == ["{'acme': 2, 'zeta': 2}"]
    assert outputs["features-6"] == ["['done', 'done', 'done', 'done', 'done']", "True"]
    assert outputs["features-7"] == ["added duplicate True added", "True"]  # unique jobs
    assert outputs["features-8"] == ["['added', 'added', 'replaced']", "True", "[1, 'email']"]
    assert outputs["features-9"] == ["['added', 'replaced', 'replaced']", "['d']"]
    assert outputs["features-10"] == ["added hello 7"]
    assert outputs["features-11"] == ["5", "ValueError: no such account"]
    assert outputs["features-12"] == ["4950"]
