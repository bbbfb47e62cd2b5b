"""Every code block of the README and docs/ runs as pasted, alone, in a fresh process.

How blocks are found, run and marked is in ``tests/support/docblocks.py``. A block
that needs PostgreSQL says so (``<!-- needs: postgresql -->``) and runs
against the test server with ``$DIBS_URL`` set; nothing here skips.
"""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import tomllib
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from docblocks import (
    LANGUAGES,
    NEEDS,
    RUN_PYTHON,
    RUN_SHELL,
    Block,
    all_blocks,
    find_blocks,
    placeholder_hosts,
    run_block,
)
from pg_fixtures import drop_schema, schema_url

RUN_EARLY = True  # long: started first under pytest -n (conftest), not last

pytestmark = pytest.mark.timeout(600)  # the first runnable block's test waits for them all

HINT = (
    "Make the block self-contained (its imports and set-up included). A block that needs a "
    "server says so just above its fence: <!-- needs: postgresql -->, <!-- needs: dibs-serve -->; "
    "a shell block that cannot run says why: <!-- not-run: reason --> (tests/support/docblocks.py)."
)

WORKERS = max(2, min(4, 2 * (os.cpu_count() or 1)))
"""Blocks running at once: enough to overlap start-ups, few enough for a shared machine."""

BLOCKS = all_blocks()
RUNNABLE = [b for b in BLOCKS if b.runs]
PARSED = [b for b in BLOCKS if b.language in {"json", "toml"}]


def _id(block: Block) -> str:
    return f"{block.where}-{block.language}"


def test_blocks_are_found() -> None:
    names = {b.path.name for b in RUNNABLE}
    assert {"README.md", "stores.md", "testing.md", "tasks.md", "postgres.md"} <= names
    patterns = {"booking", "lot", "matching", "paths", "singleflight"}
    assert {f"{p}.md" for p in patterns} <= names  # every pattern page shows running code
    assert len(RUNNABLE) >= 30


@pytest.mark.parametrize("block", BLOCKS, ids=_id)
def test_every_fence_names_a_known_language(block: Block) -> None:
    assert block.language, f"{block.where}: name the fence's language (text for output)"
    assert block.language in LANGUAGES, f"{block.where}: unknown language {block.language!r}"
    assert block.needs <= NEEDS, f"{block.where}: unknown needs {sorted(block.needs - NEEDS)}"


@pytest.mark.parametrize("block", BLOCKS, ids=_id)
def test_only_shell_blocks_may_be_left_unrun(block: Block) -> None:
    if block.not_run is None:
        return
    assert block.language in RUN_SHELL, f"{block.where}: every {block.language} block runs"
    assert block.not_run.strip(), f"{block.where}: say why the block does not run"


@pytest.mark.parametrize("block", RUNNABLE, ids=_id)
def test_no_placeholder_hosts(block: Block) -> None:
    assert not placeholder_hosts(block), (
        f"{block.where} would reach a host that is not there; read $DIBS_URL "
        "(dibs.open() does) and mark the block <!-- needs: postgresql -->"
    )


@pytest.mark.parametrize("block", PARSED, ids=_id)
def test_data_blocks_parse(block: Block) -> None:
    if block.language == "json":
        json.loads(block.source)
    else:
        tomllib.loads(block.source)


