"""Stores from other packages: registered by entry point, held to the same contract.

``tests/support/plugin_store`` is a third-party package in miniature: ``toy_store``
and a ``.dist-info`` whose ``entry_points.txt`` registers ``toy://`` in the
``dibs.stores`` group. Putting that directory on ``sys.path`` (and on
``$PYTHONPATH`` for subprocesses) installs it as far as
:mod:`importlib.metadata` can tell, without touching the environment.
"""

from __future__ import annotations

import json
import os
import pickle
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

import dibs
from dibs import FakeClock, Store
from dibs.cli import main
from dibs.stores import available_schemes, store_class
from dibs.stores.memory import MemoryStore
from dibs.tasks import TaskProcessor
from dibs.testing import StoreContract
from dibs.verify._log import dump_log
from layout import PLUGIN_DIR


def _install(monkeypatch: pytest.MonkeyPatch, where: Path) -> None:
    monkeypatch.syspath_prepend(str(where))
    paths = [str(where), *filter(None, [os.environ.get("PYTHONPATH")])]
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(paths))


@pytest.fixture
def toy(monkeypatch: pytest.MonkeyPatch) -> None:
    _install(monkeypatch, PLUGIN_DIR)


def _fake_dist(where: Path, name: str, entry_points: str) -> Path:
    info = where / f"{name}-1.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text(f"[dibs.stores]\n{entry_points}\n")
    return where


@pytest.mark.usefixtures("toy")
def test_a_plugin_scheme_opens_its_store() -> None:
    with dibs.open("toy://") as store:
        assert type(store).__name__ == "ToyStore"
        assert store.claim(dibs.Unit("seat-1", "show-1"), holder="alice")
    assert available_schemes()["toy"] == "toy_store:ToyStore"


@pytest.mark.usefixtures("toy")
def test_unknown_scheme_lists_plugins_too() -> None:
    with pytest.raises(dibs.UnknownScheme) as raised:
        dibs.open("nosuch://x")
    assert {"memory", "sqlite", "postgresql", "toy"} <= set(raised.value.schemes)
    assert "toy" in str(raised.value)
    again = pickle.loads(pickle.dumps(raised.value))
    assert again.schemes == raised.value.schemes


def test_without_the_plugin_its_scheme_is_unknown() -> None:
    with pytest.raises(dibs.UnknownScheme) as raised:
        dibs.open("toy://")
    assert "toy" not in raised.value.schemes


def test_a_plugin_cannot_take_over_a_builtin_scheme(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    _install(monkeypatch, _fake_dist(tmp_path, "hijack", "sqlite = os:system"))
    assert store_class("sqlite:///x.db").__name__ == "SQLiteStore"
    assert available_schemes()["sqlite"] == "dibs.stores.sqlite:SQLiteStore"


def test_two_plugins_on_one_scheme_are_refused(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    _install(monkeypatch, _fake_dist(tmp_path / "a", "one", "twin = toy_store:ToyStore"))
    other = "twin = dibs.stores.memory:MemoryStore"
    _install(monkeypatch, _fake_dist(tmp_path / "b", "two", other))
    with pytest.raises(dibs.InvalidInput, match="several installed packages"):
        dibs.open("twin://")


def test_an_entry_point_that_is_not_a_store_is_refused(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    _install(monkeypatch, _fake_dist(tmp_path, "odd", "odd = os:getcwd"))
    with pytest.raises(dibs.InvalidInput, match=r"not a dibs\.Store subclass"):
        dibs.open("odd://")


class TestToyStoreContract(StoreContract):
    """The contract suite, as the toy store's own package would run it."""

    @pytest.fixture
    def store(self, toy: None, clock: FakeClock) -> Iterator[Store]:
        with dibs.open("toy://", clock=clock) as store:
            yield store

    @pytest.fixture
    def reopen(self, store: Store) -> Callable[[], Store]:
        return lambda: store  # one process, one store object: its only handle


@pytest.mark.usefixtures("toy")
def test_dibs_verify_checks_the_plugin_store(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["verify", "--store", "toy://", "--clients", "2", "--ops", "200", "--json"])
    figures = json.loads(capsys.readouterr().out)
    assert code == 0, figures
    assert figures["verdict"] == "ok" and figures["operations"] >= 400  # and the sweeper's


@pytest.mark.usefixtures("toy")
def test_durable_tasks_run_on_the_plugin_store() -> None:
    with dibs.open("toy://") as store, TaskProcessor(store=store, workers=1, poll=0.01) as tasks:

        @tasks.task("double")
        def double(x: int) -> int:
            return 2 * x

        job = tasks.enqueue("double", 21)
        assert tasks.result(job, timeout=60) == 42


class _Bare(MemoryStore):
    """A store that offers no capability beyond the claim contract."""

    def job_table(self) -> None:
        return None

    def claim_log(self) -> None:
        return None


def test_a_store_without_a_job_table_is_refused_by_durable_tasks() -> None:
    with _Bare() as store, pytest.raises(dibs.InvalidInput, match="job table"):
        TaskProcessor(store=store)


def test_a_store_without_a_claim_log_cannot_be_replayed() -> None:
    with _Bare() as store, pytest.raises(TypeError, match="durable log"):
        dump_log(store)


@pytest.mark.usefixtures("toy")
def test_dibs_demo_rushes_the_plugin_store(capsys: pytest.CaptureFixture[str]) -> None:
    small = ["--seats", "60", "--row-size", "10", "--customers", "90", "--ttl", "0.3"]
    code = main(["demo", "--store", "toy://", *small, "--json", "--no-progress"])
    report = json.loads(capsys.readouterr().out)
    assert code == 0, [c for c in report["checks"] if not c["passed"]]
    assert "threads in one process" in report["mode"]  # an in-process store: no processes


@pytest.mark.usefixtures("toy")
def test_dibs_serve_serves_the_plugin_store() -> None:
    from dibs.service import ServiceConfig, Showing
    from service_support import serve_in_thread

    config = ServiceConfig(store_url="toy://", keys_file=None, showings=(Showing("show-1", 2, 2),))
    with serve_in_thread(config) as running, running.client("alice") as c:
        assert c.get("/readyz").json() == {"status": "ready", "store": "toy"}
        seat = {"resource": "A1", "slot": "show-1"}
        claimed = c.post(
            "/v1/claims",
            json={"targets": [seat], "ttl": None},
            headers={"Idempotency-Key": '"toy-1"'},
        )
        assert claimed.status_code == 201, claimed.text
