"""The package's face: its version, and the module path its public names report."""

from __future__ import annotations

import pickle
import subprocess
import sys
from importlib import metadata

import pytest

import dibs

QUICK = True  # in `pytest -m quick` (conftest.is_quick: not slow, no server)


def test_version_comes_from_the_package_metadata() -> None:
    assert dibs.__version__ == metadata.version("dibs")


def test_dibs_version_prints_it() -> None:
    out = subprocess.run(
        [sys.executable, "-c", "from dibs.cli import main; main(['--version'])"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert out.returncode == 0
    assert out.stdout.strip() == f"dibs {dibs.__version__}"


@pytest.mark.parametrize("name", [n for n in dibs.__all__ if isinstance(getattr(dibs, n), type)])
def test_public_classes_report_the_public_module(name: str) -> None:
    assert getattr(dibs, name).__module__ == "dibs"


def test_pickles_name_only_the_public_path() -> None:
    things = [
        dibs.Unit("seat", "1"),
        dibs.ClaimState.HELD,
        dibs.HoldLost("lost", claim_id="1", reason=dibs.HoldLostReason.EXPIRED),
    ]
    for thing in things:
        data = pickle.dumps(thing)
        assert b"dibs._" not in data  # no private module path
        assert type(pickle.loads(data)) is type(thing)


def test_the_package_ships_no_postgresql_installer() -> None:
    # dibs.verify.harness starts throwaway servers but installs nothing: apt-get lives in
    # scripts/*-ensure.sh, run only when DIBS_HARNESS_ENSURE names them (the tests do).
    import importlib.util

    assert importlib.util.find_spec("dibs.testing.pgserver") is None


def test_stores_keep_their_public_import_paths() -> None:
    from dibs.stores.postgres import PostgresStore, split_url
    from dibs.stores.sqlite import SQLiteStore

    assert SQLiteStore.__module__ == "dibs.stores.sqlite"
    assert PostgresStore.__module__ == "dibs.stores.postgres"
    assert callable(split_url)
