"""The plug-in guide in docs/stores.md shows the plug-in the tests install.

That every block runs as pasted is tests/project/test_docs_blocks.py's job.
"""

from __future__ import annotations

import re

from layout import PLUGIN_DIR, ROOT

BLOCK = re.compile(r"```python\n(.*?)```", re.S)


def _blocks(name: str) -> list[str]:
    return BLOCK.findall((ROOT / name).read_text())


def test_the_plugin_guide_shows_the_tested_plugin() -> None:
    module = _blocks("docs/stores.md")[-2]
    plugin = PLUGIN_DIR
    assert module == (plugin / "toy_store.py").read_text()
    (toml,) = re.findall(r"```toml\n(.*?)```", (ROOT / "docs/stores.md").read_text(), re.S)
    entry_point = '[project.entry-points."dibs.stores"]\ntoy = "toy_store:ToyStore"\n'
    assert entry_point in toml and entry_point in (plugin / "pyproject.toml").read_text()
