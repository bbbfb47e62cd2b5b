"""Negative controls: stores with planted bugs that the checkers must catch on every run.

Each plant subclasses a real store (dibs.verify._planted). A checker that
passes one of these is broken, so every run must end in "anomaly", with the
linearizability checker flagging at least one resource. Two seeds per plant
on memory:// (threads), one on SQLite and one on PostgreSQL (processes).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from dibs.verify import PLANTS, Workload, check_history, read_history, run_workload
from dibs.verify.harness import PostgresServer
from pg_fixtures import schema_url

RUN_EARLY = True  # long: started first under pytest -n (conftest), not last


def _run(url: str, plant: str, seed: int, tmp_path: Path, clients: int, ops: int) -> None:
    workload = Workload(url, clients=clients, ops=ops, plant=plant, seed=seed)
    history = read_history(run_workload(workload, tmp_path / f"h{seed}.jsonl"))
    report = check_history(history, max_witnesses=1, shrink_budget=3.0)
    flagged = [p for p in report.partitions if p.verdict == "anomaly"]
    assert report.verdict == "anomaly", report.render()
    assert flagged, report.render()
    # The first anomaly comes with a shrunk, readable sub-history.
    assert flagged[0].witness
    if plant == "check-then-act":
        # Both grants are in the log: the replay sees one granted over a live claim.
        assert report.log_anomalies, report.render()


@pytest.mark.parametrize("plant", PLANTS)
@pytest.mark.parametrize("seed", [1, 2])
def test_memory_plants_are_caught(plant: str, seed: int, tmp_path: Path) -> None:
    _run("memory://", plant, seed, tmp_path, clients=4, ops=500)


@pytest.mark.parametrize("plant", PLANTS)
def test_sqlite_plants_are_caught(plant: str, tmp_path: Path) -> None:
    _run(f"sqlite:///{tmp_path / 'p.db'}", plant, 1, tmp_path, clients=3, ops=500)


@pytest.fixture(scope="module")
def pg_server() -> Iterator[PostgresServer]:
    with PostgresServer() as server:
        yield server


@pytest.mark.parametrize("plant", PLANTS)
def test_postgres_plants_are_caught(plant: str, pg_server: PostgresServer, tmp_path: Path) -> None:
    url = schema_url(pg_server.create_database(), "plant")
    _run(url, plant, 1, tmp_path, clients=3, ops=500)
