"""Find the fenced code blocks of the README and docs/, and run one as pasted.

Every fence names its language. ``python`` blocks run with ``python`` (or
``pytest`` when they define tests), shell blocks (``sh``, ``bash``,
``console``) run with ``bash -e``, each alone in a fresh subprocess and a
fresh temporary directory, with ``PYTHONPATH`` pointing at this checkout.
``json`` and ``toml`` blocks must parse. The other languages (``text``,
``sql``, ``nginx``...) are shown, never run.

HTML comments on the lines just before a fence say what a block needs:

``<!-- needs: postgresql -->``
    The block reads ``$DIBS_URL`` (``dibs.open()`` does), which the runner
    points at a fresh schema on the test PostgreSQL server (the one the
    tests use: ``tests/support/pg_fixtures.py``, or ``$DIBS_TEST_PG_URL``).
``<!-- needs: etcd -->``
    The block reads ``$DIBS_URL``, which the runner points at a fresh prefix
    on the test etcd member (``tests/support/etcd_fixtures.py``).
``<!-- needs: dibs-serve -->``
    A shell block that calls the HTTP service: the runner starts ``dibs serve``
    (on SQLite in the block's directory, with ``--showing show-1:8x12 --lot
    garage:40``) on a free port and sets ``$API`` to its address and ``$KEY``
    to an API key of holder ``alice``. ``curl`` fails on an HTTP error status
    (``--fail-with-body``), so every call the block makes must succeed.
``<!-- needs: toy-store -->``
    The block uses the plug-in guide's ``toy://`` store, which the runner
    puts on ``PYTHONPATH`` (``tests/support/plugin_store``) as installing it would.
``<!-- not-run: reason -->``
    A shell block that cannot run on its own (it starts a server that runs
    until stopped, or installs packages); the reason is required, and only
    shell blocks may carry it.

In shell blocks ``pip`` is a no-op: the test environment already has every
extra installed, which is what ``pip install`` lines bring.

Test-only: this module is not part of the dibs package.
"""

from __future__ import annotations

import ast
import contextlib
import os
import re
import shutil
import socket
import stat
import subprocess
import sys
import textwrap
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

from eventually import eventually
from layout import PLUGIN_DIR, ROOT

__all__ = ["RUN_PYTHON", "RUN_SHELL", "Block", "find_blocks", "run_block", "urls_in"]


RUN_PYTHON = frozenset({"python", "py"})
RUN_SHELL = frozenset({"sh", "bash", "shell", "console"})
PARSED = frozenset({"json", "toml"})
SHOWN = frozenset({"text", "sql", "nginx", "ini", "yaml", "html", "diff", "pycon"})
LANGUAGES = RUN_PYTHON | RUN_SHELL | PARSED | SHOWN
NEEDS = frozenset({"postgresql", "etcd", "toy-store", "dibs-serve"})
LOOPBACK = frozenset({"", "localhost", "127.0.0.1", "::1", "[::1]"})

_FENCE = re.compile(r"^(?P<indent> *)(?P<fence>`{3,}|~{3,})(?P<info>.*)$")
_MARKER = re.compile(r"^\s*<!--\s*(?P<key>needs|not-run)\s*:\s*(?P<value>.*?)\s*-->\s*$")
_URL = re.compile(r"\b(?P<scheme>[a-z][a-z0-9+.-]*)://(?P<rest>[^\s\"'`)<>]*)")


