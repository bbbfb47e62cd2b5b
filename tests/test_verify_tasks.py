"""dibs verify tasks: the durable task processor under kill -9 and SIGSTOP of its workers."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dibs.cli import main
from dibs.verify._tasks import verify_tasks

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
