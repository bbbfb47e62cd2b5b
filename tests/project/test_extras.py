"""A missing extra is one typed error naming it, from every entry point; the CLI exits 2.

Each test runs a fresh interpreter whose import system refuses the optional
packages named (a ``sys.meta_path`` finder raising ``ModuleNotFoundError``, as
an environment without them does), then calls every entry point that reaches
them: ``dibs.open`` and ``dibs.aio.open`` per scheme, each ``dibs`` command,
the task processor's cron schedules, the service, ``dibs.observe`` and
``dibs.testing``. Each must raise :class:`dibs.MissingExtra` (an
``ImportError``) naming the extra, or exit 2 with its ``pip install`` line and
no traceback.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import dibs

pytestmark = pytest.mark.timeout(300)

_PRELUDE = """
import contextlib, io, json, sys

BLOCKED = set(sys.argv[1].split(","))


class Refuse:
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in BLOCKED:
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None


sys.meta_path.insert(0, Refuse())

import dibs
from dibs.cli import main

results = []
for label, kind, what in json.loads(sys.argv[2]):
    if kind == "cli":
        err = io.StringIO()
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            try:
                code = main(what)
            except BaseException as exc:
                code = f"raised {type(exc).__name__}: {exc}"
        results.append([label, code, err.getvalue()])
        continue
    try:
        exec(what, {})
    except dibs.MissingExtra as exc:
        results.append([label, "MissingExtra", [exc.extra, exc.name, isinstance(exc, ImportError),
                                                str(exc)]])
    except BaseException as exc:
        results.append([label, type(exc).__name__, str(exc)])
    else:
        results.append([label, "no error", ""])
