"""The CI-sized verification runs: 100,000 ops per store under faults.

Sized for a shared 2-core machine (about 20 s on memory://, 30 s on sqlite://,
90 s on PostgreSQL, checking included); the figures of the last run are in
docs/reliability.md. Each test prints its figures as JSON (visible with
``pytest -s``).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from dibs.verify import Report, Workload, check_history, read_history, run_workload
from pg_fixtures import schema_url
from pgserver import PostgresServer

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

# Log anomalies that mean an acknowledged operation was lost or a fence reused.
DURABILITY = {"lost-grant", "grant-mismatch", "lost-claim", "lost-confirmation", "lost-release"}
DURABILITY |= {"lost-extend", "fence-reused", "released-by-nobody"}


def _report(workload: Workload, path: Path, **options: Any) -> Report:
    history = read_history(run_workload(workload, path, **options))
    # A generous search budget: on a loaded machine the 10 s default can run out
    # on one resource of 12,000 ops, which would read "unknown", not "ok".
    report = check_history(history, budget=30.0, max_witnesses=1, shrink_budget=5.0)
    print(json.dumps({"store": workload.store.split("://")[0], **report.to_json()}))
    return report


def test_memory_100k_ops_under_crashes_pauses_and_skew(tmp_path: Path) -> None:
    workload = Workload(
        "memory://", clients=4, ops=25_000, faults=("kill", "pause", "skew"), fault_interval=0.5
    )
    report = _report(workload, tmp_path / "h.jsonl")
    assert report.verdict == "ok", report.render()
    assert report.operations - report.kinds["sweep"] == 100_000


def test_sqlite_100k_ops_under_kill_9_pauses_skew_and_integrity_checks(tmp_path: Path) -> None:
    workload = Workload(
        f"sqlite:///{tmp_path / 'v.db'}",
        clients=4,
        ops=25_000,
        faults=("kill", "pause", "skew", "integrity"),
        fault_interval=1.0,
    )
    report = _report(workload, tmp_path / "h.jsonl")
    assert report.verdict == "ok", report.render()
    assert report.operations - report.kinds["sweep"] == 100_000
    faults = report.faults
    assert faults["kill"] > 0 and faults["integrity_check"] == faults["kill"]


@pytest.fixture
def pg_server() -> Iterator[PostgresServer]:
    with PostgresServer() as server:
        yield server


def test_postgres_100k_ops_under_kills_terminations_and_restarts(
    pg_server: PostgresServer, tmp_path: Path
) -> None:
    workload = Workload(
        schema_url(pg_server.create_database(), "verify"),
        clients=4,
        ops=25_000,
        faults=("kill", "pause", "skew", "terminate", "restart"),
        fault_interval=0.5,
        admin_url=pg_server.admin_url,
        # Each sweep scans the claims table: 5 a second keep a sweeper in every
        # stretch between faults without slowing the clients much.
        sweep_interval=0.2,
    )
    report = _report(workload, tmp_path / "h.jsonl", restart=pg_server.restart)
    faults = report.faults
    assert faults["terminate"] > 0 and faults["restart"] > 0 and faults["kill"] > 0
    # Every killed client's backends were seen gone, which closes its op's window.
    assert faults["settle"] == faults["kill"]
    lost = [a for a in report.log_anomalies or [] if a.kind in DURABILITY]
    assert lost == [], report.render()
    assert report.verdict == "ok", report.render()
    assert report.operations - report.kinds["sweep"] == 100_000
