"""dibs verify tasks: no two runs of an ``overlap="skip"`` schedule at once, under kill -9.

The real stores pass with the schedule run by several worker processes while
the nemesis kills and stops them; the ``overlapping-runs`` plant (evaluations
blind to live runs, and jobs without the schedule's lock key) is flagged every run.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dibs.cli import main
from dibs.verify._cli import EXIT_ANOMALY
from dibs.verify._tasks import verify_tasks
from pg_fixtures import schema_url

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]


def overlapped(anomalies: list[str]) -> list[str]:
    return [a for a in anomalies if "overlapped" in a]


def test_sqlite_runs_the_schedule_one_at_a_time(tmp_path: Path) -> None:
    report = verify_tasks(tmp_path / "t.db", workers=3, jobs=100, duration=5.0)
    print(json.dumps(report.to_json()))
    assert report.anomalies == []
    assert report.overlap["overlap_runs"] > 5


@pytest.mark.parametrize("run", range(2))
def test_sqlite_flags_the_planted_overlap_every_run(tmp_path: Path, run: int) -> None:
    report = verify_tasks(tmp_path / "p.db", workers=3, jobs=50, duration=4.0,
                          plant="overlapping-runs")  # fmt: skip
    assert overlapped(report.anomalies), report.to_json()


def test_postgres_runs_one_at_a_time_and_flags_the_plant(pg_url: str, tmp_path: Path) -> None:
    good = verify_tasks(tmp_path / "l1", store_url=schema_url(pg_url), jobs=100, duration=5.0)
    assert good.anomalies == [] and good.overlap["overlap_runs"] > 5
    bad = verify_tasks(tmp_path / "l2", store_url=schema_url(pg_url), jobs=50, duration=4.0,
                       plant="overlapping-runs")  # fmt: skip
    assert overlapped(bad.anomalies), bad.to_json()


def test_cli_plant_exits_with_an_anomaly(tmp_path: Path) -> None:
    argv = ["verify", "tasks", str(tmp_path / "c.db"), "--jobs", "30", "--duration", "3",
            "--plant", "overlapping-runs", "--json"]  # fmt: skip
    assert main(argv) == EXIT_ANOMALY