@dataclass(frozen=True)
class Block:
    """One fenced code block: where it is, its language, its text and its markers."""

    path: Path
    line: int
    language: str
    source: str
    needs: frozenset[str] = frozenset()
    not_run: str | None = None
    markers: tuple[str, ...] = field(default=())

    @property
    def where(self) -> str:
        """``docs/x.md:12``, relative to the checkout."""
        return f"{self.path.relative_to(ROOT)}:{self.line}"

    @property
    def runs(self) -> bool:
        """Whether the runner executes this block."""
        return self.language in RUN_PYTHON | RUN_SHELL and self.not_run is None

    @property
    def is_pytest(self) -> bool:
        """A python block that defines tests runs under pytest."""
        return self.language in RUN_PYTHON and bool(
            re.search(r"^(class Test\w*|def test_\w*|Test\w+ = )", self.source, re.M)
        )

    def code(self) -> str:
        """What runs: a ``console`` block's ``$`` lines, else the whole block."""
        if self.language != "console":
            return self.source
        return "".join(line[2:] for line in self.source.splitlines(True) if line.startswith("$ "))


def doc_files() -> list[Path]:
    """The README and every Markdown file under docs/."""
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def find_blocks(path: Path) -> list[Block]:
    """Every fenced block of one Markdown file, with the markers just before it."""
    lines = path.read_text(encoding="utf-8").splitlines(True)
    blocks: list[Block] = []
    i = 0
    while i < len(lines):
        opening = _FENCE.match(lines[i].rstrip("\n"))
        if opening is None:
            i += 1
            continue
        indent, fence = len(opening["indent"]), opening["fence"]
        info = opening["info"].strip()
        language = info.split()[0].lstrip("{.").rstrip("}") if info else ""
        body: list[str] = []
        j = i + 1
        while j < len(lines):
            closing = _FENCE.match(lines[j].rstrip("\n"))
            if (
                closing
                and closing["fence"][0] == fence[0]
                and len(closing["fence"]) >= len(fence)
                and not closing["info"].strip()
            ):
                break
            body.append(lines[j][indent:] if lines[j][:indent].isspace() else lines[j])
            j += 1
        needs: set[str] = set()
        not_run: str | None = None
        markers: list[str] = []
        k = i - 1
        while k >= 0 and not lines[k].strip():
            k -= 1
        while k >= 0 and (marker := _MARKER.match(lines[k])):
            markers.append(lines[k].strip())
            if marker["key"] == "needs":
                needs.update(v.strip() for v in marker["value"].split(",") if v.strip())
            else:
                not_run = marker["value"]
            k -= 1
        blocks.append(
            Block(
                path=path,
                line=i + 1,
                language=language,
                source=textwrap.dedent("".join(body)),
                needs=frozenset(needs),
                not_run=not_run,
                markers=tuple(markers),
            )
        )
        i = j + 1
    return blocks


def all_blocks() -> list[Block]:
    """Every block of every doc file."""
    return [block for path in doc_files() for block in find_blocks(path)]


def urls_in(block: Block) -> list[str]:
    """URLs a runnable block would use: in a python block's strings, a shell block's words.

    Comments are left out: a comment may show the shape of a real URL.
    """
    if block.language in RUN_PYTHON:
        try:
            tree = ast.parse(block.source)
        except SyntaxError:
            return []
        texts = [
            node.value
            for node in ast.walk(tree)
            if isinstance(node, ast.Constant) and isinstance(node.value, str)
        ]
    else:
        texts = [re.sub(r"(^|\s)#.*$", "", line) for line in block.code().splitlines()]
    return [m.group(0) for text in texts for m in _URL.finditer(text)]


def placeholder_hosts(block: Block) -> list[str]:
    """URLs in a runnable block whose host is not this machine."""
    bad = []
    for url in urls_in(block):
        if url.startswith(("sqlite:", "memory:", "file:", "toy:")):
            continue
        try:
            host = urlsplit(url).hostname or ""
        except ValueError:
            bad.append(url)
            continue
        if host not in LOOPBACK:
            bad.append(url)
    return bad


