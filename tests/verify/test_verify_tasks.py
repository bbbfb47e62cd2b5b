"""dibs verify tasks: the durable task processor under kill -9 and SIGSTOP of its workers."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dibs.cli import main
from dibs.exceptions import InvalidInput
from dibs.verify._tasks import verify_tasks
from dibs.verify.harness import PostgresServer
from pg_fixtures import schema_url

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]


def test_every_job_done_once_and_every_occurrence_run_once(tmp_path: Path) -> None:
    report = verify_tasks(tmp_path / "t.db", workers=3, jobs=600, duration=8.0)
    print(json.dumps(report.to_json()))
    assert report.anomalies == []
    assert report.done == report.jobs == 600
    assert report.faults["kill"] + report.faults["stop"] > 0
    assert report.occurrences >= 40 and report.occurrences_done >= report.occurrences - 5


def test_cli_tasks_refuses_an_existing_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "t.db").touch()
    assert main(["verify", "tasks", str(tmp_path / "t.db")]) == 2
    assert "exists" in capsys.readouterr().err


def test_postgres_every_job_done_once_and_every_occurrence_run_once(tmp_path: Path) -> None:
    with PostgresServer() as server:
        url = schema_url(server.create_database(), "verify_tasks")
        report = verify_tasks(tmp_path / "ledger", store_url=url, jobs=600, duration=8.0)
        print(json.dumps(report.to_json()))
        assert report.anomalies == []
        assert report.done == report.jobs == 600
        assert report.faults["kill"] + report.faults["stop"] > 0
        assert report.occurrences >= 40 and report.occurrences_done >= report.occurrences - 5
        # A job table that already holds jobs would mix runs: refused.
        with pytest.raises(InvalidInput, match="already holds jobs"):
            verify_tasks(tmp_path / "ledger2", store_url=url, jobs=1, duration=0.0)


def test_tasks_refuse_a_store_without_a_job_table(tmp_path: Path) -> None:
    with pytest.raises(InvalidInput, match="durable store"):
        verify_tasks(tmp_path / "ledger", store_url="memory://")