@pytest.fixture(scope="module")
def outcomes(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[Block, subprocess.CompletedProcess[str] | BaseException]]:
    """Run every selected block at once, each in its own process, a few at a time.

    The blocks are independent processes, mostly waiting on their own
    start-up, so a small pool keeps the whole run short on two cores.
    """
    selected = [
        item.callspec.params["block"]
        for item in request.session.items
        if isinstance(item, pytest.Function)
        and item.originalname == "test_block_runs_as_pasted"
        and item.callspec.params["block"] in RUNNABLE
    ]
    pg_url = (
        request.getfixturevalue("pg_url")
        if any("postgresql" in b.needs for b in selected)
        else None
    )
    etcd = request.getfixturevalue("etcd_url") if any("etcd" in b.needs for b in selected) else None
    schemas: list[str] = []

    def run(block: Block) -> subprocess.CompletedProcess[str] | BaseException:
        url = None
        if "postgresql" in block.needs:
            assert pg_url is not None
            schemas.append(schema := f"docs_{secrets.token_hex(6)}")
            url = schema_url(pg_url, schema)
        try:
            etcd_url = f"{etcd}/docs-{secrets.token_hex(6)}" if etcd is not None else None
            return run_block(block, tmp_path_factory.mktemp("block"), pg_url=url, etcd_url=etcd_url)
        except Exception as exc:  # a timeout: reported by the block's own test
            return exc

    # The session's temporary root, made before the threads share it: under pytest -n
    # a worker's first mktemp makes (removing it first) popen-gwN, and two threads doing
    # that at once remove each other's directories.
    tmp_path_factory.getbasetemp()
    with ThreadPoolExecutor(max_workers=WORKERS) as pool:
        yield dict(zip(selected, pool.map(run, selected), strict=True))
    for schema in schemas:
        assert pg_url is not None
        drop_schema(pg_url, schema)


@pytest.mark.parametrize("block", RUNNABLE, ids=_id)
def test_block_runs_as_pasted(
    block: Block, outcomes: dict[Block, subprocess.CompletedProcess[str] | BaseException]
) -> None:
    done = outcomes[block]
    if isinstance(done, BaseException):
        raise AssertionError(f"{block.where} ({block.language}) did not finish") from done
    assert done.returncode == 0, (
        f"{block.where} ({block.language}) failed as pasted:\n{done.stdout}\n{done.stderr}\n{HINT}"
    )


# The finder and the runner are tested on made-up pages: what they accept and refuse.

PAGE = """\
# A page

<!-- needs: postgresql -->
```python
import dibs
store = dibs.open()
```

<!-- not-run: starts a server -->

```sh
dibs serve   # http://127.0.0.1:8000
```

- a list item:

  ```python
  print("indented")
  ```

````text
```python
not a block of its own
```
````

```
untagged
```
"""


def test_finder_reads_markers_indents_and_nesting(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text(PAGE)
    first, serve, indented, text, untagged = find_blocks(page)
    assert (first.language, first.needs, first.line) == ("python", {"postgresql"}, 4)
    assert first.source == "import dibs\nstore = dibs.open()\n"
    assert serve.not_run == "starts a server" and not serve.runs
    assert indented.source == 'print("indented")\n' and indented.runs
    assert text.language == "text" and "not a block of its own" in text.source
    assert untagged.language == "" and not untagged.runs


def test_runner_runs_alone_and_reports_failure(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text("```python\nprint(store)\n```\n\n```console\n$ dibs --help\nusage\n```\n")
    missing, console = find_blocks(page)
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    failed = run_block(missing, tmp_path / "a")
    assert failed.returncode != 0 and "NameError" in failed.stderr
    assert console.code() == "dibs --help\n"
    assert run_block(console, tmp_path / "b").returncode == 0


@pytest.mark.parametrize(
    ("source", "bad"),
    [
        ('dibs.open("postgresql://app@db.internal/app")', True),
        ('dibs.open("postgresql://app@127.0.0.1:5432/app")', False),
        ("# e.g. postgresql://app@db.internal/app\ndibs.open()", False),
        ('dibs.open("sqlite:///dibs.db")', False),
    ],
)
def test_placeholder_hosts_are_caught(tmp_path: Path, source: str, bad: bool) -> None:
    page = tmp_path / "page.md"
    page.write_text(f"```python\n{source}\n```\n")
    (block,) = find_blocks(page)
    assert bool(placeholder_hosts(block)) is bad


def test_signature_listings_fail_in_python_fences(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text("```python\ntasks.every(interval, fn, *args, start=None)\n```\n")
    (block,) = find_blocks(page)
    assert block.language in RUN_PYTHON and block.runs
    assert run_block(block, tmp_path).returncode != 0