print(json.dumps(results))
"""

PG = "postgresql://127.0.0.1:1/db"
ETCD = "etcd://127.0.0.1:1"


def _run(blocked: str, cases: list[tuple[str, str, Any]], cwd: Path) -> list[list[Any]]:
    # The dibs under test, whatever the working directory.
    env = {**os.environ, "PYTHONPATH": str(Path(dibs.__file__).parents[1])}
    done = subprocess.run(
        [sys.executable, "-c", _PRELUDE, blocked, json.dumps(cases)],
        capture_output=True, text=True, timeout=240, check=False, cwd=cwd, env=env,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    results: list[list[Any]] = json.loads(done.stdout.strip().splitlines()[-1])
    return results


def _store_cases(url: str) -> list[tuple[str, str, Any]]:
    return [
        ("dibs.open", "py", f"import dibs; dibs.open({url!r})"),
        ("dibs.aio.open", "py", f"import dibs.aio; dibs.aio.open({url!r})"),
        ("doctor", "cli", ["doctor", url, "--timeout", "1"]),
        ("demo", "cli", ["demo", "--store", url, "--no-progress", "--seats", "4"]),
        ("sweep", "cli", ["sweep", "--store", url]),
        ("jobs list", "cli", ["jobs", "list", "--store", url]),
        ("verify", "cli", ["verify", "--store", url, "--ops", "10"]),
        ("worker", "cli", ["worker", "--app", "dibs_extras_app:processor", "--store", url]),
    ]


CASES: dict[str, tuple[str, list[tuple[str, str, Any]]]] = {
    "psycopg": (
        "postgres",
        [
            *_store_cases(PG),
            ("postgres:// alias", "py", "import dibs; dibs.open('postgres://127.0.0.1:1/db')"),
            ("the package", "py", "import dibs.stores.postgres"),
            ("serve", "cli", ["serve", "--store", PG, "--keys", "keys.txt", "--port", "0"]),
        ],
    ),
    "psycopg_pool": ("postgres", _store_cases(PG)[:3]),
    "httpx": ("etcd", [*_store_cases(ETCD), ("the package", "py", "import dibs.stores.etcd")]),
    "croniter": (
        "tasks",
        [
            (
                "cron schedule",
                "py",
                "import dibs.tasks; dibs.tasks.TaskProcessor().cron('* * * * *', print)",
            )
        ],
    ),
    "starlette": (
        "service",
        [
            ("create_app", "py", "from dibs.service import create_app"),
            ("serve", "cli", ["serve", "--store", "memory://", "--keys", "keys.txt"]),
        ],
    ),
    "uvicorn": ("service", [("serve", "cli", ["serve", "--store", "memory://"])]),
    "prometheus_client": ("service", [("create_app", "py", "from dibs.service import create_app")]),
    "opentelemetry": (
        "otel",
        [
            (
                "instrument",
                "py",
                "import dibs, dibs.observe; dibs.observe.instrument(dibs.open('memory://'))",
            )
        ],
    ),
    "pytest": (
        "testing",
        [
            ("StoreContract", "py", "from dibs.testing import StoreContract"),
            ("the module", "py", "import dibs.testing.contract"),
        ],
    ),
    "hypothesis": (
        "testing",
        [
            ("StoreStateMachine", "py", "from dibs.testing import StoreStateMachine"),
            ("the strategies", "py", "import dibs.testing.strategies"),
        ],
    ),
}


@pytest.mark.parametrize("module", sorted(CASES))
def test_a_missing_extra_is_named_by_every_entry_point(tmp_path: Path, module: str) -> None:
    extra, cases = CASES[module]
    (tmp_path / "dibs_extras_app.py").write_text(
        "import dibs, dibs.tasks\nprocessor = dibs.tasks.TaskProcessor(store=dibs.open())\n"
    )
    (tmp_path / "keys.txt").write_text("")
    results = _run(module, cases, tmp_path)
    assert [r[0] for r in results] == [c[0] for c in cases]
    install = f"pip install 'dibs[{extra}]'"
    for (label, kind, _), (_, outcome, detail) in zip(cases, results, strict=True):
        if kind == "cli":
            assert (outcome, install in detail) == (2, True), (label, outcome, detail)
            assert "Traceback" not in detail, (label, detail)
        else:
            assert outcome == "MissingExtra", (label, outcome, detail)
            assert detail[:3] == [extra, module, True], (label, detail)
            assert install in detail[3], (label, detail)


def test_the_core_and_the_embedded_stores_need_no_extra(tmp_path: Path) -> None:
    every_optional = "psycopg,psycopg_pool,httpx,rich,croniter,starlette,uvicorn,"
    every_optional += "prometheus_client,opentelemetry,pytest,hypothesis"
    cases: list[tuple[str, str, Any]] = [
        ("memory", "py", "import dibs; dibs.open('memory://').close()"),
        ("sqlite", "py", "import dibs; dibs.open('sqlite:///core.db').close()"),
        ("every schedule but cron", "py", "import dibs.tasks; dibs.tasks.TaskProcessor()"),
        ("FakeClock", "py", "from dibs.testing import FakeClock, ModelStore"),
        ("help", "cli", ["sweep", "--store", "sqlite:///core.db"]),
        ("doctor without rich", "cli", ["doctor", "sqlite:///core.db"]),
    ]
    results = _run(every_optional, cases, tmp_path)
    assert [r[1] for r in results] == ["no error"] * 4 + [0, 1], results


def test_a_worker_app_that_needs_a_missing_extra_gets_it_named(tmp_path: Path) -> None:
    # Not "cannot import the app": the app imported fine up to the store it opens.
    (tmp_path / "dibs_extras_app.py").write_text(
        f"import dibs, dibs.tasks\nprocessor = dibs.tasks.TaskProcessor(store=dibs.open({PG!r}))\n"
    )
    code = "from dibs.tasks._command import load_app; load_app('dibs_extras_app:processor', None)"
    results = _run("psycopg", [("load_app", "py", code)], tmp_path)
    assert results[0][1] == "MissingExtra", results


def test_missing_extra_is_an_import_error_that_pickles() -> None:
    import pickle

    error = dibs.MissingExtra("needs psycopg", extra="postgres", name="psycopg")
    assert isinstance(error, ImportError) and isinstance(error, dibs.DibsError)
    copy = pickle.loads(pickle.dumps(error))
    assert (type(copy), str(copy), copy.extra, copy.name) == (
        dibs.MissingExtra,
        "needs psycopg",
        "postgres",
        "psycopg",
    )


def test_an_import_error_inside_dibs_is_a_bug_not_a_missing_extra() -> None:
    from dibs._extras import needs

    with pytest.raises(ImportError) as raised, needs("postgres", "x"):
        raise ModuleNotFoundError("No module named 'dibs.nope'", name="dibs.nope")
    assert type(raised.value) is ModuleNotFoundError
