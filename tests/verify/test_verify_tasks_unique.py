"""dibs verify tasks: one job per unique key while workers race for it under kill -9.

The real stores pass with keys raced by several processes; the ``unique-duplicate``
plant (a read-then-write check outside the store's index) is flagged every run.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dibs.cli import main
from dibs.exceptions import InvalidInput
from dibs.verify._cli import EXIT_ANOMALY
from dibs.verify._tasks import verify_tasks
from pg_fixtures import schema_url

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]


def test_sqlite_keeps_one_job_per_raced_key(tmp_path: Path) -> None:
    report = verify_tasks(tmp_path / "t.db", workers=3, jobs=100, duration=5.0)
    print(json.dumps(report.to_json()))
    assert report.anomalies == []
    assert report.unique["unique_raced_keys"] > 0 and report.unique["unique_keys"] > 0


@pytest.mark.parametrize("run", range(2))
def test_sqlite_flags_the_planted_duplicate_every_run(tmp_path: Path, run: int) -> None:
    report = verify_tasks(tmp_path / "p.db", workers=3, jobs=50, duration=4.0,
                          plant="unique-duplicate")  # fmt: skip
    assert any(a.startswith("unique key") for a in report.anomalies), report.to_json()


def test_postgres_keeps_one_job_per_key_and_flags_the_plant(pg_url: str, tmp_path: Path) -> None:
    good = verify_tasks(tmp_path / "l1", store_url=schema_url(pg_url), jobs=100, duration=5.0)
    assert good.anomalies == [] and good.unique["unique_raced_keys"] > 0
    bad = verify_tasks(tmp_path / "l2", store_url=schema_url(pg_url), jobs=50, duration=4.0,
                       plant="unique-duplicate")  # fmt: skip
    assert any(a.startswith("unique key") for a in bad.anomalies), bad.to_json()


def test_cli_plant_exits_with_an_anomaly(tmp_path: Path) -> None:
    argv = ["verify", "tasks", str(tmp_path / "c.db"), "--jobs", "30", "--duration", "3",
            "--plant", "unique-duplicate", "--json"]  # fmt: skip
    assert main(argv) == EXIT_ANOMALY


def test_an_unknown_plant_is_invalid_input(tmp_path: Path) -> None:
    with pytest.raises(InvalidInput) as raised:
        verify_tasks(tmp_path / "x.db", plant="no-such-plant")
    assert raised.value.field == "plant"