def _shims(where: Path) -> Path:
    """``PATH`` shims: ``pip`` a no-op, ``dibs`` this checkout's CLI, ``curl`` failing on errors."""
    shims = where / ".shims"
    shims.mkdir()
    curl = shutil.which("curl") or "/usr/bin/curl"
    scripts = {
        "pip": '#!/bin/sh\necho "(docs test: pip $* skipped; the test environment has it)"\n',
        "curl": f'#!/bin/sh\nexec "{curl}" --fail-with-body "$@"\n',
        "dibs": (
            f'#!/bin/sh\nexec "{sys.executable}" -c '
            '"import sys; from dibs.cli import main; sys.exit(main())" "$@"\n'
        ),
    }
    for name, text in scripts.items():
        (shims / name).write_text(text)
        (shims / name).chmod(stat.S_IRWXU)
    return shims


@contextlib.contextmanager
def _dibs_serve(where: Path, env: dict[str, str]) -> Iterator[dict[str, str]]:
    """``dibs serve`` on a free port for one block; yields ``API`` and ``KEY``."""
    keys = str(where / ".serve-keys.json")
    made = subprocess.run(
        ["dibs", "keys", "--keys", keys, "create", "--holder", "alice"],
        cwd=where, env=env, capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    api = f"http://127.0.0.1:{port}"
    server = subprocess.Popen(
        ["dibs", "serve", "--store", f"sqlite:///{where / '.serve.db'}", "--keys", keys,
         "--port", str(port), "--showing", "show-1:8x12", "--lot", "garage:40"],
        cwd=where, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:

        def healthy() -> bool:
            try:
                with urllib.request.urlopen(f"{api}/healthz", timeout=5):
                    return True
            except OSError:
                if server.poll() is not None:
                    raise RuntimeError(f"dibs serve exited {server.poll()}") from None
                return False

        eventually(healthy, "dibs serve answers /healthz")
        yield {"API": api, "KEY": made.stdout.strip()}
    finally:
        server.terminate()
        try:
            server.wait(timeout=15)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()


def run_block(
    block: Block,
    where: Path,
    *,
    pg_url: str | None = None,
    etcd_url: str | None = None,
    timeout: float = 240,
) -> subprocess.CompletedProcess[str]:
    """Run one block alone in a fresh subprocess with ``where`` as its working directory."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DIBS_", "PYTEST_"))}
    paths = [str(ROOT / "src")]
    if "toy-store" in block.needs:
        paths.append(str(PLUGIN_DIR))
    env["PYTHONPATH"] = os.pathsep.join(paths)
    env["PATH"] = os.pathsep.join([str(_shims(where)), env.get("PATH", "")])
    if "postgresql" in block.needs:
        if pg_url is None:
            raise ValueError(f"{block.where} needs PostgreSQL and got no URL")
        env["DIBS_URL"] = pg_url
    if "etcd" in block.needs:
        if etcd_url is None:
            raise ValueError(f"{block.where} needs etcd and got no URL")
        env["DIBS_URL"] = etcd_url
    with contextlib.ExitStack() as stack:
        if "dibs-serve" in block.needs:
            env.update(stack.enter_context(_dibs_serve(where, env)))
        return _run(block, where, env, timeout)


def _run(
    block: Block, where: Path, env: dict[str, str], timeout: float
) -> subprocess.CompletedProcess[str]:
    name = f"{block.path.stem}_{block.line}"
    if block.language in RUN_PYTHON:
        script = where / (f"test_{name}.py" if block.is_pytest else f"{name}.py")
        script.write_text(block.source, encoding="utf-8")
        if block.is_pytest:
            args = [sys.executable, "-m", "pytest", "-q", "-x", "-W", "error",
                    "-p", "no:cacheprovider", "-c", os.devnull, "--rootdir", str(where),
                    str(script)]  # fmt: skip
        else:
            args = [sys.executable, "-W", "error", str(script)]
    else:
        script = where / f"{name}.sh"
        script.write_text(block.code(), encoding="utf-8")
        args = ["bash", "-e", str(script)]  # stop at the first failing command
    return subprocess.run(
        args, cwd=where, env=env, capture_output=True, text=True, timeout=timeout, check=False
    )
