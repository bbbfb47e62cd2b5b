"""The docs site builds with ``mkdocs build --strict``, offline, with the API reference in it."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from layout import ROOT

pytestmark = pytest.mark.timeout(300)

# Loaded before mkdocs in the build's process: any connection beyond this machine fails.
NO_NETWORK = """\
import socket

_LOCAL = {None, "127.0.0.1", "::1", "localhost"}
_getaddrinfo = socket.getaddrinfo
_connect = socket.socket.connect


def _offline(what):
    return OSError(f"docs build tried to reach {what!r}: the site must build offline")


def getaddrinfo(host, *args, **kwargs):
    if host not in _LOCAL:
        raise _offline(host)
    return _getaddrinfo(host, *args, **kwargs)


def connect(self, address):
    if self.family in (socket.AF_INET, socket.AF_INET6) and address[0] not in _LOCAL:
        raise _offline(address)
    return _connect(self, address)


socket.getaddrinfo = getaddrinfo
socket.socket.connect = connect
"""


def _config() -> dict[str, object]:
    class Loader(yaml.SafeLoader):
        pass

    # mkdocs.yml may use mkdocs's !ENV and !relative tags; their values don't matter here.
    Loader.add_multi_constructor("!", lambda loader, suffix, node: None)
    config: dict[str, object] = yaml.load((ROOT / "mkdocs.yml").read_text(), Loader=Loader)
    return config


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("site")
    guard = tmp_path_factory.mktemp("guard")
    (guard / "sitecustomize.py").write_text(NO_NETWORK)
    env = {k: v for k, v in os.environ.items() if not k.startswith("DIBS_")}
    env["PYTHONPATH"] = os.pathsep.join([str(guard), str(ROOT / "src")])
    env["NO_MKDOCS_2_WARNING"] = "1"
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=280, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert "WARNING" not in done.stderr, done.stderr
    return out


def test_the_site_builds_strictly_offline(site: Path) -> None:
    assert (site / "index.html").is_file()
    assert (site / "search" / "search_index.json").is_file()  # the search plug-in is local


def test_the_build_would_notice_the_network(tmp_path: Path) -> None:
    (tmp_path / "sitecustomize.py").write_text(NO_NETWORK)
    probe = "import socket; socket.create_connection(('pypi.org', 443), timeout=5)"
    done = subprocess.run(
        [sys.executable, "-c", probe], env={**os.environ, "PYTHONPATH": str(tmp_path)},
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode != 0 and "must build offline" in done.stderr


def test_every_doc_page_is_in_the_navigation() -> None:
    def pages(entries: object) -> list[str]:
        if isinstance(entries, str):
            return [entries]
        if isinstance(entries, list):
            return [p for e in entries for p in pages(e)]
        if isinstance(entries, dict):
            return [p for v in entries.values() for p in pages(v)]
        return []

    in_nav = set(pages(_config()["nav"]))
    on_disk = {p.relative_to(ROOT / "docs").as_posix() for p in (ROOT / "docs").rglob("*.md")}
    assert on_disk == in_nav


def test_no_plugin_or_theme_setting_fetches_anything() -> None:
    config = _config()
    names = {next(iter(p)) if isinstance(p, dict) else p for p in config["plugins"]}  # type: ignore[attr-defined]
    assert names <= {"search", "mkdocstrings"}, names  # no social cards, no privacy downloads
    assert config["theme"]["font"] is False  # type: ignore[index]  # no Google Fonts
    text = (ROOT / "mkdocs.yml").read_text()
    assert "import:" not in text and "inventories" not in text  # no remote object inventories


REFERENCE = {
    "reference/stores": ["dibs.open", "dibs.Store", "claim", "PostgresStore", "SQLiteStore"],
    "reference/model": ["dibs.Unit", "dibs.Span", "dibs.ClaimResult", "dibs.FakeClock"],
    "reference/errors": ["HoldLost", "StoreUnavailable", "InvalidInput"],
    "reference/limits": ["NAME_MAX_BYTES", "TTL_MAX"],
    "reference/patterns": [
        "dibs.lot.Lot",
        "dibs.matching.match",
        "dibs.singleflight.SingleFlight",
        "dibs.lease",
        "dibs.idempotency.idempotent",
        "dibs.aio.lot.Lot",
        "dibs.aio.matching.match",
    ],
    "reference/aio": ["dibs.aio.open", "dibs.aio.AsyncStore", "dibs.aio.ThreadedStore"],
    "reference/observe": [
        "dibs.observe.instrument",
        "dibs.observe.InstrumentedStore",
        "dibs.observe.InstrumentedAsyncStore",
    ],
    "reference/tasks": ["dibs.tasks.TaskProcessor", "dibs.tasks.TaskHandle", "dibs.tasks.current"],
    "reference/testing": ["dibs.testing.StoreContract", "dibs.testing.strategies"],
}


@pytest.mark.parametrize("page", sorted(REFERENCE))
def test_the_api_reference_comes_from_the_docstrings(site: Path, page: str) -> None:
    html = (site / page / "index.html").read_text()
    for name in REFERENCE[page]:
        assert f'id="{name}' in html or f">{name}<" in html, f"{page} lacks {name}"
    assert not re.search(r":(class|func|meth|mod|attr|data):<code>", html)  # roles became links


def test_the_changelog_is_on_the_site(site: Path) -> None:
    html = (site / "changelog" / "index.html").read_text()
    assert "Unreleased" in html
    first = (ROOT / "CHANGELOG.md").read_text().splitlines()[0].lstrip("# ")
    assert first in html
    assert 'href="docs/' not in html  # the root file's links were made relative to the site


def test_readme_and_docs_link_the_changelog_and_the_reference() -> None:
    readme = (ROOT / "README.md").read_text()
    assert "(CHANGELOG.md)" in readme and "docs/reference/" in readme
    index = (ROOT / "docs" / "index.md").read_text()
    assert "(changelog.md)" in index and "(reference/index.md)" in index
