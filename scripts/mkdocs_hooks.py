"""MkDocs hooks for the docs site (mkdocs.yml names this file).

Docstrings name other objects with Sphinx roles (``:class:`dibs.Store```);
on the site each becomes a cross-reference when the name is in the API
reference, else plain code.

The Markdown under docs/ is read on GitHub as well as on the site, so it
links to repository files outside docs/ (``../src/dibs/lot.py``). The
changelog page shows CHANGELOG.md from the repository root, whose links are
relative to the root (``docs/stores.md``). On the site a link into docs/ is
rewritten relative to the page, and a link to a repository file outside docs/
becomes its text (the site has no copy of the file). A relative link whose
target does not exist is left alone, so the strict build still reports it.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
FROM_ROOT = {"changelog.md": ROOT / "CHANGELOG.md"}  # site pages that show a file at the root
_LINK = re.compile(r"(?<!!)\[(?P<text>[^\]\n]+)\]\((?P<target>[^)\s#]*)(?P<anchor>#[^)\s]*)?\)")
_EXTERNAL = re.compile(r"^[a-z][a-z0-9+.-]*:", re.I)
_ROLE = re.compile(
    r":(?:class|func|meth|attr|exc|mod|data|obj|const):<code>(?P<short>~?)(?P<name>[\w.]+)(?P<call>\(\))?</code>"
)


def on_page_markdown(markdown: str, page: Any, **_: Any) -> str:
    """Show root files' pages, and point links that leave docs/ somewhere the site can follow."""
    uri: str = page.file.src_uri
    page_dir = (DOCS / uri).parent
    base = page_dir
    if uri in FROM_ROOT:
        markdown, base = FROM_ROOT[uri].read_text(encoding="utf-8"), ROOT

    def fix(link: re.Match[str]) -> str:
        target, anchor = link["target"], link["anchor"] or ""
        if not target or _EXTERNAL.match(target) or target.startswith("/"):
            return link.group(0)
        path = (base / target).resolve()
        if not path.exists():
            return link.group(0)  # broken: the strict build reports it
        if path.is_relative_to(DOCS):
            return f"[{link['text']}]({Path(os.path.relpath(path, page_dir)).as_posix()}{anchor})"
        return link["text"]

    return _LINK.sub(fix, markdown)


def on_page_content(html: str, **_: Any) -> str:
    """Turn the docstrings' Sphinx roles into optional cross-references (mkdocs-autorefs)."""

    def ref(role: re.Match[str]) -> str:
        name = role["name"]
        shown = (name.rsplit(".", 1)[-1] if role["short"] else name) + (role["call"] or "")
        return f'<autoref optional identifier="{name}"><code>{shown}</code></autoref>'

    return _ROLE.sub(ref, html)
